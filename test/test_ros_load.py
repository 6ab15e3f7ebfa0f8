"""The node as its own process under load and on signals, over real rclpy and Fast DDS (sim engine).

A burst of 300 goals from 300 robots all end, none lost, and the node serves on; SIGINT
or SIGTERM with goals in flight ends each of them ABORTED ("server shutting down") with
its client receiving the result within 2 s, and the process exits 0.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from guards import wait_until

from timely_llm.plan.robot_file import load_skill_models
from timely_llm.traces import load_catalog
from timely_llm_bench.robots.simulated import SimulatedSkills
from timely_llm_robot.client import PlanLink, RobotClient, TaskOutcome

pytestmark = pytest.mark.ros

CATALOG = load_catalog()
SKILLS = load_skill_models()
BURST = 300
BURST_TIMEOUT_S = 80.0
SHUTDOWN_RESULTS_S = 2.0
"""The node's contract: every client has its ABORTED result this soon after the signal."""


@pytest.fixture
def node_process(ros_domain: int, tmp_path: Path) -> Iterator[Callable[..., subprocess.Popen]]:
    """Starts ``python -m timely_llm.ros.node`` on the sim engine and the test's domain with parameter overrides."""
    started: list[tuple[subprocess.Popen, Path]] = []

    def start(**params: object) -> subprocess.Popen:
        log = tmp_path / f"node{len(started)}.log"
        overrides = [arg for k, v in {"engine": "sim", **params}.items() for arg in ("-p", f"{k}:={v}")]
        process = subprocess.Popen([sys.executable, "-m", "timely_llm.ros.node", "--ros-args", *overrides],
                                   env=os.environ | {"ROS_DOMAIN_ID": str(ros_domain)},
                                   stdout=log.open("w"), stderr=subprocess.STDOUT)
        started.append((process, log))
        return process

    yield start
    for process, log in started:
        if process.poll() is None:
            process.kill()
            process.wait()
        print(log.read_text()[-4000:])


def send(link: PlanLink, agent: str, trace_id: int, report: bool = True) -> tuple[RobotClient, TaskOutcome]:
    trace = CATALOG[trace_id]
    robot = RobotClient(link, agent, trace.robot, SimulatedSkills(SKILLS[trace.robot], time_scale=0.02), report)
    return robot, robot.request(trace.prompt, None, trace.id)


def wait_all(outcomes: list[TaskOutcome], deadline: float) -> list[TaskOutcome | None]:
    """Each outcome once it ended, None for those still open at the deadline."""
    ended = []
    for outcome in outcomes:
        try:
            ended.append(outcome.wait(max(0.0, deadline - time.monotonic())))
        except TimeoutError:
            ended.append(None)
    return ended


def test_a_burst_of_300_goals_from_300_robots_all_end_and_the_node_serves_on(node_process: Callable,
                                                                            link: PlanLink) -> None:
    node = node_process(segment_timeout_margin=60.0)
    assert link.wait_for_server(30.0)
    traces = sorted(CATALOG.traces)
    sent = [send(link, f"burst_{i}", traces[i % len(traces)]) for i in range(BURST)]
    ended = wait_all([outcome for _, outcome in sent], time.monotonic() + BURST_TIMEOUT_S)
    statuses = Counter(o.status if o else "no answer" for o in ended)
    assert statuses == {"succeeded": BURST}, statuses
    for outcome in ended:
        assert outcome.result_after_segments and outcome.result.num_segments == len(outcome.segments)

    sent.append(send(link, "after_burst", 7))
    assert sent[-1][1].wait(BURST_TIMEOUT_S).status == "succeeded"
    for robot, _ in sent:
        robot.close()
    assert node.poll() is None


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_aborts_every_goal_in_flight_with_its_result_and_exits_0(node_process: Callable, link: PlanLink,
                                                                          signum: int) -> None:
    node = node_process(segment_timeout_margin=60.0)
    assert link.wait_for_server(30.0)
    sent = [send(link, f"mute_{i}", 6 + i % 3, report=False) for i in range(50)]
    for _, outcome in sent:  # in flight: accepted, planned, its robot never reports
        wait_until(lambda outcome=outcome: outcome.segments, BURST_TIMEOUT_S, "a segment of every goal")
    node.send_signal(signum)
    ended = wait_all([outcome for _, outcome in sent], time.monotonic() + SHUTDOWN_RESULTS_S)
    assert all(o is not None for o in ended), f"{sum(o is None for o in ended)} results missing after 2 s"
    assert {(o.status, o.result.reason) for o in ended} == {("aborted", "server shutting down")}
    assert node.wait(30.0) == 0
    for robot, _ in sent:
        robot.close()


