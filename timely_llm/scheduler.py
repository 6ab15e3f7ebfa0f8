"""The scheduler: owns the queue, the running, parked and blocked sets and the transitions between
them, and at each scheduling point returns what the engine must start, resume and suspend; it runs nothing.

The blocked set is the paper's waiting queue (§8): a generation whose dispatched segment ends in a
blocking call leaves the schedulable set, suspended in the engine (which keeps its KV in place while
memory allows and gives it back to the prefix cache under pressure), until the robot reports the
value; it then joins the queue again, its next segment's TUF counted from the report.

A request's status and its place change together, here, in one method per transition of the state
machine drawn in ``timely_llm.core.request``; the server loop applies the returned engine calls in
order and ``remove`` is the one way out.
"""

from __future__ import annotations

import enum
from collections import Counter
from dataclasses import dataclass, field

from timely_llm.core.admission import AminAdmission, DeferredPrefill, KvAdmission, NoDeferral
from timely_llm.core.batch import BatchController
from timely_llm.core.estimator import ProfiledTimes, SegmentTimes
from timely_llm.core.overload import OverloadControl
from timely_llm.core.queue import GenerationQueue
from timely_llm.core.request import Request, Status
from timely_llm.engines.base import Engine, KvView


class Call(enum.Enum):
    """An engine call the loop makes for a scheduling decision."""

    START = "start"  # a generation the engine does not hold yet
    RESUME = "resume"  # a suspended generation the engine holds
    SUSPEND = "suspend"


@dataclass
class SchedulerOutput:
    calls: list[tuple[Call, Request]] = field(default_factory=list)
    """Engine calls in the order decided."""
    started: list[tuple[Request, int]] = field(default_factory=list)
    """Generations (re)started or kept running at this point, with their uncached context tokens."""


