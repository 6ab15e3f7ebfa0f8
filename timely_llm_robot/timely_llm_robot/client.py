"""Robot side of ``timely_llm_server``: ask for a plan, execute its segments as they arrive, report each done.

A :class:`RobotClient` is one robot. It sends ``RequestPlan`` goals with its TUF, runs
every feedback segment through a :data:`SegmentRunner` on a worker thread of its own
(segments of a plan run in order, one at a time) and publishes ``SegmentDone`` on its own
``<agent_id>/segment_done`` (relative to the node's namespace; the agent id must be a ROS name token), stamped
with its node's clock when the segment's execution ended (the simulation's, for a node with ``use_sim_time``).
Several robots can share one node (see :class:`PlanLink`).
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from rclpy.action import ActionClient
from rclpy.action.client import ClientGoalHandle
from rclpy.exceptions import InvalidHandle
from rclpy.node import Node
from rclpy.publisher import Publisher
from rclpy.task import Future as RclpyFuture
from timely_llm_interfaces.fields import clipped, duration_msg, overrun_code, oversized, status_name
from timely_llm_interfaces.names import REQUEST_PLAN, agent_id_error, report_topic
from timely_llm_interfaces.qos import DEEP_RELIABLE, action_client_qos
from timely_llm_interfaces.rclpy_compat import PublisherEventCallbacks

from timely_llm_interfaces.action import RequestPlan
from timely_llm_interfaces.msg import Segment as SegmentMsg
from timely_llm_interfaces.msg import SegmentDone
from timely_llm_robot.executors.base import SegmentResult, SegmentRunner


class Urgency(Protocol):
    """A goal's time-utility function, TUF(t) = min(beta, alpha * (t - ert) + beta): the node's
    ``timely_llm.core.tuf.TUF``, or any object with these three fields (ert in seconds)."""

    @property
    def ert(self) -> float: ...
    @property
    def alpha(self) -> float: ...
    @property
    def beta(self) -> float: ...



REPORT_MATCH_S = 10.0
"""How long a report waits for the node's subscription to this robot's topic before it is sent regardless."""
MATCH_POLL_S = 0.01


def reported_value(segment: SegmentMsg, result: SegmentResult) -> str:
    """What a report carries as the segment's value: its last call's, when the plan waits for it (else empty)."""
    value = result.last_value
    if not segment.waits_for or value is None:
        return ""
    return str(value).lower() if isinstance(value, bool) else str(value)


@dataclass
class TaskOutcome:
    """One task as a robot saw it; ``result`` is None when the goal was rejected."""

    label: str
    sent: float
    accepted: bool = False
    result: RequestPlan.Result | None = None
    segments: list[SegmentMsg] = field(default_factory=list)
    """In the order they arrived."""
    first_segment_at: float | None = None
    """Monotonic time the first segment arrived."""
    infeasible_at: float | None = None
    """Monotonic time the server said the deadline cannot be met (goals sent with ``keep_if_infeasible``)."""
    ended_at: float | None = None
    """Monotonic time the result (or the rejection) arrived."""
    exec_time: float = 0.0
    executed: int = 0
    """Segments this robot has finished executing."""
    result_after_segments: bool = True
    """False if the result came before every segment of the plan had arrived."""
    goal_handle: ClientGoalHandle | None = None
    cancel_requested: bool = False
    """The robot asked to cancel it: its segments not yet started are not executed."""
    finished: Future = field(default_factory=Future)

    def wait(self, timeout_s: float | None = None) -> TaskOutcome:
        """Block until the task ends (result or rejection)."""
        return self.finished.result(timeout_s)

    @property
    def status(self) -> str:
        """How it ended, in the Server's words: ``succeeded``, ``aborted``, ``canceled``, or ``rejected``."""
        return status_name(self.result.status) if self.result is not None else "rejected"


