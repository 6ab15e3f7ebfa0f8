"""Subscriptions read by a thread of their own instead of the executor: the node's one subscription per robot.

rclpy Jazzy's executors rebuild their wait set in Python on each wake-up from every subscription of their nodes
and the two QoS-event waitables rclpy gives each by default, and a goal wakes the executor several times. A
guard condition's wake-up cost 0.04 ms of CPU beside no other subscription, 0.64 ms beside 100 and 7.0 ms beside
500 idle subscriptions with their default event handlers, 0.56 ms beside 500 without (this project's 2-core
machine, load average about 20). The pump keeps them out of the executor: one wait set over these subscriptions
only, built from their handles in a few C calls each, waited on in a thread that takes every ready message and
hands it to its callback; they have no event handlers. Subscribing or unsubscribing wakes it. The subscriptions
are the node's (its handle makes them), so the ROS graph and SROS2 see them as the node's own.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable

from rclpy.impl.implementation_singleton import rclpy_implementation as _rclpy
from rclpy.node import Node
from rclpy.qos import QoSProfile
from rclpy.type_support import check_is_valid_msg_type

WAIT_S = 0.1
"""The thread re-checks whether it should stop at least this often."""


class TopicPump:
    """``subscribe(type, topic, qos, callback)`` -> a handle for ``unsubscribe``; callbacks run on the pump's thread,
    one message at a time; one that raises is logged, and the next message goes on."""

    def __init__(self, node: Node) -> None:
        self._node, self._context = node, node.context
        self._lock = threading.Lock()
        self._subscriptions: dict[object, tuple[type, Callable[[object], None]]] = {}
        with self._context.handle:
            self._wake = _rclpy.GuardCondition(self._context.handle)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="timely_llm_topic_pump", daemon=True)
        self._thread.start()

    def subscribe(self, msg_type: type, topic: str, qos: QoSProfile, callback: Callable[[object], None]) -> object:
        check_is_valid_msg_type(msg_type)  # also loads its type support, as create_subscription does
        with self._node.handle:
            handle = _rclpy.Subscription(self._node.handle, msg_type, topic, qos.get_c_qos_profile())
        with self._lock:
            self._subscriptions[handle] = (msg_type, callback)
        self._wake.trigger_guard_condition()
        return handle

    def unsubscribe(self, handle: object) -> None:
        with self._lock:
            self._subscriptions.pop(handle, None)
        handle.destroy_when_not_in_use()  # after the wait that may hold it
        self._wake.trigger_guard_condition()

    def close(self) -> None:
        """Stop the thread and destroy every subscription (before the node is destroyed)."""
        self._stop.set()
        with contextlib.suppress(_rclpy.InvalidHandle):
            self._wake.trigger_guard_condition()
        self._thread.join()
        with self._lock:
            handles, self._subscriptions = list(self._subscriptions), {}
        for handle in handles:
            handle.destroy_when_not_in_use()
        self._wake.destroy_when_not_in_use()

    def _run(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                subscriptions = dict(self._subscriptions)
            try:
                self._wait_and_take(subscriptions)
            except Exception as exc:  # noqa: BLE001 - the context shut down, or one entity went: wait again
                if self._stop.is_set() or not self._context.ok():
                    return
                self._node.get_logger().debug(f"topic pump: {exc!r}")

    def _wait_and_take(self, subscriptions: dict[object, tuple[type, Callable[[object], None]]]) -> None:
        with contextlib.ExitStack() as held:  # no handle is destroyed while waited on
            handles = []
            for handle in subscriptions:
                with contextlib.suppress(_rclpy.InvalidHandle):
                    held.enter_context(handle)
                    handles.append(handle)
            held.enter_context(self._wake)
            held.enter_context(self._context.handle)
            wait_set = _rclpy.WaitSet(len(handles), 1, 0, 0, 0, 0, self._context.handle)
            wait_set.clear_entities()
            for handle in handles:
                wait_set.add_subscription(handle)
            wait_set.add_guard_condition(self._wake)
            wait_set.wait(round(WAIT_S * 1e9))
            ready = set(wait_set.get_ready_entities("subscription"))
            for handle in handles:
                if handle.pointer in ready:
                    msg_type, callback = subscriptions[handle]
                    while (taken := handle.take_message(msg_type, False)) is not None:
                        self._call(callback, taken[0])

    def _call(self, callback: Callable[[object], None], message: object) -> None:
        try:
            callback(message)
        except Exception as exc:  # noqa: BLE001 - one bad message must not stop the others'
            self._node.get_logger().error(f"handling a {type(message).__name__} failed: {exc!r}")
