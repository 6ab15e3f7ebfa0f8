"""A Nav2 bridge: a ``calls`` mobile base (``skill_models/mobile_base.yaml``) whose moves are Nav2's actions.

``go_to(place)`` becomes a ``nav2_msgs/action/NavigateToPose`` goal to the place's pose in the robot's places
file (see :mod:`timely_llm_robot.executors.places`); ``dock`` and ``undock`` become ``DockRobot`` and
``UndockRobot``. Every other skill (``look_for``, ``say``, ...) goes to the ``fallback`` dispatch the robot gives,
or fails saying Nav2 has no such skill. A segment's result carries its real duration and, on failure, Nav2's
reason: the action result's ``error_code`` / ``error_msg`` (read only where the result has them: Humble's
``NavigateToPose`` result has neither) or the goal's status. Each call has a timeout of its own (per skill);
one that runs out cancels its Nav2 goal and fails the segment saying so.

Cancel goes both ways: a task of the robot's that ends other than succeeded (canceled by the robot or anyone
else, aborted by the node) cancels the Nav2 goal its segment has in flight and fails its segments still queued
(give :meth:`Nav2Bridge.task_ended` to ``RobotClient(on_end=...)``); a Nav2 goal that Nav2 aborts or cancels
fails the segment with Nav2's reason, which the node's result then carries ("robot failed segment N: ...").

The bridge's action clients live on the node given, which must be spun (by any executor) while it runs.
Only this module imports ``nav2_msgs``: a robot's distro package, or ``../shared/nav2_msgs`` for the tests.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from action_msgs.msg import GoalStatus
from geometry_msgs.msg import PoseStamped
from nav2_msgs.action import DockRobot, NavigateToPose, UndockRobot
from rclpy.node import Node

from timely_llm_robot.client import PlanActionClient, TaskOutcome
from timely_llm_robot.executors.base import CallList, SegmentResult, run_calls, text_arg
from timely_llm_robot.executors.minispec import SkillDispatch, SkillFailed, Value
from timely_llm_robot.executors.places import Place, load_places

ACTIONS = {"go_to": ("navigate_to_pose", NavigateToPose), "dock": ("dock_robot", DockRobot),
           "undock": ("undock_robot", UndockRobot)}
"""The skills Nav2 runs: action name (Nav2's defaults, relative to the node's namespace) and type."""
DEFAULT_TIMEOUTS = {"go_to": 300.0, "dock": 180.0, "undock": 60.0}
"""Seconds one call may take, goal sent to result, by skill."""
SERVER_WAIT_S = 5.0
"""How long a call waits for its Nav2 action server to appear before failing."""
CANCEL_WAIT_S = 10.0
"""How long a call the bridge canceled waits for Nav2 to confirm before failing regardless."""
POLL_S = 0.01
ENDED_KEPT = 1000
"""How many ended tasks the bridge remembers (their queued segments are refused), oldest forgotten first."""
STATUS_WORDS = {GoalStatus.STATUS_SUCCEEDED: "succeeded", GoalStatus.STATUS_CANCELED: "canceled",
                GoalStatus.STATUS_ABORTED: "aborted"}


@dataclass
class _Flight:
    """A Nav2 goal in flight: its client and handle, the task it serves, and why the bridge canceled it."""

    client: PlanActionClient
    handle: Any
    request_id: str
    stopped: str = ""
    give_up: float = float("inf")
    """Monotonic time after which a canceled goal's result is no longer waited for."""
    cancel_sent: bool = field(default=False, repr=False)


def pose_stamped(place: Place, node: Node) -> PoseStamped:
    """``place`` as a PoseStamped in its frame, stamped now."""
    pose = PoseStamped()
    pose.header.frame_id = place.frame
    pose.header.stamp = node.get_clock().now().to_msg()
    pose.pose.position.x, pose.pose.position.y = place.x, place.y
    q = pose.pose.orientation
    q.x, q.y, q.z, q.w = place.quaternion()
    return pose


def error_code_name(result_type: type, code: int) -> str:
    """The name the action's result definition gives ``code`` (``TF_ERROR``), or empty."""
    names = [n for n in dir(type(result_type)) if n.isupper() and not n.startswith("_")]
    return next((n for n in names if getattr(result_type, n) == code), "")


