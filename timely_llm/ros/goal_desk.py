"""Goal intake and result delivery: the ``request_plan`` action and the ``task_requests`` topic in, feedback and
results out. Intake checks a goal on the executor and queues its submission in the server loop's inbox; the
Server's callbacks (on the loop) queue what they have to say in the outbox, which the executor drains."""

from __future__ import annotations

import collections
import dataclasses
import functools
import time
from collections.abc import Callable

from action_msgs.msg import GoalInfo, GoalStatus
from rclpy.action import ActionServer, CancelResponse, GoalResponse
from rclpy.duration import Duration
from timely_llm_interfaces.names import MAX_ID_CHARS, REQUEST_PLAN, agent_id_error
from timely_llm_interfaces.qos import action_server_qos
from timely_llm_interfaces.rclpy_compat import CancelScreeningActionServer, conclude, mark_executing

from timely_llm.core.request import Outcome, Request, Segment
from timely_llm.errors import RequestRejected
from timely_llm.ros.agents import AgentTopics
from timely_llm.ros.goals import GoalRules, plan_from_goal
from timely_llm.ros.interfaces import RequestPlan, SegmentDone, TaskRequest
from timely_llm.ros.interfaces import Segment as SegmentMsg
from timely_llm.ros.ledger import Ledger
from timely_llm.ros.messages import aborted_result, result_message, segment_message, status_name
from timely_llm.ros.quotas import AgentQuotas
from timely_llm.ros.reports import instant
from timely_llm.ros.server_loop import ServerLoop, cancel
from timely_llm.ros.server_node import Guard, ServerNode
from timely_llm.ros.throttle import ThrottledLog
from timely_llm.ros.topic_requests import TopicRequests
from timely_llm.server import PlanRequest, Server

EXECUTING = "executing"
"""The outbox's word that a request's generation runs: its goal goes EXECUTING."""


