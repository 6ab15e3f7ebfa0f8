"""Robot side of the topic interface (``timely_llm/ros/topic_requests.py``): publish a task, hear only your own.

A :class:`TopicRobotClient` is a :class:`RobotClient` that asks on its own ``<agent_id>/task_requests``
instead of the action (the node finds that topic in the ROS graph; the client waits up to OWN_TOPIC_MATCH_S for
the node's subscription before its first request, and asks on the shared ``task_requests`` if none comes, as a
node older than the per-robot request topics needs): it subscribes to its own ``<agent_id>/segments`` and
``<agent_id>/plan_result``
only, executes each segment with the same runners (SimulatedSkills, a Tello, an arm),
reports it on its own ``<agent_id>/segment_done`` and cancels on its own ``<agent_id>/cancel``.
Its agent id must be a ROS name token (see :func:`ros_agent_id` for turning any name into one).
There is no acceptance step: a request the node refuses ends with a ``PlanResult`` aborted, with
the reason (but a request reusing an id in flight is ignored, the node's log says so). The topic
interface has no infeasibility notice.
"""

from __future__ import annotations

import re
import threading
import time
import uuid

from rclpy.node import Node
from rclpy.publisher import Publisher
from std_msgs.msg import String
from timely_llm_interfaces.fields import duration_msg, overrun_code
from timely_llm_interfaces.names import TASK_REQUESTS, agent_topics, cancel_topic
from timely_llm_interfaces.qos import AGENT_QOS, TASK_REQUESTS_QOS
from timely_llm_interfaces.rclpy_compat import SubscriptionEventCallbacks

from timely_llm_interfaces.msg import PlanResult, TaskRequest
from timely_llm_interfaces.msg import Segment as SegmentMsg
from timely_llm_robot.client import MATCH_POLL_S, RobotClient, SegmentRunner, TaskOutcome, Urgency, robot_publisher


class TopicPlanLink:
    """A node's ``task_requests`` publisher, shared by the robots on that node."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.request_pub = node.create_publisher(TaskRequest, TASK_REQUESTS, TASK_REQUESTS_QOS)

    def wait_for_server(self, timeout_s: float = 30.0) -> bool:
        """Wait until a node reads ``task_requests`` (a request sent before is lost)."""
        deadline = time.monotonic() + timeout_s
        while not self.request_pub.get_subscription_count():
            if time.monotonic() >= deadline:
                return False
            time.sleep(MATCH_POLL_S)
        return True


OWN_TOPIC_MATCH_S = 15.0


class TopicRobotClient(RobotClient[TopicPlanLink]):
    """One robot on the topic interface; the same ``request``/``wait`` use as :class:`RobotClient`."""

    def __init__(self, link: TopicPlanLink, agent_id: str, robot_type: str, runner: SegmentRunner,
                 report: bool = True, network_delay: float = 0.0) -> None:
        super().__init__(link, agent_id, robot_type, runner, report, network_delay)
        self._ids = f"{uuid.uuid4().hex[:8]}-"  # a fresh prefix per run: see topic_requests on transient local
        self._count = 0
        self._pending: dict[str, TaskOutcome] = {}
        self._pending_lock = threading.Lock()
        segments, results = agent_topics(agent_id)
        quiet = SubscriptionEventCallbacks(use_default_callbacks=False)  # as robot_publisher's, for the same reason
        self._subscriptions = [
            link.node.create_subscription(SegmentMsg, segments, self._on_segment, AGENT_QOS, event_callbacks=quiet),
            link.node.create_subscription(PlanResult, results, self._on_plan_result, AGENT_QOS,
                                          event_callbacks=quiet)]
        self._cancel_pub = robot_publisher(link.node, String, cancel_topic(agent_id))
        self._request_pub = link.node.create_publisher(TaskRequest, f"{agent_id}/{TASK_REQUESTS}", TASK_REQUESTS_QOS)
        self._matched = False

    def _request_publisher(self) -> Publisher:
        """Its own request topic's publisher once the node reads it (waiting up to OWN_TOPIC_MATCH_S the first
        time), else the link's shared one."""
        deadline = time.monotonic() + OWN_TOPIC_MATCH_S
        while not self._matched and not self._request_pub.get_subscription_count():
            if time.monotonic() >= deadline:
                return self.link.request_pub
            time.sleep(MATCH_POLL_S)
        self._matched = True
        return self._request_pub

    def request(self, task: str, tuf: Urgency | None = None, trace_id: int = 0, max_new_tokens: int = 0,
                label: str = "", keep_if_infeasible: bool = False, overrun_strategy: str = "") -> TaskOutcome:
        """Publish a task request (``tuf=None``: the server's default for its category); ``wait()`` on the outcome."""
        ert, alpha, beta = (tuf.ert, tuf.alpha, tuf.beta) if tuf else (0.0, 0.0, 0.0)
        publisher = self._request_publisher()  # first: what arrives before it is sent is an earlier request's
        outcome = TaskOutcome(label or self.agent_id, time.monotonic(), accepted=True)
        with self._pending_lock:
            self._count += 1
            request_id = f"{self._ids}{self._count}"
            self._pending[request_id] = outcome
        publisher.publish(TaskRequest(
            request_id=request_id, agent_id=self.agent_id, robot_type=self.robot_type, task=task,
            tuf_ert=duration_msg(ert), tuf_alpha=alpha, tuf_beta=beta, max_new_tokens=max_new_tokens,
            trace_id=trace_id, keep_if_infeasible=keep_if_infeasible, overrun_strategy=overrun_code(overrun_strategy)))
        return outcome

    def cancel(self, outcome: TaskOutcome) -> None:
        """Ask the node to cancel a request in flight; its PlanResult then says canceled. Its segments not yet
        started are not executed."""
        outcome.cancel_requested = True
        with self._pending_lock:
            request_id = next((rid for rid, pending in self._pending.items() if pending is outcome), None)
        if request_id is not None:
            self._cancel_pub.publish(String(data=request_id))

    def close(self) -> None:
        super().close()
        for subscription in self._subscriptions:
            self.link.node.destroy_subscription(subscription)
        self.link.node.destroy_publisher(self._cancel_pub)
        self.link.node.destroy_publisher(self._request_pub)

    def _on_segment(self, segment: SegmentMsg) -> None:
        with self._pending_lock:
            outcome = self._pending.get(segment.request_id)
        if outcome is None:  # an earlier run's, kept by the transient-local writer
            return
        if outcome.first_segment_at is None:
            outcome.first_segment_at = time.monotonic()
        outcome.segments.append(segment)
        self._work.put((outcome, segment, time.monotonic() + self.network_delay))

    def _on_plan_result(self, result: PlanResult) -> None:
        with self._pending_lock:
            outcome = self._pending.pop(result.request_id, None)
        if outcome is None:
            return
        outcome.result = result
        outcome.result_after_segments = len(outcome.segments) == result.num_segments
        outcome.ended_at = time.monotonic()
        outcome.finished.set_result(outcome)


def ros_agent_id(name: str) -> str:
    """``name`` as a ROS name token, usable as a topic-interface agent id (e.g. ``drone-01`` -> ``drone_01``)."""
    token = re.sub(r"_+", "_", re.sub(r"[^A-Za-z0-9_]", "_", name))
    return token if token[:1].isalpha() else f"r{token}"
