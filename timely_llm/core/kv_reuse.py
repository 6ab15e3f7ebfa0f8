"""What resumes reused: of the context a suspended generation already had computed, how much the engine served
from the KV it kept (suspension in place) or found in its prefix cache, and how much it computed again.

A resume could reuse its whole context but the last sampled token (an engine always computes that one to get
the next token's logits) and what was written after it (a robot's observation, new to the engine). The
scheduler counts both per run in its counters, from the engine's own report of each (re)start
(``ResumeInfo``); an engine that cannot say (the remote engine: its servers tell only in their metrics)
reports nothing here.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

RESUMED = "resumed_tokens"
"""Counter: context tokens resumes could have reused ..."""
RESUMED_FROM_KV = "resumed_kv_tokens"
"""... and of those, the tokens the engine served from kept or cached KV."""
RESUMES = "resumes_reported"
"""Counter: resumes counted in the two above."""
COUNTERS = (RESUMED, RESUMED_FROM_KV, RESUMES)
"""What every run with resumes counts, whatever else the scheduler did."""


def count_resume(counters: Counter[str], context_tokens: int, cached_tokens: int, appended: int) -> None:
    """A generation (re)started on ``context_tokens``, ``cached_tokens`` of them served from KV, after
    ``appended`` tokens written since its last step (an observation)."""
    reusable = context_tokens - 1 - appended
    if reusable <= 0:
        return
    counters[RESUMED] += reusable
    counters[RESUMED_FROM_KV] += min(max(cached_tokens, 0), reusable)
    counters[RESUMES] += 1


@dataclass(frozen=True)
class KvReuse:
    resumes: int
    reusable: int
    """Context tokens the resumes could have reused."""
    reused: int
    """Of those, served from kept or cached KV ..."""
    at_least: bool = False
    """... or at least that many (the remote engine's servers count hits over all requests, not per resume)."""

    @classmethod
    def of(cls, counters: dict[str, int]) -> KvReuse:
        return cls(counters.get(RESUMES, 0), counters.get(RESUMED, 0), counters.get(RESUMED_FROM_KV, 0))

    @property
    def recomputed(self) -> int:
        return self.reusable - self.reused

    @property
    def share(self) -> float | None:
        """Reused over reusable; None without a resume."""
        return self.reused / self.reusable if self.reusable else None

    def describe(self) -> str:
        if self.share is None:
            return "KV reuse: no resume"
        bound = "at least " if self.at_least else ""
        return (f"KV reuse: {bound}{100 * self.share:.1f}% of resumed context from kept or cached KV "
                f"({self.reused} of {self.reusable} tokens over {self.resumes} resumes; {self.recomputed} recomputed)")
