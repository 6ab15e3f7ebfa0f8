"""Closed-loop plans over ROS: robots answer a blocking call with a value in their SegmentDone's ``result``.

A robot that answers, over the action and over the topic interface, gets the next segment generated only after
its report (that segment's gen_start is after the report was sent) and its value in the plan text; a robot that
never answers gets its goal aborted by the watchdog, the reason naming the call waited for, while the others'
goals succeed; an empty or an over-long value ends the goal, saying so (on the simulator); a goal that cannot
report (``no_execution_reports``) for a robot with blocking skills is refused. Once on the simulator (the
shipped arm, whose ``scan`` is blocking, replaying its LRTrace plans) and once on SmolLM2 on embedded vLLM (a robot file
of the test's, free-text tasks; one node start, several goals).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml
from guards import wait_until
from looker_robot import LOOKER
from timely_llm_interfaces.names import TASK_REQUESTS, agent_topics
from timely_llm_interfaces.qos import AGENT_QOS, SERVER_STATUS_QOS

from timely_llm.ros.interfaces import PlanResult, RequestPlan, SegmentDone, ServerStatus, TaskRequest
from timely_llm.ros.interfaces import Segment as SegmentMsg
from timely_llm.ros.topic_requests import TASK_REQUESTS_QOS
from timely_llm.traces import load_catalog
from timely_llm_bench.robots.fleet import server_node
from timely_llm_robot.client import RobotClient, TaskOutcome
from timely_llm_robot.executors.base import SegmentResult, run_timed
from timely_llm_robot.topic_client import TopicPlanLink, TopicRobotClient

pytestmark = pytest.mark.ros

ARM_TRACE = 9
"""The arm's stacking plan: scan('red_box') first, two more scans later."""
TIMEOUTS = {"segment_timeout_factor": 2.0, "segment_timeout_margin": 4.0}
"""The watchdog ends a silent robot's goal some seconds after its blocking segment went out."""
RESULT_TIMEOUT_S = 120.0
VLLM_RESULT_TIMEOUT_S = 900.0
"""SmolLM2 plans on a loaded 2-core machine, after a vLLM start that compiles for minutes."""


def seconds(stamp: object) -> float:
    return stamp.sec + stamp.nanosec * 1e-9


class Reports:
    """Records when each report left: (robot's request id, segment index) -> the robot node's ROS time."""

    def __init__(self) -> None:
        self.sent: dict[tuple[str, int], float] = {}

    def _publish(self, report: SegmentDone) -> None:
        self.sent[(report.request_id, report.index)] = self.link.node.get_clock().now().nanoseconds * 1e-9
        super()._publish(report)


class ActionRobot(Reports, RobotClient):
    def __init__(self, *args: object, **kwargs: object) -> None:
        Reports.__init__(self)
        RobotClient.__init__(self, *args, **kwargs)


class TopicRobot(Reports, TopicRobotClient):
    def __init__(self, *args: object, **kwargs: object) -> None:
        Reports.__init__(self)
        TopicRobotClient.__init__(self, *args, **kwargs)


def answering(value: str) -> Callable[[SegmentMsg, str], SegmentResult]:
    """A robot whose every call returns ``value`` (the client sends it only for a segment that waits)."""
    return lambda segment, label: run_timed(lambda: time.sleep(0.05), lambda: value)


def check_waited_and_resumed_after(robot: Reports, outcome: TaskOutcome, value: str, call: str) -> None:
    """The goal succeeded; each segment after a waiting one was started after the robot's report went out; the
    plan text holds the value after each call waited for."""
    assert outcome.status == "succeeded", outcome.result.reason if outcome.result else "rejected"
    segments = outcome.segments
    waiting = [i for i, s in enumerate(segments) if s.waits_for]
    assert waiting and waiting[-1] < len(segments) - 1, [(s.text, s.waits_for) for s in segments]
    assert segments[waiting[0]].waits_for.startswith(call), segments[waiting[0]].waits_for
    for i in waiting:
        assert seconds(segments[i + 1].gen_start) >= robot.sent[(segments[i].request_id, i)], i
    assert f"# {value}\n" in outcome.result.plan, outcome.result.plan
    assert outcome.result.plan.count(f"# {value}\n") == len(waiting), outcome.result.plan


def check_silent_robot_aborted(outcome: TaskOutcome, call: str) -> None:
    assert outcome.status == "aborted", outcome.result.reason
    assert outcome.result.reason.startswith("robot did not report segment 0 done in time"), outcome.result.reason
    assert f"waiting for the value of {call}" in outcome.result.reason, outcome.result.reason


def send_without_reports(link: object, agent: str, robot_type: str, task: str, trace_id: int) -> object:
    """An action goal with no_execution_reports; its goal handle (whether accepted)."""
    goal = RequestPlan.Goal(agent_id=agent, robot_type=robot_type, task=task, trace_id=trace_id,
                            no_execution_reports=True)
    future = link.action.send_goal_async(goal)
    wait_until(future.done, 30.0, "goal response")
    return future.result()


