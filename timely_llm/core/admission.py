"""Admission: memory-safe admission under length uncertainty (Amin) and deferred prefill (K*).

**Amin** (Algorithm 2 of the Amax/Amin paper). How many tokens a generation still writes
before its segment ends is known only as an interval ``[lower, upper]``: at least the
shortest segment its robot type has produced (at least one token), at most the segment's
maximum length. Amin plans with the lower bound, which it raises as tokens arrive, and
resolves a memory overflow itself:

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

**Deferred prefill** (paper 004): ``departure_threshold`` gives K*, ``DeferredPrefill``
holds prefills back under backlog until K* generations have left the batch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from timely_llm.core.request import Request

if TYPE_CHECKING:
    from timely_llm.engines.base import KvView


class SegmentLengths:
    """The shortest segment (in tokens) seen per robot type: a segment's length lower bound."""

    def __init__(self) -> None:
        self._shortest: dict[str, int] = {}

    def observe(self, robot: str, tokens: int) -> None:
        if tokens > 0:
            self._shortest[robot] = min(tokens, self._shortest.get(robot, tokens))

    def lower(self, robot: str) -> int:
        return self._shortest.get(robot, 1)


class KvAdmission:
    """Amin off: a newcomer needs room for its context and a whole segment in the free blocks the engine
    reports; nothing is reserved or evicted (the engine preempts on overflow)."""

    def __init__(self, blocks_for: Callable[[int], int]) -> None:
        self.blocks_for = blocks_for

    def blocks_needed(self, request: Request, parked: bool, kv: KvView) -> int:
        """Blocks ``request`` needs to run (a parked generation holds its own)."""
        return 0 if parked else self.blocks_for(request.context_tokens + request.robot.segment_max_tokens)

    def free(self, kv: KvView, reserved: int) -> int:
        return kv.free_blocks

    def demand(self, running: Iterable[Request]) -> tuple[int, int]:
        return 0, 0

    @staticmethod
    def eviction_order(running: Iterable[Request], network_latency: float) -> list[Request]:
        return []

    def observe_segment(self, robot: str, tokens: int) -> None:
        pass


class AminAdmission:
    """The memory side of admission and eviction for one engine (``blocks_for``: tokens -> KV blocks)."""

    def __init__(self, blocks_for: Callable[[int], int]) -> None:
        self.blocks_for = blocks_for
        self.segments = SegmentLengths()

    def blocks_needed(self, request: Request, parked: bool, kv: KvView) -> int:
        """Blocks ``request`` takes before reaching its lower bound: ``reserve`` if running, else ``needed``."""
        return self.reserve(request) if parked else self.needed(request, kv.blocks_to_start)

    def free(self, kv: KvView, reserved: int) -> int:
        """Free blocks less those the generations admitted before still take to their lower bounds."""
        return kv.free_blocks - reserved

    def observe_segment(self, robot: str, tokens: int) -> None:
        self.segments.observe(robot, tokens)

    def lower_bound(self, request: Request) -> int:
        """Tokens the request's current segment certainly still takes (always at least one more)."""
        return max(self.segments.lower(request.robot.robot) - request.seg_tokens, 1)

    def reserve(self, request: Request) -> int:
        """Blocks a running generation still takes before reaching its lower bound."""
        context = request.context_tokens
        return self.blocks_for(context - 1 + self.lower_bound(request)) - self.blocks_for(context - 1)

    def needed(self, request: Request, blocks_to_start: Callable[[list[int]], int]) -> int:
        """Free blocks a generation (re)started now takes: its prompt less what other generations
        share with it in the prefix cache (its own generated tokens no one shares; ``blocks_to_start``:
        the engine's count of a prompt's blocks), the rest of its context and its segment's lower bound."""
        prompt = len(request.prompt_ids)
        rest = self.blocks_for(request.context_tokens + self.lower_bound(request)) - self.blocks_for(prompt)
        return blocks_to_start(request.prompt_ids) + rest

    @staticmethod
    def eviction_order(running: Iterable[Request], network_latency: float) -> list[Request]:
        """Running generations in the order Amin suspends them on overflow: fewest tokens generated
        (smallest certified lower bound) first, then the least urgent (latest dispatch deadline)."""
        return sorted(running, key=lambda r: (len(r.output_ids), -r.dispatch_deadline(network_latency)))

    def demand(self, running: Iterable[Request]) -> tuple[int, int]:
        """(blocks the next step takes, blocks to reach every lower bound) of the running generations.
        A running generation writes its last token's KV in the next step."""
        growth = reserve = 0
        for r in running:
            context = r.context_tokens
            written = self.blocks_for(context - 1)
            growth += self.blocks_for(context) - written
            reserve += self.blocks_for(context - 1 + self.lower_bound(r)) - written
        return growth, reserve


def departure_threshold(stall: float, step_base: float, capacity: int, alpha: float) -> int:
    """K*, the departures to let accumulate before a prefill (deferred prefill, paper 004, Prop. 1).

    With a prefill stall of ``stall + t_p·tokens`` seconds, a decode step of ``step_base + t_d·B``,
    a batch of at most ``capacity`` and each generation leaving the batch after a token with
    probability ``alpha``, the inverse throughput is approximately
    ``(stall + step_base·ln(1 − K/C)/ln(1 − alpha)) / K`` plus terms free of K; K* minimises it.
    Without a fixed stall (``stall`` = 0) nothing is gained by waiting: K* = 1 (the paper's Remark 2).
    """
    if capacity <= 1 or stall <= 0:
        return 1
    alpha = min(max(alpha, 1e-6), 1 - 1e-6)
    per_departure_steps = -1.0 / math.log1p(-alpha)

    def inverse_throughput(k: int) -> float:
        steps = -math.log1p(-k / capacity) * per_departure_steps
        return (stall + step_base * steps) / k

    return min(range(1, capacity), key=inverse_throughput)


class DeferredPrefill:
    """Under backlog, start prefills only once K* generations left the batch since the last prefill.

    A prefill stalls every decoding generation for a fixed ``c_p`` plus its tokens' time, so
    batching K prefills into one stall saves (K − 1)·c_p (paper 004). The batch size right after
    the last prefill is remembered; departures are how far the batch has shrunk since. Once a
    scheduling point prefills anything, every other admission there joins the same stall.
    """

    def __init__(self, threshold: int) -> None:
        self.threshold = threshold
        self._batch_after_prefill = 0

    def departures(self, in_batch: int) -> int:
        return max(self._batch_after_prefill - in_batch, 0)

    def defers(self, in_batch: int, waiting: int) -> bool:
        """Hold prefills back: the batch (``in_batch`` generations) has not yet shed K* since the
        last prefill, it still can, and ``waiting`` generations are enough to fill K* slots at once.
        (Whether the candidate's deadline lets it wait is the caller's to check.)"""
        if in_batch == 0 or waiting < self.threshold:
            return False
        return self._batch_after_prefill >= self.threshold and self.departures(in_batch) < self.threshold

    def prefilled(self, batch: int) -> None:
        """A scheduling point prefilled; ``batch`` generations run after it."""
        self._batch_after_prefill = batch


class NoDeferral:
    """Deferred prefill off (or K* = 1): every prefill starts when admitted."""

    def defers(self, in_batch: int, waiting: int) -> bool:
        return False

    def prefilled(self, batch: int) -> None:
        pass
