"""The timely_llm_server node and robot clients over real rclpy and Fast DDS, on the sim engine.

Needs the interfaces built by scripts/build_interfaces.sh and scripts/ros_env.sh sourced
(scripts/test.sh does both); without them the import fails rather than skipping.
Every test gets a ROS domain of its own.
"""

from __future__ import annotations

import itertools
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import pytest
from builtin_interfaces.msg import Duration as DurationMsg
from guards import wait_until

from timely_llm.core.estimator import ExecutionTimeEstimator
from timely_llm.core.throughput import TYPICAL_CONTEXT, derive_curve
from timely_llm.core.tuf import TUF
from timely_llm.engines.hardware import load_profile
from timely_llm.engines.sim_tokenizer import SimTokenizer
from timely_llm.errors import RequestRejected, RunIncomplete
from timely_llm.plan.robot_file import load_skill_models
from timely_llm.ros.goals import GoalRules, plan_from_goal
from timely_llm.ros.interfaces import RequestPlan, ServerStatus
from timely_llm.ros.interfaces import Segment as SegmentMsg
from timely_llm.ros.messages import duration_msg, duration_seconds, stamp_seconds
from timely_llm.ros.node import NodeStartError
from timely_llm.server import Server
from timely_llm.traces import load_catalog
from timely_llm_bench.evaluation.harness import run_bench
from timely_llm_bench.robots.fleet import cut, fleet_agents, fleet_result, run_fleet, server_node
from timely_llm_bench.robots.sim_robots import SkillTimes, simulated_robots
from timely_llm_bench.robots.simulated import SimulatedSkills, segment_rng
from timely_llm_bench.workloads.generator import BUILTIN, generate
from timely_llm_robot.client import PlanLink, RobotClient, TaskOutcome
from timely_llm_robot.executors.base import SegmentResult
from timely_llm_robot.executors.tello import tello_runner

pytestmark = pytest.mark.ros

Goal = RequestPlan.Goal
RESULT_TIMEOUT_S = 60.0
CATALOG = load_catalog()
SKILLS = load_skill_models()


def ask(robot: RobotClient, trace_id: int, tuf: TUF | None = None, **kwargs: object) -> TaskOutcome:
    return robot.request(CATALOG[trace_id].prompt, tuf, trace_id, **kwargs)


# ----- goal validation (pure) -----

RULES = GoalRules(SKILLS, CATALOG, SimTokenizer().encode, 1536,
                  {c: TUF(1.0, -2.0, 1.0) for c in ("normal", "urgent", "arm")}, trace_required=True)


@pytest.mark.parametrize(("change", "reason"), [
    ({"task": "  "}, "empty task"),
    ({"robot_type": "submarine"}, "unknown robot type"),
    ({"tuf_ert": (1, 10**9)}, "tuf_ert nanosec 1000000000 is not below 1e9"),
    ({"tuf_alpha": 0.5}, "alpha"),
    ({"tuf_beta": -1.0}, "beta"),
    ({"tuf_ert": -1.0}, "ert"),
    ({"tuf_ert": (-1, 999_999_999)}, "ert"),
    ({"overrun_strategy": 3}, r"unknown overrun_strategy 3 \(known: 0 none, 1 kill, 2 skip-next\)"),
    ({"trace_id": 0}, "trace_id"),
    ({"trace_id": 9}, "robot 'arm'"),
    ({"agent_id": ""}, "empty agent id"),
    ({"agent_id": " "}, "empty agent id"),
    ({"task": "x" * 2001}, "max_task_chars"),
    ({"tuf_ert": 3601.0}, "ert"),
    ({"tuf_alpha": -1.5e6}, "alpha"),
    ({"tuf_beta": 1.5e6}, "beta"),
    ({"tuf_ert": (2**31 - 1, 999_999_999), "tuf_alpha": -1e308, "tuf_beta": 1e308}, "exceeds"),
    ({"tuf_alpha": -math.inf}, "finite"),
    ({"robot_type": "r" * 300}, "robot_type of 300 characters is longer than its bound 256"),
    ({"agent_id": "a" * 257}, "agent_id of 257 characters is longer than its bound 256"),
    ({"task": "x" * 70_000}, "task of 70000 characters is longer than its bound 65536"),
])
def test_malformed_goals_are_refused_with_a_reason(change: dict, reason: str) -> None:
    """tuf_ert given as seconds, or as (sec, nanosec) for a Duration no number of seconds gives."""
    fields = {"agent_id": "d1", "robot_type": "tello", "task": "find the cat", "trace_id": 1,
              "tuf_ert": 1.0, "tuf_alpha": -2.0, "tuf_beta": 1.0} | change
    ert = fields["tuf_ert"]
    fields["tuf_ert"] = DurationMsg(sec=ert[0], nanosec=ert[1]) if isinstance(ert, tuple) else duration_msg(ert)
    with pytest.raises(RequestRejected, match=reason) as refused:
        plan_from_goal(Goal(**fields), "r1", RULES)
    assert "\n" not in str(refused.value)


