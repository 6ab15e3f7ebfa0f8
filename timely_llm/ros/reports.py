"""SegmentDone reports the node expects: who may send them, for which segments, by when."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from timely_llm_interfaces.names import MAX_ID_CHARS

from timely_llm.clock import WallClock
from timely_llm.ros.interfaces import SegmentDone
from timely_llm.ros.messages import FieldError, duration_seconds, stamp_seconds

if TYPE_CHECKING:
    from rclpy.clock import Clock

REPORT_SLACK_S = 1.0
"""How far a reported execution may reach outside the time since its segment's dispatch: before the dispatch, or
(stamped) past the report's arrival. Clock granularity, and the skew between a robot's clock and the node's. In wall
seconds: on sim time each node's clock lags the /clock topic by its own delivery delay, so the skew in simulated
seconds grows with the simulation's speed."""


@dataclass(frozen=True)
class Instant:
    """One moment on the node's two clocks: ``node``, its ROS clock (the simulation's with ``use_sim_time``), on
    which robots report and the watchdog counts; ``server``, the scheduler's (monotonic wall time)."""

    node: float
    server: float


def instant(ros_clock: Clock, server_clock: WallClock) -> Instant:
    """Now on the node's ROS clock (an rclpy Clock) and on the server's."""
    return Instant(ros_clock.now().nanoseconds * 1e-9, server_clock.now())


def clock_speed(since: Instant, now: Instant) -> float | None:
    """Node-clock seconds per server second between two instants: a sim clock's speed, 1 on ROS wall time.
    None when the node's clock did not advance; infinite when only it did."""
    on_node = now.node - since.node
    if on_node <= 0:
        return None
    on_server = now.server - since.server
    return on_node / on_server if on_server > 0 else math.inf


class ReportRefused(ValueError):
    """Why a report is not applied (nothing changed)."""


@dataclass(frozen=True)
class Executed:
    """A report taken: when its segment was dispatched, how long it executed and when that ended, on the node's
    clock (``ended`` None: the report had no stamp)."""

    dispatched: Instant
    duration: float
    ended: float | None


@dataclass
class _Awaited:
    """A dispatched segment whose SegmentDone has not come yet."""

    est_exec_time: float
    dispatched: Instant
    deadline: float
    """By when its report must come, on the node's clock; for a request without reports, its estimated execution
    end on the server's."""


@dataclass
class _Lane:
    agent: str
    reports: bool = True
    """False: the client sends no SegmentDone (goal no_execution_reports); each segment counts as executed at
    its estimated end, which ``due`` hands out, and no deadline applies."""
    dispatched: int = 0
    awaited: dict[int, _Awaited] = field(default_factory=dict)
    """By segment index, in dispatch order."""
    overdue: bool = False
    """A deadline was missed and the request is being aborted."""


