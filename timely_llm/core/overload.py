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
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from timely_llm.core.estimator import SegmentTimes
from timely_llm.core.request import Request, Status

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

    def push(self, due: float, item: T) -> None:
        if math.isfinite(due):  # never due: nothing to watch
            heapq.heappush(self._heap, (due, next(self._seq), item))

    def pop_due(self, now: float) -> list[T]:
        out = []
        while self._heap and self._heap[0][0] < now:
            out.append(heapq.heappop(self._heap)[2])
        return out


@dataclass(frozen=True)
class Verdict:
    """What overload control decided for a request: end it, for ``reason``, or (``reason`` None) tell its robot,
    which keeps waiting, that its deadline cannot be met."""

    request: Request
    reason: str | None = None


def infeasible_at(arrival: float, cutoff: float, generation_time: float, network_latency: float) -> float:
    """The time after which a first segment started now gives a response past the TUF ``cutoff``."""
    return arrival + cutoff - network_latency - generation_time


class OverloadControl:
    """Decides, for one server, when a request is told that its deadline cannot be met (``shed``) and when
    a segment overran its deadline (each request's overrun strategy); the scheduler carries out its verdicts.

    ``running``: the server's running generations (read, never changed here); ``times``: TimeBill's
    estimator, when on, for the predicted generation times."""

    def __init__(self, shed: bool, running: Mapping[str, Request], times: SegmentTimes | None,
                 network_latency: float, counters: Counter[str]) -> None:
        self.shed = shed
        self.running = running
        self.times = times
        self.network_latency = network_latency
        self.counters = counters
        self._infeasible: DueHeap[Request] = DueHeap()
        """First segments not yet generated, by the time they become infeasible (``shed``)."""
        self._overruns: DueHeap[tuple[Request, int]] = DueHeap()
        """(request, segments done) of requests with an overrun strategy, by that segment's deadline."""

    def submitted(self, request: Request) -> None:
        """A new request: noted for when it will be infeasible (the next ``check`` finds it if it is already)."""
        if self.shed:
            fastest = request.overload.fastest_first_segment = self._fastest_first_segment(request)
            self._infeasible.push(infeasible_at(request.arrival, request.tuf.cutoff, fastest, self.network_latency),
                                  request)
        if request.overload.overrun != OVERRUN_NONE:
            self.watch_segment(request)

    def check(self, now: float) -> list[Verdict]:
        """At a scheduling point: the requests whose deadline can no longer be met, and the overrun strategies
        that fell due, in the order decided."""
        verdicts = []
        for request in self._infeasible.pop_due(now):
            if request.status in (Status.WAITING, Status.SUSPENDED) and not request.segments:  # (Amin evicts)
                verdicts.append(self.tell(request, now, None))
            elif request.status is Status.RUNNING and not request.segments:
                self._infeasible.push(now, request)  # being served: shed only if it returns to the queue unserved
        if self.shed:
            verdicts += self._shed_running(now)
        ending = {v.request.id for v in verdicts if v.reason is not None}
        for request, done in self._overruns.pop_due(now):
            if (request.status.ended or request.id in ending or request.finished_generating
                    or segments_done(request) != done):
                continue  # gone, or that segment came out (its successor is watched)
            deadline = self._segment_deadline(request)
            if deadline >= now:  # moved later (the robot reported the previous segment's real end)
                self._overruns.push(deadline, (request, done))
            elif (verdict := self.overran(request, done, now)) is not None:
                verdicts.append(verdict)
                ending.add(request.id)
        return verdicts

    def tell(self, request: Request, now: float, left: float | None) -> Verdict:
        """Its deadline cannot be met: shed it, or notify a robot that keeps waiting; ``left``: the predicted
        rest of a first segment being generated (None: the fastest first segment, for one not started)."""
        request.overload.infeasible_at = now
        left = request.overload.fastest_first_segment if left is None else left
        request.overload.best_response = now + left + self.network_latency - request.arrival
        if request.overload.keep_if_infeasible:
            self.counters["infeasible_kept"] += 1
            return Verdict(request)
        request.overload.shed = True
        self.counters["shed"] += 1
        return Verdict(request, INFEASIBLE_REASON)

    def overran(self, request: Request, index: int, now: float) -> Verdict | None:
        """Segment ``index`` overran its deadline: kill the plan, or (None) skip that segment when it comes out."""
        if request.overload.overrun == OVERRUN_KILL:
            self.counters["overruns_killed"] += 1
            request.overload.killed_at = now
            return Verdict(request, f"segment {index} overran its deadline (overrun strategy kill)")
        request.overload.skip_current = True  # counted when a segment is in fact dropped (the end of a plan is not)
        return None

    def breaks_a_cutoff(self, newcomer: Request, now: float) -> bool:
        """Would one more generation in the batch make a running first segment, more urgent than ``newcomer``
        and able to end by its cut-off in the batch as it is, miss it? (Never, with ``shed`` off.)"""
        if not self.shed:
            return False
        batch = len(self.running)
        own = self._segment_deadline(newcomer)
        for request in self.running.values():
            if not in_first_segment(request):
                continue
            cutoff = self._cutoff_dispatch(request)
            if cutoff < own and (now + self.first_segment_left(request, now, batch + 1) > cutoff
                                 >= now + self.first_segment_left(request, now, batch)):
                return True
        return False

    def watch_segment(self, request: Request) -> None:
        """Watch the request's next segment for an overrun (when its deadline is, or moves)."""
        self._overruns.push(self._segment_deadline(request), (request, segments_done(request)))

    def first_segment_left(self, request: Request, now: float, batch: int) -> float:
        """Predicted time to the end of a running first segment in a batch of ``batch``: TimeBill's expected
        tokens still to come at that batch's token time; without it, the robot's profiled G from its start."""
        if self.times:
            return self.times.expected_tokens(request) * self.times.token_time(batch, request.context_tokens)
        started = now if request.seg_gen_start is None else request.seg_gen_start
        return max(started + request.robot.segment_generation_time - now, 0.0)

    def _shed_running(self, now: float) -> list[Verdict]:
        """First segments being generated that, at the batch they are in, can no longer end by their cut-off."""
        batch, verdicts = len(self.running), []
        for request in self.running.values():
            if in_first_segment(request):
                left = self.first_segment_left(request, now, batch)
                if now + left > self._cutoff_dispatch(request):
                    self.counters["shed_running"] += 1
                    verdicts.append(self.tell(request, now, left))
        return verdicts

    def _fastest_first_segment(self, request: Request) -> float:
        """The fastest generation of its first segment we can predict: with TimeBill's estimator, its prompt's
        prefill and its expected length at a batch of one (the step time of the batch it would join sheds
        requests that could still make it); without, the robot's profiled G (PUD's)."""
        if not self.times:
            return request.robot.segment_generation_time
        tokens = self.times.expected_tokens(request) * self.times.token_time(1, request.context_tokens)
        return self.times.prefill_time(request, self.times.uncached_tokens(request)) + tokens

    def _segment_deadline(self, request: Request) -> float:
        """Latest dispatch of the next segment (sent or skipped) that can still bring utility >= 0 (inf when
        the TUF never reaches zero)."""
        origin, tuf = request.segment_tuf(segments_done(request))
        return origin + tuf.cutoff - self.network_latency

    def _cutoff_dispatch(self, request: Request) -> float:
        return request.arrival + request.tuf.cutoff - self.network_latency


def segments_done(request: Request) -> int:
    """Segments of the plan sent or skipped so far."""
    return len(request.segments) + request.overload.skipped_segments


def in_first_segment(request: Request) -> bool:
    """Generating its first segment, and not yet told that it is infeasible."""
    return not request.segments and not request.overload.skipped_segments and request.overload.infeasible_at is None
