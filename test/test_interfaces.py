"""The generated ROS 2 interfaces (package timely_llm_interfaces) keep interface v1's fields and constants, convert
to and from Python values in one place (timely_llm/ros/messages.py), and travel between two rclpy nodes.

Needs the interfaces that scripts/build_interfaces.sh installs into the venv
(scripts/setup_env.sh runs it); without them the import fails rather than skipping.
"""

from __future__ import annotations

import importlib.util
import math
import time
from collections.abc import Iterator

import pytest
import rclpy
import rclpy.context as rclpy_context
import rclpy.executors as rclpy_executors
from builtin_interfaces.msg import Duration as DurationMsg
from builtin_interfaces.msg import Time as TimeMsg

import timely_llm
import timely_llm.ros.interfaces as interfaces_action
import timely_llm.ros.interfaces as interfaces_msg
from timely_llm.ros import messages
from timely_llm_interfaces import fields

pytestmark = pytest.mark.ros

RECEIVE_TIMEOUT_S = 15.0


@pytest.fixture
def ros_context(ros_domain: int) -> Iterator[rclpy.context.Context]:
    context = rclpy_context.Context()
    rclpy.init(context=context, domain_id=ros_domain)
    yield context
    rclpy.shutdown(context=context)


DURATION, TIME = "builtin_interfaces/Duration", "builtin_interfaces/Time"
AGREED_FIELDS = {
    interfaces_action.RequestPlan.Goal: {
        "agent_id": "string<256>", "robot_type": "string<256>", "task": "string<65536>", "tuf_ert": DURATION,
        "tuf_alpha": "double", "tuf_beta": "double", "max_new_tokens": "uint32", "trace_id": "int32",
        "keep_if_infeasible": "boolean",
        "overrun_strategy": "uint8", "no_execution_reports": "boolean"},
    interfaces_action.RequestPlan.Result: {
        "status": "uint8", "reason": "string<1024>", "plan": "string<262144>", "response_time": DURATION,
        "waiting_time": DURATION, "utility": "double", "num_segments": "uint32"},
    interfaces_action.RequestPlan.Feedback: {"segment": "timely_llm_interfaces/Segment", "infeasible": "boolean"},
    interfaces_msg.Segment: {
        "request_id": "string<256>", "agent_id": "string<256>", "index": "uint32", "text": "string<262144>",
        "skills": "sequence<timely_llm_interfaces/SkillCall>", "estimated_exec_time": DURATION,
        "gen_start": TIME, "gen_end": TIME, "dispatch_time": TIME, "final": "boolean", "waits_for": "string<1024>"},
    interfaces_msg.TaskRequest: {
        "request_id": "string<256>", "agent_id": "string<256>", "robot_type": "string<256>", "task": "string<65536>",
        "tuf_ert": DURATION, "tuf_alpha": "double", "tuf_beta": "double", "max_new_tokens": "uint32",
        "trace_id": "int32",
        "keep_if_infeasible": "boolean", "overrun_strategy": "uint8", "no_execution_reports": "boolean"},
    interfaces_msg.PlanResult: {
        "request_id": "string<256>", "agent_id": "string<256>", "status": "uint8", "reason": "string<1024>",
        "plan": "string<262144>", "response_time": DURATION, "waiting_time": DURATION, "utility": "double",
        "num_segments": "uint32"},
    interfaces_msg.SkillCall: {"name": "string<256>", "args": "sequence<string<1024>, 64>"},
    interfaces_msg.SegmentDone: {
        "stamp": TIME, "agent_id": "string<256>", "request_id": "string<256>", "index": "uint32", "duration": DURATION,
        "success": "boolean", "reason": "string<1024>", "result": "string<1024>"},
    interfaces_msg.CategoryStatus: {"name": "string<256>", "mean_utility": "double", "finished": "uint32"},
    interfaces_msg.ServerStatus: {
        "stamp": TIME, "queue_length": "uint32", "running": "uint32", "suspended": "uint32", "executing": "uint32",
        "waiting": "uint32", "finished": "uint32", "categories": "sequence<timely_llm_interfaces/CategoryStatus>",
        "policy": "string<256>", "engine": "string<256>"},
}
"""Interface v1 with its string bounds (docs/interfaces.md): what the node, robots, the robot clients and the fleet
read and write; a field renamed, retyped or dropped breaks them (fields may be added)."""