def test_oversized_prompt_is_refused_and_zero_tuf_takes_the_default() -> None:
    goal = Goal(agent_id="d1", robot_type="tello", task="find the cat", trace_id=6)
    plan = plan_from_goal(goal, "r1", RULES)
    assert plan.category == "urgent" and plan.tuf == TUF(1.0, -2.0, 1.0) and plan.forced_ids

    small = GoalRules(RULES.robots, CATALOG, RULES.encode, 10, RULES.default_tufs, True)
    with pytest.raises(RequestRejected, match="max_prompt_tokens"):
        plan_from_goal(goal, "r1", small)


# ----- over ROS 2 -----

def test_malformed_goal_is_rejected_at_goal_time(session: tuple, robots: Callable) -> None:
    with server_node(session[1], session[0]):
        outcome = robots("d1").request("", None, 1).wait(RESULT_TIMEOUT_S)
    assert not outcome.accepted and outcome.status == "rejected"


def test_segments_arrive_in_order_as_feedback_before_the_result(session: tuple, robots: Callable) -> None:
    with server_node(session[1], session[0]):
        outcome = ask(robots("d1"), 2).wait(RESULT_TIMEOUT_S)

    assert outcome.status == "succeeded", outcome.result.reason
    assert [s.index for s in outcome.segments] == list(range(outcome.result.num_segments))
    assert outcome.result.num_segments >= 2 and outcome.result_after_segments
    assert outcome.segments[-1].final
    assert "".join(s.text for s in outcome.segments) == outcome.result.plan == CATALOG[2].plan
    assert 0 <= duration_seconds(outcome.result.response_time) and 0 < outcome.result.utility <= 1.0
    gen_ends = [stamp_seconds(s.gen_end) for s in outcome.segments]
    dispatches = [stamp_seconds(s.dispatch_time) for s in outcome.segments]
    # dispatch_time: when the node sent it, after its generation ended; later segments later
    assert all(d >= g for d, g in zip(dispatches, gen_ends, strict=True)), (gen_ends, dispatches)
    assert dispatches == sorted(dispatches) and dispatches[-1] > dispatches[0]


def test_timebill_feature_takes_its_estimator_from_the_hw_profile(session: tuple, robots: Callable) -> None:
    with server_node(session[1], session[0], features="timebill", hw_profile="h100-llama3-8b") as node:
        outcome = ask(robots("d1"), 2).wait(RESULT_TIMEOUT_S)
        times = node.server.times
    assert outcome.status == "succeeded", outcome.result.reason
    assert times is not None and times.estimator.c == load_profile("h100-llama3-8b").step["base"]
    assert times.lengths.expected("tello", 0) != SKILLS["tello"].segment_max_tokens / 2  # learned from the plan


