"""rclpy_compat's goal execution: a goal goes EXECUTING with no task waiting on it, and ends through its execute
callback once its result is there, from EXECUTING or, after a cancel, from CANCELING (docs/node.md, "Private rclpy
uses")."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from action_msgs.msg import GoalStatus
from guards import wait_until
from rclpy.action import ActionServer, CancelResponse
from rclpy.action.server import ServerGoalHandle
from spun_nodes import spun_node
from timely_llm_interfaces.qos import action_client_qos, action_server_qos
from timely_llm_interfaces.rclpy_compat import conclude, mark_executing

from timely_llm.ros.interfaces import RequestPlan
from timely_llm_robot.client import PlanActionClient

TIMEOUT_S = 30.0
ACTION = "compat_plan"

pytestmark = pytest.mark.no_vllm


@contextmanager
def action_pair(session: tuple, on_accepted: Callable[[ServerGoalHandle], None]) -> Iterator[PlanActionClient]:
    """An action server whose accepted goals go to ``on_accepted``, and a client of it, spun by the session."""
    with spun_node(session, "compat_server") as server_node, spun_node(session, "compat_client") as client_node:
        server = ActionServer(server_node, RequestPlan, ACTION, execute_callback=_never,
                              handle_accepted_callback=on_accepted, cancel_callback=lambda _: CancelResponse.ACCEPT,
                              **action_server_qos())
        client = PlanActionClient(client_node, RequestPlan, ACTION, **action_client_qos())
        try:
            assert client.wait_for_server(TIMEOUT_S)
            yield client
        finally:
            client.destroy()
            server.destroy()


def _never(goal_handle: ServerGoalHandle) -> RequestPlan.Result:
    raise AssertionError("the action server's own execute callback ran")


def _waiting_tasks(executor: object) -> list:
    """The tasks the executor would resume at its next wake-up (rclpy's private list: a test's view only)."""
    return [task for task, *_ in list(executor._tasks) if not task.done()]  # noqa: SLF001


def _goal(client: PlanActionClient) -> object:
    sent = client.send_goal_async(RequestPlan.Goal(agent_id="compat"))
    wait_until(sent.done, TIMEOUT_S, "the goal's acceptance")
    goal = sent.result()
    assert goal.accepted
    return goal


def _succeed(goal_handle: ServerGoalHandle) -> RequestPlan.Result:
    goal_handle.succeed()
    return RequestPlan.Result(status=RequestPlan.Result.STATUS_SUCCEEDED, reason="done")


def _canceled(goal_handle: ServerGoalHandle) -> RequestPlan.Result:
    goal_handle.canceled()
    return RequestPlan.Result(status=RequestPlan.Result.STATUS_CANCELED, reason="canceled")


def _marked_executing() -> tuple[list[ServerGoalHandle], Callable[[ServerGoalHandle], None]]:
    """The goals accepted, and an accepted callback that moves each to EXECUTING as the node does."""
    accepted: list[ServerGoalHandle] = []

    def on_accepted(goal_handle: ServerGoalHandle) -> None:
        mark_executing(goal_handle)
        accepted.append(goal_handle)

    return accepted, on_accepted


def test_an_executing_goal_holds_no_task_and_ends_with_its_result(session: tuple) -> None:
    accepted, on_accepted = _marked_executing()
    with action_pair(session, on_accepted) as client:
        goal = _goal(client)
        wait_until(lambda: goal.status == GoalStatus.STATUS_EXECUTING, TIMEOUT_S, f"EXECUTING ({goal.status})")
        assert accepted[0].status == GoalStatus.STATUS_EXECUTING
        result = client.get_result_async(goal)
        wait_until(lambda: not _waiting_tasks(session[1]), TIMEOUT_S, "no task waiting on the executing goal")
        conclude(accepted[0], _succeed)
        wait_until(result.done, TIMEOUT_S, "the result")
    assert result.result().status == GoalStatus.STATUS_SUCCEEDED
    assert result.result().result.reason == "done"


def test_a_goal_canceled_while_executing_ends_canceled_through_conclude(session: tuple) -> None:
    accepted, on_accepted = _marked_executing()
    with action_pair(session, on_accepted) as client:
        goal = _goal(client)
        result = client.get_result_async(goal)
        wait_until(lambda: accepted and accepted[0].status == GoalStatus.STATUS_EXECUTING, TIMEOUT_S, "EXECUTING")
        canceling = client.cancel_goal_async(goal)
        wait_until(canceling.done, TIMEOUT_S, "the cancel's answer")
        assert accepted[0].status == GoalStatus.STATUS_CANCELING
        conclude(accepted[0], _canceled)
        wait_until(result.done, TIMEOUT_S, "the result")
    assert result.result().status == GoalStatus.STATUS_CANCELED


def test_a_goal_that_never_executed_ends_through_conclude_too(session: tuple) -> None:
    accepted: list[ServerGoalHandle] = []
    with action_pair(session, accepted.append) as client:
        goal = _goal(client)
        result = client.get_result_async(goal)
        wait_until(lambda: accepted, TIMEOUT_S, "the accepted goal")
        assert accepted[0].status == GoalStatus.STATUS_ACCEPTED
        conclude(accepted[0], _succeed)
        wait_until(result.done, TIMEOUT_S, "the result")
    assert result.result().status == GoalStatus.STATUS_SUCCEEDED


def test_the_task_check_sees_a_goal_whose_execute_callback_awaits_its_end(session: tuple) -> None:
    """What ``mark_executing`` avoids: rclpy's ``execute`` with a callback that awaits the result is a task the
    executor resumes on every wake-up until the goal ends."""
    from rclpy.task import Future

    ended = Future()

    async def await_end(goal_handle: ServerGoalHandle) -> RequestPlan.Result:
        return _succeed(goal_handle) if await ended else RequestPlan.Result()

    with action_pair(session, lambda goal_handle: goal_handle.execute(await_end)) as client:
        goal = _goal(client)
        result = client.get_result_async(goal)
        wait_until(lambda: goal.status == GoalStatus.STATUS_EXECUTING, TIMEOUT_S, "EXECUTING")
        assert _waiting_tasks(session[1])
        ended.set_result(True)
        wait_until(result.done, TIMEOUT_S, "the result")
    assert result.result().status == GoalStatus.STATUS_SUCCEEDED