AGREED_CONSTANTS = {
    interfaces_action.RequestPlan.Result: {"STATUS_SUCCEEDED": 1, "STATUS_ABORTED": 2, "STATUS_CANCELED": 3},
    interfaces_msg.PlanResult: {"STATUS_SUCCEEDED": 1, "STATUS_ABORTED": 2, "STATUS_CANCELED": 3},
    interfaces_action.RequestPlan.Goal: {"OVERRUN_NONE": 0, "OVERRUN_KILL": 1, "OVERRUN_SKIP_NEXT": 2},
    interfaces_msg.TaskRequest: {"OVERRUN_NONE": 0, "OVERRUN_KILL": 1, "OVERRUN_SKIP_NEXT": 2},
}


@pytest.mark.parametrize("interface", list(AGREED_FIELDS), ids=lambda c: c.__name__)
def test_interfaces_keep_the_agreed_fields_and_types(interface: type) -> None:
    fields = interface.get_fields_and_field_types()
    assert {name: fields.get(name) for name in AGREED_FIELDS[interface]} == AGREED_FIELDS[interface]


@pytest.mark.parametrize("interface", list(AGREED_CONSTANTS), ids=lambda c: c.__name__)
def test_interfaces_keep_the_agreed_constants(interface: type) -> None:
    assert {name: getattr(interface, name) for name in AGREED_CONSTANTS[interface]} == AGREED_CONSTANTS[interface]


def test_the_interfaces_are_their_own_package() -> None:
    """timely_llm_interfaces, installed apart from the node's Python package (scripts/build_interfaces.sh)."""
    assert interfaces_msg.SegmentDone.__module__.startswith("timely_llm_interfaces.msg")
    assert interfaces_action.RequestPlan.__module__.startswith("timely_llm_interfaces.action")
    assert not hasattr(timely_llm, "msg") and importlib.util.find_spec("timely_llm.msg") is None


@pytest.mark.parametrize("seconds", [0.0, 1e-9, 0.25, 3.0, 1234.5678, -1.0, -0.25])
def test_durations_round_trip_with_nanoseconds_in_range(seconds: float) -> None:
    msg = fields.duration_msg(seconds)
    assert 0 <= msg.nanosec < fields.NANOS and fields.duration_seconds(msg) == pytest.approx(seconds, abs=1e-9)


def test_out_of_range_fields_and_unknown_constants_say_which_in_one_line() -> None:
    for call, text in ((lambda: fields.duration_seconds(DurationMsg(sec=1, nanosec=10**9), "tuf_ert"),
                        "tuf_ert nanosec 1000000000 is not below 1e9"),
                       (lambda: fields.stamp_seconds(TimeMsg(sec=1, nanosec=2 * 10**9)), "stamp nanosec"),
                       (lambda: fields.overrun_name(3), "unknown overrun_strategy 3 (known: 0 none, 1 kill, "
                                                          "2 skip-next)"),
                       (lambda: fields.overrun_code("retry"), "unknown overrun strategy 'retry'")):
        with pytest.raises(fields.FieldError) as refused:
            call()
        assert text in str(refused.value) and "\n" not in str(refused.value)


def test_status_and_overrun_constants_map_to_the_servers_words_and_back() -> None:
    result = interfaces_action.RequestPlan.Result
    assert [fields.status_name(c) for c in (result.STATUS_SUCCEEDED, result.STATUS_ABORTED,
                                               result.STATUS_CANCELED, 0)] == [
        "succeeded", "aborted", "canceled", "status 0"]
    assert [fields.overrun_name(fields.overrun_code(s)) for s in ("", "none", "kill", "skip-next")] == [
        "none", "none", "kill", "skip-next"]


