"""An entity destroyed while the executor spins: its work is void, the spinning goes on for the rest; the end of a
``spinning`` block."""

from __future__ import annotations

import threading
import time

import rclpy
from guards import wait_until
from rclpy.callback_groups import ReentrantCallbackGroup
from rclpy.context import Context
from rclpy.exceptions import InvalidHandle
from rclpy.node import Node
from timely_llm_interfaces.rclpy_compat import spinning


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


def test_leaving_spinning_waits_for_the_callbacks_still_running(ros_domain: int) -> None:
    """Jazzy's executor.shutdown() does not wait for them, and destroys the guard condition they trigger."""
    context = Context()
    rclpy.init(context=context, domain_id=ros_domain)
    started, ended = threading.Event(), threading.Event()

    def slow() -> None:
        started.set()
        time.sleep(0.5)
        ended.set()

    try:
        node = Node("teardown", context=context)
        with spinning(context, threads=2) as executor:
            executor.add_node(node)
            node.create_timer(0.01, slow, callback_group=ReentrantCallbackGroup())
            assert started.wait(10.0)
        assert ended.is_set()
        node.destroy_node()
    finally:
        rclpy.try_shutdown(context=context)
