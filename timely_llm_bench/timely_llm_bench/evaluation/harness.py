"""Runs a workload through the server on the simulator engine, with simulated robots.

Simulated robots execute each dispatched segment after the network latency, once
their previous segment is done, for a duration drawn from the skill models; they
report completion back over the same latency, with the value of a blocking call the
segment ends with. Durations and values are drawn from a random stream keyed by
(seed, request, segment), so every policy sees the same robots.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from timely_llm.clock import VirtualClock, WallClock
from timely_llm.core.features import DEFAULT as DEFAULT_FEATURES
from timely_llm.core.features import Features
from timely_llm.core.policies import POLICIES, VLLM_STREAM
from timely_llm.core.request import Outcome, Request, Segment
from timely_llm.engines.base import Engine
from timely_llm.engines.hardware import HardwareProfile
from timely_llm.engines.sim_remote import simulator
from timely_llm.plan.skills import SIMULATED_VALUES, SkillModel
from timely_llm.server import PlanRequest
from timely_llm.serving import Action, Driver, ServerConfig, build_server
from timely_llm.traces import TraceCatalog
from timely_llm_bench.evaluation.metrics import summarize
from timely_llm_bench.workloads.generator import Workload, WorkloadRequest

ISOLATED = "isolated"
"""The bench's own policy: each request alone on an idle simulated server (the best it could get)."""
BENCH_POLICY_HELP = {ISOLATED: "bench only: each request alone on an idle simulated server (the best it could get)"}
"""The bench's policies beside the node's (``timely_llm.core.policies``), with their help lines."""
BENCH_POLICIES = (*POLICIES, *BENCH_POLICY_HELP)


@dataclass
class SimulatedRobots:
    """Execute segments on the server's clock and report back through ``schedule`` (a ``Driver``'s ``at``)."""

    skills: dict[str, SkillModel]
    network_latency: float
    seed: int
    schedule: Callable[[float, Action], None]
    values: Mapping[int, Mapping[str, Sequence[str]]] = field(default_factory=dict)
    """Per trace, per blocking skill: the values the robot may see (one drawn per segment); a skill not
    listed answers with a value of its return type (``SIMULATED_VALUES``)."""
    answers: dict[tuple[str, int], str] = field(default_factory=dict)
    """(request, segment) -> the value reported for the blocking call the segment ended with."""
    _lane_free: dict[str, float] = field(default_factory=dict)

    def on_segment(self, request: Request, segment: Segment) -> None:
        start = max(segment.gen_end + self.network_latency, self._lane_free.get(request.id, 0.0))
        rng = random.Random(zlib.crc32(f"{self.seed}/{request.id}/{segment.index}".encode()))
        end = start + request.robot.sample_exec_time(segment.text, rng)
        self._lane_free[request.id] = end
        result = None if segment.waits_for is None else self._answer(request, segment.waits_for.name, rng)
        if result is not None:
            self.answers[(request.id, segment.index)] = result
        self.schedule(end + self.network_latency,
                      lambda server: server.segment_done(request.id, segment.index, start, end, result=result))

    def _answer(self, request: Request, skill: str, rng: random.Random) -> str:
        listed = self.values.get(request.trace, {}).get(skill) if request.trace is not None else None
        return rng.choice(listed or SIMULATED_VALUES[request.robot.skills[skill].returns or "text"])


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
        return cls(name, lambda: simulator(profile, suspends_in_place=suspends_in_place), VirtualClock, profile)

    @classmethod
    def real(cls, name: str, engine: Engine, profile: HardwareProfile | None = None) -> EngineSetup:
        return cls(name, lambda: engine, WallClock, profile)

    def server_config(self, policy: str, network_latency: float, max_batch: int | None,
                      features: Features) -> ServerConfig:
        """A bench run's server on this setup, its step-time model this setup's profile."""
        return ServerConfig(policy, network_latency, features, max_batch, step_profile=self.profile,
                            step_profile_source=f"a step-time profile of {self.name} (fit one with timely-llm profile)")


