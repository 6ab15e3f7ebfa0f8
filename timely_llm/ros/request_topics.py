"""Each robot's own request topic, ``<agent_id>/task_requests`` (relative to the node's namespace), beside the
shared ``task_requests``: a name only that robot publishes on, so that with SROS2 (``timely-llm security-policy``)
a robot can only ever ask as itself.

ROS has no wildcard subscription, so the node finds these topics in the ROS graph: every :data:`DISCOVER_S` it
lists the topics of type ``TaskRequest`` named ``<agent_id>/task_requests`` under its namespace and subscribes to
those of the agents that may ask (``may_ask``: with a fleet file, the ones it names or matches), at most
:data:`MAX_TOPICS` (those the fleet file names by id first). Every :data:`PRUNE_S` it drops the subscriptions
whose topic has no publisher left. A robot's client waits for the node's subscription before its first request
(``TopicRobotClient``).

The subscriptions are the topic pump's (``topic_pump``: out of the node's executor); a request that arrives is
queued and handed to the goals' callback group by a guard condition, as every request is taken there.
"""

from __future__ import annotations

import collections
import functools
import time
from collections.abc import Callable

from rclpy.callback_groups import CallbackGroup
from rclpy.node import Node
from rclpy.subscription import Subscription
from timely_llm_interfaces.names import TASK_REQUESTS, agent_id_error
from timely_llm_interfaces.qos import TASK_REQUESTS_QOS

from timely_llm.ros.fleet_file import own_request_topic
from timely_llm.ros.interfaces import TaskRequest
from timely_llm.ros.topic_pump import TopicPump

DISCOVER_S = 0.5
PRUNE_S = 30.0
MAX_TOPICS = 1024
TYPE_NAME = "timely_llm_interfaces/msg/TaskRequest"


class RequestTopics:
    """``on_request(agent, request)`` gets each request that came on ``agent``'s own request topic, in the goals'
    callback group; ``may_ask(agent)``: whether the agent may ask at all; ``named(agent)``: the fleet file names
    it by id (its topic is subscribed first)."""

    def __init__(self, node: Node, pump: TopicPump, on_request: Callable[[str, TaskRequest], None],
                 may_ask: Callable[[str], bool], named: Callable[[str], bool], group: CallbackGroup) -> None:
        self._node, self._pump, self._on_request, self._may_ask, self._named = node, pump, on_request, may_ask, named
        self._subscribed: dict[str, Subscription] = {}  # agent -> its subscription in the pump
        self._inbox: collections.deque[tuple[str, object]] = collections.deque()
        self._ready = node.create_guard_condition(self._drain, callback_group=group)
        self._pruned_at = time.monotonic()
        namespace = node.get_namespace().rstrip("/")
        self._prefix = f"{namespace}/"
        node.create_timer(DISCOVER_S, self.discover, callback_group=group)

    @property
    def agents(self) -> set[str]:
        """The agents whose request topic is subscribed."""
        return set(self._subscribed)

    def discover(self) -> None:
        """Subscribe the request topics that appeared (and drop, now and then, those without a publisher)."""
        found = [agent for agent in map(self._agent_of, self._node.get_topic_names_and_types()) if agent]
        new = sorted((a for a in found if a not in self._subscribed and self._may_ask(a)),
                     key=lambda agent: not self._named(agent))
        if len(self._subscribed) + len(new) > MAX_TOPICS or time.monotonic() - self._pruned_at >= PRUNE_S:
            self._prune()
        for agent in new[:max(0, MAX_TOPICS - len(self._subscribed))]:
            self._subscribed[agent] = self._pump.subscribe(
                TaskRequest, own_request_topic(agent), TASK_REQUESTS_QOS, functools.partial(self._queue, agent))

    def _agent_of(self, name_and_types: tuple[str, list[str]]) -> str | None:
        name, types = name_and_types
        suffix = f"/{TASK_REQUESTS}"
        if TYPE_NAME not in types or not name.endswith(suffix) or not name.startswith(self._prefix):
            return None
        agent = name[len(self._prefix):-len(suffix)]
        return None if "/" in agent or agent_id_error(agent) else agent

    def _prune(self) -> None:
        self._pruned_at = time.monotonic()
        for agent, handle in list(self._subscribed.items()):
            name = f"{self._prefix}{own_request_topic(agent)}"
            if not self._node.count_publishers(name) or not self._may_ask(agent):
                self._pump.unsubscribe(handle)
                del self._subscribed[agent]

    def _queue(self, agent: str, request: object) -> None:
        """The pump's thread: hand the request to the goals' callback group."""
        self._inbox.append((agent, request))
        self._ready.trigger()

    def _drain(self) -> None:
        while self._inbox:
            agent, request = self._inbox.popleft()
            self._on_request(agent, request)
