"""One way to build a server (``ServerConfig``, ``build_server``: the scheduler, its parts and the server around
them) and one loop to drive it (``Driver``: arrivals and robot reports when due, engine steps in between)."""

from __future__ import annotations

import heapq
import itertools
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from timely_llm.clock import VirtualClock, WallClock
from timely_llm.core.admission import AminAdmission, DeferredPrefill, KvAdmission, NoDeferral, departure_threshold
from timely_llm.core.batch import BatchController
from timely_llm.core.estimator import ExecutionTimeEstimator, ProfiledTimes, SegmentTimes, estimator_for
from timely_llm.core.features import DEFAULT as DEFAULT_FEATURES
from timely_llm.core.features import Features
from timely_llm.core.overload import OverloadControl
from timely_llm.core.places import RequestPlaces
from timely_llm.core.policies import ServingPolicy, serving_policy
from timely_llm.core.queue import GenerationQueue
from timely_llm.core.request import Request, Segment
from timely_llm.core.throughput import PRIOR_SIZES, TYPICAL_CONTEXT, ThroughputModel, derive_curve
from timely_llm.engines.base import DEFAULT_MAX_NEW_TOKENS, Engine
from timely_llm.engines.hardware import HardwareProfile
from timely_llm.plan.skills import SkillModel
from timely_llm.scheduler import Scheduler
from timely_llm.server import PlanRequest, Server

Action = Callable[[Server], object]
"""Something that happens to the server at a time: a request arrives, a robot reports."""
DEFAULT_MAX_BATCH = 256
"""The batch cap unless one is given (vLLM's own default varies with its version and device)."""
IDLE_WAIT_S = 0.05
"""How long a loop that runs until stopped idles with nothing due (a new action wakes it at once)."""


@dataclass(frozen=True)
class ServerConfig:
    """How a server serves, apart from its engine, robots, clock and callbacks. Refused when built if a part
    needs the engine's step-time profile and there is none, so before any engine starts."""

    policy: str
    """A name in ``POLICIES``."""
    network_latency: float
    """Seconds between the server and a robot, each way."""
    features: Features = DEFAULT_FEATURES
    """The scheduler parts asked for; a policy runs with ``parts``."""
    max_batch: int | None = None
    """The batch cap; None: ``DEFAULT_MAX_BATCH``. Either way at most what the engine runs at once."""
    default_max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    step_profile: HardwareProfile | None = None
    """The engine's step-time profile (TimeBill's estimator, ALA's prior); None where there is none."""
    step_profile_source: str = "the engine's step-time profile (fit one with timely-llm profile)"
    """What would give ``step_profile``, named when a part needs it and there is none."""

    def __post_init__(self) -> None:
        self.estimator()

    @property
    def serving_policy(self) -> ServingPolicy:
        return serving_policy(self.policy)

    @property
    def parts(self) -> Features:
        """The parts the policy runs with: none under the unsegmented ones (the vLLM baselines)."""
        return self.serving_policy.parts(self.features)

    def estimator(self) -> ExecutionTimeEstimator | None:
        """The step-time model the parts take; ValueError when timebill or deferred_prefill is on without one."""
        return estimator_for(self.parts, self.step_profile, self.step_profile_source)

    def vllm_args(self) -> dict[str, str]:
        """The vLLM engine arguments the policy decides (``ServingPolicy.engine_scheduling``)."""
        return {"scheduling_policy": self.serving_policy.engine_scheduling}


def build_server(config: ServerConfig, engine: Engine, robots: dict[str, SkillModel],
                 clock: VirtualClock | WallClock, *,
                 on_segment: Callable[[Request, Segment], None] | None = None,
                 on_finish: Callable[[Request], None] | None = None,
                 on_infeasible: Callable[[Request], None] | None = None,
                 on_start: Callable[[Request], None] | None = None) -> Server:
    """The server ``config`` describes, on ``engine``, for ``robots``, told of dispatched segments, ended
    requests, requests that can no longer be served in time and generations started through the callbacks."""
    return Server(engine, robots, config.serving_policy, build_scheduler(config, engine, robots), clock,
                  config.network_latency, config.parts, config.default_max_new_tokens, on_segment=on_segment,
                  on_finish=on_finish, on_infeasible=on_infeasible, on_start=on_start)


def build_scheduler(config: ServerConfig, engine: Engine, robots: dict[str, SkillModel]) -> Scheduler:
    """The scheduler of a server, with the parts its policy runs with and do-nothing stand-ins for the rest."""
    parts, policy, latency, estimator = config.parts, config.serving_policy, config.network_latency, config.estimator()
    if estimator is not None:
        estimator = estimator.spread_over(engine.server_count)
    counters: Counter[str] = Counter()
    timebill = _segment_times(estimator, robots, engine.block_size) if parts.timebill else None
    batch = BatchController(policy.adaptive_batch, batch_cap(config.max_batch, engine), latency,
                            throughput=_throughput_model(estimator) if parts.ala else None,
                            wcet_model=timebill.wcet if timebill else None, counters=counters)
    queue = GenerationQueue(policy.queue_order(latency), timebill.queue_terms if timebill else None)
    deferral = _deferred_prefill(estimator, robots, batch.max_batch) if parts.deferred_prefill else NoDeferral()
    memory = (AminAdmission if parts.amin else KvAdmission)(engine.blocks_for)
    places = RequestPlaces(queue, counters)
    overload = OverloadControl(parts.shed, places.running, timebill, latency, counters)
    return Scheduler(engine, places, batch, overload, timebill or ProfiledTimes(), memory, deferral, latency,
                     policy.segmented)


