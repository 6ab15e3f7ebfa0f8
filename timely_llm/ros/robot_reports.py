"""The robots' ``segment_done`` reports and the watchdog: checked on the executor, applied on the server loop."""

from __future__ import annotations

import functools

from rclpy.callback_groups import MutuallyExclusiveCallbackGroup

from timely_llm.ros.goals import MAX_ID_CHARS
from timely_llm.ros.interfaces import SegmentDone
from timely_llm.ros.ledger import Ledger
from timely_llm.ros.qos import DEEP_RELIABLE
from timely_llm.ros.server_loop import ServerLoop, abort, executed
from timely_llm.ros.topic_requests import TopicRequests
from timely_llm.server import Server

WATCHDOG_PERIOD_S = 0.1
MAX_REASON_CHARS = 200


class RobotReports:
    """A report is checked against the ledger and queued for the loop; the watchdog ends what is overdue."""

    def __init__(self, node: object, loop: ServerLoop, ledger: Ledger, topics: TopicRequests,
                 guarded: object) -> None:
        self._node, self._loop, self._ledger, self._topics = node, loop, ledger, topics
        node.create_subscription(SegmentDone, "segment_done", guarded(self._on_segment_done), DEEP_RELIABLE,
                                 callback_group=MutuallyExclusiveCallbackGroup())
        node.create_timer(WATCHDOG_PERIOD_S, guarded(self._check_watchdog),
                          callback_group=MutuallyExclusiveCallbackGroup())

    def _on_segment_done(self, report: SegmentDone) -> None:
        report = self._topics.to_node(report)
        now = self._loop.clock.now()
        refused = self._ledger.take(report, now)
        if refused:
            self._node.get_logger().warning(
                f"ignored SegmentDone from {report.agent_id[:MAX_ID_CHARS]!r} for goal "
                f"{report.request_id[:MAX_ID_CHARS]!r} segment {report.index}: {refused}")
            return
        self._loop.send(functools.partial(_apply_report, report, now))

    def _check_watchdog(self) -> None:
        overdue, due = self._ledger.overdue_and_due(self._loop.clock.now())
        for request_id, index, start, end in due:  # goals without reports: executed as estimated
            self._loop.send(functools.partial(executed, request_id, index, start, end))
        for request_id, index in overdue:
            reason = f"robot did not report segment {index} done in time"
            self._node.get_logger().warning(f"aborting request {request_id}: {reason}")
            self._loop.send(functools.partial(abort, request_id, reason))


def _apply_report(report: SegmentDone, received: float, server: Server) -> None:
    exec_end = received - server.network_latency
    try:
        server.segment_done(report.request_id, report.index, exec_end - report.duration, exec_end,
                            report.success, report.reason[:MAX_REASON_CHARS])
    except Exception as exc:  # noqa: BLE001 - ends this goal only
        server.abort(report.request_id, f"internal error handling the report of segment {report.index}: {exc!r}")