class GoalDesk:
    """Goals and topic requests from robots to the server loop; segments and ends from the Server to the robots."""

    def __init__(self, node: ServerNode, loop: ServerLoop, ledger: Ledger, guarded: Guard,
                 on_report: Callable[[str, SegmentDone], None]) -> None:
        """``on_report(agent, report)``: a report that came on ``agent``'s own topic (``robot_reports``)."""
        self._node, self._loop, self._ledger = node, loop, ledger
        self.serving = False  # active: goals are accepted
        self._goal_rules: GoalRules | None = None  # set at configure, and by live parameters
        self._checked: tuple[int, PlanRequest] | None = None  # the goal just checked, for its accepted callback
        self._outbox: collections.deque[tuple[str, object]] = collections.deque()
        self._group = node.goals_group  # goal, cancel, result requests, outbox: one at a time
        self._guarded = guarded
        self._outbox_ready = node.create_guard_condition(guarded(self._drain_outbox), callback_group=self._group)
        self._log = ThrottledLog(node.get_logger().warning)  # refusals: the budget flooding clients spend
        self._clamps = ThrottledLog(node.get_logger().warning)  # accepted requests' clamped claims: quotas bound them
        self.agents = AgentTopics(node, ledger.agents, lambda agent, report: on_report(
            agent, self.topics.to_node(report)), self._group)
        self.topics = TopicRequests(node, self._start_topic_request, self._cancel_topic_request, self.agents,
                                    self._group, self._screen, self._may_ask, self._log)
        self._quotas = AgentQuotas(ledger.in_flight)
        self._action: ActionServer | None = None

    @property
    def rules(self) -> GoalRules | None:
        """What the next goal is checked against: set at configure, and by live parameters."""
        return self._goal_rules

    @rules.setter
    def rules(self, rules: GoalRules | None) -> None:
        self._goal_rules = rules
        self.agents.named = frozenset(rules.fleet.named) if rules is not None else frozenset()

    def open(self, result_timeout: float) -> None:
        """The ``request_plan`` action and the ``task_requests`` topic."""
        self.topics.open()
        self._action = OwnGoalsActionServer(self._node, RequestPlan, REQUEST_PLAN, execute_callback=_conclude,
                                            on_refused_cancel=self._log.warn, callback_group=self._group,
                                    goal_callback=self._guarded(self._on_goal, GoalResponse.REJECT),
                                    handle_accepted_callback=self._guarded(self._on_accepted),
                                    cancel_callback=self._guarded(self._on_cancel, CancelResponse.REJECT),
                                    result_timeout=result_timeout, **action_server_qos())

    def destroy(self) -> None:
        self.agents.close()
        if self._action is not None:
            self._action.destroy()

    def settled(self) -> bool:
        """Every goal's final state set and nothing left to deliver."""
        return not self._outbox and self._ledger.settled()

    # ----- intake (executor, goals' callback group) -----

    def _on_goal(self, goal: RequestPlan.Goal) -> GoalResponse:
        try:
            self._check_serving()
            notes: list[str] = []
            plan = plan_from_goal(goal, "", self._rules(), notes)
            self._check_quota(goal.agent_id)
            too_many = self.agents.admit(goal.agent_id)
            if too_many:
                raise RequestRejected(too_many)
        except RequestRejected as exc:
            agent = goal.agent_id[:MAX_ID_CHARS]
            self._log.warn(agent, f"rejected goal from {agent!r}: {exc}")
            return GoalResponse.REJECT
        self._tell(goal.agent_id, notes)
        self._checked = (id(goal), plan)  # rclpy passes no goal id here; its accepted callback comes next
        return GoalResponse.ACCEPT

    def _check_serving(self) -> None:
        if not self.serving:
            raise RequestRejected("server is not active")

    def _check_quota(self, agent: str) -> None:
        """RequestRejected if the agent is over its quota of requests in flight or its rate (then takes a token)."""
        entry = self._rules().fleet.entry(agent)
        if entry is not None and (refused := self._quotas.refusal(agent, entry.quotas)):
            raise RequestRejected(refused)

    def _rules(self) -> GoalRules:
        if self.rules is None:  # set at configure, before the node serves
            raise RequestRejected("server is not configured")
        return self.rules

    def _tell(self, agent: str, notes: list[str]) -> None:
        """Log (throttled) what was clamped in an accepted request."""
        if notes:
            self._clamps.warn(agent, f"request of {agent!r}: {'; '.join(notes)}")

    def _screen(self, request: TaskRequest) -> str | None:
        """Why a task request's agent may not ask for it at all (checked before any endpoint is made for it)."""
        if self.rules is None:
            return None  # refused as the server is not active
        return agent_id_error(request.agent_id) or self.rules.fleet.screen(request.agent_id, request.robot_type)

    def _may_ask(self, agent: str) -> bool:
        return self.rules is None or self.rules.fleet.entry(agent) is not None

    def _on_accepted(self, goal_handle) -> None:  # noqa: ANN001 - rclpy ServerGoalHandle
        request_id = goal_handle.goal_id.uuid.tobytes().hex()
        checked, self._checked = self._checked, None
        goal = goal_handle.request
        self._ledger.open(request_id, goal.agent_id, not goal.no_execution_reports, goal_handle)
        try:
            plan = checked[1] if checked and checked[0] == id(goal) else plan_from_goal(goal, "", self._rules())
        except RequestRejected as exc:
            self.end_unserved(request_id, str(exc))
            return
        self._loop.send(functools.partial(self._submit, dataclasses.replace(plan, id=request_id,
                                                                             arrival=self._loop.clock.now())))

    def _start_topic_request(self, request: TaskRequest, request_id: str) -> None:
        """Serve a task request from the topic as a goal is served; RequestRejected says why it cannot be."""
        self._check_serving()
        notes: list[str] = []
        plan = plan_from_goal(request, request_id, self._rules(), notes)
        self._check_quota(request.agent_id)
        self._tell(request.agent_id, notes)
        self._ledger.open(request_id, request.agent_id, not request.no_execution_reports)
        self._loop.send(functools.partial(self._submit, dataclasses.replace(plan, arrival=self._loop.clock.now())))

    def _cancel_topic_request(self, request_id: str) -> None:
        if request_id in self._ledger:
            self._loop.send(functools.partial(cancel, request_id))

    def _on_cancel(self, goal_handle) -> CancelResponse:  # noqa: ANN001 - rclpy ServerGoalHandle
        request_id = goal_handle.goal_id.uuid.tobytes().hex()
        if request_id not in self._ledger:
            return CancelResponse.REJECT
        # The result reaches the outbox, which this callback group drains once the goal is CANCELING.
        self._loop.send(functools.partial(cancel, request_id))
        return CancelResponse.ACCEPT

    # ----- on the server loop -----

    def _submit(self, plan: PlanRequest, server: Server) -> None:
        try:
            self._check_serving()
            server.submit(plan)
        except Exception as exc:  # noqa: BLE001 - RequestRejected or not, this goal ends with the reason
            self.end_unserved(plan.id, str(exc) if isinstance(exc, RequestRejected) else f"internal error: {exc!r}")

    def abort_all(self, reason: str, server: Server) -> None:
        for request_id in self._ledger.live():
            if not server.abort(request_id, reason):
                self.end_unserved(request_id, reason)

    def end_unserved(self, request_id: str, reason: str) -> None:
        """End a goal whose request the Server does not have."""
        self._ledger.close(request_id)
        self._post(request_id, aborted_result(reason))

    # ----- the Server's callbacks (server loop, holding the server lock): queue and wake the executor -----

    def on_start(self, request: Request) -> None:
        self._post(request.id, EXECUTING)

    def on_segment(self, request: Request, segment: Segment) -> None:
        try:
            message = segment_message(request, segment, self._ros_time)
            self._ledger.dispatched(request.id, segment.index, segment.est_exec_time,
                                    instant(self._node.get_clock(), self._loop.clock), segment.est_end)
        except Exception as exc:  # noqa: BLE001 - this request only, and not in the middle of the step
            reason = f"internal error sending segment {segment.index}: {exc!r}"
            self._loop.send(lambda server: server.abort(request.id, reason))
            return
        told = request.overload.infeasible_at is not None
        self._post(request.id, RequestPlan.Feedback(segment=message, infeasible=told))

    def on_infeasible(self, request: Request) -> None:
        """The notice to a goal that keeps waiting though its deadline cannot be met: a feedback without a segment."""
        self._post(request.id, RequestPlan.Feedback(
            segment=SegmentMsg(request_id="", agent_id=request.agent), infeasible=True))

    def on_finish(self, request: Request) -> None:
        outcome: Outcome | None = None
        try:
            outcome = Outcome.of(request)
            result, utility = result_message(outcome), outcome.utility
        except Exception as exc:  # noqa: BLE001 - the goal must still get a result
            result, utility = aborted_result(f"internal error: {exc!r}"), None
        self._ledger.finished_one(request.id, request.category, utility)
        self._ledger.served.record(request.robot.robot, outcome)
        self._post(request.id, result)

    def _ros_time(self, t: float):  # noqa: ANN202 - builtin_interfaces Time
        """The node's ROS time (``use_sim_time`` included) at server-clock time ``t``."""
        ago = Duration(nanoseconds=round((self._loop.clock.now() - t) * 1e9))
        return (self._node.get_clock().now() - ago).to_msg()

    def _post(self, request_id: str, item: object) -> None:
        self._outbox.append((request_id, item))
        self._outbox_ready.trigger()

    def _drain_outbox(self) -> None:
        """Delivery, on the executor in the goals' callback group."""
        while self._outbox:
            request_id, item = self._outbox.popleft()
            try:
                self._deliver(request_id, item)
            except Exception as exc:  # noqa: BLE001 - one goal's failure must not hold up the rest
                self._node.get_logger().error(f"could not deliver to goal {request_id}: {exc!r}")

    def _deliver(self, request_id: str, item: object) -> None:
        if isinstance(item, RequestPlan.Feedback) and item.segment.request_id:  # not the infeasibility notice
            item.segment.dispatch_time = self._node.get_clock().now().to_msg()
        if self.topics.deliver(request_id, item):
            return
        if item is EXECUTING or isinstance(item, RequestPlan.Feedback):
            goal_handle = self._ledger.goal(request_id)
            if goal_handle is None:
                return
            if isinstance(item, RequestPlan.Feedback):
                goal_handle.publish_feedback(item)
            elif goal_handle.status == GoalStatus.STATUS_ACCEPTED:  # not CANCELING
                mark_executing(goal_handle)
            return
        goal_handle = self._ledger.to_conclude(request_id)
        if goal_handle is not None:
            conclude(goal_handle, functools.partial(self._conclude_with, item))

    def _conclude_with(self, result: RequestPlan.Result, goal_handle) -> RequestPlan.Result:  # noqa: ANN001
        """Execute callback of an ended request: set the goal's final state and return its result."""
        request_id = goal_handle.goal_id.uuid.tobytes().hex()
        try:
            if result.status == RequestPlan.Result.STATUS_SUCCEEDED:
                goal_handle.succeed()
            elif result.status == RequestPlan.Result.STATUS_CANCELED and goal_handle.is_cancel_requested:
                goal_handle.canceled()
            else:
                goal_handle.abort()
        finally:
            self._ledger.concluded(request_id)
        log = self._node.get_logger()
        (log.debug if result.status == RequestPlan.Result.STATUS_SUCCEEDED else log.info)(
            f"request {request_id} {status_name(result.status)} {result.reason}".rstrip())
        return result


