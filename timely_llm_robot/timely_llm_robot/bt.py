"""A py_trees leaf that asks timely_llm for a plan and executes it: :class:`AskTimelyLlm`.

The leaf drives a :class:`~timely_llm_robot.client.RobotClient` (or a ``TopicRobotClient``): on its first tick it
sends the task, then stays RUNNING while the client executes each segment through the robot's runner as it
arrives and reports it (a segment that ends in a blocking skill reports the runner's ``last_value``, which the
plan goes on from). It ends SUCCESS when the node's result says succeeded, else FAILURE; either way the
blackboard says why. Halting it (``terminate(INVALID)``: a higher-priority branch preempts it, or the tree is
interrupted) cancels the goal; the segment running then finishes, those not started are not executed.

Blackboard, under the namespace given (default ``/timely_llm``):

- read, when set: ``task`` (the task text), ``trace_id`` (the sim engine's recorded plan), ``tuf`` (an object with
  ``ert``, ``alpha``, ``beta``); each falls back to the constructor's value when the key is absent;
- written: ``plan`` (the plan text of the result, empty until it ends), ``plan_status`` (``running``, then
  ``succeeded``, ``aborted``, ``canceled``, ``rejected``, ``not sent`` or ``preempted``) and ``plan_reason``.

py_trees (PyPI's 2.x, or the ROS package ``py_trees``) is imported by this module only.
"""

from __future__ import annotations

import time
from typing import Any

import py_trees
from py_trees.common import Access, Status

from timely_llm_robot.client import RobotClient, TaskOutcome, Urgency

DEFAULT_NAMESPACE = "/timely_llm"
INPUTS = ("task", "trace_id", "tuf")
OUTPUTS = ("plan", "plan_status", "plan_reason")
PREEMPTED = "preempted"


class AskTimelyLlm(py_trees.behaviour.Behaviour):
    """Request a plan for a task from timely_llm through ``robot`` and execute it; see the module's docstring.

    ``timeout_s``: the leaf cancels the goal and fails if no result came that long after it was sent (None: it
    waits for the node, whose watchdogs end every goal).
    """

    def __init__(self, name: str, robot: RobotClient, task: str = "", *, namespace: str = DEFAULT_NAMESPACE,
                 tuf: Urgency | None = None, trace_id: int = 0, timeout_s: float | None = None) -> None:
        super().__init__(name)
        self.robot = robot
        self.defaults: dict[str, Any] = {"task": task, "trace_id": trace_id, "tuf": tuf}
        self.timeout_s = timeout_s
        self.outcome: TaskOutcome | None = None
        """The task of the last request sent: ``outcome.wait()`` gives the node's result even after a halt."""
        self._sent_at = 0.0
        self._not_sent = ""
        self.board = self.attach_blackboard_client(name=name, namespace=namespace)
        for key in INPUTS:
            self.board.register_key(key, access=Access.READ)
        for key in OUTPUTS:
            self.board.register_key(key, access=Access.WRITE)

    def initialise(self) -> None:
        """Send the request (each time the leaf starts afresh: after it ended, or was halted)."""
        self.outcome, self._not_sent = None, ""
        task, trace_id, tuf = (self._input(key) for key in INPUTS)
        self._write("", "running", "")
        if not task:
            self._not_sent = f"no task: {self.board.namespace}/task is not set and the leaf was given none"
            return
        try:
            self.outcome = self.robot.request(str(task), tuf, int(trace_id), label=self.name)
        except ValueError as exc:  # a goal over an interface bound: refused before it is sent
            self._not_sent = str(exc)
        self._sent_at = time.monotonic()

    def update(self) -> Status:
        if self.outcome is None:
            self._write("", "not sent", self._not_sent)
            return Status.FAILURE
        if not self.outcome.finished.done():
            if self.timeout_s is not None and time.monotonic() - self._sent_at > self.timeout_s:
                self.robot.cancel(self.outcome)
                self._write("", "aborted", f"no result within {self.timeout_s:g} s: goal canceled")
                return Status.FAILURE
            self.feedback_message = f"{len(self.outcome.segments)} segment(s) received"
            return Status.RUNNING
        return self._ended(self.outcome)

    def terminate(self, new_status: Status) -> None:
        """Halted while its goal is in flight (``INVALID``): cancel the goal and say so on the blackboard."""
        outcome = self.outcome
        if new_status != Status.INVALID or outcome is None or outcome.finished.done():
            return
        self.robot.cancel(outcome)
        self._write("", PREEMPTED, f"halted after {len(outcome.segments)} segment(s) received: goal canceled")

    def _ended(self, outcome: TaskOutcome) -> Status:
        result = outcome.result
        if result is None:
            robot = self.robot
            self._write("", "rejected", f"the node rejected the goal of {robot.agent_id!r} ({robot.robot_type!r}): "
                                        "its log says why (e.g. an unknown robot type, or the node not active)")
            return Status.FAILURE
        status = outcome.status
        self._write(result.plan, status, result.reason or ("" if status == "succeeded" else status))
        return Status.SUCCESS if status == "succeeded" else Status.FAILURE

    def _input(self, key: str) -> Any:
        return self.board.get(key) if self.board.exists(key) else self.defaults[key]

    def _write(self, plan: str, status: str, reason: str) -> None:
        self.board.set("plan", plan)
        self.board.set("plan_status", status)
        self.board.set("plan_reason", reason)
        self.feedback_message = f"{status}: {reason}" if reason else status
