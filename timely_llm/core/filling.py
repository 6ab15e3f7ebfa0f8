"""Filling the batch at a scheduling point: which queued generations start or resume, which parked ones go on and
which are suspended, as far as the batch controller, KV memory, deferred prefill and overload control allow.

A parked generation (at a segment boundary, still in the engine) competes like any queued one: picked, it simply
keeps running; passed over, it is suspended. It is suspended early when a more urgent generation needs the room
or memory it holds. At the batch cap, on an engine that suspends in place (embedded vLLM: the resume prefills
nothing), a running generation in a later segment of its plan, its robot still acting on the one before, yields its
slot to a newcomer (adaptive batch control) when it has the slack: due after the newcomer, it can wait for the
newcomer's segment and still end its own by its deadline in the worst case. On an engine whose resume is a new
request to a server (remote), later segments do not swap: a parked generation holds its slot against a queued
later segment, and only first segments take it. With Amin (``features.amin``) memory is counted by segment lower
bounds, and running generations are suspended first when the next step's KV would not fit (core/admission.py).
"""

from __future__ import annotations

from timely_llm.core.admission import AminAdmission, DeferredPrefill, KvAdmission, NoDeferral
from timely_llm.core.batch import BatchController, RunningBatch
from timely_llm.core.estimator import ProfiledTimes, SegmentTimes
from timely_llm.core.overload import OverloadControl
from timely_llm.core.places import Call, RequestPlaces
from timely_llm.core.request import Request
from timely_llm.engines.base import Engine, KvView


