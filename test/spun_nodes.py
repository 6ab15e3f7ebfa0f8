"""A test node spun by a session's executor (the ``session`` fixture's context and executor) while a block runs."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


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
