"""What the node served, per robot type, for ``/diagnostics``: goals ended, deadline misses in the last minute (urgent
ones apart), mean response. Recorded by the server loop as goals end, read by the diagnostics timer: under a lock.

A deadline miss is a goal whose first response (its first segment's execution start, as ``Outcome`` measures it)
came after its TUF's deadline (ERT), or that was shed (even served at once it could no longer get utility >= 0:
past its ERT). A goal that ended otherwise without a response (canceled, aborted, rejected by the engine) is
served but neither a miss nor a response.
"""

from __future__ import annotations

import collections
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from timely_llm.core.request import Outcome

WINDOW_S = 60.0
"""Deadline misses count over this many seconds (wall clock, monotonic)."""
URGENT = "urgent"
"""The goal category whose misses make the node WARN (core/tuf.py's ``DEFAULT_TUFS``)."""


@dataclass(frozen=True)
class RobotTypeLine:
    """One robot type's figures at one moment."""

    robot: str
    served: int
    """Goals of this type ended since the node started."""
    misses: int
    """Deadline misses in the last WINDOW_S ..."""
    urgent_misses: int
    """... of which urgent goals'."""
    mean_response_s: float
    """Mean response time of the goals that had one (NaN: none yet)."""
    responses: int


@dataclass
class _Totals:
    served: int = 0
    responses: int = 0
    response_sum: float = 0.0
    misses: collections.deque[tuple[float, bool]] = field(default_factory=collections.deque)
    """(when, urgent) of each miss in the window."""


def is_miss(outcome: Outcome) -> bool:
    """Whether the goal missed its deadline (see the module)."""
    return outcome.shed or (outcome.response_time is not None and outcome.response_time > outcome.tuf.ert)


class ServedStats:
    """Per robot type: goals ended, responses, deadline misses in a sliding window."""

    def __init__(self, now: Callable[[], float] = time.monotonic) -> None:
        self._now = now
        self._lock = threading.Lock()
        self._types: dict[str, _Totals] = collections.defaultdict(_Totals)

    def record(self, robot: str, outcome: Outcome | None) -> None:
        """A goal of ``robot`` ended; ``outcome`` None when its outcome could not be read (served, nothing else)."""
        with self._lock:
            totals = self._types[robot]
            totals.served += 1
            if outcome is None:
                return
            if outcome.response_time is not None:
                totals.responses += 1
                totals.response_sum += outcome.response_time
            if is_miss(outcome):
                totals.misses.append((self._now(), outcome.category == URGENT))

    def lines(self, robots: list[str]) -> list[RobotTypeLine]:
        """The figures of each of ``robots`` (the configured types) and of any other type served, by name."""
        with self._lock:
            cutoff = self._now() - WINDOW_S
            for totals in self._types.values():
                while totals.misses and totals.misses[0][0] < cutoff:
                    totals.misses.popleft()
            return [self._line(robot, self._types.get(robot) or _Totals())
                    for robot in sorted(set(robots) | set(self._types))]

    @staticmethod
    def _line(robot: str, t: _Totals) -> RobotTypeLine:
        mean = t.response_sum / t.responses if t.responses else math.nan
        return RobotTypeLine(robot, t.served, len(t.misses), sum(urgent for _, urgent in t.misses), mean, t.responses)
