"""Task requests over topics, beside the ``request_plan`` action: each robot hears only its own traffic.

A robot publishes a ``TaskRequest`` on its own ``<agent_id>/task_requests`` (``request_topics``: found in the
ROS graph), or on the shared ``task_requests``; the node answers on topics of that robot's own, relative to the
node's namespace: every segment on ``<agent_id>/segments``
(``Segment``) and the plan's end on ``<agent_id>/plan_result`` (``PlanResult``). With the action,
every client's reader takes every goal's feedback from the one feedback topic and drops the
others'; here a robot host subscribes to, and deserializes, its own segments only. Executed
segments are reported on ``<agent_id>/segment_done`` as for the action, naming the robot's request id,
and a request is cancelled by its request id on ``<agent_id>/cancel`` (``std_msgs/String``).
The per-agent endpoints, their bound and their cleanup: ``agents``.

A request is checked, scheduled, watched and ended exactly as a goal is: this module only
turns messages into the node's requests and the node's outputs into messages. The node knows a
request by an id of its own (``topic-<n>``, never 32 hex digits as an action goal's id is); the
robot's ``request_id`` is echoed in its segments and in its result.

A request that cannot be served ends with an aborted ``PlanResult`` on its agent's ``plan_result``, except one
whose request id is in flight already: anyone may publish on ``task_requests`` under any agent id, so such a
refusal would end the live request in its robot's eyes; it goes to the log only. Request ids are scoped to
where they came from: a request on a robot's own topic, which only that robot may publish on (with SROS2), is
the robot's. One that finds its id taken by a request of the shared topic under its agent id (an impostor that
guessed the id before the node found the robot's own topic) takes the id over: the impostor's request is
canceled and nothing more of it is sent; once the node reads an agent's own topic, requests naming that agent on
the shared topic are ignored (log only). A request
on an agent's own topic must name that agent. An agent that may not ask at all (the fleet file does not name it)
is only logged: no endpoint is made for it.

QoS. ``task_requests`` is reliable and volatile: a request is for the node running now, not
one started later. The per-agent topics are reliable and **transient local**: their publishers
are created on a robot's first request, and the first segment can go out before the new
writer has matched the robot's reader; a transient-local reader gets what it missed (``AGENT_QOS``'s depth).
A robot restarted with the same agent id may so receive
messages of its earlier requests, which it ignores by request id (so ids must not repeat
across restarts; ``TopicRobotClient`` draws a fresh prefix per run).
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass

from rclpy.callback_groups import CallbackGroup
from rclpy.node import Node
from std_msgs.msg import String
from timely_llm_interfaces.names import MAX_ID_CHARS, TASK_REQUESTS, agent_id_error
from timely_llm_interfaces.qos import TASK_REQUESTS_QOS

from timely_llm.errors import RequestRejected
from timely_llm.ros.agents import AgentTopics, TopicEndpoints
from timely_llm.ros.interfaces import PlanResult, RequestPlan, SegmentDone, TaskRequest
from timely_llm.ros.messages import aborted_result
from timely_llm.ros.request_topics import RequestTopics
from timely_llm.ros.throttle import ThrottledLog

ID_PREFIX = "topic-"
"""The node's ids of topic requests: never 32 lower-case hex digits, the form of an action goal's id."""


@dataclass(frozen=True)
class _Live:
    agent: str
    request_id: str
    """The robot's."""
    own: bool = False
    """It came on the agent's own request topic."""


