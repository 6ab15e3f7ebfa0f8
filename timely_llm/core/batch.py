"""Latency-guided batch control (§4.4): who may run in the next iteration.

The server asks ``admits`` once per candidate, in priority order, at every
scheduling point, as many times as candidates keep being admitted: there is no
per-iteration limit, so admissions keep up with resumes at any load.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Sequence

from timely_llm.core.request import Request
from timely_llm.core.throughput import CAP_BOUND_SPEED, ThroughputModel

KNEE_SEARCH_LIMIT = 1024
"""Largest knee looked for when no batch cap is set."""


class StepModel:
    """Decode step time as a line in the batch size, fitted to the recent decode-only steps.

    §4.4 reads the generation speed off the most recent steps ("a lag for one
    generation"); a fitted line lets the controller also predict the step after
    several admissions, so many generations can join in one iteration. Until
    the recent steps span two batch sizes the slowdown is taken as proportional
    to the batch (the pessimistic reading). A better estimator (issue 11: TimeBill)
    replaces this class.
    """

    def __init__(self, window: int = 64) -> None:
        self._samples: deque[tuple[int, float]] = deque(maxlen=window)
        self._sums = [0.0] * 5  # n, sum B, sum d, sum B^2, sum B*d

    def record(self, batch: int, duration: float) -> None:
        if len(self._samples) == self._samples.maxlen:
            self._add(*self._samples[0], sign=-1.0)
        self._samples.append((batch, duration))
        self._add(batch, duration, sign=1.0)

    def _add(self, batch: int, duration: float, sign: float) -> None:
        s = self._sums
        s[0] += sign
        s[1] += sign * batch
        s[2] += sign * duration
        s[3] += sign * batch * batch
        s[4] += sign * batch * duration

    def predict(self, batch: int) -> float | None:
        """Seconds per decode step with ``batch`` generations; None before any step."""
        n, sb, sd, sbb, sbd = self._sums
        if n < 0.5:
            return None
        mean_b, mean_d = sb / n, sd / n
        var = sbb / n - mean_b * mean_b
        proportional = mean_d / max(mean_b, 1.0)
        slope = proportional if var < 0.25 else min(max((sbd / n - mean_b * mean_d) / var, 0.0), proportional)
        return max(mean_d + slope * (batch - mean_b), 0.0)


class RunningBatch(Sequence[Request]):
    """The running generations in dispatch-deadline order, kept through one scheduling point.

    Within a scheduling point ``now`` and the running generations' deadlines stay fixed (the server
    holds its lock); only generations admitted join. A newcomer's check then looks only at those more
    urgent than itself (``more_urgent``) instead of walking the whole batch for each candidate.
    """

    def __init__(self, running: Iterable[Request], network_latency: float) -> None:
        self.network_latency = network_latency
        pairs = sorted(((r.dispatch_deadline(network_latency), r) for r in running), key=lambda p: p[0])
        self._deadlines = [deadline for deadline, _ in pairs]
        self._requests = [request for _, request in pairs]

    def __len__(self) -> int:
        return len(self._requests)

    def __getitem__(self, index):  # noqa: ANN001, ANN204 - Sequence's int and slice overloads
        return self._requests[index]

    def add(self, request: Request) -> None:
        """``request`` was admitted: it joins in deadline order (after those with the same deadline)."""
        deadline = request.dispatch_deadline(self.network_latency)
        at = bisect_right(self._deadlines, deadline)
        self._deadlines.insert(at, deadline)
        self._requests.insert(at, request)

    def more_urgent(self, due: float | None, now: float) -> Iterator[tuple[float, Request]]:
        """(budget at ``now``, generation) of each generation whose budget is below ``due`` (all without one).

        Budgets are compared as ``BatchController.budget`` computes them (deadline - now): the deadline
        order is their order, and a bisection on them finds exactly those below ``due``.
        """
        end = len(self._requests) if due is None else bisect_left(self._deadlines, due, key=lambda d: d - now)
        return ((self._deadlines[i] - now, self._requests[i]) for i in range(end))


class BatchController:
    """Decides whether one more generation may run in the next iteration.

    * A fixed ``max_batch`` caps the batch (the engine's cap too) in every mode.
    * Free KV memory must hold the newcomer's context plus one segment.
    * Adaptive mode also protects running generations more urgent than the newcomer
      (earlier deadline) that can still make it: one whose worst case (WCET: tokens
      left to its segment's maximum length times the predicted step time) fits its
      budget at the current batch size vetoes the newcomer if it would miss it with
      one more generation in the batch. A generation already past saving vetoes
      nothing (otherwise one late urgent segment serialises every request behind it).
    * No newcomer is refused if waiting for the protected segment would make it
      late too: then refusing only moves the lateness.
    * With a throughput model (ALA, ``Features.ala``) step times come from its fitted curve
      where it is confident (``StepModel`` where not), and adaptive mode stops growing the
      batch past the curve's knee, except for a newcomer already late (waiting cannot help it)
      and, where the batch cap bounds the slowdown (``CAP_BOUND_SPEED``), a newcomer at its
      latest start: one more step of waiting and its worst case no longer fits its budget.
      There holding it back past its deadline buys the running generations less than it
      costs it; without such a cap the batch could grow far past the knee that way.
    """

    def __init__(self, adaptive: bool, max_batch: int | None = None, network_latency: float = 0.0,
                 step_model: StepModel | None = None, throughput: ThroughputModel | None = None,
                 wcet_model: Callable[[Request, int], float] | None = None,
                 counters: Counter[str] | None = None) -> None:
        if max_batch is not None and max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.adaptive = adaptive
        self.max_batch = max_batch
        self.network_latency = network_latency
        self.steps = step_model or StepModel()
        self.wcet_model = wcet_model
        """When set (TimeBill), a segment's worst case comes from it instead of the recent-step rule."""
        self.throughput = throughput
        self.counters = Counter() if counters is None else counters
        """Events by name (the server's counters when it runs one); ``ala_knee_refusals``: newcomers kept
        waiting at the knee."""

    def record_step(self, duration: float, batch: int, prefill: bool = False) -> None:
        """One engine iteration over ``batch`` generations; prefill steps do not measure decoding."""
        if not prefill and batch > 0:
            self.steps.record(batch, duration)
            if self.throughput is not None:
                self.throughput.record(batch, duration)

    def step_time(self, batch: int) -> float:
        if self.throughput is not None:
            predicted = self.throughput.step_time(batch)
            if predicted is not None:
                return predicted
        return self.steps.predict(batch) or 0.0

    def budget(self, request: Request, now: float) -> float:
        return request.dispatch_deadline(self.network_latency) - now

    def wcet(self, request: Request, batch: int, step: float | None = None) -> float:
        """Worst-case time for ``request`` to finish its current segment in a batch of ``batch``
        (``step``: the step time at that batch, when the caller has it already)."""
        if self.wcet_model is not None:
            return self.wcet_model(request, batch)
        left = max(request.robot.segment_max_tokens - request.seg_tokens, 1)
        return left * (self.step_time(batch) if step is None else step)

    def has_room(self, running: int) -> bool:
        return self.max_batch is None or running < self.max_batch

    def ordered(self, running: Iterable[Request]) -> RunningBatch:
        """``running`` as ``admits`` reads it; one per scheduling point spares ordering it for each candidate."""
        return RunningBatch(running, self.network_latency)

    def admits(self, running: Sequence[Request], now: float, free_blocks: int, needed_blocks: int,
               newcomer: Request | None = None) -> bool:
        """May ``newcomer`` join ``running`` in the next iteration? ``running``: best a ``RunningBatch`` from
        ``ordered``, kept through the scheduling point (any other sequence is ordered at each call)."""
        if not self.has_room(len(running)) or needed_blocks > free_blocks:
            return False
        if not self.adaptive or not running:
            return True
        if self._past_knee(len(running), now, newcomer):
            return False
        n = len(running)
        step_now, step_grown = self.step_time(n), self.step_time(n + 1)
        due = None if newcomer is None else self.budget(newcomer, now)
        own = 0.0 if newcomer is None else self.wcet(newcomer, n + 1, step_grown)
        batch = running if isinstance(running, RunningBatch) else self.ordered(running)
        for budget, r in batch.more_urgent(due, now):  # only a more urgent generation (earlier deadline) vetoes
            wcet_now, wcet_grown = self.wcet(r, n, step_now), self.wcet(r, n + 1, step_grown)
            if wcet_now <= budget < wcet_grown:
                if due is not None and due - wcet_now < own:
                    continue  # waiting for it would make the newcomer late too: no gain in refusing
                return False
        return True

    def _past_knee(self, running: int, now: float, newcomer: Request | None) -> bool:
        """ALA: the batch is at the throughput curve's knee and the newcomer can still afford to wait."""
        if self.throughput is None:
            return False
        knee = self.throughput.knee(self.max_batch or KNEE_SEARCH_LIMIT)
        if knee is None or running < knee:
            return False
        if newcomer is not None and self.budget(newcomer, now) < 0:
            return False
        if newcomer is not None and self._cap_bounds_batch() and self._at_latest_start(newcomer, running, now):
            self.counters["ala_knee_latest_starts"] += 1
            return False
        self.counters["ala_knee_refusals"] += 1
        return True

    def _cap_bounds_batch(self) -> bool:
        return (self.max_batch is not None and self.throughput is not None
                and self.throughput.knee(self.max_batch, CAP_BOUND_SPEED) == self.max_batch)

    def _at_latest_start(self, newcomer: Request, running: int, now: float) -> bool:
        """Waiting one more step would leave ``newcomer`` less budget than its worst case in the grown batch."""
        return self.budget(newcomer, now) - self.wcet(newcomer, running + 1) <= self.step_time(running)
