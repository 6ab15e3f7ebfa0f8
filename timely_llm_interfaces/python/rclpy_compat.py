"""What both ends of the wire need of rclpy beyond its public API, in one place: the names that moved between the
distributions the node runs on (Humble, Jazzy), an executor spun in a thread that stops cleanly, and an action
server that may refuse a cancel request whole.

Every use of rclpy's private API in timely_llm's packages is here (``test/test_public_rclpy.py`` holds it; the
same in Humble and Jazzy), so that a new rclpy release is checked in one place:

- ``await_handlers`` reads ``Executor._futures``, the callbacks a MultiThreadedExecutor has handed to its threads,
  which Jazzy's ``shutdown()`` does not wait for;
- ``CancelScreeningActionServer`` overrides ``ActionServer._execute_cancel_request`` and answers a refused cancel
  request through the action server's ``_handle`` (``send_cancel_response``): rclpy's ``cancel_callback`` is asked
  goal by goal, so it cannot refuse a request that names every goal without canceling some;
- ``mark_executing`` moves a goal to EXECUTING through ``ServerGoalHandle._update_state`` and ``conclude`` runs its
  execute callback through ``ActionServer.notify_execute``: rclpy moves a goal to EXECUTING only in ``execute``,
  which schedules the callback at once, and a callback that waits for the goal's end is a task the executor resumes
  on every wake-up, a cost per goal in flight on every message.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import rclpy
import rclpy.executors
from action_msgs.msg import GoalStatus
from action_msgs.srv import CancelGoal
from rclpy.action import ActionServer
from rclpy.action.server import GoalEvent, ServerGoalHandle
from rclpy.context import Context
from rclpy.exceptions import InvalidHandle

try:  # Iron and later
    from rclpy.event_handler import PublisherEventCallbacks, SubscriptionEventCallbacks
except ImportError:  # Humble
    from rclpy.qos_event import PublisherEventCallbacks, SubscriptionEventCallbacks

__all__ = ["CancelScreeningActionServer", "PublisherEventCallbacks", "SubscriptionEventCallbacks", "await_handlers",
           "conclude", "mark_executing", "spin", "spinning"]

EXECUTOR_THREADS = 8
"""A session shared with clients that may wait (tests, fleet, demo): one thread per callback group (goals and
results, reports, watchdog, status and diagnostics, lifecycle transitions, lifecycle queries, parameters) and
one spare, so no goal holds a thread."""
SPIN_WAKE_S = 0.1
"""The executor re-examines its work at least this often: a lost wake-up costs this, not a stalled node."""
HANDLERS_WAIT_S = 2.0
"""How long the end of a ``spinning`` block waits for the callbacks its executor's threads are still running."""

def spin(executor: rclpy.executors.Executor, stop: threading.Event) -> None:
    """``executor.spin()`` until ``stop`` is set, but never waiting for work longer than SPIN_WAKE_S.

    Seen under load with rclpy Jazzy's MultiThreadedExecutor: a wait that began while a
    timer's callback group was busy was not woken when the group became free, and the
    node's timers stopped until some message happened to arrive.

    A task that met an entity destroyed since the executor's wait (``InvalidHandle``, re-raised
    here by ``spin_once``) concerned a node already gone: the spinning goes on for the others.
    Join the thread running this before ``executor.shutdown()`` (:func:`spinning` does): Jazzy's
    shutdown destroys the executor's guard condition without waiting for callbacks in flight,
    and every task a ``spin_once`` still makes triggers it.
    """
    while not stop.is_set() and executor.context.ok():
        try:
            executor.spin_once(timeout_sec=SPIN_WAKE_S)
        except rclpy.executors.ExternalShutdownException:
            return
        except InvalidHandle:
            continue


@contextmanager
def spinning(context: Context | None = None, threads: int = EXECUTOR_THREADS) -> Iterator[rclpy.executors.Executor]:
    """An executor spinning in a thread of its own; stopped, then shut down, when the block ends. ``threads`` 1:
    a SingleThreadedExecutor, else a MultiThreadedExecutor (a session shared with clients that may wait)."""
    executor = (rclpy.executors.SingleThreadedExecutor(context=context) if threads == 1
                else rclpy.executors.MultiThreadedExecutor(num_threads=threads, context=context))
    stop = threading.Event()
    spinner = threading.Thread(target=spin, args=(executor, stop), name="executor", daemon=True)
    spinner.start()
    try:
        yield executor
    finally:
        stop.set()
        spinner.join()  # before the shutdown: see spin
        await_handlers(executor, HANDLERS_WAIT_S)
        executor.shutdown()


def await_handlers(executor: rclpy.executors.Executor, timeout_s: float) -> None:
    """Wait, at most ``timeout_s``, for the callbacks a MultiThreadedExecutor has handed to its threads.

    Each one triggers the executor's guard condition, which Jazzy's ``shutdown()`` destroys without waiting
    for them (the wait its docstring promises is skipped): the callback then fails with InvalidHandle, and
    rclpy prints "The following exception was never retrieved" when its task is collected.
    """
    deadline = time.monotonic() + timeout_s
    for task in list(getattr(executor, "_futures", ())):
        while not task.done() and time.monotonic() < deadline:
            time.sleep(0.005)


class CancelScreeningActionServer(ActionServer):
    """rclpy's ActionServer that screens each cancel request as a whole before rclpy asks ``cancel_callback`` goal
    by goal: where ``screen_cancel(goal_info)`` (the request's ``action_msgs/GoalInfo``) gives a reason, the request
    is refused whole (``ERROR_REJECTED``, no goal canceling) and ``on_refused_cancel(reason)`` told; where it gives
    None, rclpy handles the request as usual."""

    def __init__(self, *args: Any, screen_cancel: Callable[[Any], str | None],
                 on_refused_cancel: Callable[[str], None], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._screen_cancel = screen_cancel
        self._on_refused_cancel = on_refused_cancel

    async def _execute_cancel_request(self, request_header_and_message: tuple) -> None:
        request_header, request = request_header_and_message
        refused = self._screen_cancel(request.goal_info)
        if refused is None:
            await super()._execute_cancel_request(request_header_and_message)
            return
        self._on_refused_cancel(refused)
        try:
            self._handle.send_cancel_response(request_header, CancelGoal.Response(
                return_code=CancelGoal.Response.ERROR_REJECTED))
        except RuntimeError:  # rclpy's RCLError (a RuntimeError): the client went away
            pass


def mark_executing(goal_handle: ServerGoalHandle) -> None:
    """Move an ACCEPTED goal to EXECUTING (its status published) without running an execute callback: ``conclude``
    runs one once the goal's result is there, so no task waits on the goal meanwhile."""
    goal_handle._update_state(GoalEvent.EXECUTE)


def conclude(goal_handle: ServerGoalHandle, execute_callback: Callable[[ServerGoalHandle], Any]) -> None:
    """Run ``execute_callback`` once, on the executor, for a goal whose result is there: through ``execute`` if it is
    still ACCEPTED, else (``mark_executing`` made it EXECUTING, or a cancel CANCELING) as ``execute`` does after its
    transition, which it would refuse there."""
    if goal_handle.status == GoalStatus.STATUS_ACCEPTED:
        goal_handle.execute(execute_callback)
    else:
        goal_handle._action_server.notify_execute(goal_handle, execute_callback)
