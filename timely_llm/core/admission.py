"""Memory-safe admission under length uncertainty (Amin, Algorithm 2 of the Amax/Amin paper).

How many tokens a generation still writes before its segment ends is known only as an
interval ``[lower, upper]``: at least the shortest segment its robot type has produced
(at least one token), at most the segment's maximum length. Amin plans with the lower
bound, which it raises as tokens arrive, and resolves a memory overflow itself:

* **Overflow resolution.** When the blocks the running generations need for the next
  step exceed the free KV blocks, suspend running generations (their token ids kept,
  their KV left in the prefix cache) in eviction order until the rest fits: fewest
  tokens generated first (the paper's smallest lower bound, the cheapest to restart),
  and among equals the least urgent (latest dispatch deadline). Without this the
  engine recompute-preempts whoever started last.
* **Admission by the lower bound.** A newcomer needs blocks for its context plus its
  segment's lower bound, out of the free blocks minus what the running generations
  still need to reach their own lower bounds and what this scheduling point already
  promised to earlier admissions (the engine allocates only when it prefills).

A newcomer's context is counted less the blocks other generations already hold for it
(a robot's shared prompt), as the engine reports them (``Engine.blocks_to_start``): counted
in full for every newcomer, as the plain rule does, admission by the lower bound would
admit one generation at a time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from timely_llm.core.request import Request


@dataclass(frozen=True)
class LengthBounds:
    """Tokens a generation still writes before its current segment ends, as an interval."""

    lower: int
    upper: int


class SegmentLengths:
    """The shortest segment (in tokens) seen per robot type: a segment's length lower bound."""

    def __init__(self) -> None:
        self._shortest: dict[str, int] = {}

    def observe(self, robot: str, tokens: int) -> None:
        if tokens > 0:
            self._shortest[robot] = min(tokens, self._shortest.get(robot, tokens))

    def lower(self, robot: str) -> int:
        return self._shortest.get(robot, 1)


class AminAdmission:
    """The memory side of admission and eviction for one engine (``blocks_for``: tokens -> KV blocks)."""

    def __init__(self, blocks_for: Callable[[int], int], blocks_to_start: Callable[[list[int]], int]) -> None:
        self.blocks_for = blocks_for
        self.blocks_to_start = blocks_to_start
        self.segments = SegmentLengths()

    def bounds(self, request: Request) -> LengthBounds:
        """Remaining tokens of the request's current segment (always at least one more)."""
        seg_max = request.robot.segment_max_tokens
        lower = max(self.segments.lower(request.robot.robot) - request.seg_tokens, 1)
        return LengthBounds(lower, max(seg_max - request.seg_tokens, lower))

    def growth(self, request: Request) -> int:
        """Blocks a running generation takes in the next step: the last token's KV is written then."""
        context = request.context_tokens
        return self.blocks_for(context) - self.blocks_for(context - 1)

    def reserve(self, request: Request) -> int:
        """Blocks a running generation still takes before reaching its lower bound."""
        context = request.context_tokens
        return self.blocks_for(context - 1 + self.bounds(request).lower) - self.blocks_for(context - 1)

    def needed(self, request: Request) -> int:
        """Free blocks a generation (re)started now takes: its context (less what other generations
        share with it in the prefix cache) plus its segment's lower bound."""
        context = request.context_tokens
        grown = self.blocks_for(context + self.bounds(request).lower) - self.blocks_for(context)
        return self.blocks_to_start(request.prompt_ids + request.output_ids) + grown

    @staticmethod
    def eviction_order(running: Iterable[Request], network_latency: float) -> list[Request]:
        """Running generations in the order Amin suspends them on overflow: fewest tokens generated
        (smallest certified lower bound) first, then the least urgent (latest dispatch deadline)."""
        return sorted(running, key=lambda r: (len(r.output_ids), -r.dispatch_deadline(network_latency)))

    def shortfall(self, running: Iterable[Request], free_blocks: int) -> int:
        """Blocks the next step needs beyond ``free_blocks`` (<= 0: it fits)."""
        return sum(self.growth(r) for r in running) - free_blocks