@dataclass
class ReportBook:
    """Per request in flight: its agent and every dispatched segment still awaiting its report, each with a deadline.

    A robot executes its segments in order, so a segment's deadline allows for the awaited
    segments before it: ``factor`` x their estimated times plus its own, plus ``margin``,
    counted from its dispatch; a report moves the deadlines of the segments after it (never
    before it) to count from the report. Each segment is cleared only by its own report, so
    a robot that skips one is caught however it reports the others.

    A request opened without reports has no deadlines: its segments fall ``due`` at their estimated
    execution end instead, as if reported then.

    Reports and deadlines are measured on the node's clock, the estimated ends (the scheduler's) on the server's.
    """

    factor: float
    margin: float
    _lanes: dict[str, _Lane] = field(default_factory=dict)

    def open(self, request_id: str, agent: str, reports: bool = True) -> None:
        self._lanes[request_id] = _Lane(agent, reports)

    def close(self, request_id: str) -> str | None:
        """Forget a request; its agent (None if it was not open)."""
        lane = self._lanes.pop(request_id, None)
        return lane.agent if lane is not None else None

    def live(self) -> list[str]:
        return list(self._lanes)

    def agents(self) -> set[str]:
        """The agents with a request in flight."""
        return {lane.agent for lane in self._lanes.values()}

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._lanes

    def dispatched(self, request_id: str, index: int, est_exec_time: float, now: Instant, est_end: float) -> None:
        """Segment ``index`` went out at ``now``; ``est_end``: when it is estimated to be executed (server clock)."""
        lane = self._lanes.get(request_id)
        if lane is None:
            return
        lane.dispatched = index + 1
        if not lane.reports:
            lane.awaited[index] = _Awaited(est_exec_time, now, est_end)
            return
        ahead = math.fsum(s.est_exec_time for s in lane.awaited.values()) + est_exec_time
        lane.awaited[index] = _Awaited(est_exec_time, now, now.node + self.factor * ahead + self.margin)

    def take(self, report: SegmentDone, now: Instant) -> Executed:
        """Record a report; ReportRefused says why it is not (nothing changes)."""
        lane = self._lanes.get(report.request_id)
        if lane is None:
            raise ReportRefused("no such goal in flight")
        if report.agent_id != lane.agent:
            raise ReportRefused(f"agent {report.agent_id[:MAX_ID_CHARS]!r} did not send this goal")
        if not lane.reports:
            raise ReportRefused("the goal was sent with no_execution_reports")
        if report.index >= lane.dispatched:
            raise ReportRefused(f"segment {report.index} was not dispatched ({lane.dispatched} so far)")
        segment = lane.awaited.get(report.index)
        if segment is None:
            raise ReportRefused(f"segment {report.index} was already reported")
        executed = _executed(report, segment.dispatched, now)
        del lane.awaited[report.index]
        ahead = 0.0
        for index, later in lane.awaited.items():
            if index > report.index:
                ahead += later.est_exec_time
                later.deadline = max(later.deadline, now.node + self.factor * ahead + self.margin)
        return executed

    def expired(self, now: float) -> list[tuple[str, int]]:
        """(request, first overdue segment) for each request whose robot just missed a deadline (once each);
        ``now`` on the node's clock."""
        overdue = []
        for request_id, lane in self._lanes.items():
            if not lane.reports or lane.overdue:
                continue
            late = [index for index, s in lane.awaited.items() if now > s.deadline]
            if late:
                lane.overdue = True
                overdue.append((request_id, min(late)))
        return overdue

    def due(self, now: float) -> list[tuple[str, int, float, float]]:
        """(request, segment, estimated execution start, end) of each segment of a request without reports whose
        estimated end has passed (``now`` and the times on the server's clock); each is handed out once."""
        due = []
        for request_id, lane in self._lanes.items():
            if lane.reports:
                continue
            for index in [i for i, s in lane.awaited.items() if now >= s.deadline]:
                segment = lane.awaited.pop(index)
                due.append((request_id, index, segment.deadline - segment.est_exec_time, segment.deadline))
        return due

    def executing(self) -> int:
        """Requests with a dispatched segment their robot has not reported yet."""
        return sum(1 for lane in self._lanes.values() if lane.awaited)


def _executed(report: SegmentDone, dispatched: Instant, now: Instant) -> Executed:
    """The report's execution, checked to fit between its segment's dispatch and now (node's clock): stamped, its
    window [stamp - duration, stamp]; else its duration within the time since the dispatch."""
    try:
        duration, ended = duration_seconds(report.duration), stamp_seconds(report.stamp)
    except FieldError as exc:
        raise ReportRefused(str(exc)) from None
    if duration < 0:
        raise ReportRefused(f"duration {duration:.6g} s is negative")
    slack = _slack(dispatched, now)
    if ended is None:
        since = now.node - dispatched.node
        if duration > since + slack:
            raise ReportRefused(f"duration {duration:.6g} s exceeds the {since:.3f} s since its dispatch")
    elif ended > now.node + slack:
        raise ReportRefused(f"stamp {ended:.3f} s is ahead of the node's clock ({now.node:.3f} s): the robot's "
                            "clock and the node's disagree")
    elif ended - duration < dispatched.node - slack:
        raise ReportRefused(f"execution from {ended - duration:.3f} s (stamp minus duration) starts before its "
                            f"dispatch at {dispatched.node:.3f} s on the node's clock")
    return Executed(dispatched, duration, ended)


def _slack(dispatched: Instant, now: Instant) -> float:
    """``REPORT_SLACK_S`` at the node clock's speed since the dispatch, never less: a slower, paused or unmeasurable
    clock keeps the wall slack."""
    speed = clock_speed(dispatched, now)
    return REPORT_SLACK_S * (max(speed, 1.0) if speed is not None and math.isfinite(speed) else 1.0)
