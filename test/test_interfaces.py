"""The generated ROS 2 interfaces import and travel between two rclpy nodes.

Needs the interfaces that scripts/build_interfaces.sh installs into the venv
(scripts/setup_env.sh runs it); without them the import fails rather than skipping.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest
import rclpy
import rclpy.context as rclpy_context
import rclpy.executors as rclpy_executors

import timely_llm.ros.interfaces as interfaces_action
import timely_llm.ros.interfaces as interfaces_msg

pytestmark = pytest.mark.ros

RECEIVE_TIMEOUT_S = 15.0


@pytest.fixture
def ros_context(monkeypatch: pytest.MonkeyPatch) -> Iterator[rclpy.context.Context]:
    # Discovery stays on this host and in a domain of its own, so concurrent runs don't meet.
    monkeypatch.setenv("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    context = rclpy_context.Context()
    rclpy.init(context=context, domain_id=100 + os.getpid() % 100)
    yield context
    rclpy.shutdown(context=context)


AGREED_FIELDS = {
    interfaces_action.RequestPlan.Goal: {
        "agent_id": "string", "robot_type": "string", "task": "string", "tuf_ert": "double", "tuf_alpha": "double",
        "tuf_beta": "double", "max_new_tokens": "uint32", "trace_id": "int32", "no_execution_reports": "boolean"},
    interfaces_action.RequestPlan.Result: {
        "status": "string", "reason": "string", "plan": "string", "response_time": "double",
        "waiting_time": "double", "utility": "double", "num_segments": "uint32"},
    interfaces_action.RequestPlan.Feedback: {"segment": "timely_llm/Segment"},
    interfaces_msg.Segment: {
        "request_id": "string", "agent_id": "string", "index": "uint32", "text": "string",
        "skills": "sequence<timely_llm/SkillCall>", "estimated_exec_time": "double",
        "gen_start": "builtin_interfaces/Time", "gen_end": "builtin_interfaces/Time",
        "dispatch_time": "builtin_interfaces/Time", "final": "boolean", "waits_for": "string"},
    interfaces_msg.TaskRequest: {
        "request_id": "string", "agent_id": "string", "robot_type": "string", "task": "string", "tuf_ert": "double",
        "tuf_alpha": "double", "tuf_beta": "double", "max_new_tokens": "uint32", "trace_id": "int32",
        "keep_if_infeasible": "boolean", "overrun_strategy": "string", "no_execution_reports": "boolean"},
    interfaces_msg.PlanResult: {
        "request_id": "string", "agent_id": "string", "status": "string", "reason": "string", "plan": "string",
        "response_time": "double", "waiting_time": "double", "utility": "double", "num_segments": "uint32"},
    interfaces_msg.SkillCall: {"name": "string", "args": "sequence<string>"},
    interfaces_msg.SegmentDone: {
        "agent_id": "string", "request_id": "string", "index": "uint32", "duration": "double",
        "success": "boolean", "reason": "string", "result": "string"},
    interfaces_msg.ServerStatus: {
        "stamp": "builtin_interfaces/Time", "queue_length": "uint32", "running": "uint32", "suspended": "uint32",
        "waiting": "uint32", "finished": "uint32", "categories": "sequence<string>", "mean_utility": "sequence<double>",
        "count": "sequence<uint32>", "policy": "string", "engine": "string"},
}
"""What the node, the robot clients and the fleet read and write: a field renamed, retyped or dropped
breaks them (fields may be added)."""


@pytest.mark.parametrize("interface", list(AGREED_FIELDS), ids=lambda c: c.__name__)
def test_interfaces_keep_the_agreed_fields_and_types(interface: type) -> None:
    fields = interface.get_fields_and_field_types()
    assert {name: fields.get(name) for name in AGREED_FIELDS[interface]} == AGREED_FIELDS[interface]


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
        agent_id="tello-1", request_id="r1", index=2, duration=3.25, success=False,
        reason="out of range")

    deadline = time.monotonic() + RECEIVE_TIMEOUT_S
    while not received and time.monotonic() < deadline:
        publisher.publish(sent)
        executor.spin_once(timeout_sec=0.1)

    executor.shutdown()
    sender.destroy_node()
    receiver.destroy_node()
    assert received, "no SegmentDone arrived"
    assert received[0] == sent
