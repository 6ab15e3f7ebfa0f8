"""Test nodes: one spun by a session's executor (the ``session`` fixture's context and executor) while a block runs,
and a listener to an agent's topics."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rclpy.node import Node


@contextmanager
def spun_node(session: tuple, name: str, namespace: str = "") -> Iterator:
    """A node named ``name`` (in ``namespace``), spun by the session's executor while the block runs."""
    from rclpy.node import Node

    context, executor = session
    node = Node(name, namespace=namespace, context=context)
    executor.add_node(node)
    try:
        yield node
    finally:
        executor.remove_node(node)
        node.destroy_node()


class Heard:
    """Every message on an agent's ``segments`` and ``plan_result`` topics, whoever sent it or is meant by it."""

    def __init__(self, node: Node, agent: str) -> None:
        from timely_llm_interfaces.names import agent_topics
        from timely_llm_interfaces.qos import AGENT_QOS

        from timely_llm.ros.interfaces import PlanResult, Segment

        self.segments: list[Segment] = []
        self.results: list[PlanResult] = []
        segments, results = agent_topics(agent)
        node.create_subscription(Segment, segments, self.segments.append, AGENT_QOS)
        node.create_subscription(PlanResult, results, self.results.append, AGENT_QOS)
