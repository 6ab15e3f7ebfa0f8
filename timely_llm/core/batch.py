"""Latency-guided batch control (§4.4) and the fixed batch sizes it is compared with."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from timely_llm.core.request import Request


class BatchController:
    """Decides whether the next generation may join the running batch.

    Adaptive mode admits a generation only if the most urgent running generation
    (least time left before its segment must be dispatched) still finishes its
    segment in time: its worst case (WCET) is the tokens left to the segment's
    maximum length times the recent step time. Two readings of §4.4 make this work:

    * the lag: while a batch runs, at most one generation joins per iteration, so
      each decision sees a step time measured with the previous newcomer in it;
    * the newcomer is refused if some running generation that can still make its
      deadline would miss it once the batch grows from n to n + 1 (WCET scaled by
      (n + 1) / n, a pessimistic linear slowdown); a generation already past
      saving does not veto admissions (otherwise one late urgent segment
      serialises every request behind it).

    Free KV memory must hold the newcomer's context plus one segment. A fixed
    ``max_batch`` caps the batch in either mode.
    """

    def __init__(self, adaptive: bool, max_batch: int | None = None, network_latency: float = 0.0,
                 window: int = 4) -> None:
        if max_batch is not None and max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {max_batch}")
        self.adaptive = adaptive
        self.max_batch = max_batch
        self.network_latency = network_latency
        self._recent_steps: deque[float] = deque(maxlen=window)
        self._admitted_this_step = False

    def record_step(self, duration: float) -> None:
        self._recent_steps.append(duration)
        self._admitted_this_step = False

    @property
    def step_time(self) -> float | None:
        """Recent seconds per decode step (one token per running generation)."""
        return sum(self._recent_steps) / len(self._recent_steps) if self._recent_steps else None

    def budget(self, request: Request, now: float) -> float:
        return request.dispatch_deadline(self.network_latency) - now

    def wcet(self, request: Request) -> float:
        """Worst-case time for ``request`` to finish its current segment at the recent speed."""
        left = max(request.robot.segment_max_tokens - request.seg_tokens, 1)
        return left * (self.step_time or 0.0)

    def admits(self, running: Sequence[Request], now: float, free_blocks: int, needed_blocks: int) -> bool:
        if self.max_batch is not None and len(running) >= self.max_batch:
            return False
        if needed_blocks > free_blocks:
            return False
        if not self.adaptive or not running:
            return True
        if self._admitted_this_step:
            return False
        growth = (len(running) + 1) / len(running)
        for r in running:
            wcet, budget = self.wcet(r), self.budget(r, now)
            if wcet <= budget < wcet * growth:
                return False
        self._admitted_this_step = True
        return True
