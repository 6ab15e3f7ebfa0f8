"""A fake Nav2: ``navigate_to_pose``, ``dock_robot`` and ``undock_robot`` action servers of the real nav2_msgs types
(the subset in ../shared/nav2_msgs, built into the venv by scripts/build_interfaces.sh), in a ROS context of their
own as Nav2 runs in a process of its own. Each goal is recorded and answered as the test's script says: succeed
after a while, abort with an error code and message, or hang until canceled.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import rclpy
from rclpy.action import ActionServer, CancelResponse, GoalResponse
from rclpy.callback_groups import ReentrantCallbackGroup
from rclpy.context import Context
from rclpy.node import Node
from timely_llm_interfaces.rclpy_compat import spinning

NAV2_MISSING = ("nav2_msgs is not installed in this venv: scripts/build_interfaces.sh builds it from "
                "../shared/nav2_msgs beside the checkout (none found there)")
HANG_LIMIT_S = 120.0


@dataclass(frozen=True)
class Answer:
    """How the fake answers a goal: succeed after ``seconds``, abort with ``error_code``/``error_msg``, or
    (``hang``) run until canceled."""

    seconds: float = 0.2
    error_code: int = 0
    error_msg: str = ""
    hang: bool = False


@dataclass
class Received:
    action: str
    goal: object
    ended: str = ""
    """succeeded, aborted or canceled, once the fake ended it."""
    cancel_requested: bool = False


@dataclass
class FakeNav2:
    answer: Callable[[str, object], Answer] = field(default=lambda action, goal: Answer())
    received: list[Received] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def goals(self, action: str) -> list[Received]:
        with self.lock:
            return [r for r in self.received if r.action == action]

    def execute(self, action: str, result_type: type, goal_handle: object) -> object:
        record = Received(action, goal_handle.request)
        with self.lock:
            self.received.append(record)
        answer = self.answer(action, goal_handle.request)
        end = time.monotonic() + (HANG_LIMIT_S if answer.hang else answer.seconds)
        while time.monotonic() < end:
            if goal_handle.is_cancel_requested:
                record.cancel_requested, record.ended = True, "canceled"
                goal_handle.canceled()
                return result_type()
            time.sleep(0.01)
        result = result_type()
        if answer.error_code or answer.error_msg:
            result.error_code = answer.error_code
            if hasattr(result, "error_msg"):
                result.error_msg = answer.error_msg
            record.ended = "aborted"
            goal_handle.abort()
            return result
        record.ended = "succeeded"
        goal_handle.succeed()
        return result


@contextmanager
def fake_nav2(domain_id: int, answer: Callable[[str, object], Answer] | None = None,
              namespace: str = "") -> Iterator[FakeNav2]:
    """The fake's three action servers in a context of their own on ``domain_id``, while the block runs."""
    from nav2_msgs.action import DockRobot, NavigateToPose, UndockRobot

    fake = FakeNav2() if answer is None else FakeNav2(answer)
    context = Context()
    rclpy.init(context=context, domain_id=domain_id)
    try:
        with spinning(context) as executor:
            node = Node("fake_nav2", namespace=namespace, context=context)
            group = ReentrantCallbackGroup()
            servers = [ActionServer(node, action_type, name,
                                    execute_callback=lambda handle, n=name, t=action_type: fake.execute(n, t.Result,
                                                                                                        handle),
                                    goal_callback=lambda goal: GoalResponse.ACCEPT,
                                    cancel_callback=lambda handle: CancelResponse.ACCEPT, callback_group=group)
                       for name, action_type in (("navigate_to_pose", NavigateToPose), ("dock_robot", DockRobot),
                                                 ("undock_robot", UndockRobot))]
            executor.add_node(node)
            try:
                yield fake
            finally:
                executor.remove_node(node)
                for server in servers:
                    server.destroy()
                node.destroy_node()
    finally:
        rclpy.try_shutdown(context=context)