def test_ala_takes_the_prior_bench_gives_it_from_the_hw_profile(session: tuple) -> None:
    profile = load_profile("jetson-agx-orin-64gb-llama3-8b-q4")
    step = ExecutionTimeEstimator.from_profile(profile).decode_step
    with server_node(session[1], session[0], features="amin,ala", hw_profile=profile.name) as node:
        throughput = node.server.batch.throughput
    assert throughput.prior == derive_curve(lambda batch: step(batch, batch * TYPICAL_CONTEXT))
    assert throughput.knee(64) < 64  # the edge GPU's curve bends early: a batch limit before any step is measured


def test_a_node_whose_parts_need_a_missing_profile_refuses_before_loading_the_engine(session: tuple) -> None:
    with pytest.raises(NodeStartError, match="need parameter estimator_profile for model 'tiny'"), \
            server_node(session[1], session[0], engine="vllm", model="tiny", features="timebill"):
        pass


ARM_HEAD_START_STEPS = 5
"""Engine iterations the arm plans generate before the urgent goal comes: prefilled, well short of done."""


def _urgent_wait(session: tuple, link: PlanLink, robots: Callable, policy: str) -> int:
    """Engine iterations from an urgent goal's arrival, amid 12 arm plans generating, to its first segment.

    Counted in iterations, not seconds: the wall clock of a loaded machine says nothing about the scheduler.
    """
    with server_node(session[1], session[0], policy=policy) as node:
        assert link.wait_for_server()
        watch = StepWatch()
        watch.attach(node.server)
        arms = [ask(robots(f"{policy}_arm{i}", "arm"), 9 + i % 3) for i in range(12)]
        wait_until(lambda: len(watch.arrived) == len(arms), RESULT_TIMEOUT_S, "every arm goal in the server")
        head_start = max(watch.arrived.values()) + ARM_HEAD_START_STEPS
        wait_until(lambda: watch.steps >= head_start, RESULT_TIMEOUT_S, "the arm plans generating")
        urgent = ask(robots(f"{policy}_drone", "tello"), 6).wait(RESULT_TIMEOUT_S)
        for arm in arms:
            arm.wait(RESULT_TIMEOUT_S)
    drone = f"{policy}_drone"
    assert urgent.status == "succeeded" and all(arm.status == "succeeded" for arm in arms)
    assert all(watch.done[f"{policy}_arm{i}"] > watch.arrived[drone] for i in range(12))  # amid them, indeed
    return watch.first_segment[drone] - watch.arrived[drone]


@dataclass
class StepWatch:
    """Engine iterations so far, and the one at which each agent's goal arrived, got segment 0, was generated."""

    steps: int = 0
    arrived: dict[str, int] = field(default_factory=dict)
    first_segment: dict[str, int] = field(default_factory=dict)
    done: dict[str, int] = field(default_factory=dict)

    def attach(self, server: Server) -> None:
        engine_step, submit, on_segment = server.engine.step, server.submit, server.on_segment

        def step():  # noqa: ANN202 - StepOutput
            self.steps += 1
            return engine_step()

        def watched_submit(plan):  # noqa: ANN001, ANN202 - PlanRequest -> Request
            self.arrived[plan.agent] = self.steps
            return submit(plan)

        def watched_segment(request, segment) -> None:  # noqa: ANN001
            self.first_segment.setdefault(request.agent, self.steps)
            if segment.final:
                self.done[request.agent] = self.steps
            on_segment(request, segment)

        server.engine.step, server.submit, server.on_segment = step, watched_submit, watched_segment


def test_urgent_goal_gets_its_first_segment_sooner_than_under_vllm(session: tuple, link: PlanLink,
                                                                   robots: Callable) -> None:
    timely = _urgent_wait(session, link, robots, "timelyllm")
    vllm = _urgent_wait(session, link, robots, "vllm")
    assert 0 < timely < 0.5 * vllm, (timely, vllm)


