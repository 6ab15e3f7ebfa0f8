"""Priority policies: PUD (Eq. 4), EDF, FCFS and vLLM's priority order, evaluated over the whole queue at once.

Each policy maps the queue's columns to scores (higher runs first). Scores depend on
the current time, so the queue asks for them afresh at every fetch (§4.3).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numpy as np


class QueueColumns:
    """Per-generation scheduling parameters, one numpy column each."""

    NAMES = ("arrival", "ert", "alpha", "beta", "seg_index", "origin", "seg_ert", "gen_time", "gen_fixed",
             "gen_tokens", "gen_mean")
    """``origin`` and ``seg_ert``: when the next segment's TUF counts from and its ERT (``Request.segment_tuf``).
    ``gen_time`` is G(s); the queue may derive it from its terms: gen_fixed + gen_tokens x a token time.
    ``gen_mean`` is Eq. 4's G: the robot's average segment generation time from profiling."""

    def __init__(self, capacity: int = 64) -> None:
        self.size = 0
        self.data = np.zeros((len(self.NAMES), capacity))

    def column(self, name: str) -> np.ndarray:
        return self.data[self.NAMES.index(name), : self.size]

    def append(self, values: tuple[float, ...]) -> int:
        if self.size == self.data.shape[1]:
            self.data = np.concatenate([self.data, np.zeros_like(self.data)], axis=1)
        self.data[:, self.size] = values
        self.size += 1
        return self.size - 1

    def set(self, slot: int, values: tuple[float, ...]) -> None:
        if not 0 <= slot < self.size:
            raise IndexError(f"no row {slot} in a queue of {self.size}")
        self.data[:, slot] = values

    def remove(self, slot: int) -> int:
        """Remove ``slot`` by moving the last row into it; returns the slot that moved."""
        last = self.size - 1
        self.data[:, slot] = self.data[:, last]
        self.size -= 1
        return last


class PriorityPolicy(ABC):
    @abstractmethod
    def scores(self, q: QueueColumns, now: float) -> np.ndarray:
        """Priority of every queued generation at time ``now``; higher runs first."""


class FCFS(PriorityPolicy):
    """Earliest arrival first; a suspended generation keeps its request's arrival."""

    def scores(self, q: QueueColumns, now: float) -> np.ndarray:
        return -q.column("arrival")


class EDF(PriorityPolicy):
    """Earliest first-response deadline first; suspended generations keep it (§7.3.2)."""

    def scores(self, q: QueueColumns, now: float) -> np.ndarray:
        return -(q.column("arrival") + q.column("ert"))


class PUD(PriorityPolicy):
    """Potential utility density scaled by slack (Eq. 4), and the loss rate once late.

    For a segment whose generation would start now, its action starts at
    ``now + G(s) + network`` (G(s) the segment generation time: the robot's profiled
    constant, or TimeBill's per-generation estimate). W is that start
    minus the request's arrival (first segment) or minus the estimated end of the
    previous segment's execution (later segments, TUF_1 with ERT = 0). L, the slack,
    is the time from that start to the segment's deadline (arrival + ERT, or the
    previous segment's end).

    The density's G (the divisor) is Eq. 4's: the robot's average segment generation
    time from profiling, the same for all its segments, while G(s) dates the action.
    With TimeBill both differ: a per-segment G(s) in the divisor would rank by it
    quadratically (below), so a first segment, which pays its prompt's prefill and is
    longer than most, would wait behind every later segment of plans in flight.

    On time (L >= 0) the score is Eq. 4, TUF(W) / (G * L), with L floored at G.
    Late (L < 0) the TUF keeps falling at |alpha| per second, so waiting one more
    generation time costs |alpha| * G: the score is (delta_k * beta + |alpha| * G) / G^2,
    the first segment's (delta_0 = 1) above the on-time ones of equal beta, urgent
    (steeper alpha) above normal. Eq. 4 itself would rank a late generation by its
    falling, eventually negative utility, i.e. last: under overload late urgent
    requests then wait without bound behind fresh normal ones. Among equals the
    longest late goes first.
    """

    LATENESS_TIEBREAK = 1e-6

    def __init__(self, network_latency: float) -> None:
        self.network_latency = network_latency

    def scores(self, q: QueueColumns, now: float) -> np.ndarray:
        first = q.column("seg_index") == 0
        g = q.column("gen_mean")  # Eq. 4's G
        action_start = now + q.column("gen_time") + self.network_latency
        origin, ert = q.column("origin"), q.column("seg_ert")
        beta, alpha = q.column("beta"), q.column("alpha")
        utility = np.minimum(beta, alpha * (action_start - origin - ert) + beta)
        slack = origin + ert - action_start
        on_time = utility / (g * np.maximum(slack, g))
        late = (np.where(first, beta, 0.0) - alpha * g) / (g * g) \
            - self.LATENESS_TIEBREAK * slack
        return np.where(slack >= 0, on_time, late)


def request_priority(ert: float) -> int:
    """The request's urgency as a vLLM ``priority`` (lower runs first): its ERT in milliseconds."""
    return round(ert * 1000)


class VllmPriority(PriorityPolicy):
    """vLLM's ``scheduling_policy="priority"``: lowest ``request_priority`` first, then earliest arrival."""

    ARRIVAL_SCALE = 1e-7  # arrival seconds stay far below one priority step

    def scores(self, q: QueueColumns, now: float) -> np.ndarray:
        return -(np.round(q.column("ert") * 1000) + q.column("arrival") * self.ARRIVAL_SCALE)