class PlanActionClient(ActionClient):
    """rclpy's ActionClient, safe to send from any thread while an executor spins another.

    Jazzy's rclpy registers a request's sequence number (and a goal's feedback callback) only after
    sending it; an executor thread that takes the response, or the first feedback, in between drops
    it as unexpected and the goal's future never completes (ros2/rclpy#1123, fixed upstream by
    ros2/rclpy#1308 after the Jazzy wheels). Sending and taking hold one lock, so a response is
    taken only once its request is registered.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._request_lock = threading.RLock()

    def take_data(self) -> dict:
        with self._request_lock:
            return super().take_data()

    def send_goal_async(self, *args: Any, **kwargs: Any) -> RclpyFuture:
        with self._request_lock:
            return super().send_goal_async(*args, **kwargs)

    def cancel_goal_async(self, goal_handle: ClientGoalHandle) -> RclpyFuture:
        """``goal_handle.cancel_goal_async()`` under the lock: cancel through this, not the handle."""
        with self._request_lock:
            return goal_handle.cancel_goal_async()

    def get_result_async(self, goal_handle: ClientGoalHandle) -> RclpyFuture:
        """``goal_handle.get_result_async()`` under the lock: ask for a result through this, not the handle."""
        with self._request_lock:
            return goal_handle.get_result_async()


def robot_publisher(node: Node, msg_type: type, topic: str) -> Publisher:
    """A publisher of one robot among many on ``node``, without rclpy's default QoS-event handlers: they only log
    incompatible QoS, but add two waitables per publisher that each wake-up of the node's executor walks (500
    robots' publishers: 4.7 ms of CPU per wake-up instead of 0.04 ms on this project's 2-core machine)."""
    return node.create_publisher(msg_type, topic, DEEP_RELIABLE,
                                 event_callbacks=PublisherEventCallbacks(use_default_callbacks=False))


class PlanLink:
    """A node's action client, shared by the robots on that node."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.action = PlanActionClient(node, RequestPlan, REQUEST_PLAN, **action_client_qos())

    def wait_for_server(self, timeout_s: float = 30.0) -> bool:
        return self.action.wait_for_server(timeout_sec=timeout_s)


class RobotLink(Protocol):
    """What a robot requests its plans through: its node, and the way to the server (``PlanLink``'s action, a
    topic in ``timely_llm_robot.topic_client``)."""

    @property
    def node(self) -> Node: ...

    def wait_for_server(self, timeout_s: float = 30.0) -> bool: ...


LinkT = TypeVar("LinkT", bound=RobotLink)


