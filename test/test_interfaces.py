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


def test_action_types_have_the_agreed_fields() -> None:
    goal = interfaces_action.RequestPlan.Goal(
        agent_id="tello-1", robot_type="tello", task="find a cat", tuf_ert=5.0,
        tuf_alpha=0.5, tuf_beta=1.0, max_new_tokens=0, trace_id=7)
    result = interfaces_action.RequestPlan.Result(status="succeeded", num_segments=3, utility=0.9)
    segment = interfaces_msg.Segment(
        request_id="r1", agent_id="tello-1", index=0, text="mf(50);",
        skills=[interfaces_msg.SkillCall(name="mf", args=["50"])], final=True)
    feedback = interfaces_action.RequestPlan.Feedback(segment=segment)

    assert goal.trace_id == 7 and goal.robot_type == "tello"
    assert result.num_segments == 3
    assert feedback.segment.skills[0].args == ["50"]


def test_server_status_holds_per_category_arrays() -> None:
    status = interfaces_msg.ServerStatus(
        queue_length=2, categories=["tello", "arm"], mean_utility=[0.8, 0.6], count=[3, 4],
        policy="tuf", engine="sim")

    assert list(status.mean_utility) == [0.8, 0.6]
    assert list(status.count) == [3, 4]


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
