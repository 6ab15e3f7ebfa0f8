"""The server: one serving step at a time, applying the scheduler's decisions to an engine, and the API robots and
front ends call; ``serving.build_server`` builds it and ``serving.Driver``, the one loop, calls its ``step``, in
the benchmarks and on the node's thread alike.

One server serves every engine and every policy. Each ``step()`` is a scheduling point: the scheduler decides
(overload control, then which generations start, resume, go on or are suspended), the server makes those engine
calls, the engine runs one iteration, and the scheduler takes its output (``Scheduler.update_from_output``): new
text is segmented and each finished segment dispatched (``on_segment``). A request ends (``on_finish``) once its
plan is generated and the robot has reported every segment executed, or when it is aborted or canceled; no
accepted request ends any other way, and once ended it is forgotten.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from timely_llm.clock import VirtualClock, WallClock
from timely_llm.core.features import Features
from timely_llm.core.kv_reuse import KvReuse
from timely_llm.core.overload import OVERRUN_NONE, OVERRUN_STRATEGIES
from timely_llm.core.places import PlaceCounts
from timely_llm.core.policies import ServingPolicy
from timely_llm.core.request import OverloadState, Request, Segment, Status
from timely_llm.core.tuf import TUF
from timely_llm.engines.base import DEFAULT_MAX_NEW_TOKENS, Engine, EngineRejected, GenerationSpec, StepOutput
from timely_llm.errors import RequestRejected
from timely_llm.plan.grammar import plan_grammar
from timely_llm.plan.plan_stream import PlanStream
from timely_llm.plan.skills import SkillModel
from timely_llm.scheduler import Call, Dispatched, Ended, Generated, Infeasible, Notice, Scheduler, SchedulerOutput


@dataclass
class PlanRequest:
    """What a robot asks for; validated by ``Server.submit``."""

    id: str
    agent: str
    robot: str
    prompt_ids: list[int]
    tuf: TUF
    category: str = "normal"
    max_new_tokens: int = 0
    forced_ids: list[int] | None = None
    trace: int | None = None
    arrival: float | None = None
    """When the request reached the server; defaults to the time of ``submit``."""
    constrained: bool = True
    """Generate within the robot's plan grammar (unless forced: a replayed plan needs none)."""
    keep_if_infeasible: bool = False
    """Overload control (features.shed): once its deadline cannot be met, keep waiting (told through
    ``on_infeasible``) instead of ending aborted."""
    overrun: str = OVERRUN_NONE
    """What to do with a segment that overruns its deadline: none, kill or skip-next (core/overload.py)."""

    def request(self, robot: SkillModel, arrival: float, default_max_new_tokens: int,
                decode: Callable[[list[int]], str], streaming: bool) -> Request:
        """The request the server serves for this one, arrived at ``arrival``; ``decode`` and ``streaming``:
        its plan stream's detokenizer and whether segments go out as they are cut."""
        grammar = plan_grammar(robot) if self.constrained and self.forced_ids is None else None
        return Request(
            id=self.id, agent=self.agent, robot=robot, tuf=self.tuf, arrival=arrival,
            prompt_ids=list(self.prompt_ids), max_new_tokens=self.max_new_tokens or default_max_new_tokens,
            forced_ids=self.forced_ids, category=self.category, trace=self.trace, grammar=grammar,
            stream=PlanStream(robot, decode, streaming, grammar),
            overload=OverloadState(keep_if_infeasible=self.keep_if_infeasible, overrun=self.overrun),
        )

    def check(self, robots: dict[str, SkillModel]) -> None:
        """Raises RequestRejected, with the reason, for a request no robot of ``robots`` can be served."""
        if not self.agent:
            raise RequestRejected("agent id is empty")
        if self.robot not in robots:
            raise RequestRejected(f"unknown robot type {self.robot!r} (known: {', '.join(sorted(robots))})")
        if not self.prompt_ids:
            raise RequestRejected("empty prompt")
        if self.max_new_tokens < 0:
            raise RequestRejected(f"max_new_tokens must be >= 0, got {self.max_new_tokens}")
        if self.overrun not in OVERRUN_STRATEGIES:
            raise RequestRejected(f"unknown overrun strategy {self.overrun!r} (known: {', '.join(OVERRUN_STRATEGIES)})")