def test_cancel_ends_the_goal_canceled_and_frees_the_generation(session: tuple, robots: Callable) -> None:
    with server_node(session[1], session[0]) as node:
        arm = robots("a1", "arm")
        outcome = ask(arm, 11)
        wait_until(lambda: outcome.segments, RESULT_TIMEOUT_S, "the first segment")
        arm.cancel(outcome)
        outcome.wait(RESULT_TIMEOUT_S)
        request_id = outcome.segments[0].request_id
        assert outcome.status == "canceled"
        assert request_id not in node.server.running and request_id not in node.server.queue
        assert request_id not in node.server.requests and request_id not in node.server.engine.running_ids()
        plan = outcome.result.plan  # canceled while generating: only part of the plan exists
        assert plan and CATALOG[11].plan.startswith(plan) and plan != CATALOG[11].plan


def test_a_silent_robot_is_aborted_by_the_watchdog_and_others_succeed(session: tuple, robots: Callable) -> None:
    with server_node(session[1], session[0], segment_timeout_factor=1.0, segment_timeout_margin=0.5):
        silent = ask(robots("mute", report=False), 3)
        others = [ask(robots(f"d{i}"), trace) for i, trace in enumerate((2, 7, 8))]
        muted = silent.wait(RESULT_TIMEOUT_S)
        results = [o.wait(RESULT_TIMEOUT_S) for o in others]
    assert muted.status == "aborted" and "did not report segment 0" in muted.result.reason
    assert [r.status for r in results] == ["succeeded"] * 3


def test_close_returns_once_the_segment_being_executed_has_ended(session: tuple, robots: Callable) -> None:
    """No thread of the robot runs on after ``close``: one left running the robot, or waiting inside rclpy, when
    the process exits can abort it (``terminate called without an active exception``)."""
    started, release, ended = threading.Event(), threading.Event(), []

    def runner(segment: SegmentMsg, label: str) -> SegmentResult:
        started.set()
        release.wait(RESULT_TIMEOUT_S)
        ended.append(segment.index)
        return SegmentResult(True, "", 0.0)

    robot = robots("d1", runner=runner)
    with server_node(session[1], session[0]):
        ask(robot, 2)
        assert started.wait(RESULT_TIMEOUT_S)
        threading.Timer(0.2, release.set).start()  # the segment ends after close() is called
        robot.close()
        assert ended == [0]


STATUS_PERIOD_S = 0.2