def test_load_bench_prints_every_goal_ended_and_flat_memory(ros_domain: int) -> None:
    command = [sys.executable, "-m", "timely_llm.cli", "load-bench", "--agents", "20", "--duration", "3",
               "--memory-goals", "40", "80", "--memory-agents", "20", "--domain-id", str(ros_domain)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=BURST_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-2000:]
    row = next(line.split() for line in done.stdout.splitlines() if line.split()[:1] == ["20"])
    goals = int(row[1])
    assert goals >= 20 and f"{goals} succeeded; exit 0" in " ".join(row), done.stdout
    assert "after 40 goals" in done.stdout and "after 80 goals" in done.stdout, done.stdout


def test_load_bench_says_which_answer_a_goal_never_got() -> None:
    from action_msgs.msg import GoalStatus

    from timely_llm.ros.interfaces import RequestPlan
    from timely_llm_bench.robots.load_bench import GoalTimes, _plan_status

    assert GoalTimes(sent=0.0).outcome == "no goal response"
    assert GoalTimes(sent=0.0, accepted=0.1).outcome == "no result"
    assert GoalTimes(sent=0.0, accepted=0.1, ended=0.2, status="aborted").outcome == "aborted"
    response = RequestPlan.Impl.GetResultService.Response(status=GoalStatus.STATUS_UNKNOWN)
    assert _plan_status(response) == "result expired"
    response.status = GoalStatus.STATUS_ABORTED
    assert _plan_status(response) == f"no plan status (ROS status {GoalStatus.STATUS_ABORTED})"
    response.status, response.result.status = GoalStatus.STATUS_SUCCEEDED, RequestPlan.Result.STATUS_SUCCEEDED
    assert _plan_status(response) == "succeeded"


def test_a_lifecycle_shutdown_request_aborts_every_goal_in_flight_with_its_result(node_process: Callable,
                                                                                   link: PlanLink) -> None:
    """Requested through the change_state service, on_shutdown runs on the node's one executor thread, which
    can deliver the results only after it: they still reach every client and the process exits 0."""
    from lifecycle_msgs.msg import Transition
    from lifecycle_msgs.srv import ChangeState

    node = node_process(segment_timeout_margin=60.0)
    assert link.wait_for_server(30.0)
    change_state = link.node.create_client(ChangeState, "/timely_llm_server/change_state")
    sent = [send(link, f"mute_{i}", 6 + i % 3, report=False) for i in range(20)]
    for _, outcome in sent:
        wait_until(lambda outcome=outcome: outcome.segments, BURST_TIMEOUT_S, "a segment of every goal")
    assert change_state.wait_for_service(timeout_sec=10.0)
    answer = change_state.call_async(ChangeState.Request(transition=Transition(
        id=Transition.TRANSITION_ACTIVE_SHUTDOWN)))
    ended = wait_all([outcome for _, outcome in sent], time.monotonic() + 10.0)
    assert all(o is not None for o in ended), f"{sum(o is None for o in ended)} results missing"
    assert {(o.status, o.result.reason) for o in ended} == {("aborted", "server shutting down")}
    wait_until(answer.done, 10.0, "the change_state answer")
    assert answer.result().success
    assert node.wait(30.0) == 0
    for robot, _ in sent:
        robot.close()
