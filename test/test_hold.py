"""Just-in-time later segments: where the engine suspends in place, a later segment whose robot stays busy
waits out of the batch while another robot waits for its first action, and still comes before its robot needs it."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from timely_llm.clock import VirtualClock
from timely_llm.core.request import Outcome, Status
from timely_llm.core.skills import load_skill_models
from timely_llm.core.tuf import TUF
from timely_llm.engines.base import StepOutput
from timely_llm.engines.hardware import load_profile
from timely_llm.engines.sim import SimEngine
from timely_llm.evaluation.harness import SimulatedRobots, Simulation
from timely_llm.server import POLICIES, PlanRequest, Server
from timely_llm.workloads.traces import load_catalog

SKILLS = load_skill_models()
CATALOG = load_catalog()
ARM_TRACE, URGENT_TRACE = 9, 6
URGENT_ARRIVAL = 1.2
"""While the arm generates the segments after its pick: its robot is busy for seconds."""


class LoggedSim(SimEngine):
    """The simulator, keeping which generations got a token at each step (with the step's start)."""

    def __init__(self, suspends_in_place: bool, clock: VirtualClock) -> None:
        super().__init__(load_profile("cpu-2core-smollm2-135m"), suspends_in_place=suspends_in_place)
        self.clock = clock
        self.log: list[tuple[float, set[str]]] = []

    def step(self) -> StepOutput:
        out = super().step()
        self.log.append((self.clock.now(), {g for g, tokens in out.new_tokens.items() if tokens}))
        return out


@dataclass
class Served:
    engine: LoggedSim
    outcomes: dict[str, Outcome]
    counters: dict[str, int]

    def steps_with(self, gen_id: str, begin: float, end: float) -> int:
        return sum(1 for t, got in self.engine.log if begin <= t < end and gen_id in got)


def serve(suspends_in_place: bool, policy: str = "timelyllm") -> Served:
    """An arm mid-plan (its robot busy for seconds a segment) when an urgent drone request arrives."""
    clock = VirtualClock()
    engine = LoggedSim(suspends_in_place, clock)
    outcomes: dict[str, Outcome] = {}
    server = Server(engine, SKILLS, POLICIES[policy], clock,
                    on_finish=lambda r: outcomes.__setitem__(r.id, Outcome.of(r)))
    sim = Simulation(server, clock)
    robots = SimulatedRobots(SKILLS, server.network_latency, 0, sim.schedule, server.segment_done)
    server.on_segment = robots.on_segment
    for rid, trace_id, arrival, tuf in [("arm", ARM_TRACE, 0.0, TUF(1.0, -2.0, 1.0)),
                                        ("urgent", URGENT_TRACE, URGENT_ARRIVAL, TUF(0.2, -6.67, 2.0))]:
        trace = CATALOG[trace_id]
        prompt = engine.tokenizer.encode(CATALOG.prompt_text(trace.robot, trace.prompt))
        plan = PlanRequest(rid, rid, trace.robot, prompt, tuf, forced_ids=engine.tokenizer.encode(trace.plan),
                           arrival=arrival)
        sim.schedule(arrival, lambda plan=plan: server.submit(plan))
    sim.run()
    return Served(engine, outcomes, dict(server.counters))


def test_a_busy_robots_later_segment_leaves_the_batch_while_another_robot_waits() -> None:
    held, kept = serve(suspends_in_place=True), serve(suspends_in_place=False)
    first_action = URGENT_ARRIVAL + kept.outcomes["urgent"].response_time
    assert held.counters.get("held_segments", 0) > 0
    assert "held_segments" not in kept.counters  # where a resume prefills again, nothing is held
    assert held.steps_with("arm", URGENT_ARRIVAL, first_action) < kept.steps_with("arm", URGENT_ARRIVAL, first_action)
    assert held.outcomes["urgent"].response_time < kept.outcomes["urgent"].response_time


@pytest.mark.parametrize("policy", ["timelyllm", "edf"])
def test_holding_costs_the_held_robot_no_waiting(policy: str) -> None:
    held, kept = serve(True, policy), serve(False, policy)
    for served in (held, kept):
        assert all(o.status is Status.SUCCEEDED for o in served.outcomes.values())
    assert held.counters.get("held_segments", 0) > 0
    assert held.outcomes["arm"].waiting_time <= kept.outcomes["arm"].waiting_time + 1e-9
    assert held.outcomes["urgent"].response_time <= kept.outcomes["urgent"].response_time
