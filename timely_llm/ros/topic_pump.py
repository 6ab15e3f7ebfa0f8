"""Subscriptions read by an executor of their own instead of the node's: the node's one subscription per robot.

rclpy's executors rebuild their wait set in Python on each wake-up from every subscription of their nodes and
the two QoS-event waitables rclpy gives each by default, and a goal wakes the node's executor several times. A
guard condition's wake-up cost 0.04 ms of CPU beside no other subscription, 0.64 ms beside 100 and 7.0 ms beside
500 idle subscriptions with their default event handlers, 0.56 ms beside 500 without (this project's 2-core
machine, load average about 20). The pump keeps them out of the node's executor: they belong to a second node in
the same context and namespace (``<node>_robot_topics``), made without event handlers and spun by a
SingleThreadedExecutor in a thread of its own, so only a robot's report or cancel wakes it, and the node's
executor never walks them. Callbacks run on that thread, one message at a time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from rclpy.executors import SingleThreadedExecutor
from rclpy.node import Node
from rclpy.qos import QoSProfile
from rclpy.subscription import Subscription
from timely_llm_interfaces.rclpy_compat import SubscriptionEventCallbacks

WAIT_S = 0.1
"""The thread re-checks whether it should stop at least this often."""


class TopicPump:
    """``subscribe(type, topic, qos, callback)`` -> a handle for ``unsubscribe``; callbacks run on the pump's thread,
    one message at a time; one that raises is logged, and the next message goes on."""

    def __init__(self, node: Node) -> None:
        self._log = node.get_logger()
        name = f"{node.get_name()}_robot_topics"
        # A local remap, so that a launch file's global __node:= (the server's name) does not name this node too.
        self._node = Node(name, namespace=node.get_namespace(), context=node.context,
                          cli_args=["--ros-args", "-r", f"__node:={name}"], start_parameter_services=False)
        self._executor = SingleThreadedExecutor(context=node.context)
        self._executor.add_node(self._node)
        self._quiet = SubscriptionEventCallbacks(use_default_callbacks=False)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="timely_llm_topic_pump", daemon=True)
        self._thread.start()

    def subscribe(self, msg_type: type, topic: str, qos: QoSProfile,
                  callback: Callable[[object], None]) -> Subscription:
        return self._node.create_subscription(msg_type, topic, lambda message: self._call(callback, message), qos,
                                              event_callbacks=self._quiet)

    def unsubscribe(self, handle: Subscription) -> None:
        self._node.destroy_subscription(handle)  # rclpy destroys it once the wait that may hold it has ended

    def close(self) -> None:
        """Stop the thread and destroy every subscription (before the node is destroyed)."""
        self._stop.set()
        self._executor.wake()
        self._thread.join()
        self._executor.shutdown()
        self._node.destroy_node()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._executor.spin_once(timeout_sec=WAIT_S)
            except Exception as exc:  # noqa: BLE001 - the context shut down, or one entity went: wait again
                if self._stop.is_set() or not self._node.context.ok():
                    return
                self._log.debug(f"topic pump: {exc!r}")

    def _call(self, callback: Callable[[object], None], message: object) -> None:
        try:
            callback(message)
        except Exception as exc:  # noqa: BLE001 - one bad message must not stop the others'
            self._log.error(f"handling a {type(message).__name__} failed: {exc!r}")
