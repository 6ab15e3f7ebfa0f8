"""An entity destroyed while the executor spins: its work is void, the spinning goes on for the rest."""

from __future__ import annotations

import threading

from guards import wait_until
from rclpy.exceptions import InvalidHandle
from rclpy.node import Node


def test_spinning_goes_on_after_a_task_meets_a_destroyed_entity(session: tuple) -> None:
    context, executor = session
    node = Node("teardown", context=context)
    ticks: list[int] = []
    raised = threading.Event()

    def meets_destroyed() -> None:  # what rclpy raises when a task uses an entity destroyed since the wait
        if not raised.is_set():
            raised.set()
            raise InvalidHandle("cannot use Destroyable because destruction was requested")

    node.create_timer(0.01, meets_destroyed)
    node.create_timer(0.01, lambda: ticks.append(1))
    executor.add_node(node)
    try:
        wait_until(raised.is_set, 10.0, "the timer that raises")
        after = len(ticks)
        wait_until(lambda: len(ticks) >= after + 20, 10.0, "ticks after the InvalidHandle")
    finally:
        executor.remove_node(node)
        node.destroy_node()
