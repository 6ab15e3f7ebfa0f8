"""Runs a workload through the server on the simulator engine, with simulated robots.

Simulated robots execute each dispatched segment after the network latency, once
their previous segment is done, for a duration drawn from the skill models; they
report completion back over the same latency. Durations are drawn from a random
stream keyed by (seed, request, segment), so every policy sees the same robots.
"""

from __future__ import annotations

import heapq
import itertools
import random
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

from timely_llm.clock import VirtualClock, WallClock
from timely_llm.core.estimator import ExecutionTimeEstimator, estimator_for
from timely_llm.core.features import DEFAULT as DEFAULT_FEATURES
from timely_llm.core.features import Features
from timely_llm.core.request import Outcome, Request, Segment
from timely_llm.core.skills import SkillModel
from timely_llm.engines.base import Engine
from timely_llm.engines.hardware import HardwareProfile
from timely_llm.engines.sim import SimEngine
from timely_llm.evaluation.metrics import summarize
from timely_llm.server import POLICIES, PlanRequest, Server, parts_of
from timely_llm.workloads.generator import Workload, WorkloadRequest
from timely_llm.workloads.traces import TraceCatalog

BENCH_POLICIES = (*POLICIES, "isolated")


@dataclass
class SimulatedRobots:
    """Executes segments on the server's clock and reports back through ``report``."""

    skills: dict[str, SkillModel]
    network_latency: float
    seed: int
    schedule: Callable[[float, Callable[[], None]], None]
    report: Callable[..., None] = field(default=lambda *a, **k: None)
    _lane_free: dict[str, float] = field(default_factory=dict)

    def on_segment(self, request: Request, segment: Segment) -> None:
        start = max(segment.gen_end + self.network_latency, self._lane_free.get(request.id, 0.0))
        rng = random.Random(zlib.crc32(f"{self.seed}/{request.id}/{segment.index}".encode()))
        end = start + request.robot.sample_exec_time(segment.text, rng)
        self._lane_free[request.id] = end
        self.schedule(end + self.network_latency,
                      lambda: self.report(request.id, segment.index, start, end))


class Simulation:
    """Discrete-event driver: arrivals and robot reports interleaved with engine steps."""

    def __init__(self, server: Server, clock: VirtualClock | WallClock) -> None:
        self.server = server
        self.clock = clock
        self._events: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self.peak_queue = 0
        """Most generations ever waiting in the server's queue at a scheduling point."""

    def schedule(self, t: float, action: Callable[[], None]) -> None:
        heapq.heappush(self._events, (t, next(self._seq), action))

    def run(self) -> None:
        while True:
            while self._events and self._events[0][0] <= self.clock.now():
                heapq.heappop(self._events)[2]()
            self.peak_queue = max(self.peak_queue, len(self.server.queue))
            if self.server.step():
                continue
            if not self._events:
                return
            self.clock.idle_until(self._events[0][0])


@dataclass
class EngineSetup:
    """How a bench run gets its engine and clock: the simulator on a virtual clock (a fresh
    engine per run), or one real engine on the wall clock (real step times, real waits)."""

    name: str
    new_engine: Callable[[], Engine]
    new_clock: Callable[[], VirtualClock | WallClock]
    profile: HardwareProfile | None = None
    """The engine's step-time model, for TimeBill's estimator (the simulator's own profile, or one
    ``timely-llm profile`` fitted to the real engine)."""

    @classmethod
    def simulator(cls, profile: HardwareProfile, suspends_in_place: bool = False) -> EngineSetup:
        """A fresh simulator per run; ``suspends_in_place`` models embedded vLLM's suspension (KV kept)."""
        name = f"{profile.name}-in-place" if suspends_in_place else profile.name
        return cls(name, lambda: SimEngine(profile, suspends_in_place=suspends_in_place), VirtualClock, profile)

    @classmethod
    def real(cls, name: str, engine: Engine, profile: HardwareProfile | None = None) -> EngineSetup:
        return cls(name, lambda: engine, WallClock, profile)

    def estimator(self, features: Features) -> ExecutionTimeEstimator | None:
        return estimator_for(features, self.profile, f"a step-time profile of {self.name} "
                                                     "(fit one with timely-llm profile)")


def run_bench(workload: Workload, policy: str, setup: EngineSetup | HardwareProfile,
              skills: dict[str, SkillModel], catalog: TraceCatalog, seed: int = 0,
              max_batch: int | None = None, features: Features = DEFAULT_FEATURES) -> dict:
    if policy not in BENCH_POLICIES:
        raise ValueError(f"unknown policy {policy!r} (one of {', '.join(BENCH_POLICIES)})")
    if isinstance(setup, HardwareProfile):
        setup = EngineSetup.simulator(setup)
    if policy in POLICIES:
        features = parts_of(POLICIES[policy], features)
    if policy == "isolated":
        if setup.new_clock is not VirtualClock:
            raise ValueError("policy 'isolated' replays each request alone and needs the simulator engine")
        records = [_run(workload, [r], "vllm-stream", setup, skills, catalog, seed, None, Features())[0][0]
                   for r in workload.requests]
        peak_queue, counters = 1, {}
    else:
        records, peak_queue, counters = _run(workload, list(workload.requests), policy, setup, skills, catalog, seed,
                                             max_batch, features)
    records.sort(key=lambda r: (r["arrival"], r["id"]))
    return {
        "policy": policy, "workload": workload.name, "hw": setup.name, "seed": seed,
        "network_latency": workload.network_latency, "max_batch": max_batch, "peak_queue": peak_queue,
        "features": features.label(), "counters": counters,
        "requests": records, "summary": summarize(records),
    }


def _run(workload: Workload, requests: list[WorkloadRequest], policy: str, setup: EngineSetup,
         skills: dict[str, SkillModel], catalog: TraceCatalog, seed: int, max_batch: int | None,
         features: Features) -> tuple[list[dict], int, dict[str, int]]:
    estimator = setup.estimator(features)
    engine = setup.new_engine()
    clock = setup.new_clock()
    records: list[dict] = []
    server = Server(engine, skills, POLICIES[policy], clock, workload.network_latency, max_batch,
                    on_finish=lambda r: records.append(Outcome.of(r).to_record()), features=features,
                    estimator=estimator)
    sim = Simulation(server, clock)
    robots = SimulatedRobots(skills, workload.network_latency, seed, sim.schedule, server.segment_done)
    server.on_segment = robots.on_segment
    tokenizer = engine.tokenizer
    for robot in sorted({catalog[r.trace].robot for r in requests}):
        server.warm_prefix(tokenizer.encode(catalog.prompt_text(robot, "")))
    origin = clock.now()  # arrivals count from here, after the warm-up
    encoded = {t: (tokenizer.encode(catalog.prompt_text(catalog[t].robot, catalog[t].prompt)),
                   tokenizer.encode(catalog[t].plan)) for t in {r.trace for r in requests}}
    for r in requests:
        trace = catalog[r.trace]
        prompt_ids, plan_ids = encoded[r.trace]
        plan = PlanRequest(r.id, r.agent, trace.robot, prompt_ids, r.tuf, trace.category, forced_ids=plan_ids,
                           trace=trace.id, arrival=origin + r.arrival, overrun=r.overrun)
        sim.schedule(origin + r.arrival, lambda plan=plan: server.submit(plan))
    sim.run()
    return records, sim.peak_queue, dict(sorted(server.counters.items()))