@dataclass(frozen=True)
class ServerView:
    """What the server serves with and how loaded it is, read at one instant (``Server.view``): what status,
    ``/diagnostics`` and the node's loop read instead of the scheduler's parts."""

    policy: str
    batch_cap: int
    """The fixed batch cap; 0 where there is none (the engine's own)."""
    counts: PlaceCounts
    kv_reuse: KvReuse
    """What resumes reused so far, where the engine reports it."""


class Server:
    """The serving step and the public API: requests and robot reports come in, the scheduler decides, the server
    makes the engine calls it decided, steps the engine, and carries out what the step's output leads to."""

    def __init__(self, engine: Engine, robots: dict[str, SkillModel], policy: ServingPolicy, scheduler: Scheduler,
                 clock: VirtualClock | WallClock, network_latency: float, features: Features,
                 default_max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
                 on_segment: Callable[[Request, Segment], None] | None = None,
                 on_finish: Callable[[Request], None] | None = None,
                 on_infeasible: Callable[[Request], None] | None = None,
                 on_start: Callable[[Request], None] | None = None) -> None:
        """Built by ``serving.build_server``. ``features``: the scheduler parts on (none under the unsegmented
        policies, the vLLM baselines). ``on_infeasible``: told when a request that opted to keep waiting can no
        longer get utility >= 0; ``on_start``: when a generation first starts in the engine."""
        self.engine = engine
        self.robots = robots
        self.policy = policy
        self.scheduler = scheduler
        self.clock = clock
        self.network_latency = network_latency
        self.features = features
        self.default_max_new_tokens = default_max_new_tokens
        self.on_segment = on_segment or (lambda request, segment: None)
        self.on_finish = on_finish or (lambda request: None)
        self.on_infeasible = on_infeasible or (lambda request: None)
        self.on_start = on_start or (lambda request: None)
        self.requests: dict[str, Request] = {}
        self.lock = threading.RLock()
        self.counters = scheduler.counters
        """Events of the run by name (preemptions, shed requests...), for benchmarks and the status topic."""
        self.last_step_s = float("nan")
        """The last engine step's duration, as its output gives it (NaN before the first)."""
        self.queue, self.running, self.parked = scheduler.queue, scheduler.running, scheduler.parked
        self.batch, self.times, self.memory, self.overload = (scheduler.batch, scheduler.times, scheduler.memory,
                                                              scheduler.overload)

    # ----- called by robots and front ends (any thread) -----

    def submit(self, plan: PlanRequest) -> Request:
        arrival = self.clock.now() if plan.arrival is None else plan.arrival  # before waiting for the lock
        with self.lock:
            if not plan.id or plan.id in self.requests:
                raise RequestRejected(f"request id {plan.id!r} is empty or already used")
            plan.check(self.robots)
            request = plan.request(self.robots[plan.robot], arrival, self.default_max_new_tokens,
                                   self.engine.tokenizer.decode, self.policy.streaming)
            self.requests[request.id] = request
            self.scheduler.add(request)
        self.clock.wake()
        return request

    def segment_done(self, request_id: str, index: int, exec_start: float, exec_end: float,
                     success: bool = True, reason: str = "", result: str | None = None) -> None:
        """A robot reports that it executed segment ``index`` (times on the server's clock); ``result``: the
        value of the blocking call the segment ended with (ignored for a segment that did not wait)."""
        with self.lock:
            request = self.requests.get(request_id)
            if (request is None or request.status.ended or index >= len(request.segments)
                    or request.segments[index].exec_end is not None):
                return
            self._carry_out(self.scheduler.reported(request, index, exec_start, exec_end, success, reason, result))
        self.clock.wake()

    def cancel(self, request_id: str, reason: str = "canceled by client") -> bool:
        return self._end_live(request_id, Status.CANCELED, reason)

    def abort(self, request_id: str, reason: str) -> bool:
        """End a request the server cannot complete (e.g. its robot stopped answering)."""
        return self._end_live(request_id, Status.ABORTED, reason)

    def _end_live(self, request_id: str, status: Status, reason: str) -> bool:
        with self.lock:
            request = self.requests.get(request_id)
            if request is None or request.status.ended:
                return False
            self._carry_out(self.scheduler.end(request, status, reason))
        self.clock.wake()
        return True

    # ----- the serving step (serving.Driver calls it) -----

    def step(self) -> bool:
        """One scheduling point and engine iteration; False when there was nothing to run."""
        with self.lock:
            decision = self.scheduler.schedule(self.clock.now())
            self._carry_out(decision.notices)
            self._apply(decision)
            if not self.running:
                return False
            began = self.clock.now()
            out = self._step_engine()
        if out is None:
            return True
        self.last_step_s = out.duration
        # A modelled step elapses without the lock, so requests and robot reports are not held up.
        self.clock.sleep_until(began + out.duration)
        with self.lock:
            self._carry_out(self.scheduler.update_from_output(out, self.clock.now()))
        return True

    def warm_prefix(self, prompt_ids: list[int]) -> None:
        """Prefill a shared prompt prefix once so requests find it in the prefix cache.

        The paper's server keeps each robot's fixed prompt (skills, guidance, examples);
        this puts its KV in the cache before the first request needs it.
        """
        gen_id = f"warm-{len(prompt_ids)}-{hash(tuple(prompt_ids)) & 0xFFFF:x}"
        with self.lock:
            self.times.warmed(prompt_ids)
            self.engine.start(GenerationSpec(gen_id, list(prompt_ids), max_new_tokens=1, forced_ids=[]))
            while True:
                started = self.clock.now()
                out = self.engine.step()
                self.clock.sleep_until(started + out.duration)
                if gen_id in out.finished or gen_id in out.failed:
                    break
            self.engine.release(gen_id)

    # ----- read by status and benchmarks, and the live policy switch (any thread) -----

    def view(self) -> ServerView:
        """The policy, the batch cap and where the live requests are, read under the server's lock."""
        with self.lock:
            return ServerView(self.policy.name, self.batch.max_batch or 0, self.scheduler.places.counts(),
                              KvReuse.of(self.counters))

    def queued(self) -> int:
        """How many requests are queued (cheap, unlocked: the loop's own per-step reading)."""
        return self.scheduler.places.queued()

    def use_policy(self, policy: ServingPolicy) -> None:
        """Serve with ``policy`` from the next scheduling point on: only the queue's order changes, so it must be of
        this policy's serving mode and engine scheduling (the caller checks)."""
        with self.lock:
            self.policy = policy
            self.scheduler.places.reorder(policy.queue_order(self.network_latency))

    # ----- internals -----

    def _apply(self, decision: SchedulerOutput) -> None:
        """Make the engine calls the scheduler decided, in its order."""
        for call, request in decision.calls:
            if call is Call.SUSPEND:
                self.engine.suspend(request.id)
            else:
                self._start(request, resumed=call is Call.RESUME)
        self.scheduler.applied(decision)

    def _start(self, request: Request, resumed: bool) -> None:
        priority = self.policy.engine_priority(request.tuf.ert)
        spec = GenerationSpec(request.id, request.prompt_ids, list(request.output_ids),
                              request.max_new_tokens, request.forced_ids, priority, request.grammar,
                              tuple(request.observed))
        try:
            self.engine.start(spec)
        except EngineRejected as exc:  # a resumed generation is still the engine's to release
            self._carry_out(self.scheduler.end(request, Status.ABORTED, f"engine rejected the request: {exc}",
                                               in_engine=resumed))
            return
        if not resumed:
            self.on_start(request)

    def _step_engine(self) -> StepOutput | None:
        """One engine iteration; None when the engine failed, which ends the requests it was running."""
        try:
            return self.engine.step()
        except Exception as exc:  # noqa: BLE001 - an engine crash ends its requests, not the loop
            for request in list(self.running.values()):
                self._carry_out(self.scheduler.end(request, Status.ABORTED, f"engine error: {exc}"))
            return None

    def _carry_out(self, notices: list[Notice]) -> None:
        """What the scheduler's decisions lead to, in order: engine releases, and segments, ends and notices
        for the robots. An ended request lives on only in what ``on_finish`` kept."""
        for notice in notices:
            if isinstance(notice, Dispatched):
                self.on_segment(notice.request, notice.segment)
            elif isinstance(notice, Generated):
                self.engine.release(notice.request.id)
            elif isinstance(notice, Infeasible):
                self.on_infeasible(notice.request)
            else:
                self._ended(notice)

    def _ended(self, notice: Ended) -> None:
        try:
            if notice.in_engine:
                self.engine.release(notice.request.id)
        finally:
            self.on_finish(notice.request)
            self.requests.pop(notice.request.id, None)
