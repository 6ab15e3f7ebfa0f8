"""The requests in flight as both the executor and the server loop see them, under one lock (thread model:
``timely_llm.ros.node``). Every method holds the lock for a moment and waits for nothing while holding it."""

from __future__ import annotations

import collections
import math
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

from timely_llm.ros.interfaces import SegmentDone
from timely_llm.ros.reports import Executed, Instant, ReportBook
from timely_llm.ros.served import ServedStats

if TYPE_CHECKING:
    from rclpy.action.server import ServerGoalHandle


@dataclass
class CategoryTotals:
    """What the status topic reports about ended requests, kept as running totals."""

    count: int = 0
    utility_sum: float = 0.0
    with_utility: int = 0

    def add(self, utility: float | None) -> None:
        self.count += 1
        if utility is not None:
            self.utility_sum += utility
            self.with_utility += 1

    @property
    def mean_utility(self) -> float:
        return self.utility_sum / self.with_utility if self.with_utility else math.nan


class Ledger:
    """Requests in flight (reports, goal handles, goals concluding) and the totals of those ended."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._reports = ReportBook(0.0, 0.0)
        self._goals: dict[str, ServerGoalHandle] = {}  # request id -> goal handle, until its result is handed over
        self._concluding: set[str] = set()  # requests whose goal's execute callback has yet to run
        self._totals: dict[str, CategoryTotals] = collections.defaultdict(CategoryTotals)
        self.finished = 0
        self._in_flight: collections.Counter[str] = collections.Counter()  # agent -> its requests open
        self.served = ServedStats()
        """Per robot type, for /diagnostics (a lock of its own)."""

    def reset_reports(self, factor: float, margin: float) -> None:
        """A fresh report book (at configure) with the watchdog's timeouts: swapped whole, no lock needed."""
        self._reports = ReportBook(factor, margin)
        self._in_flight = collections.Counter()

    def set_timeouts(self, factor: float, margin: float) -> None:
        with self._lock:
            self._reports.factor, self._reports.margin = factor, margin

    def open(self, request_id: str, agent: str, reports: bool, goal_handle: ServerGoalHandle | None = None) -> None:
        """A request accepted; ``goal_handle`` for an action goal (a topic request has none)."""
        with self._lock:
            if goal_handle is not None:
                self._goals[request_id] = goal_handle
            if request_id not in self._reports:
                self._in_flight[agent] += 1
            self._reports.open(request_id, agent, reports)

    def __contains__(self, request_id: str) -> bool:
        with self._lock:
            return request_id in self._reports

    def live(self) -> list[str]:
        with self._lock:
            return self._reports.live()

    def agents(self) -> set[str]:
        """The agents with a request in flight."""
        with self._lock:
            return self._reports.agents()

    def in_flight(self, agent: str) -> int:
        """The agent's requests in flight (its quota's count)."""
        with self._lock:
            return self._in_flight.get(agent, 0)

    def _close(self, request_id: str) -> None:
        agent = self._reports.close(request_id)
        if agent is not None:
            self._in_flight[agent] -= 1
            if not self._in_flight[agent]:
                del self._in_flight[agent]

    def close(self, request_id: str) -> None:
        with self._lock:
            self._close(request_id)

    def finished_one(self, request_id: str, category: str, utility: float | None) -> None:
        with self._lock:
            self._close(request_id)
            self._totals[category].add(utility)
            self.finished += 1

    def dispatched(self, request_id: str, index: int, est_exec_time: float, now: Instant, est_end: float) -> None:
        with self._lock:
            self._reports.dispatched(request_id, index, est_exec_time, now, est_end)

    def take(self, report: SegmentDone, now: Instant) -> Executed:
        """The robot's report recorded; its execution on the node's clock (ReportRefused: why not)."""
        with self._lock:
            return self._reports.take(report, now)

    def overdue_and_due(self, now: Instant) -> tuple[list[tuple[str, int]], list[tuple[str, int, float, float]]]:
        """Segments whose report is overdue; segments of goals without reports whose estimated end has passed."""
        with self._lock:
            return self._reports.expired(now.node), self._reports.due(now.server)

    def executing(self) -> int:
        with self._lock:
            return self._reports.executing()

    def totals(self) -> tuple[list[tuple[str, int, float]], int, int]:
        """Per category (count, mean utility), sorted; requests finished; segments executing."""
        with self._lock:
            return (sorted((c, t.count, t.mean_utility) for c, t in self._totals.items()), self.finished,
                    self._reports.executing())

    def goal(self, request_id: str) -> ServerGoalHandle | None:
        """The goal handle of a request still in flight (executor, goals' callback group only)."""
        return self._goals.get(request_id)

    def to_conclude(self, request_id: str) -> ServerGoalHandle | None:
        """The goal handle whose result is to be handed over now, marked concluding (None: not an action goal)."""
        with self._lock:
            goal_handle = self._goals.pop(request_id, None)
            if goal_handle is not None:
                self._concluding.add(request_id)
            return goal_handle

    def concluded(self, request_id: str) -> None:
        with self._lock:
            self._concluding.discard(request_id)

    def settled(self) -> bool:
        """No goal left whose final state is still to be set."""
        with self._lock:
            return not self._goals and not self._concluding
