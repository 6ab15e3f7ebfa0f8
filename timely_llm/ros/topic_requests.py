"""Task requests over topics, beside the ``request_plan`` action: each robot hears only its own traffic.

A robot publishes a ``TaskRequest`` on ``task_requests``; the node answers on topics of that
robot's own, relative to the node's namespace: every segment on ``<agent_id>/segments``
(``Segment``) and the plan's end on ``<agent_id>/plan_result`` (``PlanResult``). With the action,
every client's reader takes every goal's feedback from the one feedback topic and drops the
others'; here a robot host subscribes to, and deserializes, its own segments only. Executed
segments are reported on ``segment_done`` as for the action, naming the robot's request id.

A request is checked, scheduled, watched and ended exactly as a goal is: this module only
turns messages into the node's requests and the node's outputs into messages. The node knows a
request by an id of its own (``topic-<n>``, never 32 hex digits as an action goal's id is); the
robot's ``request_id`` is echoed in its segments and in its result.

QoS. ``task_requests`` is reliable and volatile: a request is for the node running now, not
one started later. The per-agent topics are reliable and **transient local**: their publishers
are created on a robot's first request, and the first segment can go out before the new
writer has matched the robot's reader; a transient-local reader gets what it missed (the last
:data:`AGENT_DEPTH` messages). A robot restarted with the same agent id may so receive
messages of its earlier requests, which it ignores by request id (so ids must not repeat
across restarts; ``TopicRobotClient`` draws a fresh prefix per run).

The publishers of at most :data:`MAX_AGENTS` agents are kept; past that, those of the agent
heard from least recently and with no request in flight are destroyed (created again if it
asks again).
"""

from __future__ import annotations

import itertools
import re
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from rclpy.callback_groups import CallbackGroup
from rclpy.node import Node
from rclpy.publisher import Publisher
from rclpy.qos import DurabilityPolicy, HistoryPolicy, QoSProfile, ReliabilityPolicy

from timely_llm.errors import RequestRejected
from timely_llm.ros.goals import MAX_ID_CHARS
from timely_llm.ros.interfaces import PlanResult, RequestPlan, SegmentDone, TaskRequest
from timely_llm.ros.interfaces import Segment as SegmentMsg
from timely_llm.ros.qos import DEEP_RELIABLE

TASK_REQUESTS = "task_requests"
SEGMENTS = "segments"
PLAN_RESULT = "plan_result"
ID_PREFIX = "topic-"
"""The node's ids of topic requests: never 32 lower-case hex digits, the form of an action goal's id."""
MAX_AGENTS = 256
AGENT_DEPTH = 100
"""Messages a per-agent writer keeps for a late reader, and a reader holds: a robot's few plans in flight."""

AGENT_QOS = QoSProfile(history=HistoryPolicy.KEEP_LAST, depth=AGENT_DEPTH, reliability=ReliabilityPolicy.RELIABLE,
                       durability=DurabilityPolicy.TRANSIENT_LOCAL)
"""``<agent_id>/segments`` and ``<agent_id>/plan_result``, on the node and on the robot."""
TASK_REQUESTS_QOS = DEEP_RELIABLE

_NAME_TOKEN = re.compile(r"[A-Za-z][A-Za-z0-9_]*")


def agent_topic_error(agent_id: str) -> str | None:
    """Why ``agent_id`` cannot name a robot's topics (it must be one ROS name token), or None."""
    if not agent_id.strip():
        return "empty agent id"
    if len(agent_id) > MAX_ID_CHARS:
        return f"agent id longer than {MAX_ID_CHARS} characters"
    if not _NAME_TOKEN.fullmatch(agent_id) or "__" in agent_id:
        return (f"agent id {agent_id!r} is not a ROS name token (a letter, then letters, digits and single "
                "underscores), so it cannot name its topics")
    return None


def agent_topics(agent_id: str) -> tuple[str, str]:
    """The relative names of a robot's segments and plan_result topics."""
    return f"{agent_id}/{SEGMENTS}", f"{agent_id}/{PLAN_RESULT}"


@dataclass(frozen=True)
class _Live:
    agent: str
    request_id: str
    """The robot's."""


