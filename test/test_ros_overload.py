"""Overload control over real rclpy and Fast DDS: goals whose deadline cannot be met are told at once.

Needs the interfaces built by scripts/build_interfaces.sh (the goal's keep_if_infeasible and
overrun_strategy, the feedback's infeasible flag) and scripts/ros_env.sh sourced.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from pathlib import Path

import pytest

from timely_llm.core.overload import INFEASIBLE_REASON
from timely_llm.core.tuf import TUF
from timely_llm.engines.sim_tokenizer import SimTokenizer
from timely_llm.errors import RequestRejected
from timely_llm.plan.robot_file import load_skill_models
from timely_llm.ros.goals import GoalRules, plan_from_goal
from timely_llm.ros.interfaces import RequestPlan
from timely_llm.traces import load_catalog
from timely_llm_bench.evaluation.metrics import run_end, shed_utility
from timely_llm_bench.robots.fleet import fleet_result, run_fleet, server_node
from timely_llm_bench.robots.simulated import SimulatedSkills
from timely_llm_bench.workloads.generator import Workload, WorkloadRequest

pytestmark = pytest.mark.ros

RESULT_TIMEOUT_S = 60.0
CATALOG = load_catalog()
IMPOSSIBLE = TUF(ert=0.0, alpha=-100.0, beta=1.0)
STRICT_FLEET = ("classes:\n  strict: {max_beta: 2.0, max_slope: 100.0, min_ert: 0.0}\n"
                "robots:\n  - {id: '*', types: ['*'], class: strict}\n")
"""Every robot of class ``strict``, which allows the deadlines these tests claim: the default class would clamp an
ERT of 0 to the urgent category's 0.2 s (fleet admission), and the goal would not be infeasible."""


@pytest.fixture
def strict_fleet(tmp_path: Path) -> str:
    path = tmp_path / "fleet.yaml"
    path.write_text(STRICT_FLEET)
    return str(path)
"""Cut-off 10 ms after arrival: less than the network latency plus one segment's generation."""
RULES = GoalRules(load_skill_models(), CATALOG, SimTokenizer().encode, 1536,
                  {c: TUF(1.0, -2.0, 1.0) for c in ("normal", "urgent", "arm")}, trace_required=True)


def test_goal_fields_reach_the_plan_request_and_a_bad_strategy_is_refused() -> None:
    goal = RequestPlan.Goal(agent_id="d1", robot_type="tello", task="t", trace_id=6, keep_if_infeasible=True,
                            overrun_strategy=RequestPlan.Goal.OVERRUN_SKIP_NEXT)
    plan = plan_from_goal(goal, "r1", RULES)
    assert plan.keep_if_infeasible and plan.overrun == "skip-next"
    goal.overrun_strategy = RequestPlan.Goal.OVERRUN_KILL
    assert plan_from_goal(goal, "r2", RULES).overrun == "kill"
    assert plan_from_goal(RequestPlan.Goal(agent_id="d1", robot_type="tello", task="t", trace_id=6),
                          "r2", RULES).overrun == "none"
    goal.overrun_strategy = 255
    with pytest.raises(RequestRejected, match="unknown overrun_strategy 255"):
        plan_from_goal(goal, "r3", RULES)


def test_goal_that_cannot_meet_its_deadline_is_aborted_at_once(session: tuple, robots: Callable,
                                                                strict_fleet: str) -> None:
    with server_node(session[1], session[0], fleet_file=strict_fleet, features="shed"):
        doomed = robots("d1").request(CATALOG[6].prompt, IMPOSSIBLE, 6)
        fine = robots("d2").request(CATALOG[7].prompt, None, 7)
        doomed.wait(RESULT_TIMEOUT_S), fine.wait(RESULT_TIMEOUT_S)
    assert doomed.accepted and doomed.status == "aborted" and doomed.result.reason == INFEASIBLE_REASON
    assert doomed.segments == [] and doomed.infeasible_at is None  # ended, not told to wait
    assert fine.status == "succeeded", fine.result.reason


def test_opted_in_goal_keeps_waiting_and_its_feedback_says_so(session: tuple, robots: Callable,
                                                              strict_fleet: str) -> None:
    with server_node(session[1], session[0], fleet_file=strict_fleet, features="shed"):
        kept = robots("d1").request(CATALOG[6].prompt, IMPOSSIBLE, 6, keep_if_infeasible=True)
        kept.wait(RESULT_TIMEOUT_S)
    assert kept.status == "succeeded", kept.result.reason
    assert kept.infeasible_at is not None and kept.infeasible_at <= kept.first_segment_at  # told before served
    assert "".join(s.text for s in kept.segments) == CATALOG[6].plan  # the notice is no segment
    assert kept.result.utility < 0


def test_fleet_records_mark_shed_goals_and_the_summary_counts_them_back_in(session: tuple, strict_fleet: str) -> None:
    """An overloaded burst (urgent drones at a batch of one, one of them impossible) replayed by run_fleet."""
    urgent, relaxed = TUF(0.2, -6.67, 2.0), TUF(5.0, -2.0, 1.0)
    burst = [WorkloadRequest("impossible", 0.0, "d-0", 7, IMPOSSIBLE)]
    burst += [WorkloadRequest(f"u{i}", 0.001 * i, f"d-{i}", (2, 7, 8)[i % 3], urgent) for i in range(1, 10)]
    burst += [WorkloadRequest("relaxed", 0.01, "d-10", 3, relaxed)]
    workload = Workload("burst", 0.008, tuple(burst))
    skills = load_skill_models()
    runners = {r.agent: SimulatedSkills(skills["tello"], time_scale=0.1) for r in burst}
    with server_node(session[1], session[0], fleet_file=strict_fleet, features="amin,ala,shed", max_batch=1):
        records = run_fleet(workload, CATALOG, skills, session[1], session[0], runners=runners)
    summary = fleet_result(workload, records, "timelyllm", 0)["summary"]["all"]

    by_id = {r["id"]: r for r in records}
    assert set(by_id) == {r.id for r in burst} and by_id["relaxed"]["status"] == "succeeded"
    shed = [r for r in records if r["shed"]]
    assert by_id["impossible"] in shed
    assert all(r["shed"] == (r["status"] == "aborted" and r["reason"] == INFEASIBLE_REASON) for r in records)
    fastest = skills["tello"].segment_generation_time + 0.008  # served next: generation + the node's latency
    end = run_end(records)
    for r in shed:
        assert r["response_time"] is None and r["utility"] is None
        assert r["infeasible_at"] >= r["arrival"] and r["best_response"] >= fastest
        assert shed_utility(r, end) < 0
    served = [r["utility"] for r in records if r["status"] == "succeeded"]
    assert summary["shed"] == len(shed) and summary["mean_utility"] == pytest.approx(statistics.fmean(served))
    assert summary["mean_utility_with_shed"] < summary["mean_utility"]
