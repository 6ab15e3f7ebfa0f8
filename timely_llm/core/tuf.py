"""Time-utility functions (Eq. 1 of the TimelyLLM paper)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property


@dataclass(frozen=True)
class TUF:
    """TUF(t) = min(beta, alpha * (t - ert) + beta); alpha <= 0, beta > 0, ert >= 0.

    Utility keeps falling past the cut-off (where it crosses zero), as in the paper.
    """

    ert: float
    alpha: float
    beta: float

    def __post_init__(self) -> None:
        for name in ("ert", "alpha", "beta"):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"TUF {name} must be finite, got {getattr(self, name)!r}")
        if self.ert < 0:
            raise ValueError(f"TUF ert must be >= 0, got {self.ert}")
        if self.alpha > 0:
            raise ValueError(f"TUF alpha must be <= 0 (utility cannot grow with delay), got {self.alpha}")
        if self.beta <= 0:
            raise ValueError(f"TUF beta must be > 0, got {self.beta}")

    def __call__(self, t: float) -> float:
        return min(self.beta, self.alpha * (t - self.ert) + self.beta)

    @property
    def cutoff(self) -> float:
        """Response time at which utility reaches zero (inf when alpha == 0)."""
        return math.inf if self.alpha == 0 else self.ert - self.beta / self.alpha

    def for_segment(self, index: int) -> TUF:
        """TUF_0 for the first segment, TUF_1 (ert = 0, same alpha and beta) for later ones (§4.2)."""
        return self if index == 0 else self._later_segments

    @cached_property
    def _later_segments(self) -> TUF:
        return TUF(0.0, self.alpha, self.beta)

    def to_dict(self) -> dict[str, float]:
        return {"ert": self.ert, "alpha": self.alpha, "beta": self.beta}


NORMAL_TUF = TUF(ert=1.0, alpha=-2.0, beta=1.0)
URGENT_TUF = TUF(ert=0.2, alpha=-6.67, beta=2.0)
DEFAULT_TUFS: dict[str, TUF] = {"normal": NORMAL_TUF, "urgent": URGENT_TUF, "arm": NORMAL_TUF}
"""The TUF of a request of each category (LRTrace's task categories) that gives none: the one source
for workloads, the node's ``tuf.<category>.*`` parameter defaults and the config file."""
