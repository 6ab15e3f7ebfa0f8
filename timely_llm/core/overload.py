"""Overload control: when a request can no longer be served with utility >= 0, and TimeBill's overrun strategies.

A request's utility is its TUF at its response time, the first segment's execution
start. Served next, that segment's action starts at best at ``now + G + network``,
G the fastest generation of its first segment the server can predict (the robot's
profiled G that PUD ranks by; with the ``timebill`` feature, TimeBill's estimate of its
prefill and expected length at a batch of one, which knows the hardware), so its best
utility is below zero once that passes the TUF cut-off: from ``infeasible_at`` on.
Each request's time is computed once and kept in a ``DueHeap``; a scheduling point
pops only what has fallen due, O(log n) each, nothing when nothing has.

Overrun strategies (TimeBill §5, per request): a segment *overruns* when its
generation has not been dispatched by its deadline, the time past which it can only
bring negative utility: the first segment's TUF cut-off (less the network latency),
a later one's TUF_1 cut-off counted from the estimated end of the previous segment's
execution (the robot has then been idle that long). ``kill`` ends the plan there.
``skip-next`` drops the late segment: it is still generated (what follows is
generated from it) but never sent, and the plan goes on with the next segment, whose
deadline counts from the moment of the skip. The robot thus never executes a stale
step and is not held back by it.
"""

from __future__ import annotations

import heapq
import itertools
import math
from typing import Generic, TypeVar

OVERRUN_NONE = "none"
OVERRUN_KILL = "kill"
OVERRUN_SKIP_NEXT = "skip-next"
OVERRUN_STRATEGIES = (OVERRUN_NONE, OVERRUN_KILL, OVERRUN_SKIP_NEXT)

INFEASIBLE_REASON = "deadline cannot be met"
"""Why a shed request ended (the ROS goal's abort reason too)."""

T = TypeVar("T")


class DueHeap(Generic[T]):
    """Items each due at a time; ``pop_due(now)`` hands out those due strictly before ``now``, earliest first."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, T]] = []
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, due: float, item: T) -> None:
        if math.isfinite(due):  # never due: nothing to watch
            heapq.heappush(self._heap, (due, next(self._seq), item))

    def pop_due(self, now: float) -> list[T]:
        out = []
        while self._heap and self._heap[0][0] < now:
            out.append(heapq.heappop(self._heap)[2])
        return out


def infeasible_at(arrival: float, cutoff: float, generation_time: float, network_latency: float) -> float:
    """The time after which a first segment started now gives a response past the TUF ``cutoff``."""
    return arrival + cutoff - network_latency - generation_time


def segment_deadline(first: bool, arrival: float, prev_end: float, cutoff: float, alpha: float, beta: float,
                     network_latency: float) -> float:
    """Latest dispatch of a segment that can still bring utility >= 0 (inf when the TUF never reaches zero)."""
    if first:
        return arrival + cutoff - network_latency
    return math.inf if alpha == 0 else prev_end - beta / alpha - network_latency
