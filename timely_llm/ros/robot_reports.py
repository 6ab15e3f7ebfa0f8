"""The robots' reports, each on its robot's ``<agent_id>/segment_done`` (``agents``), and the watchdog: checked on
the executor against the node's clock (ROS time, the simulation's with ``use_sim_time``), applied on the server
loop in the server's clock. A report's stamp (the robot's clock at its execution's end) places the execution;
a report without one ended, as far as the node knows, ``network_latency`` before it arrived."""

from __future__ import annotations

import functools

from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
from timely_llm_interfaces.fields import oversized
from timely_llm_interfaces.names import MAX_ID_CHARS

from timely_llm.ros.interfaces import SegmentDone
from timely_llm.ros.ledger import Ledger
from timely_llm.ros.reports import Executed, Instant, ReportRefused, clock_speed, instant
from timely_llm.ros.server_loop import ServerLoop, abort, executed
from timely_llm.ros.server_node import Guard, ServerNode
from timely_llm.ros.throttle import ThrottledLog
from timely_llm.server import Server

WATCHDOG_PERIOD_S = 0.1
MAX_REASON_CHARS = 200


class RobotReports:
    """A report is checked against the ledger and queued for the loop; the watchdog ends what is overdue."""

    def __init__(self, node: ServerNode, loop: ServerLoop, ledger: Ledger, guarded: Guard) -> None:
        self._node, self._loop, self._ledger = node, loop, ledger
        self._log = ThrottledLog(node.get_logger().warning)
        node.create_timer(WATCHDOG_PERIOD_S, guarded(self._check_watchdog),
                          callback_group=MutuallyExclusiveCallbackGroup())

    def take(self, agent: str, report: SegmentDone) -> None:
        """A report that came on ``agent``'s own topic: applied only to that agent's goals."""
        received = instant(self._node.get_clock(), self._loop.clock)
        try:
            if report.agent_id != agent:
                raise ReportRefused(f"it names agent {report.agent_id[:MAX_ID_CHARS]!r}")
            too_long = oversized(report)
            if too_long:
                raise ReportRefused(too_long)
            executed = self._ledger.take(report, received)
        except ReportRefused as refused:
            self._log.warn(agent, f"ignored SegmentDone on {agent!r}'s topic for goal "
                                  f"{report.request_id[:MAX_ID_CHARS]!r} segment {report.index}: {refused}")
            return
        self._loop.send(functools.partial(_apply_report, report, received.server, *server_window(executed, received)))

    def _check_watchdog(self) -> None:
        overdue, due = self._ledger.overdue_and_due(instant(self._node.get_clock(), self._loop.clock))
        for request_id, index, start, end in due:  # goals without reports: executed as estimated
            self._loop.send(functools.partial(executed, request_id, index, start, end))
        for request_id, index in overdue:
            reason = f"robot did not report segment {index} done in time"
            self._node.get_logger().warning(f"aborting request {request_id}: {reason}")
            self._loop.send(functools.partial(abort, request_id, reason))


def server_seconds(duration: float, dispatched: Instant, received: Instant) -> float:
    """A duration on the node's clock in the server's seconds: scaled by how the two clocks ran since the dispatch
    (a simulation may run faster than the wall; on ROS wall time the scale is 1)."""
    speed = clock_speed(dispatched, received)
    return duration if speed is None else duration / speed


def server_window(executed: Executed, received: Instant) -> tuple[float, float | None]:
    """The execution's duration in the server's seconds, and how long before the report's arrival it ended
    (None: the report had no stamp; never negative: a robot's clock a little ahead of the node's)."""
    duration = server_seconds(executed.duration, executed.dispatched, received)
    if executed.ended is None:
        return duration, None
    return duration, server_seconds(max(0.0, received.node - executed.ended), executed.dispatched, received)


def _apply_report(report: SegmentDone, received: float, duration: float, ended_ago: float | None,
                  server: Server) -> None:
    exec_end = received - (server.network_latency if ended_ago is None else ended_ago)
    try:
        server.segment_done(report.request_id, report.index, exec_end - duration, exec_end,
                            report.success, report.reason[:MAX_REASON_CHARS], result=report.result or None)
    except Exception as exc:  # noqa: BLE001 - ends this goal only
        server.abort(report.request_id, f"internal error handling the report of segment {report.index}: {exc!r}")