class Driver:
    """The one loop that drives a server, in the benchmarks and in the node: the actions due (arrivals, robot
    reports, commands sent from other threads) run, then the server steps; with nothing to step, the clock idles
    until the next action. Without a ``stop`` flag the run ends when no action is left; with one it ends once the
    flag is cleared, after the actions already due."""

    def __init__(self, clock: VirtualClock | WallClock,
                 on_error: Callable[[str, Exception], None] | None = None) -> None:
        """``on_error``: told of an action or a step that raised, and the loop goes on (the node's: one
        failure must not stop serving everyone); None: the error ends the run."""
        self.clock = clock
        self.on_error = on_error
        self._due: list[tuple[float, int, Action]] = []
        self._lock = threading.Lock()
        self._order = itertools.count()
        """Ties between actions due at one time go by when they were scheduled."""
        self.peak_queue = 0
        """Most generations ever waiting in the server's queue at a scheduling point."""

    def at(self, t: float, action: Action) -> None:
        """Run ``action`` at ``t``."""
        with self._lock:
            heapq.heappush(self._due, (t, next(self._order), action))

    def send(self, action: Action) -> None:
        """Run ``action`` before the next step; from any thread: it wakes the loop."""
        self.at(self.clock.now(), action)
        self.clock.wake()

    def arrive(self, plan: PlanRequest) -> None:
        """Submit ``plan`` at its arrival time."""
        if plan.arrival is None:
            raise ValueError(f"{plan.id}: a plan the driver submits needs its arrival time")
        self.at(plan.arrival, lambda server: server.submit(plan))

    def executed_at_once(self, request: Request, segment: Segment) -> None:
        """``on_segment`` of robots that execute each segment in no time: reported after the step."""
        self.at(self.clock.now(), lambda server: _report_now(server, request.id, segment.index))

    def run(self, server: Server, stop: threading.Event | None = None) -> None:
        """Drive ``server``; ``stop``: run while it is set (the node's loop), else until no action is left."""
        while stop is None or stop.is_set():
            self._run_due(server)
            self.peak_queue = max(self.peak_queue, server.queued())
            if self._step(server):
                continue
            next_due = self._next_due()
            if next_due is None and stop is None:
                return
            self.clock.idle_until(IDLE_WAIT_S + self.clock.now() if next_due is None else next_due)
        self._run_due(server)

    def _run_due(self, server: Server) -> None:
        while (action := self._pop_due()) is not None:
            try:
                action(server)
            except Exception as exc:  # noqa: BLE001 - told to on_error, where there is one
                self._failed("action", exc)

    def _step(self, server: Server) -> bool:
        try:
            return server.step()
        except Exception as exc:  # noqa: BLE001 - told to on_error, where there is one
            self._failed("step", exc)
            self.clock.idle_until(self.clock.now() + IDLE_WAIT_S)
            return False

    def _failed(self, what: str, exc: Exception) -> None:
        """An action or a step raised: ``on_error`` is told and the loop goes on; without one, the run ends."""
        if self.on_error is None:
            raise exc
        self.on_error(what, exc)

    def _pop_due(self) -> Action | None:
        with self._lock:
            if self._due and self._due[0][0] <= self.clock.now():
                return heapq.heappop(self._due)[2]
        return None

    def _next_due(self) -> float | None:
        with self._lock:
            return self._due[0][0] if self._due else None


def _report_now(server: Server, request_id: str, index: int) -> None:
    now = server.clock.now()
    server.segment_done(request_id, index, now, now)


def batch_cap(max_batch: int | None, engine: Engine) -> int:
    """The batch cap: the one asked for (``DEFAULT_MAX_BATCH`` otherwise), at most what the engine runs at once
    (more would only wait inside the engine, out of our scheduling)."""
    max_batch = max_batch or DEFAULT_MAX_BATCH
    return max_batch if engine.max_batch is None else min(max_batch, engine.max_batch)


def _segment_times(estimator: ExecutionTimeEstimator | None, robots: dict[str, SkillModel],
                   block_size: int) -> SegmentTimes:
    if estimator is None:
        raise ValueError("the timebill feature needs an execution-time estimator (a hardware profile)")
    return SegmentTimes(estimator, robots, block_size)


def _deferred_prefill(estimator: ExecutionTimeEstimator | None, robots: dict[str, SkillModel],
                      max_batch: int | None) -> DeferredPrefill | NoDeferral:
    """K* from the engine's step model read as paper 004's affine one: a prefill stalls decoding for
    c_p (the profile's ``prefill_stall``) plus its tokens' time, TBT = the step intercept + t_d·B; a
    generation leaves the batch after a segment (alpha = 1 / the robots' mean maximum segment length).
    None of it where K* = 1: without a fixed stall, as in the simulated GPUs and vLLM V1's chunked prefill,
    holding prefills back saves nothing and only delays first actions (the paper's Remark 2)."""
    if estimator is None:
        raise ValueError("the deferred_prefill feature needs the engine's step-time model (a hardware profile)")
    mean_segment = sum(r.segment_max_tokens for r in robots.values()) / max(len(robots), 1)
    threshold = departure_threshold(estimator.stall, estimator.c, max_batch or 1, 1.0 / max(mean_segment, 1.0))
    return DeferredPrefill(threshold) if threshold > 1 else NoDeferral()


def _throughput_model(estimator: ExecutionTimeEstimator | None) -> ThroughputModel:
    """ALA's throughput model: a prior from the engine's step-time model where there is one, refined online
    from the decode steps measured."""
    if estimator is None:
        return ThroughputModel()
    sizes = [size * estimator.servers for size in PRIOR_SIZES]  # each server's share at the sizes one server has
    return ThroughputModel(derive_curve(lambda batch: estimator.decode_step(batch, batch * TYPICAL_CONTEXT), sizes),
                           sizes, estimator.servers)