class BatchFilling:
    def __init__(self, places: RequestPlaces, batch: BatchController, overload: OverloadControl,
                 times: SegmentTimes | ProfiledTimes, memory: AminAdmission | KvAdmission,
                 deferral: DeferredPrefill | NoDeferral, engine: Engine, network_latency: float) -> None:
        """``engine``: asked about KV memory only (what is free, what a context takes)."""
        self.places = places
        self.queue = places.queue
        self.running = places.running
        self.parked = places.parked
        self.batch = batch
        self.overload = overload
        self.times = times
        self.memory = memory
        self.deferral = deferral
        self.engine = engine
        self.network_latency = network_latency
        self.counters = places.counters
        self._kv_view: tuple[int, KvView] | None = None
        self._started: list[tuple[Request, int]] = []
        self._yielded: set[str] = set()

    def fill(self, now: float) -> list[tuple[Request, int]]:
        """The batch filled from the queue in priority order (engine calls in ``places.calls``); returns the
        generations (re)started or kept running, with their uncached context tokens."""
        self._started, self._kv_view, self._yielded = [], None, set()
        reserved = self._evict_on_overflow()
        self.times.join_running(self.running.values(), self.batch.max_batch)
        self.queue.token_time = self.times.token_time()
        prefilling = deferring = False
        running = self.batch.ordered(self.running.values())  # kept in step with self.running below
        holding = False  # a later segment waits for a parked generation's slot: only first segments may pass it
        while len(self.queue) > 0:
            request = self._candidate(now, deferring, holding)
            if request is None:
                break
            parked = request.id in self.parked
            if not parked and not prefilling and self._defers(request, now):
                deferring = True  # the parked generations, which need no prefill, may still go on
                self.counters["deferred_prefills"] += 1
                continue
            needed, free = self._memory(request, parked, reserved)
            if not parked and self._waits_for_plans_in_flight(request, running, now, free, needed):
                holding = True
                continue
            if (not self.batch.admits(running, now, free, needed, request)
                    or self.overload.breaks_a_cutoff(request, now)):
                if self.parked and not parked:
                    self._suspend_parked()  # they rank below this one: free what they hold and retry
                    continue
                smaller = None if parked else self._yield_slot(request, now, free, needed)
                if smaller is None:
                    break
                running = smaller
            reserved += needed
            self._admit(request, parked, now)
            running.add(request)
            prefilling = prefilling or not parked
        self._suspend_parked()
        if prefilling:
            self.deferral.prefilled(len(self.running))
        return self._started

    def _admit(self, request: Request, parked: bool, now: float) -> None:
        """Into the batch: a parked generation goes on, a queued one is (re)started."""
        self._started.append((request, self.times.uncached_tokens(request)))
        if parked:
            self.places.keep_running(request)
        else:
            self.places.start(request, now)

    def _memory(self, request: Request, parked: bool, reserved: int) -> tuple[int, int]:
        """KV blocks ``request`` needs to (go on) run and those free for it."""
        kv = self._kv()
        return self.memory.blocks_needed(request, parked, kv), self.memory.free(kv, reserved)

    def _kv(self) -> KvView:
        """The engine's KV memory once the calls decided so far are made."""
        calls = self.places.calls
        if self._kv_view is None or self._kv_view[0] != len(calls):
            suspended = [r.id for call, r in calls if call is Call.SUSPEND]
            resumed = [r.id for call, r in calls if call is Call.RESUME]
            self._kv_view = len(calls), self.engine.kv_after(suspended, resumed)
        return self._kv_view[1]

    def _evict_on_overflow(self) -> int:
        """Amin's overflow resolution: suspend running generations, in its eviction order, until the
        next step's KV growth fits; returns the blocks the rest still need to reach their lower bounds."""
        growth, reserve = self.memory.demand(self.running.values())
        if growth and growth > self._kv().free_blocks:
            for victim in self.memory.eviction_order(self.running.values(), self.network_latency):
                self.places.evict(victim, "amin_evictions")
                growth, reserve = self.memory.demand(self.running.values())
                if growth <= self._kv().free_blocks:
                    break
        return reserve

    def _yield_slot(self, request: Request, now: float, free: int, needed: int) -> RunningBatch | None:
        """Adaptive batch control at the batch cap, on an engine that suspends in place: the running generation that
        can best wait gives ``request`` its slot, its KV kept; returns the batch without it, or None where no
        generation can wait or ``request`` would still not be admitted."""
        if (not self.batch.adaptive or not self.engine.suspends_in_place or self.batch.has_room(len(self.running))
                or request.id in self._yielded or self.overload.breaks_a_cutoff(request, now)):
            return None  # one that yielded here takes no other generation's slot at the same point
        victim = self._most_slack(request, now)
        if victim is None:
            return None
        rest = self.batch.ordered(r for r in self.running.values() if r is not victim)
        if not self.batch.admits(rest, now, free, needed, request):
            return None
        self.places.evict(victim, "slot_yields")
        self._yielded.add(victim.id)
        return rest

    def _most_slack(self, request: Request, now: float) -> Request | None:
        """The running generation with the latest deadline among those in a later segment (their first one, the
        response, is not delayed), due after ``request``, that, waiting for ``request``'s segment (its G(s)) and then
        taking their worst case, still end their segment on time; none (re)started at this scheduling point."""
        batch = len(self.running)
        wait = self.times.gen_time(request, self.times.uncached_tokens(request), batch)
        due = request.dispatch_deadline(self.network_latency)
        started = {r.id for r, _ in self._started}
        best, latest = None, due
        for r in self.running.values():
            deadline = r.dispatch_deadline(self.network_latency)
            if (deadline > latest and r.seg_index > 0 and r.id not in started
                    and deadline - now - self.batch.wcet(r, batch) >= wait):
                best, latest = r, deadline
        return best

    def _defers(self, request: Request, now: float) -> bool:
        """Deferred prefill: hold this generation's (re)start back, unless waiting one more step
        could make it miss its deadline."""
        if not self.deferral.defers(len(self.running) + len(self.parked), len(self.queue) - len(self.parked)):
            return False
        batch = max(len(self.running), 1)
        return self.batch.budget(request, now) - self.batch.wcet(request, batch + 1) > self.batch.step_time(batch)

    def _candidate(self, now: float, deferring: bool, holding: bool) -> Request | None:
        """The next generation to place: the most urgent parked one while prefills are deferred; the queue's best
        otherwise, but only first segments while a later segment waits for a slot, then the parked ones."""
        if deferring:
            return self._most_urgent_parked()
        if holding:
            return self.queue.best(now, first_segments_only=True) or self._most_urgent_parked()
        return self.queue.best(now)

    def _waits_for_plans_in_flight(self, request: Request, running: RunningBatch, now: float, free: int,
                                   needed: int) -> bool:
        """Whether ``request``, a later segment, waits for a slot rather than take a parked generation's, on an
        engine whose resume is a new request to a server (``Engine.resumes_resubmit``). Swapping one plan in flight
        for another there buys no robot its first action, costs a request and a prefilled tail each time, and under
        a backlog leaves the plans of lower classes waiting for every plan of a higher one (docs/peer-benchmark.md:
        the capped remote point). First segments still take parked generations' slots."""
        if not self.engine.resumes_resubmit or request.seg_index == 0 or not self.parked:
            return False
        with_parked = self.batch.ordered([*running, *self.parked.values()])
        return not self.batch.admits(with_parked, now, free, needed, request)

    def _most_urgent_parked(self) -> Request | None:
        return min(self.parked.values(), key=lambda r: r.dispatch_deadline(self.network_latency), default=None)

    def _suspend_parked(self) -> None:
        for request in list(self.parked.values()):
            self.places.suspend(request)