class TopicRequests:
    """The node's topic interface: takes task requests, publishes each one's segments and result.

    ``start(request, node_id)`` checks a request and hands it to the server loop under the
    node's id for it; it raises RequestRejected with the reason a request cannot be served.
    Every started request's outputs then come back through :meth:`deliver`.
    """

    def __init__(self, node: Node, start: Callable[[TaskRequest, str], None], callback_group: CallbackGroup) -> None:
        self._node = node
        self._start = start
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._live: dict[str, _Live] = {}  # node id -> whose request
        self._by_robot: dict[tuple[str, str], str] = {}  # (agent, robot's request id) -> node id
        self._publishers: OrderedDict[str, tuple[Publisher, Publisher]] = OrderedDict()  # least recent first
        self._callback_group = callback_group

    def open(self) -> None:
        """Subscribe to ``task_requests``: a robot that waits for its reader (as TopicPlanLink does) finds the node
        ready to serve, as an action client waiting for the action server does."""
        self._node.create_subscription(TaskRequest, TASK_REQUESTS, self._on_request, TASK_REQUESTS_QOS,
                                       callback_group=self._callback_group)

    def _on_request(self, request: TaskRequest) -> None:
        try:
            self._take(request)
        except Exception as exc:  # noqa: BLE001 - a bad message must not stop the node from taking the next
            self._node.get_logger().error(f"task request from {request.agent_id[:MAX_ID_CHARS]!r} failed: {exc!r}")

    def _take(self, request: TaskRequest) -> None:
        agent, robot_id = request.agent_id, request.request_id
        unnamed = agent_topic_error(agent)
        if unnamed:
            self._node.get_logger().warning(f"ignored task request {robot_id[:MAX_ID_CHARS]!r}: {unnamed}")
            return
        node_id = f"{ID_PREFIX}{next(self._ids)}"
        with self._lock:
            refused = self._request_id_error(agent, robot_id)
            if not refused:
                self._live[node_id] = _Live(agent, robot_id)
                self._by_robot[(agent, robot_id)] = node_id
        if refused:
            self._refuse(agent, robot_id, refused)
            return
        try:
            self._start(request, node_id)
        except RequestRejected as exc:
            self._forget(node_id)
            self._refuse(agent, robot_id, str(exc))

    def _request_id_error(self, agent: str, robot_id: str) -> str | None:
        if not robot_id:
            return "empty request id"
        if len(robot_id) > MAX_ID_CHARS:
            return f"request id longer than {MAX_ID_CHARS} characters"
        if (agent, robot_id) in self._by_robot:
            return f"duplicate request id {robot_id!r}: a request of {agent!r} with this id is in flight"
        return None

    def _refuse(self, agent: str, robot_id: str, reason: str) -> None:
        self._node.get_logger().warning(f"rejected task request {robot_id[:MAX_ID_CHARS]!r} from {agent!r}: {reason}")
        self._publishers_of(agent)[1].publish(PlanResult(
            request_id=robot_id[:MAX_ID_CHARS], agent_id=agent, status="aborted", reason=reason,
            **dict.fromkeys(("response_time", "waiting_time", "utility"), float("nan"))))

    def _forget(self, node_id: str) -> _Live | None:
        with self._lock:
            live = self._live.pop(node_id, None)
            if live is not None:
                del self._by_robot[(live.agent, live.request_id)]
        return live

    def deliver(self, node_id: str, item: object) -> bool:
        """Publish a segment (feedback) or the result of a topic request; False if ``node_id`` is not one."""
        with self._lock:
            live = self._live.get(node_id)
        if live is None:
            return node_id.startswith(ID_PREFIX)  # ended already: nothing left to send it
        segments, results = self._publishers_of(live.agent)
        if isinstance(item, RequestPlan.Feedback):
            if item.segment.request_id:  # the infeasibility notice has no segment and no topic message
                item.segment.request_id = live.request_id
                segments.publish(item.segment)
            return True
        self._forget(node_id)
        results.publish(plan_result(item, live))
        return True

    def to_node(self, report: SegmentDone) -> SegmentDone:
        """A robot's report on a topic request, under the node's id for it; any other report as it came."""
        with self._lock:
            node_id = self._by_robot.get((report.agent_id, report.request_id))
        if node_id is not None:
            report.request_id = node_id
        return report

    def _publishers_of(self, agent: str) -> tuple[Publisher, Publisher]:
        """The agent's two publishers, made on first use; the least recently used idle agents' go past MAX_AGENTS."""
        pair = self._publishers.get(agent)
        if pair is None:
            segments, results = agent_topics(agent)
            pair = (self._node.create_publisher(SegmentMsg, segments, AGENT_QOS),
                    self._node.create_publisher(PlanResult, results, AGENT_QOS))
            self._drop_idle(len(self._publishers) + 1 - MAX_AGENTS)
            self._publishers[agent] = pair
        self._publishers.move_to_end(agent)
        return pair

    def _drop_idle(self, count: int) -> None:
        """Destroy the publishers of up to ``count`` agents with no request in flight, least recently used first."""
        with self._lock:
            busy = {live.agent for live in self._live.values()}
        for agent in [a for a in self._publishers if a not in busy][:max(0, count)]:
            for publisher in self._publishers.pop(agent):
                self._node.destroy_publisher(publisher)


def plan_result(result: RequestPlan.Result, live: _Live) -> PlanResult:
    """The topic message of how a request ended, under the robot's ids."""
    return PlanResult(request_id=live.request_id, agent_id=live.agent, status=result.status, reason=result.reason,
                      plan=result.plan, response_time=result.response_time, waiting_time=result.waiting_time,
                      utility=result.utility, num_segments=result.num_segments)