def test_status_reports_queue_counts_and_per_category_utility(session: tuple, link: PlanLink,
                                                               robots: Callable) -> None:
    statuses: list[ServerStatus] = []
    link.node.create_subscription(ServerStatus, "status", statuses.append, 100)
    traces = {2: "tello", 6: "tello", 9: "arm"}
    with server_node(session[1], session[0], status_period=STATUS_PERIOD_S):
        outcomes = [ask(robots(f"s{trace}", robot), trace) for trace, robot in traces.items()]
        results = [o.wait(RESULT_TIMEOUT_S) for o in outcomes]
        wait_until(lambda: statuses and statuses[-1].finished == len(traces), RESULT_TIMEOUT_S, "all finished")
        seen = len(statuses)
        wait_until(lambda: len(statuses) >= max(5, seen + 2), RESULT_TIMEOUT_S, "two more statuses")

    assert [r.status for r in results] == ["succeeded"] * 3
    stamps = [m.stamp.sec + m.stamp.nanosec * 1e-9 for m in statuses]
    gaps = sorted(b - a for a, b in itertools.pairwise(stamps))
    # Periodic: a loaded machine delays some ticks, so the typical gap, not each, is the period.
    assert 0.75 * STATUS_PERIOD_S <= gaps[len(gaps) // 2] <= 1.5 * STATUS_PERIOD_S, gaps
    assert {(m.policy, m.engine) for m in statuses} == {("timelyllm", "sim")}
    for m in statuses:
        assert m.suspended <= m.queue_length and m.queue_length + m.running + m.finished <= len(traces)
        assert sum(c.finished for c in m.categories) == m.finished
    assert [m.finished for m in statuses] == sorted(m.finished for m in statuses)
    assert any(m.running for m in statuses)
    last = statuses[-1]
    assert last.finished == len(traces) and last.queue_length == last.running == 0
    utilities = {CATALOG[t].category: r.result.utility for t, r in zip(traces, results, strict=True)}
    assert [(c.name, c.finished) for c in last.categories] == [(c, 1) for c in sorted(utilities)]
    assert [c.mean_utility for c in last.categories] == pytest.approx([utilities[c.name] for c in last.categories])


def test_tello_executor_flies_a_plan_from_the_node(session: tuple, robots: Callable,
                                                 tello_client_ports: tuple[int, int]) -> None:
    from timely_llm_bench.robots.tello_sim import TelloSimulator
    from timely_llm_robot.executors.tello import TelloExecutor

    with TelloSimulator(state_port=tello_client_ports[1], time_scale=0.01) as drone, \
            TelloExecutor(drone.address, time_scale=0.01) as tello, server_node(session[1], session[0]):
        tello.dispatch("takeoff", [])
        outcome = ask(robots("tello_1", runner=tello_runner(tello)), 6).wait(RESULT_TIMEOUT_S)
        commands = list(drone.commands)
    assert outcome.status == "succeeded", outcome.result.reason
    assert [c for c in commands if c.split()[0] in ("back", "up", "forward")] == ["back 80", "up 60", "forward 100"]


@pytest.mark.parametrize("trace", [1, 9])
def test_skill_times_are_the_draws_simulated_skills_sleeps(trace: int) -> None:
    model = SKILLS[CATALOG[trace].robot]
    text = CATALOG[trace].plan
    times = SkillTimes(model, seed=3)
    times.draw(SegmentMsg(text=text, index=2), "r7")
    used = sum(times.seconds(c.name, c.numeric_arg) for c in model.find_calls(text))
    assert used == pytest.approx(model.sample_exec_time(text, segment_rng(3, "r7", 2)))


def test_simulated_fleet_flies_djitellopy_drones_and_arms(session: tuple, robots: Callable,
                                                          tello_client_ports: tuple[int, int]) -> None:
    scale = 0.1
    with simulated_robots({"drone_a": "tello", "drone_b": "tello", "arm_a": "arm"}, SKILLS, CATALOG,
                          time_scale=scale) as runners, server_node(session[1], session[0]):
        sent = [(trace, ask(robots(agent, CATALOG[trace].robot, runners[agent]), trace, label=f"t{trace}"))
                for agent, trace in (("drone_a", 1), ("drone_b", 6), ("arm_a", 9))]
        outcomes = [(trace, outcome.wait(RESULT_TIMEOUT_S)) for trace, outcome in sent]

    for trace, outcome in outcomes:
        assert outcome.status == "succeeded", (trace, outcome.result.reason)
        drawn = SKILLS[CATALOG[trace].robot].sample_exec_time
        expected = sum(drawn(s.text, segment_rng(0, f"t{trace}", s.index)) for s in outcome.segments) * scale
        assert expected * 0.9 <= outcome.exec_time <= expected + 1.5, trace


def test_a_fleet_that_cannot_finish_in_its_grace_says_how_many_requests_are_still_open(session: tuple) -> None:
    """Robots twenty times slower than their skill models cannot end their plans within a 1 s grace after the
    last arrival: the run ends with one line saying how many requests were open, not a bare TimeoutError."""
    wid1 = generate(BUILTIN["WID1"], CATALOG, SKILLS, seed=0)
    workload = replace(wid1, requests=tuple(replace(r, arrival=0.1 * i) for i, r in enumerate(wid1.requests[:3])))
    slow = {agent: SimulatedSkills(SKILLS[robot], 0, time_scale=20.0)
            for agent, robot in fleet_agents(workload, CATALOG).items()}
    n = len(workload.requests)
    with server_node(session[1], session[0]), pytest.raises(RunIncomplete) as raised:
        run_fleet(workload, CATALOG, SKILLS, session[1], session[0], 0, slow, grace_s=1.0)
    assert str(raised.value) == (f"{n} of {n} requests had not ended 1 s after the last arrival: the node cannot "
                                 "keep up with this workload on this machine")


RESPONSE_DEADLINE_S = 5.0
"""By when, over ROS, every replayed request must have its first segment: ten times the urgent TUF's zero-utility
point, so a stalled or serialising node fails it and a loaded machine's scheduling jitter does not."""


def test_wid1_replay_over_ros_serves_the_bench_plans_on_its_schedule(session: tuple) -> None:
    """The bench's requests replayed over ROS by robot clients: the same plans, all succeeding, in the same order.

    The bench runs on a virtual clock, the node on the wall clock: how closely the two agree is measured
    (README), not asserted, since a loaded machine adds to every wall-clock time. Asserted are contracts that
    hold at any load: ROS never beats the modelled schedule (which a mis-stamped arrival would), every request
    has its first segment by RESPONSE_DEADLINE_S, and urgent requests wait less than normal ones, as modelled.
    """
    workload = cut(generate(BUILTIN["WID1"], CATALOG, SKILLS, seed=0), 35.0)
    assert 6 <= len(workload.requests)
    bench = run_bench(workload, "timelyllm", load_profile("rtx4090-llama3-8b"), SKILLS, CATALOG, seed=0)
    with server_node(session[1], session[0]):
        ros = fleet_result(workload, run_fleet(workload, CATALOG, SKILLS, session[1], session[0], 0), "timelyllm", 0)
    print({"bench": bench["summary"], "ros": ros["summary"]})
    planned = {r["id"]: len(r["segments"]) for r in bench["requests"]}
    assert {r["id"]: r["num_segments"] for r in ros["requests"]} == planned
    assert max(r["response_time"] for r in ros["requests"]) <= RESPONSE_DEADLINE_S
    for category, expected in bench["summary"].items():
        got = ros["summary"][category]
        assert got["succeeded"] == expected["succeeded"] == expected["count"]
        for metric in ("mean_response_time", "mean_waiting_time"):
            assert 0.9 * expected[metric] <= got[metric], (category, metric)
        assert got["mean_utility"] <= 1.1 * expected["mean_utility"], category
    waits = {c: (bench["summary"][c]["mean_waiting_time"], ros["summary"][c]["mean_waiting_time"])
             for c in ("urgent", "normal")}
    assert waits["urgent"][0] < waits["normal"][0]
    assert waits["urgent"][1] < waits["normal"][1], waits


@pytest.mark.vllm
def test_node_on_the_embedded_vllm_engine_serves_forced_plans(session: tuple, robots: Callable) -> None:
    with server_node(session[1], session[0], engine="vllm", model="tiny", kv_cache_gib=0.25,
                     max_batch=4) as node:
        assert node.server.engine.max_batch == node.server.batch.max_batch == 4  # -p max_batch:=4
        from timely_llm.engines.vllm_engine import PAUSED_SLOTS

        vllm_config = node.server.engine._engine.vllm_config  # vLLM's slots: the cap's, and room for paused ones
        assert vllm_config.scheduler_config.max_num_seqs == 4 + PAUSED_SLOTS
        assert node.server.engine.device == "cpu"  # what /diagnostics reports as the device
        sent = {trace: ask(robots(f"{robot}_{trace}", robot), trace) for trace, robot in
                ((6, "tello"), (2, "tello"), (9, "arm"))}
        outcomes = {trace: outcome.wait(RESULT_TIMEOUT_S) for trace, outcome in sent.items()}

    for trace, outcome in outcomes.items():
        assert outcome.status == "succeeded", (trace, outcome.result.reason)
        assert [s.index for s in outcome.segments] == list(range(outcome.result.num_segments))
        assert outcome.result_after_segments
        plan = SKILLS[CATALOG[trace].robot].without_observations(outcome.result.plan)  # the arm's scan answers
        assert "".join(s.text for s in outcome.segments) == plan == CATALOG[trace].plan
    assert "scan('red_box'); # " in outcomes[9].result.plan  # the simulated arm's answer, after its scan