def nav2_failure(call: str, action_type: Any, status: int, result: object) -> str:
    """Why a Nav2 goal failed, from its result's error_code / error_msg / success and its status; empty if it
    did not."""
    code = int(getattr(result, "error_code", 0))
    message = str(getattr(result, "error_msg", "")).strip()
    if status == GoalStatus.STATUS_SUCCEEDED and code == 0 and getattr(result, "success", True):
        return ""
    what = STATUS_WORDS.get(status, f"ended with status {status}")
    if status == GoalStatus.STATUS_CANCELED:
        what = "canceled by Nav2"
    detail = ""
    if code:
        name = error_code_name(action_type.Result, code)
        detail = f": error {code}" + (f" {name}" if name else "")
    if message:
        detail += f"{': ' if not detail else ', '}{message}"
    if status == GoalStatus.STATUS_SUCCEEDED:
        what = "reported failure"
    return f"{call}: Nav2 {action_type.__name__} {what}{detail}"


class Nav2Bridge:
    """A mobile base driven by Nav2: a SegmentRunner (call it with a segment and its task's label) and a
    SkillDispatch (:meth:`dispatch`).

    ``places``: a places file or its places; ``fallback``: runs the skills Nav2 has not (None: they fail);
    ``timeouts``: seconds per call by skill, over :data:`DEFAULT_TIMEOUTS`; ``dock_id``: the dock ``dock`` docks
    at (from the docking server's database), else the pose of the place named ``dock`` (with ``dock_type``);
    ``action_names``: Nav2's action names by skill, over the defaults in :data:`ACTIONS`.
    """

    def __init__(self, node: Node, places: str | Path | Mapping[str, Place], fallback: SkillDispatch | None = None,
                 timeouts: Mapping[str, float] | None = None, dock_id: str = "", dock_type: str = "",
                 action_names: Mapping[str, str] | None = None, server_wait_s: float = SERVER_WAIT_S) -> None:
        self.node = node
        self.places = load_places(places) if isinstance(places, str | Path) else dict(places)
        self.fallback = fallback
        self.timeouts = {**DEFAULT_TIMEOUTS, **(timeouts or {})}
        self.dock_id, self.dock_type = dock_id, dock_type
        self.server_wait_s = server_wait_s
        self.action_names = {skill: name for skill, (name, _) in ACTIONS.items()} | dict(action_names or {})
        self.clients = {skill: PlanActionClient(node, action_type, self.action_names[skill])
                        for skill, (_, action_type) in ACTIONS.items()}
        self._lock = threading.Lock()
        self._flight: _Flight | None = None
        self._ended: dict[str, str] = {}
        """Request ids of the robot's tasks that ended other than succeeded -> how they ended."""
        self._request_id = ""

    def __call__(self, segment: Any, label: str) -> SegmentResult:
        """Run one ``timely_llm_interfaces/Segment``'s calls (a SegmentRunner)."""
        with self._lock:
            self._request_id = segment.request_id
            ended = self._ended.get(segment.request_id, "")
        if ended:
            return SegmentResult(False, f"not run: {ended}", 0.0)
        result = self.execute_calls([(call.name, list(call.args)) for call in segment.skills])
        if not result.success:  # the plan stops here: the node ends the task on this report
            self._mark_ended([segment.request_id], f"segment {segment.index} of the task failed", overwrite=False)
        return result

    def execute_calls(self, calls: CallList) -> SegmentResult:
        """Run skill calls in order, stopping at the first failure."""
        return run_calls(self.dispatch, calls)

    def dispatch(self, name: str, args: Sequence[Value]) -> Value:
        """Carry out one skill; SkillFailed with the reason if it cannot."""
        if name == "go_to":
            self._go_to(args)
            return None
        if name in ("dock", "undock"):
            if args:
                raise SkillFailed(f"{name} takes no argument, got {list(args)}")
            self._run_goal(name, name, self._dock_goal() if name == "dock" else self._undock_goal())
            return None
        if self.fallback is None:
            raise SkillFailed(f"{name}: not a Nav2 skill (go_to, dock, undock) and this robot has no fallback "
                              "executor for it")
        return self.fallback(name, args)

    def task_ended(self, outcome: TaskOutcome) -> None:
        """A task of this robot's ended (RobotClient's ``on_end``): unless it succeeded, its Nav2 goal in flight
        is canceled and its segments not yet run fail without moving the robot."""
        if outcome.status == "succeeded":
            return
        ended = f"{outcome.status}: {outcome.result.reason}" if outcome.result and outcome.result.reason \
            else outcome.status
        self._mark_ended([segment.request_id for segment in outcome.segments], f"the task ended ({ended})")
        with self._lock:
            flight = self._flight
            why = self._ended.get(flight.request_id, "") if flight is not None else ""
        if flight is not None and why:
            self._cancel(flight, why)

    def _mark_ended(self, request_ids: list[str], why: str, overwrite: bool = True) -> None:
        with self._lock:
            for request_id in request_ids:
                if overwrite or request_id not in self._ended:
                    self._ended.pop(request_id, None)
                    self._ended[request_id] = why
            while len(self._ended) > ENDED_KEPT:
                del self._ended[next(iter(self._ended))]

    def close(self) -> None:
        """Destroy the action clients (a goal in flight is canceled first)."""
        with self._lock:
            flight = self._flight
        if flight is not None:
            self._cancel(flight, "the bridge closed")
        for client in self.clients.values():
            client.destroy()

    def _go_to(self, args: Sequence[Value]) -> None:
        name = text_arg("go_to", args)
        call = f"go_to('{name}')"
        if name not in self.places:
            raise SkillFailed(f"{call}: no place {name!r} in the places file")
        self._run_goal("go_to", call, NavigateToPose.Goal(pose=pose_stamped(self.places[name], self.node)))

    def _dock_goal(self) -> DockRobot.Goal:
        if self.dock_id:
            return DockRobot.Goal(use_dock_id=True, dock_id=self.dock_id)
        if "dock" not in self.places:
            raise SkillFailed("dock: the bridge has no dock_id and the places file no place 'dock'")
        return DockRobot.Goal(use_dock_id=False, dock_pose=pose_stamped(self.places["dock"], self.node),
                              dock_type=self.dock_type)

    def _undock_goal(self) -> UndockRobot.Goal:
        return UndockRobot.Goal(dock_type=self.dock_type)

    def _run_goal(self, skill: str, call: str, goal: Any) -> None:
        """Send ``goal`` to Nav2 and wait for its result, within the skill's timeout; SkillFailed with the reason
        if it did not succeed."""
        client, timeout = self.clients[skill], self.timeouts[skill]
        deadline = time.monotonic() + timeout
        if not client.wait_for_server(timeout_sec=min(self.server_wait_s, timeout)):
            raise SkillFailed(f"{call}: no Nav2 action server {self.action_names[skill]!r} "
                              f"(waited {min(self.server_wait_s, timeout):g} s)")
        sent = client.send_goal_async(goal)
        if not self._wait(sent, deadline):
            sent.add_done_callback(lambda done: self._cancel_late(client, done))
            raise SkillFailed(f"{call}: timed out after {timeout:g} s ({skill}'s per-call timeout) waiting for "
                              "Nav2 to accept the goal")
        handle = sent.result()
        if not handle.accepted:
            raise SkillFailed(f"{call}: Nav2 {ACTIONS[skill][1].__name__} rejected the goal")
        self._fly(skill, call, _Flight(client, handle, self._request_id), deadline)

    def _fly(self, skill: str, call: str, flight: _Flight, deadline: float) -> None:
        """Wait for an accepted goal's result; cancel it if the task ends or its time runs out."""
        with self._lock:
            self._flight = flight
            ended = self._ended.get(flight.request_id, "")
        try:
            if ended:
                self._cancel(flight, ended)
            result = flight.client.get_result_async(flight.handle)
            if not self._wait(result, deadline, flight) and not flight.stopped:
                self._cancel(flight, "timed out")
                raise SkillFailed(f"{call}: timed out after {self.timeouts[skill]:g} s ({skill}'s per-call "
                                  "timeout); Nav2 goal canceled")
        finally:
            with self._lock:
                self._flight = None
        if flight.stopped:
            unconfirmed = "" if result.done() else f" (Nav2 did not confirm within {CANCEL_WAIT_S:g} s)"
            raise SkillFailed(f"{call}: Nav2 goal canceled{unconfirmed}: {flight.stopped}")
        response = result.result()
        failure = nav2_failure(call, ACTIONS[skill][1], response.status, response.result)
        if failure:
            raise SkillFailed(failure)

    def _wait(self, future: Any, deadline: float, flight: _Flight | None = None) -> bool:
        """Whether ``future`` completed before ``deadline`` (for a goal the bridge canceled: before it gave up)."""
        while not future.done():
            if time.monotonic() >= min(deadline, flight.give_up if flight else deadline):
                return False
            time.sleep(POLL_S)
        return True

    def _cancel(self, flight: _Flight, why: str) -> None:
        with self._lock:
            if flight.cancel_sent:
                return
            flight.cancel_sent, flight.stopped = True, flight.stopped or why
            flight.give_up = time.monotonic() + CANCEL_WAIT_S
        flight.client.cancel_goal_async(flight.handle)

    def _cancel_late(self, client: PlanActionClient, sent: Any) -> None:
        """A goal accepted after its call timed out is canceled at once."""
        handle = sent.result()
        if handle is not None and handle.accepted:
            client.cancel_goal_async(handle)