class RobotClient(Generic[LinkT]):
    """One robot: requests plans and executes them; ``report=False`` makes a robot that never reports.

    ``network_delay`` emulates a one-way network latency (on loopback DDS there is next to none):
    a segment starts that long after it arrives, and its report leaves that long after it ends.
    ``on_end`` is called with each task's outcome once it ends (result or rejection), on the node's executor: an
    executor that drives a real robot stops what the task still has in flight there (see ``executors.nav2``).
    """

    def __init__(self, link: LinkT, agent_id: str, robot_type: str, runner: SegmentRunner,
                 report: bool = True, network_delay: float = 0.0,
                 on_end: Callable[[TaskOutcome], None] | None = None) -> None:
        self.link = link
        self.on_end = on_end
        self.network_delay = network_delay
        self.agent_id = agent_id
        self.robot_type = robot_type
        self.runner = runner
        self.report = report
        unnamed = agent_id_error(agent_id)
        if unnamed:
            raise ValueError(f"{unnamed} (ros_agent_id makes one of any name)")
        self.done_pub = robot_publisher(link.node, SegmentDone, report_topic(agent_id))
        self._work: queue.Queue = queue.Queue()
        self._stopping = threading.Event()
        self._worker = threading.Thread(target=self._execute_loop, name=f"robot-{agent_id}", daemon=True)
        self._worker.start()

    def request(self: RobotClient[PlanLink], task: str, tuf: Urgency | None = None, trace_id: int = 0,
                max_new_tokens: int = 0, label: str = "", keep_if_infeasible: bool = False,
                overrun_strategy: str = "") -> TaskOutcome:
        """Send a goal (``tuf=None``: the server's default for its category; ``overrun_strategy``: ``none`` or
        empty, ``kill``, ``skip-next``); ``wait()`` on what it returns."""
        ert, alpha, beta = (tuf.ert, tuf.alpha, tuf.beta) if tuf else (0.0, 0.0, 0.0)
        goal = RequestPlan.Goal(agent_id=self.agent_id, robot_type=self.robot_type, task=task,
                                tuf_ert=duration_msg(ert), tuf_alpha=alpha, tuf_beta=beta,
                                max_new_tokens=max_new_tokens, trace_id=trace_id, keep_if_infeasible=keep_if_infeasible,
                                overrun_strategy=overrun_code(overrun_strategy))
        too_long = oversized(goal)
        if too_long:
            raise ValueError(f"goal not sent: {too_long}")
        outcome = TaskOutcome(label or self.agent_id, time.monotonic())
        sent = self.link.action.send_goal_async(goal, feedback_callback=lambda fb: self._on_feedback(outcome, fb))
        sent.add_done_callback(lambda f: self._on_response(outcome, f.result()))
        return outcome

    def cancel(self: RobotClient[PlanLink], outcome: TaskOutcome) -> None:
        """Ask the server to cancel a task; its result then says canceled. Sent at once if the goal was accepted,
        else as soon as it is (a behaviour tree may halt a request the tick after sending it). Segments of the
        task not yet started are not executed; one already running finishes."""
        outcome.cancel_requested = True
        if outcome.goal_handle is not None and outcome.accepted:
            self.link.action.cancel_goal_async(outcome.goal_handle)

    def close(self) -> None:
        """Stop executing; a segment already running finishes unreported, and this returns once it has: no thread
        of the robot's runs on, driving the robot or inside a library while the process exits."""
        self._stopping.set()
        self._work.put(None)
        if threading.current_thread() is not self._worker:  # a runner may close its own robot
            self._worker.join()
        self.link.node.destroy_publisher(self.done_pub)

    def _on_response(self: RobotClient[PlanLink], outcome: TaskOutcome,
                     goal_handle: ClientGoalHandle) -> None:
        outcome.goal_handle = goal_handle
        outcome.accepted = goal_handle.accepted
        if not goal_handle.accepted:
            self._ended(outcome)
            return
        if outcome.cancel_requested:  # canceled before the answer came (a second cancel, if raced, is harmless)
            self.link.action.cancel_goal_async(goal_handle)
        self.link.action.get_result_async(goal_handle).add_done_callback(
            lambda f: self._on_result(outcome, f.result()))

    def _on_result(self, outcome: TaskOutcome, response) -> None:  # noqa: ANN001 - GetResult response
        outcome.result = response.result
        outcome.result_after_segments = len(outcome.segments) == response.result.num_segments
        self._ended(outcome)

    def _ended(self, outcome: TaskOutcome) -> None:
        outcome.ended_at = time.monotonic()
        try:
            if self.on_end is not None:
                self.on_end(outcome)
        finally:
            outcome.finished.set_result(outcome)

    def _on_feedback(self, outcome: TaskOutcome, feedback) -> None:  # noqa: ANN001 - FeedbackMessage
        if feedback.feedback.infeasible and outcome.infeasible_at is None:
            outcome.infeasible_at = time.monotonic()
        if not feedback.feedback.segment.request_id:  # a notice, no segment to execute
            return
        if outcome.first_segment_at is None:
            outcome.first_segment_at = time.monotonic()
        outcome.segments.append(feedback.feedback.segment)
        self._work.put((outcome, feedback.feedback.segment, time.monotonic() + self.network_delay))

    def _execute_loop(self) -> None:
        while (item := self._work.get()) is not None and not self._stopping.is_set():
            outcome, segment, arrives = item
            time.sleep(max(0.0, arrives - time.monotonic()))
            if outcome.cancel_requested:  # the robot gave the plan up: the node ends it canceled, unreported
                continue
            result = self.runner(segment, outcome.label)
            ended = self.link.node.get_clock().now().to_msg()
            outcome.exec_time += result.duration
            outcome.executed += 1
            if self.report:
                report = SegmentDone(stamp=ended, agent_id=self.agent_id, request_id=segment.request_id,
                                     index=segment.index, duration=duration_msg(result.duration),
                                     success=result.success, reason=clipped(result.reason, SegmentDone, "reason"),
                                     result=clipped(reported_value(segment, result), SegmentDone, "result"))
                if self.network_delay > 0:
                    threading.Timer(self.network_delay, self._publish, (report,)).start()
                else:
                    self._publish(report)

    def _publish(self, report: SegmentDone) -> None:
        """Publish once the node reads this robot's topic: it subscribes when it accepts the robot's first
        request, and a report sent before the two have matched would be lost."""
        deadline = time.monotonic() + REPORT_MATCH_S
        with contextlib.suppress(InvalidHandle):  # closed meanwhile
            while not self.done_pub.get_subscription_count() and time.monotonic() < deadline:
                if self._stopping.wait(MATCH_POLL_S):
                    return
            if not self._stopping.is_set():
                self.done_pub.publish(report)
