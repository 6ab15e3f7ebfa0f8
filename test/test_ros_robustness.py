"""The node against bad robots and lifecycle changes, over real rclpy and Fast DDS on the sim engine.

Malformed or foreign SegmentDone reports are refused with a logged reason and change
nothing; the watchdog catches a skipped segment; ``final`` marks the real last segment;
the status topic counts goals whose robot is executing; lifecycle transitions gate goals.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator

import pytest
from builtin_interfaces.msg import Duration as DurationMsg
from builtin_interfaces.msg import Time as TimeMsg
from guards import wait_until
from rclpy.lifecycle import TransitionCallbackReturn
from rclpy.publisher import Publisher
from timely_llm_interfaces.names import report_topic
from timely_llm_interfaces.qos import DEEP_RELIABLE

from timely_llm.plan.robot_file import load_skill_models
from timely_llm.ros import throttle
from timely_llm.ros.interfaces import SegmentDone, ServerStatus
from timely_llm.ros.messages import duration_msg, duration_seconds
from timely_llm.traces import load_catalog
from timely_llm_bench.robots.fleet import server_node
from timely_llm_robot.client import PlanLink, RobotClient, TaskOutcome

pytestmark = pytest.mark.ros

RESULT_TIMEOUT_S = 60.0
CATALOG = load_catalog()
SKILLS = load_skill_models()


def ask(robot: RobotClient, trace_id: int) -> TaskOutcome:
    return robot.request(CATALOG[trace_id].prompt, None, trace_id)


def whole_plan(outcome: TaskOutcome) -> None:
    """Wait until every segment of the plan has arrived (the last one says final)."""
    wait_until(lambda: outcome.segments and outcome.segments[-1].final, RESULT_TIMEOUT_S, "the final segment")


Report = Callable[..., None]


@pytest.fixture
def report(link: PlanLink) -> Iterator[Report]:
    """``report(agent, outcome, index, duration, success, reason, on=topic's agent, stamp=...)``: a SegmentDone for
    the outcome's request naming ``agent``, published on ``<on>/segment_done`` (default: the agent's own) once the
    node reads it. ``duration``: seconds, or a (sec, nanosec) pair; ``stamp``: seconds of ROS time, or none (the
    zero stamp)."""
    publishers: dict[str, Publisher] = {}

    def send(agent: str, outcome: TaskOutcome, index: int, duration: float | tuple[int, int] = 0.001,
             success: bool = True, reason: str = "", on: str = "", stamp: float | None = None) -> None:
        topic = report_topic(on or agent)
        if topic not in publishers:
            publishers[topic] = link.node.create_publisher(SegmentDone, topic, DEEP_RELIABLE)
        wait_until(publishers[topic].get_subscription_count, RESULT_TIMEOUT_S, f"the node reading {topic}")
        publishers[topic].publish(SegmentDone(
            stamp=TimeMsg() if stamp is None else TimeMsg(sec=int(stamp), nanosec=int(stamp % 1 * 1e9)),
            agent_id=agent, request_id=outcome.segments[0].request_id, index=index,
            duration=DurationMsg(sec=duration[0], nanosec=duration[1]) if isinstance(duration, tuple)
            else duration_msg(duration), success=success, reason=reason))

    yield send
    for publisher in publishers.values():
        link.node.destroy_publisher(publisher)


BAD_REPORTS = [  # (agent, index, duration, stamp, success, what the node logs), on the victim's topic
    ("victim", 0, (1, 1_000_000_000), None, True, "duration nanosec 1000000000 is not below 1e9"),
    ("victim", 0, -1.0, None, True, "duration -1 s is negative"),
    ("victim", 0, (2**31 - 1, 0), None, True, "since its dispatch"),
    ("victim", 0, 0.001, time.time() + 3600.0, True, "ahead of the node's clock"),
    ("victim", 0, 0.001, 1.5, True, "starts before its dispatch"),
    ("victim", 99, 0.001, None, True, "segment 99 was not dispatched"),
    ("intruder", 0, 0.001, None, False, "it names agent 'intruder'"),
]


def test_malformed_and_foreign_reports_are_refused_and_change_nothing(
        session: tuple, robots: Callable, report: Report, server_log: Callable[[], str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(throttle, "PERIOD_S", 0.0)  # every refusal logged
    with server_node(session[1], session[0], segment_timeout_margin=60.0):
        victim = ask(robots("victim", report=False), 2)
        bystander = ask(robots("bystander"), 7)
        whole_plan(victim)
        for agent, index, duration, stamp, success, _ in BAD_REPORTS:
            report(agent, victim, index, duration, success, "sabotage", on="victim", stamp=stamp)
        report("victim", victim, 0, stamp=time.time())  # a stamped report, on a wall-time node's clock
        report("victim", victim, 0)  # duplicate
        wait_until(lambda: "segment 0 was already reported" in server_log(), RESULT_TIMEOUT_S, "the duplicate refused")
        assert not victim.finished.done()  # still waiting for its other segments: nothing was aborted
        for index in range(1, len(victim.segments)):
            report("victim", victim, index)
        victim.wait(RESULT_TIMEOUT_S)
        assert bystander.wait(RESULT_TIMEOUT_S).status == "succeeded"
    for *_, reason in BAD_REPORTS:
        assert reason in server_log(), reason
    assert victim.status == "succeeded", victim.result.reason
    assert victim.result.num_segments == len(victim.segments)
    assert 0 <= duration_seconds(victim.result.response_time) < RESULT_TIMEOUT_S
    assert 0 <= duration_seconds(victim.result.waiting_time) < RESULT_TIMEOUT_S
    assert math.isfinite(victim.result.utility) and victim.result.utility <= 1.0  # the default TUF's beta at most


def test_a_skipped_segment_is_caught_by_the_watchdog_however_the_others_are_reported(
        session: tuple, robots: Callable, report: Report) -> None:
    with server_node(session[1], session[0], segment_timeout_factor=1.0, segment_timeout_margin=0.5):
        outcome = ask(robots("skipper", report=False), 2)
        whole_plan(outcome)
        assert len(outcome.segments) >= 3
        for index in reversed(range(1, len(outcome.segments))):  # all but segment 0, out of order
            report("skipper", outcome, index)
        outcome.wait(RESULT_TIMEOUT_S)
    assert outcome.status == "aborted" and "did not report segment 0 done" in outcome.result.reason


@pytest.mark.parametrize("trace", [6, 3])
def test_final_marks_the_real_last_segment(session: tuple, robots: Callable, trace: int) -> None:
    plan = CATALOG[trace].plan
    assert plan.endswith(";") or plan.endswith("}")  # the segmenter cut the last segment before the plan ended
    with server_node(session[1], session[0]):
        outcome = ask(robots(f"d{trace}"), trace).wait(RESULT_TIMEOUT_S)
    assert outcome.status == "succeeded", outcome.result.reason
    assert [s.final for s in outcome.segments] == [False] * (len(outcome.segments) - 1) + [True]
    assert outcome.segments[-1].text.strip() and "".join(s.text for s in outcome.segments) == plan


def test_status_counts_goals_whose_robot_is_executing(session: tuple, link: PlanLink, robots: Callable,
                                                     report: Report) -> None:
    statuses: list[ServerStatus] = []
    link.node.create_subscription(ServerStatus, "status", statuses.append, 100)
    with server_node(session[1], session[0], status_period=0.1, segment_timeout_margin=60.0):
        stuck = [ask(robots(f"mute{i}", report=False), 7) for i in range(2)]
        for outcome in stuck:
            wait_until(lambda outcome=outcome: outcome.segments, RESULT_TIMEOUT_S, "a segment")
        seen = len(statuses)
        wait_until(lambda: any(m.executing == 2 for m in statuses[seen:]), RESULT_TIMEOUT_S,
                   f"executing 2 ({len(statuses)} statuses, last {statuses[-1:]})")
        for outcome in stuck:
            whole_plan(outcome)
            for index in range(len(outcome.segments)):
                report(outcome.segments[0].agent_id, outcome, index)
            outcome.wait(RESULT_TIMEOUT_S)
        seen = len(statuses)
        wait_until(lambda: any(m.executing == 0 and m.finished == 2 for m in statuses[seen:]), RESULT_TIMEOUT_S,
                   "executing 0")
    assert [o.status for o in stuck] == ["succeeded"] * 2


@pytest.mark.no_vllm
def test_lifecycle_gates_goals_and_deactivate_aborts_those_in_flight(session: tuple, robots: Callable) -> None:
    with server_node(session[1], session[0], autostart=False, segment_timeout_margin=60.0) as node:
        assert node.server is None
        assert ask(robots("early"), 7).wait(RESULT_TIMEOUT_S).status == "rejected"
        assert node.trigger_configure() == TransitionCallbackReturn.SUCCESS and node.server is not None
        assert ask(robots("inactive"), 7).wait(RESULT_TIMEOUT_S).status == "rejected"
        assert node.trigger_activate() == TransitionCallbackReturn.SUCCESS
        assert ask(robots("served"), 7).wait(RESULT_TIMEOUT_S).status == "succeeded"

        in_flight = ask(robots("mute", report=False), 7)
        wait_until(lambda: in_flight.segments, RESULT_TIMEOUT_S, "a segment")
        assert node.trigger_deactivate() == TransitionCallbackReturn.SUCCESS
        in_flight.wait(RESULT_TIMEOUT_S)
        assert ask(robots("late"), 7).wait(RESULT_TIMEOUT_S).status == "rejected"
        engine = node.server.engine
        assert node.trigger_cleanup() == TransitionCallbackReturn.SUCCESS
        assert node.server is None and not engine.running_ids()

        assert node.trigger_configure() == TransitionCallbackReturn.SUCCESS
        assert node.trigger_activate() == TransitionCallbackReturn.SUCCESS
        assert ask(robots("again"), 7).wait(RESULT_TIMEOUT_S).status == "succeeded"
    assert in_flight.status == "aborted" and in_flight.result.reason == "server deactivated"


@pytest.mark.no_vllm
def test_a_node_that_cannot_configure_says_why(session: tuple) -> None:
    from timely_llm.ros.node import NodeStartError

    with pytest.raises(NodeStartError, match="policy"), server_node(session[1], session[0], policy="nonsense"):
        pass


class _PausingAfterSend:
    """rclpy's C action-client handle, pausing after each goal request is sent, as a sender thread that the
    OS deschedules there would: the node answers in the meantime."""

    def __init__(self, handle: object, pause_s: float) -> None:
        self._handle = handle
        self._pause_s = pause_s

    def send_goal_request(self, request: object) -> int:
        sequence_number = self._handle.send_goal_request(request)
        time.sleep(self._pause_s)
        return sequence_number

    def __getattr__(self, name: str) -> object:
        return getattr(self._handle, name)

    def __enter__(self) -> object:
        return self._handle.__enter__()

    def __exit__(self, *exc: object) -> None:
        self._handle.__exit__(*exc)


def test_a_goal_answered_before_its_sender_registered_it_still_completes(session: tuple, link: PlanLink,
                                                                         robots: Callable) -> None:
    # ros2/rclpy#1123: with Jazzy's ActionClient the executor drops that answer ("Ignoring unexpected goal
    # response") and the goal never completes; PlanActionClient takes answers only once requests are registered.
    link.action._client_handle = _PausingAfterSend(link.action._client_handle, 0.5)
    with server_node(session[1], session[0]):
        outcomes = [ask(robots(f"tello_{i}", "tello"), 6) for i in range(2)]
        assert [outcome.wait(RESULT_TIMEOUT_S).status for outcome in outcomes] == ["succeeded", "succeeded"]