def run_bench(workload: Workload, policy: str, setup: EngineSetup | HardwareProfile,
              skills: dict[str, SkillModel], catalog: TraceCatalog, seed: int = 0,
              max_batch: int | None = None, features: Features = DEFAULT_FEATURES,
              values: Mapping[int, Mapping[str, Sequence[str]]] | None = None,
              forced_plans: Mapping[str, list[int] | None] | None = None) -> dict:
    """``values``: what the simulated robots may report for blocking calls (``SimulatedRobots.values``);
    ``forced_plans``: by request id, the token ids it replays instead of its trace's recorded plan (None: the engine
    generates its plan under the robot's grammar, as a server does for a goal)."""
    if policy not in BENCH_POLICIES:
        raise ValueError(f"unknown policy {policy!r} (one of {', '.join(BENCH_POLICIES)})")
    if isinstance(setup, HardwareProfile):
        setup = EngineSetup.simulator(setup)
    counters: dict[str, int]
    if policy == ISOLATED:
        if setup.new_clock is not VirtualClock:
            raise ValueError(f"policy {ISOLATED!r} replays each request alone and needs the simulator engine")
        alone = setup.server_config(VLLM_STREAM.name, workload.network_latency, None, Features())
        records = [_run(workload, [r], alone, setup, skills, catalog, seed, values, forced_plans)[0][0]
                   for r in workload.requests]
        peak_queue, counters = 1, {}
    else:
        config = setup.server_config(policy, workload.network_latency, max_batch, features)
        records, peak_queue, counters = _run(workload, list(workload.requests), config, setup, skills, catalog, seed,
                                             values, forced_plans)
        features = config.parts
    records.sort(key=lambda r: (r["arrival"], r["id"]))
    return {
        "policy": policy, "workload": workload.name, "hw": setup.name, "seed": seed,
        "network_latency": workload.network_latency, "max_batch": max_batch, "peak_queue": peak_queue,
        "features": features.label(), "counters": counters,
        "requests": records, "summary": summarize(records),
    }


def _run(workload: Workload, requests: list[WorkloadRequest], config: ServerConfig, setup: EngineSetup,
         skills: dict[str, SkillModel], catalog: TraceCatalog, seed: int,
         values: Mapping[int, Mapping[str, Sequence[str]]] | None = None,
         forced_plans: Mapping[str, list[int] | None] | None = None) -> tuple[list[dict], int, dict[str, int]]:
    engine = setup.new_engine()
    clock = setup.new_clock()
    records: list[dict] = []
    driver = Driver(clock)
    robots = SimulatedRobots(skills, workload.network_latency, seed, driver.at, values or {})
    server = build_server(config, engine, skills, clock, on_segment=robots.on_segment,
                          on_finish=lambda r: records.append(Outcome.of(r).to_record()))
    tokenizer = engine.tokenizer
    for robot in sorted({catalog[r.trace].robot for r in requests}):
        server.warm_prefix(tokenizer.encode(catalog.prompt_text(robot, "")))
    origin = clock.now()  # arrivals count from here, after the warm-up
    encoded = {t: (tokenizer.encode(catalog.prompt_text(catalog[t].robot, catalog[t].prompt)),
                   tokenizer.encode(catalog[t].plan)) for t in {r.trace for r in requests}}
    for r in requests:
        trace = catalog[r.trace]
        prompt_ids, recorded = encoded[r.trace]
        plan_ids = forced_plans[r.id] if forced_plans is not None and r.id in forced_plans else recorded
        driver.arrive(PlanRequest(r.id, r.agent, trace.robot, prompt_ids, r.tuf, trace.category, forced_ids=plan_ids,
                                  trace=trace.id, arrival=origin + r.arrival, overrun=r.overrun))
    driver.run(server)
    return records, driver.peak_queue, dict(sorted(server.counters.items()))