def test_a_result_without_times_says_so_with_negative_durations() -> None:
    aborted = messages.aborted_result("no")
    assert aborted.status == interfaces_action.RequestPlan.Result.STATUS_ABORTED and math.isnan(aborted.utility)
    assert (aborted.response_time.sec, aborted.response_time.nanosec) == (-1, 0)
    assert messages.optional_seconds(aborted.response_time) is None
    assert messages.optional_seconds(messages.optional_duration(0.5)) == 0.5
    assert fields.stamp_seconds(TimeMsg()) is None and fields.stamp_seconds(TimeMsg(sec=2, nanosec=5)) == 2 + 5e-9


def test_segment_done_round_trips_between_two_nodes(ros_context: rclpy.context.Context) -> None:
    sender = rclpy.create_node("segment_done_sender", context=ros_context)
    receiver = rclpy.create_node("segment_done_receiver", context=ros_context)
    received: list = []
    receiver.create_subscription(interfaces_msg.SegmentDone, "segment_done", received.append, 10)
    publisher = sender.create_publisher(interfaces_msg.SegmentDone, "segment_done", 10)
    executor = rclpy_executors.SingleThreadedExecutor(context=ros_context)
    executor.add_node(sender)
    executor.add_node(receiver)
    sent = interfaces_msg.SegmentDone(
        stamp=TimeMsg(sec=1700000000, nanosec=5), agent_id="tello_1", request_id="r1", index=2,
        duration=fields.duration_msg(3.25), success=False, reason="out of range")

    deadline = time.monotonic() + RECEIVE_TIMEOUT_S
    while not received and time.monotonic() < deadline:
        publisher.publish(sent)
        executor.spin_once(timeout_sec=0.1)

    executor.shutdown()
    sender.destroy_node()
    receiver.destroy_node()
    assert received, "no SegmentDone arrived"
    assert received[0] == sent


def _message_types() -> list[type]:
    from timely_llm_interfaces import msg
    from timely_llm_interfaces.action import RequestPlan
    names = ("CategoryStatus", "PlanResult", "Segment", "SegmentDone", "ServerStatus", "SkillCall", "TaskRequest")
    return [*(getattr(msg, n) for n in names), RequestPlan.Goal, RequestPlan.Result, RequestPlan.Feedback]


@pytest.mark.parametrize("msg_type", _message_types(), ids=lambda t: t.__name__)
def test_every_string_of_the_interface_is_bounded(msg_type: type) -> None:
    from timely_llm_interfaces.fields import string_bound
    kinds = msg_type.get_fields_and_field_types()
    strings = [f for f, kind in kinds.items() if "string" in kind]
    assert all(string_bound(msg_type, f) for f in strings), kinds


def test_a_string_over_its_bound_is_refused_by_rclpy_and_named_by_the_receivers_check() -> None:
    from timely_llm_interfaces.fields import clipped, oversized

    from timely_llm_interfaces.msg import SegmentDone, SkillCall, TaskRequest
    with pytest.raises(AssertionError, match="agent_id"):
        TaskRequest(check_fields=True, agent_id="a" * 257)
    TaskRequest(check_fields=True, agent_id="a" * 256)
    assert oversized(TaskRequest(agent_id="a" * 257)) == "agent_id of 257 characters is longer than its bound 256"
    assert oversized(SkillCall(args=["ok", "x" * 1025])) == "args of 1025 characters is longer than its bound 1024"
    assert oversized(SegmentDone(reason="r" * 1024, result="v")) is None
    assert clipped("r" * 5000, SegmentDone, "reason") == "r" * 1024 and clipped("ok", SegmentDone, "reason") == "ok"
