"""The lifecycle services moved so that a transition never blocks the executor."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable

import rclpy.task
from lifecycle_msgs.srv import ChangeState, GetAvailableStates, GetAvailableTransitions, GetState
from rclpy.callback_groups import CallbackGroup, MutuallyExclusiveCallbackGroup
from rclpy.lifecycle import LifecycleNode

LIFECYCLE_QUERIES = (GetState, GetAvailableStates, GetAvailableTransitions)
"""The types of the lifecycle services that only answer (get_transition_graph is a GetAvailableTransitions)."""


def regroup_lifecycle_services(node: LifecycleNode, transitions: CallbackGroup,
                               transition_lock: threading.RLock) -> None:
    """ChangeState in the transitions' callback group, the lifecycle queries in one of their own.

    rclpy puts every lifecycle service in the node's default callback group, with the parameter
    services: a configure loading the engine for minutes would hold get_state and the parameters
    unanswered. ChangeState is also guarded: rclpy raises an invalid transition's RCLError (a
    RuntimeError) out of the service callback, which would stop the executor.
    """
    queries = MutuallyExclusiveCallbackGroup()
    (change_state_service,) = (s for s in node.services if s.srv_type is ChangeState)
    for service in node.services:
        if service.srv_type is ChangeState or service.srv_type in LIFECYCLE_QUERIES:
            group = transitions if service is change_state_service else queries
            service.callback_group.entities.discard(weakref.ref(service))
            service.callback_group = group
            group.add_entity(service)
    change_state = change_state_service.callback

    def guarded_change_state(request: ChangeState.Request, response: ChangeState.Response) -> ChangeState.Response:
        with transition_lock:
            try:
                return change_state(request, response)
            except RuntimeError as exc:
                transition = request.transition.label or request.transition.id
                node.get_logger().warning(f"refused lifecycle transition {transition!r}: {exc}")
                response.success = False
                return response

    async def change_state_off_the_executor(request: ChangeState.Request,
                                           response: ChangeState.Response) -> ChangeState.Response:
        # A coroutine callback: the executor polls it between other callbacks, so even a single-threaded
        # executor keeps answering get_state and the parameters while a configure loads the engine.
        return await _in_thread("timely_llm_transition", guarded_change_state, request, response)

    # rclpy's executor awaits a coroutine callback; Service.callback's annotation allows only a plain function
    change_state_service.callback = change_state_off_the_executor  # type: ignore[assignment]


def _in_thread(name: str, function: Callable[..., object], *args: object) -> rclpy.task.Future:
    """``function(*args)`` run in a thread of its own; the future an executor's coroutine callback can await."""
    done = rclpy.task.Future()

    def run() -> None:
        try:
            done.set_result(function(*args))
        except BaseException as exc:  # noqa: BLE001 - handed to whoever awaits it
            done.set_exception(exc)

    threading.Thread(target=run, name=name, daemon=True).start()
    return done