class TopicRequests:
    """The node's topic interface: takes task requests and cancels, publishes each request's segments and result.

    ``start(request, node_id)`` checks a request and hands it to the server loop under the
    node's id for it; it raises RequestRejected with the reason a request cannot be served.
    Every started request's outputs then come back through :meth:`deliver`; ``cancel(node_id)`` ends one.
    """

    def __init__(self, node: Node, start: Callable[[TaskRequest, str], None], cancel: Callable[[str], None],
                 agents: AgentTopics, callback_group: CallbackGroup,
                 screen: Callable[[TaskRequest], str | None] = lambda request: None,
                 may_ask: Callable[[str], bool] = lambda agent: True, log: ThrottledLog | None = None) -> None:
        """``screen(request)``: why its agent may not ask for it at all (not in the fleet file, not that robot type),
        or None; ``may_ask(agent)``: the agent may ask (its own request topic is subscribed); ``log``: the throttled
        log of the node's goal intake (one budget for both)."""
        self._node, self._start, self._cancel, self._agents, self._screen = node, start, cancel, agents, screen
        self._may_ask = may_ask
        self.own_topics: RequestTopics | None = None
        self._lock = threading.Lock()  # this callback group writes; the reports' reads
        self._ids = itertools.count(1)
        self._live: dict[str, _Live] = {}  # node id -> whose request
        self._by_robot: dict[tuple[str, str], str] = {}  # (agent, robot's request id) -> node id
        self._callback_group = callback_group
        self._log = log or ThrottledLog(node.get_logger().warning)

    def open(self) -> None:
        """Subscribe to ``task_requests``: a robot that waits for its reader (as TopicPlanLink does) finds the node
        ready to serve, as an action client waiting for the action server does."""
        self._node.create_subscription(TaskRequest, TASK_REQUESTS, self._on_request, TASK_REQUESTS_QOS,
                                       callback_group=self._callback_group)
        self.own_topics = RequestTopics(
            self._node, self._agents.pump, self._on_own_request, self._may_ask,
            lambda agent: agent in self._agents.named, self._callback_group)

    def _on_request(self, request: TaskRequest, own: bool = False) -> None:
        try:
            self._take(request, own)
        except Exception as exc:  # noqa: BLE001 - a bad message must not stop the node from taking the next
            self._node.get_logger().error(f"task request from {request.agent_id[:MAX_ID_CHARS]!r} failed: {exc!r}")

    def _on_own_request(self, agent: str, request: TaskRequest) -> None:
        """A request on ``agent``'s own request topic: it must name that agent."""
        if request.agent_id != agent:
            self._refuse(agent, request.request_id, f"a request on {agent!r}'s own request topic names agent "
                                                    f"{request.agent_id[:MAX_ID_CHARS]!r}")
            return
        self._on_request(request, own=True)

    def _take(self, request: TaskRequest, own: bool) -> None:
        agent, robot_id = request.agent_id, request.request_id
        refused = agent_id_error(agent) or (None if self._may_ask(agent) else self._screen(request))
        if refused:  # not a word on its topics: none is made for an agent that may not ask
            self._log.warn(agent[:MAX_ID_CHARS], f"ignored task request {robot_id[:MAX_ID_CHARS]!r}: {refused}")
            return
        if not self._may_take_id(agent, robot_id, own):
            self._log.warn(agent, f"ignored task request {robot_id[:MAX_ID_CHARS]!r} of {agent!r}: a request with "
                                  "this id is in flight")
            return
        if not own and self.own_topics is not None and agent in self.own_topics.agents:
            self._log.warn(agent, f"ignored task request {robot_id[:MAX_ID_CHARS]!r} naming {agent!r} on the shared "
                                  f"{TASK_REQUESTS}: that robot asks on its own {agent}/{TASK_REQUESTS}")
            return
        refused = _request_id_error(robot_id) or self._agents.admit(agent)
        if refused:
            self._refuse(agent, robot_id, refused)
            return
        self._endpoints(agent)  # its cancel subscription too, before the robot may want it
        node_id = f"{ID_PREFIX}{next(self._ids)}"
        with self._lock:
            self._live[node_id] = _Live(agent, robot_id, own)
            self._by_robot[(agent, robot_id)] = node_id
        try:
            self._start(request, node_id)
        except RequestRejected as exc:
            self._forget(node_id)
            self._refuse(agent, robot_id, str(exc))

    def _may_take_id(self, agent: str, robot_id: str, own: bool) -> bool:
        """Whether a request may take the id ``robot_id`` of ``agent``: free, or held by a request of the shared
        topic while this one came on the agent's own (the held one is canceled, and nothing more of it sent)."""
        with self._lock:
            node_id = self._by_robot.get((agent, robot_id))
            held = self._live.get(node_id) if node_id is not None else None
        if node_id is None:
            return True
        if not own or held is None or held.own:  # not a word on its topics: the live request may be the robot's
            return False
        self._log.warn(agent, f"request id {robot_id[:MAX_ID_CHARS]!r} of {agent!r} was taken on the shared "
                              "task_requests: that request is canceled, the one on the robot's own topic served")
        self._forget(node_id)
        self._cancel(node_id)
        return True

    def _on_cancel(self, agent: str, message: String) -> None:
        """A robot cancels one of its requests (by its request id) on its own ``<agent_id>/cancel``."""
        with self._lock:
            node_id = self._by_robot.get((agent, message.data))
        if node_id is None:
            self._log.warn(agent, f"ignored cancel of {message.data[:MAX_ID_CHARS]!r} on {agent!r}'s topic: "
                                  "no such request of it in flight")
            return
        self._cancel(node_id)

    def _refuse(self, agent: str, robot_id: str, reason: str) -> None:
        self._log.warn(agent, f"rejected task request {robot_id[:MAX_ID_CHARS]!r} from {agent!r}: {reason}")
        endpoints = self._endpoints(agent)
        if endpoints is None:  # too many robots: no topic of its own to answer on
            return
        endpoints.results.publish(plan_result(aborted_result(reason), _Live(agent, robot_id[:MAX_ID_CHARS])))

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
        if not isinstance(item, RequestPlan.Feedback | RequestPlan.Result):  # an action goal's state change only
            return True
        endpoints = self._endpoints(live.agent)
        if endpoints is None:  # its topics were dropped while its result was on its way, and no room is left
            self._node.get_logger().error(f"no topics left to tell {live.agent!r} of request {live.request_id!r}")
            self._forget(node_id)
            return True
        if isinstance(item, RequestPlan.Feedback):
            if item.segment.request_id:  # the infeasibility notice has no segment and no topic message
                item.segment.request_id = live.request_id
                endpoints.segments.publish(item.segment)
            return True
        self._forget(node_id)
        endpoints.results.publish(plan_result(item, live))
        return True

    def to_node(self, report: SegmentDone) -> SegmentDone:
        """A robot's report on a topic request, under the node's id for it; any other report as it came."""
        with self._lock:
            node_id = self._by_robot.get((report.agent_id, report.request_id))
        if node_id is not None:
            report.request_id = node_id
        return report

    def _endpoints(self, agent: str) -> TopicEndpoints | None:
        """The agent's topics (made again if dropped meanwhile); None when too many robots hold theirs."""
        if self._agents.admit(agent):
            return None
        return self._agents.topic_endpoints(agent, self._on_cancel)


def _request_id_error(robot_id: str) -> str | None:
    if not robot_id:
        return "empty request id"
    if len(robot_id) > MAX_ID_CHARS:
        return f"request id longer than {MAX_ID_CHARS} characters"
    return None


def plan_result(result: RequestPlan.Result, live: _Live) -> PlanResult:
    """The topic message of how a request ended, under the robot's ids."""
    return PlanResult(request_id=live.request_id, agent_id=live.agent, status=result.status, reason=result.reason,
                      plan=result.plan, response_time=result.response_time, waiting_time=result.waiting_time,
                      utility=result.utility, num_segments=result.num_segments)