class Scheduler:
    def __init__(self, engine: Engine, queue: GenerationQueue, batch: BatchController, overload: OverloadControl,
                 running: dict[str, Request], times: SegmentTimes | ProfiledTimes,
                 memory: AminAdmission | KvAdmission, deferral: DeferredPrefill | NoDeferral,
                 network_latency: float, counters: Counter[str]) -> None:
        """``engine``: asked about KV memory only (what is free, what a context takes). ``times``, ``memory``
        and ``deferral``: the scheduler parts (TimeBill, Amin, deferred prefill) or their do-nothing stand-ins."""
        self.engine = engine
        self.queue = queue
        self.batch = batch
        self.overload = overload
        self.running = running
        self.parked: dict[str, Request] = {}
        """Generations at a segment boundary: queued, yet still in the engine until the next scheduling point."""
        self.times = times
        self.memory = memory
        self.deferral = deferral
        self.network_latency = network_latency
        self.counters = counters
        self.evicted: set[str] = set()
        """Generations Amin suspended whose resume prefill is still to count as recomputed."""
        self.blocked: dict[str, Request] = {}
        """Generations waiting for the value of the blocking call their last segment ended with."""
        self._blocking: dict[str, Request] = {}
        """Blocked since the last scheduling point: still to suspend in the engine."""
        self._out = SchedulerOutput()
        self._kv_view: KvView | None = None

    def schedule(self, now: float) -> SchedulerOutput:
        """Fill the batch from the queue in priority order, as far as the batch controller allows.

        A parked generation (at a segment boundary, still in the engine) competes like any
        queued one: picked, it simply keeps running; passed over, it is suspended. It is
        suspended early when a more urgent generation needs the room or memory it holds.
        With Amin (``features.amin``) memory is counted by segment lower bounds, and running
        generations are suspended first when the next step's KV would not fit (core/admission.py).
        """
        self._out, self._kv_view = SchedulerOutput(), None
        for blocked in self._blocking.values():
            self._call(Call.SUSPEND, blocked)
        self._blocking.clear()
        reserved = self._evict_on_overflow()
        self.times.join_running(self.running.values(), self.batch.max_batch)
        self.queue.token_time = self.times.token_time()
        prefilling = deferring = False
        running = self.batch.ordered(self.running.values())  # kept in step with self.running below
        while len(self.queue) > 0:
            request = self._most_urgent_parked() if deferring else self.queue.best(now)
            if request is None:
                break
            parked = request.id in self.parked
            if not parked and not prefilling and self._defers(request, now):
                deferring = True  # the parked generations, which need no prefill, may still go on
                self.counters["deferred_prefills"] += 1
                continue
            needed, free = self._memory(request, parked, reserved)
            if (not self.batch.admits(running, now, free, needed, request)
                    or self.overload.breaks_a_cutoff(request, now)):
                if parked or not self.parked:
                    break
                self._suspend_parked()  # they rank below this one: free what they hold and retry
                continue
            reserved += needed
            self._admit(request, parked, now)
            running.add(request)
            prefilling = prefilling or not parked
        self._suspend_parked()
        if prefilling:
            self.deferral.prefilled(len(self.running))
        return self._out

    def _admit(self, request: Request, parked: bool, now: float) -> None:
        """Into the batch: a parked generation goes on, a queued one is (re)started."""
        self._out.started.append((request, self.times.uncached_tokens(request)))
        if parked:
            self._keep_running(request)
        else:
            self._start(request, now)

    def _memory(self, request: Request, parked: bool, reserved: int) -> tuple[int, int]:
        """KV blocks ``request`` needs to (go on) run and those free for it."""
        kv = self._kv()
        return self.memory.blocks_needed(request, parked, kv), self.memory.free(kv, reserved)

    def _kv(self) -> KvView:
        """The engine's KV memory once the calls decided so far are made."""
        if self._kv_view is None:
            suspended = [r.id for call, r in self._out.calls if call is Call.SUSPEND]
            resumed = [r.id for call, r in self._out.calls if call is Call.RESUME]
            self._kv_view = self.engine.kv_after(suspended, resumed)
        return self._kv_view

    def _evict_on_overflow(self) -> int:
        """Amin's overflow resolution: suspend running generations, in its eviction order, until the
        next step's KV growth fits; returns the blocks the rest still need to reach their lower bounds."""
        growth, reserve = self.memory.demand(self.running.values())
        if growth and growth > self._kv().free_blocks:
            for victim in self.memory.eviction_order(self.running.values(), self.network_latency):
                self._evict(victim)
                growth, reserve = self.memory.demand(self.running.values())
                if growth <= self._kv().free_blocks:
                    break
        return reserve

    def _defers(self, request: Request, now: float) -> bool:
        """Deferred prefill: hold this generation's (re)start back, unless waiting one more step
        could make it miss its deadline."""
        if not self.deferral.defers(len(self.running) + len(self.parked), len(self.queue) - len(self.parked)):
            return False
        batch = max(len(self.running), 1)
        return self.batch.budget(request, now) - self.batch.wcet(request, batch + 1) > self.batch.step_time(batch)

    def _most_urgent_parked(self) -> Request | None:
        return min(self.parked.values(), key=lambda r: r.dispatch_deadline(self.network_latency), default=None)

    def _suspend_parked(self) -> None:
        for request in list(self.parked.values()):
            self._suspend(request)

    def _call(self, call: Call, request: Request) -> None:
        self._out.calls.append((call, request))
        self._kv_view = None

    # ----- transitions: each changes a request's status and its place together -----

    def add(self, request: Request) -> None:
        """Submitted: WAITING in the queue."""
        self.queue.push(request)

    def _start(self, request: Request, now: float) -> None:
        """WAITING or SUSPENDED -> RUNNING: out of the queue, (re)started in the engine."""
        came_from = request.advance(Status.RUNNING)
        self.queue.remove(request.id)
        self.running[request.id] = request
        if request.seg_gen_start is None:
            request.seg_gen_start = now
        self._call(Call.RESUME if came_from is Status.SUSPENDED else Call.START, request)

    def park(self, request: Request) -> None:
        """RUNNING -> PARKED: a segment was dispatched; queued again, still in the engine."""
        request.advance(Status.PARKED)
        del self.running[request.id]
        self.parked[request.id] = request
        self.queue.push(request)

    def block(self, request: Request) -> None:
        """RUNNING -> BLOCKED: a segment ending in a blocking call was dispatched; out of the queue, suspended
        at the next scheduling point (before any engine step: nothing past the call is generated)."""
        request.advance(Status.BLOCKED)
        del self.running[request.id]
        self.blocked[request.id] = request
        self._blocking[request.id] = request

    def observed(self, request: Request) -> None:
        """BLOCKED -> SUSPENDED: its observation was appended; queued again for its next segment."""
        request.advance(Status.SUSPENDED)
        del self.blocked[request.id]
        request.seg_gen_start = None
        self.queue.push(request)

    def _keep_running(self, request: Request) -> None:
        """PARKED -> RUNNING: picked at the next scheduling point, it goes on where it is."""
        request.advance(Status.RUNNING)
        self.queue.remove(request.id)
        del self.parked[request.id]
        self.running[request.id] = request

    def _suspend(self, request: Request) -> None:
        """PARKED -> SUSPENDED: passed over; the engine drops it from the batch, keeping its context cached."""
        request.advance(Status.SUSPENDED)
        del self.parked[request.id]
        self._call(Call.SUSPEND, request)
        request.seg_gen_start = None
        self.queue.update(request)  # with TimeBill its G(s) now includes the resume prefill

    def _evict(self, request: Request) -> None:
        """RUNNING -> SUSPENDED: Amin frees KV memory mid-segment; queued again, its token ids kept
        (the segment goes on from there when it is resumed)."""
        request.advance(Status.SUSPENDED)
        del self.running[request.id]
        self._call(Call.SUSPEND, request)
        self.queue.push(request)
        self.counters["amin_evictions"] += 1
        self.evicted.add(request.id)

    def generated(self, request: Request) -> None:
        """RUNNING -> GENERATED: the plan is complete; out of the running set (the server releases it from the
        engine)."""
        request.advance(Status.GENERATED)
        del self.running[request.id]

    def remove(self, request: Request, status: Status) -> Status:
        """Any live status -> SUCCEEDED, ABORTED or CANCELED: out of every place; returns the status left."""
        came_from = request.advance(status)
        self.evicted.discard(request.id)
        if came_from.queued:
            self.queue.remove(request.id)
        if came_from is Status.RUNNING:
            del self.running[request.id]
        elif came_from is Status.PARKED:
            del self.parked[request.id]
        elif came_from is Status.BLOCKED:
            del self.blocked[request.id]
            self._blocking.pop(request.id, None)  # not suspended yet: the engine releases it running
        return came_from
