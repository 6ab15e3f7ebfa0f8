"""Each robot's own topics on the node: the names only that robot uses, so that SROS2 can keep the others off them.

For every agent with a request in flight the node subscribes ``<agent_id>/segment_done`` (its reports) and, for a
robot on the topic interface, ``<agent_id>/cancel`` (``std_msgs/String``: the robot's request id), and publishes
``<agent_id>/segments`` and ``<agent_id>/plan_result`` (``topic_requests``). All are relative to the node's
namespace. A report is applied only to goals of the agent whose topic it came on (``robot_reports``), so a client
that may publish only on its own topics cannot fail, advance or cancel another robot's plan.

Bound and cleanup. A goal or a task request names its agent, and without DDS Security nothing in ROS 2 tells who
sent it: one client could name a new agent in every request and make the node create endpoints without end. So:

- an agent's endpoints are made when a request of it passes the goal checks (and for a task request refused for
  its fields, whose refusal goes to the agent's ``plan_result``), and destroyed once the agent has had no request
  in flight for :data:`IDLE_S` (a robot sending plan after plan keeps them, so its next report does not wait for
  a new subscription to be discovered);
- at most :data:`MAX_AGENTS` agents have endpoints at once (the node is sized for 1,000 goals in flight). A new
  agent past that takes the place of the idle agent whose last request came least recently (one the fleet file
  does not name, first); when every one has a request in flight, the new agent's request is refused ("too many
  robots"), and no endpoint is made;
- the agents a fleet file names by their own id (``named``) have slots kept for them: agents it does not name
  (matched by a pattern, or every agent without a fleet file) hold at most MAX_AGENTS less the named ones, so
  however many ids a client makes up, every named robot finds its slot. (With a fleet file an agent it does not
  match at all is refused before it reaches this.)

The agent ids a hostile client makes up thus cost the node at most MAX_AGENTS agents' endpoints, held only while
their requests are in flight (which the goal checks and the watchdog bound) and IDLE_S after.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from rclpy.callback_groups import CallbackGroup
from rclpy.node import Node
from rclpy.publisher import Publisher
from rclpy.subscription import Subscription
from std_msgs.msg import String
from timely_llm_interfaces.names import agent_topics, cancel_topic, report_topic
from timely_llm_interfaces.qos import AGENT_QOS, DEEP_RELIABLE

from timely_llm.ros.interfaces import PlanResult, SegmentDone
from timely_llm.ros.interfaces import Segment as SegmentMsg
from timely_llm.ros.topic_pump import TopicPump

MAX_AGENTS = 1024
IDLE_S = 30.0
"""An agent with no request in flight keeps its endpoints this long."""
SWEEP_S = 1.0


@dataclass
class TopicEndpoints:
    """A topic-interface robot's: the node's segments and plan_result publishers, its cancel subscription."""

    segments: Publisher
    results: Publisher
    cancel: Subscription
    """Its handle in the pump."""


@dataclass
class _Agent:
    report: Subscription
    """Its handle in the pump."""
    topic: TopicEndpoints | None = None
    idle_since: float | None = None


class AgentTopics:
    """The per-agent endpoints, made on demand and swept when idle (see the module).

    Used from one callback group only (the goals'), which also runs the sweep: no lock.
    ``busy()`` names the agents with a request in flight; ``on_report(agent, report)`` and
    ``on_cancel(agent, message)`` get what arrives on an agent's own topics, on the pump's thread
    (``topic_pump``: subscriptions kept out of the executor, whose every wake-up would cost O(robots)).
    """

    def __init__(self, node: Node, busy: Callable[[], set[str]], on_report: Callable[[str, SegmentDone], None],
                 goals_group: CallbackGroup) -> None:
        self._node, self._busy, self._on_report = node, busy, on_report
        self._pump = TopicPump(node)
        self._agents: OrderedDict[str, _Agent] = OrderedDict()  # least recently admitted first
        self.named: frozenset[str] = frozenset()
        """The agent ids the fleet file names itself: slots are kept for them (set at configure)."""
        node.create_timer(SWEEP_S, self.sweep, callback_group=goals_group)

    def admit(self, agent: str) -> str | None:
        """Make sure ``agent``'s report subscription exists; why it cannot (too many robots), or None."""
        if agent in self._agents:
            self._agents.move_to_end(agent)
            return None
        if not self._room_for(agent):
            return f"too many robots: {MAX_AGENTS} have requests in flight ({len(self.named)} slots kept for the " \
                   "robots the fleet file names)"
        self._agents[agent] = _Agent(self._pump.subscribe(
            SegmentDone, report_topic(agent), DEEP_RELIABLE, lambda report: self._on_report(agent, report)))
        return None

    @property
    def pump(self) -> TopicPump:
        """The thread that takes the robots' own topics (``topic_pump``)."""
        return self._pump

    def topic_endpoints(self, agent: str, on_cancel: Callable[[str, String], None]) -> TopicEndpoints:
        """An admitted agent's topic-interface endpoints, made on first use."""
        held = self._agents[agent]
        if held.topic is None:
            segments, results = agent_topics(agent)
            held.topic = TopicEndpoints(
                self._node.create_publisher(SegmentMsg, segments, AGENT_QOS),
                self._node.create_publisher(PlanResult, results, AGENT_QOS),
                self._pump.subscribe(String, cancel_topic(agent), DEEP_RELIABLE, lambda m: on_cancel(agent, m)))
        return held.topic

    def sweep(self) -> None:
        """Destroy the endpoints of agents idle for IDLE_S."""
        now, busy = time.monotonic(), self._busy()
        for agent, held in list(self._agents.items()):
            if agent in busy:
                held.idle_since = None
            elif held.idle_since is None:
                held.idle_since = now
            elif now - held.idle_since >= IDLE_S:
                self._drop(agent)

    def _room_for(self, agent: str) -> bool:
        """Room for a new agent's endpoints, made by dropping an idle agent's if need be."""
        if agent not in self.named:
            unnamed = sum(1 for held in self._agents if held not in self.named)
            if unnamed >= MAX_AGENTS - len(self.named) and not self._drop_least_recent_idle(unnamed_only=True):
                return False
        return len(self._agents) < MAX_AGENTS or self._drop_least_recent_idle(unnamed_only=False)

    def _drop_least_recent_idle(self, unnamed_only: bool) -> bool:
        """Drop the least recently admitted idle agent the fleet file does not name (else, unless ``unnamed_only``,
        the least recent idle one); False if there is none."""
        busy = self._busy()
        idle = [agent for agent in self._agents if agent not in busy]
        chosen = next((agent for agent in idle if agent not in self.named), None)
        if chosen is None and not unnamed_only and idle:
            chosen = idle[0]
        if chosen is None:
            return False
        self._drop(chosen)
        return True

    def _drop(self, agent: str) -> None:
        held = self._agents.pop(agent)
        self._pump.unsubscribe(held.report)
        if held.topic is not None:
            self._node.destroy_publisher(held.topic.segments)
            self._node.destroy_publisher(held.topic.results)
            self._pump.unsubscribe(held.topic.cancel)

    def close(self) -> None:
        """Stop taking messages (before the node is destroyed)."""
        self._pump.close()