def topic_without_reports(topic_link: TopicPlanLink, agent: str, robot_type: str, task: str,
                          trace_id: int) -> PlanResult:
    """A topic request with no_execution_reports; the PlanResult the node answers with."""
    results: list[PlanResult] = []
    node = topic_link.node
    subscription = node.create_subscription(PlanResult, agent_topics(agent)[1], results.append, AGENT_QOS)
    publisher = node.create_publisher(TaskRequest, TASK_REQUESTS, TASK_REQUESTS_QOS)
    try:
        wait_until(lambda: publisher.get_subscription_count() > 0, 30.0, "task_requests subscriber")
        publisher.publish(TaskRequest(request_id="no-reports-1", agent_id=agent, robot_type=robot_type, task=task,
                                      trace_id=trace_id, no_execution_reports=True))
        wait_until(lambda: any(r.request_id == "no-reports-1" for r in results), 30.0, "plan_result")
    finally:
        node.destroy_subscription(subscription)
        node.destroy_publisher(publisher)
    return next(r for r in results if r.request_id == "no-reports-1")


def check_refused_without_reports(link: object, topic_link: TopicPlanLink, robot_type: str, task: str,
                                  trace_id: int) -> None:
    assert not send_without_reports(link, "mute_action", robot_type, task, trace_id).accepted
    refused = topic_without_reports(topic_link, "mute_topic", robot_type, task, trace_id)
    assert refused.status == PlanResult.STATUS_ABORTED and "has blocking skills" in refused.reason, refused.reason


@pytest.fixture
def statuses(link: object) -> list[ServerStatus]:
    received: list[ServerStatus] = []
    link.node.create_subscription(ServerStatus, "status", received.append, SERVER_STATUS_QOS)
    return received


@pytest.fixture
def robots(link: object) -> Iterator[Callable[..., RobotClient]]:
    """Makes robots on the test's node (action, topic or silent), closed at the end."""
    topic_link = TopicPlanLink(link.node)
    made: list[RobotClient] = []

    def make(kind: str, agent: str, robot_type: str, value: str = "") -> RobotClient:
        robot = {"action": lambda: ActionRobot(link, agent, robot_type, answering(value)),
                 "topic": lambda: TopicRobot(topic_link, agent, robot_type, answering(value)),
                 "silent": lambda: RobotClient(link, agent, robot_type, answering(value), report=False)}[kind]()
        made.append(robot)
        return robot

    make.topic_link = topic_link
    yield make
    for robot in made:
        robot.close()


def test_robots_answer_blocking_calls_over_the_action_and_the_topic_on_the_simulator(
        session: tuple, link: object, robots: Callable, statuses: list) -> None:
    trace = load_catalog()[ARM_TRACE]
    with server_node(session[1], session[0], status_period=0.05, **TIMEOUTS):  # the shipped arm: scan blocks
        assert link.wait_for_server() and robots.topic_link.wait_for_server()
        check_refused_without_reports(link, robots.topic_link, "arm", trace.prompt, trace.id)
        by_action = robots("action", "arm_action", "arm", "yes, behind the lamp")
        by_topic = robots("topic", "arm_topic", "arm", "no, not in view")
        silent = robots("silent", "arm_silent", "arm")
        valueless = robots("action", "arm_valueless", "arm", "")
        verbose = robots("topic", "arm_verbose", "arm", "very " * 100)
        sent = {robot: robot.request(trace.prompt, None, trace.id)
                for robot in (silent, by_action, by_topic, valueless, verbose)}
        outcomes = {robot: outcome.wait(RESULT_TIMEOUT_S) for robot, outcome in sent.items()}
    check_waited_and_resumed_after(by_action, outcomes[by_action], "yes, behind the lamp", "scan(")
    check_waited_and_resumed_after(by_topic, outcomes[by_topic], "no, not in view", "scan(")
    check_silent_robot_aborted(outcomes[silent], "scan('red_box')")
    waited = " (its plan was waiting for the value of scan('red_box'))"
    assert outcomes[valueless].result.reason == "robot reported segment 0 without a value" + waited
    assert outcomes[verbose].result.reason.endswith("more than the 48 of arm's observation.max_tokens" + waited)
    assert max(s.waiting for s in statuses) >= 1


@pytest.mark.vllm
def test_robots_answer_blocking_calls_over_the_action_and_the_topic_on_smollm2(
        session: tuple, link: object, robots: Callable, tmp_path: Path) -> None:
    path = tmp_path / "looker.yaml"
    path.write_text(yaml.safe_dump(LOOKER))
    task = "Find the keys, then the wallet."
    with server_node(session[1], session[0], engine="vllm", model="smollm2", kv_cache_gib=0.25,
                     skill_models=[str(path)], max_new_tokens=40, **TIMEOUTS,
                     max_batch=4, **{"vllm.max_model_len": 2048}):
        assert link.wait_for_server() and robots.topic_link.wait_for_server()
        check_refused_without_reports(link, robots.topic_link, "looker", task, 0)
        by_action = robots("action", "looker_action", "looker", "under the red cushion")
        by_topic = robots("topic", "looker_topic", "looker", "next to the green lamp")
        silent = robots("silent", "looker_silent", "looker")
        sent = {robot: robot.request(task) for robot in (silent, by_action, by_topic)}
        outcomes = {robot: outcome.wait(VLLM_RESULT_TIMEOUT_S) for robot, outcome in sent.items()}
    check_waited_and_resumed_after(by_action, outcomes[by_action], "under the red cushion", "look_for(")
    check_waited_and_resumed_after(by_topic, outcomes[by_topic], "next to the green lamp", "look_for(")
    check_silent_robot_aborted(outcomes[silent], "look_for(")
