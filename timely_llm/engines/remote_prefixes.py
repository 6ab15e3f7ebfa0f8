"""What each server behind the remote engine holds in its prefix cache, as far as this engine can tell, and what
its prefix-cache metrics say.

``PrefixIndex`` is the engine's own record of the contexts it had a server compute, as chained hashes of their
full KV blocks (a block matches only after the same blocks before it, as vLLM's prefix cache does), the most
recently used last and bounded to the server's KV capacity: new generations go where their prompt's blocks are
(remote.py). It cannot see the server's own evictions; the server's metrics (``PrefixCacheCounts``) are what
measure the reuse.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import dataclass

BALANCE_SLACK = 2
"""A new generation follows its cached prompt prefix to a server with at most this many more open streams than
the least busy one; past that it goes to the least busy (the cache saves a prefill, a long batch costs every
step: SGLang's cache-aware router balances alike)."""
_METRIC = re.compile(r"^vllm:prefix_cache_(?P<what>queries|hits)(?:_total)?(?:\{[^}]*\})? (?P<value>\S+)$",
                     re.MULTILINE)


@dataclass(frozen=True)
class Candidate:
    """A server a new generation could go to, as placement weighs it."""

    cached_blocks: int
    """Leading full blocks of the generation's prompt it holds."""
    open: int
    """Generations streaming from it now."""
    free_blocks: int
    silent: bool = False
    """Its streams have long gone without a token (stalled: ``remote.SILENT_SHARE``)."""


def choose_server(candidates: list[Candidate], max_open: int) -> int:
    """The index of the server a new generation goes to: where most of its prompt's leading blocks are cached, among
    those with room (fewer than ``max_open`` open) within ``BALANCE_SLACK`` of the least busy; then the fewest open,
    then the most free KV (all full: the least busy). A server gone silent only when no other has room. The remote
    engine and its simulator place alike."""
    speaking = [i for i, c in enumerate(candidates) if not c.silent and c.open < max_open]
    if speaking and any(c.silent for c in candidates):
        return speaking[choose_server([candidates[i] for i in speaking], max_open)]
    least = min(c.open for c in candidates)
    near = [i for i, c in enumerate(candidates) if c.open - least <= BALANCE_SLACK and c.open < max_open]
    if not near:  # every server full: the least busy, then the cache
        return min(range(len(candidates)), key=lambda i: (candidates[i].open, -candidates[i].cached_blocks))
    return min(near, key=lambda i: (-candidates[i].cached_blocks, candidates[i].open, -candidates[i].free_blocks))


class PrefixIndex:
    def __init__(self, block_size: int, capacity_blocks: int) -> None:
        self._block_size = block_size
        self._capacity = max(capacity_blocks, 1)
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def add(self, token_ids: list[int]) -> None:
        """The server computed ``token_ids``: their full blocks are now its most recently used."""
        for key in self._chain(token_ids):
            self._blocks[key] = None
            self._blocks.move_to_end(key)
        while len(self._blocks) > self._capacity:
            self._blocks.popitem(last=False)

    def cached_blocks(self, token_ids: list[int]) -> int:
        """How many leading full blocks of ``token_ids`` the server holds."""
        found = 0
        for key in self._chain(token_ids):
            if key not in self._blocks:
                break
            found += 1
        return found

    def clear(self) -> None:
        """The server went away: whatever it held is gone."""
        self._blocks.clear()

    def _chain(self, token_ids: list[int]) -> list[int]:
        keys, parent = [], 0
        for end in range(self._block_size, len(token_ids) + 1, self._block_size):
            parent = hash((parent, tuple(token_ids[end - self._block_size:end])))
            keys.append(parent)
        return keys


@dataclass(frozen=True)
class PrefixCacheCounts:
    """One server's prefix cache as its metrics count it (tokens looked up, tokens found), beside what this engine
    asked of it (tokens its first starts could find cached at most, tokens its resumes could reuse, resumes).
    Subtract two to get a run's."""

    queries: int = 0
    hits: int = 0
    first_start_tokens: int = 0
    resumed_tokens: int = 0
    resumes: int = 0

    def __sub__(self, other: PrefixCacheCounts) -> PrefixCacheCounts:
        return PrefixCacheCounts(*(a - b for a, b in zip(self.fields(), other.fields(), strict=True)))

    def __add__(self, other: PrefixCacheCounts) -> PrefixCacheCounts:
        return PrefixCacheCounts(*(a + b for a, b in zip(self.fields(), other.fields(), strict=True)))

    def fields(self) -> tuple[int, int, int, int, int]:
        return self.queries, self.hits, self.first_start_tokens, self.resumed_tokens, self.resumes

    @property
    def resumed_hits_at_least(self) -> int:
        """Tokens the resumes found cached, at least: every hit but the most first starts could have had."""
        return min(max(self.hits - self.first_start_tokens, 0), self.resumed_tokens)


def prefix_cache_metrics(text: str) -> tuple[int, int] | None:
    """(queries, hits) in tokens from a server's Prometheus metrics, summed over its engines; None where it does
    not count them (a server that is not vLLM, or started with its stats off)."""
    found = {"queries": 0.0, "hits": 0.0}
    seen = False
    for match in _METRIC.finditer(text):
        found[match["what"]] += float(match["value"])
        seen = True
    return (int(found["queries"]), int(found["hits"])) if seen else None