class OwnGoalsActionServer(CancelScreeningActionServer):
    """rclpy's ActionServer honouring only cancels that name one goal. ROS lets a CancelGoal request with a zero
    goal id cancel every goal (with a stamp: every goal accepted before it, whatever the id), so any one client
    could end every robot's plan; such a request is refused whole (``ERROR_REJECTED``, no goal canceling) and
    ``on_refused_cancel(client, line)`` told. Which client sent it is not known: they share one throttle.
    (The refusal rests on rclpy's private API: ``CancelScreeningActionServer``, in rclpy_compat.)"""

    def __init__(self, *args: object, on_refused_cancel: Callable[[str, str], None], **kwargs: object) -> None:
        super().__init__(*args, screen_cancel=cancel_scope_error, on_refused_cancel=lambda reason: on_refused_cancel(
            "cancel requests", f"refused a cancel request: {reason}"), **kwargs)


def cancel_scope_error(goal_info: GoalInfo) -> str | None:
    """Why a cancel request reaches beyond the one goal it names, or None."""
    if not any(goal_info.goal_id.uuid):
        return "a zero goal id cancels every robot's goals; cancel your own by its goal id"
    if goal_info.stamp.sec or goal_info.stamp.nanosec:
        return "a stamp cancels every goal accepted before it; cancel your own by its goal id alone"
    return None


def _conclude(goal_handle) -> RequestPlan.Result:  # noqa: ANN001 - rclpy ServerGoalHandle
    """rclpy needs a default execute callback; every goal is executed with ``_conclude_with`` instead."""
    goal_handle.abort()
    return aborted_result("executed without a result")


def await_settled(desk: GoalDesk, deadline: float) -> None:
    """Wait until every goal's final state is set (or ``deadline``)."""
    while time.monotonic() < deadline and not desk.settled():
        time.sleep(0.01)
