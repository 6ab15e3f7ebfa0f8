"""The scheduler's switchable parts, from the companion papers (one source for their names and defaults).

Each part is off unless switched on; ``DEFAULT`` holds the ones on by default, those
that measurably help (docs/scheduler-parts.md, "Ablation"). A set of parts is written as a comma list
of names, or ``all``, ``none``, ``default``: ``timely-llm bench --features timebill,amin``,
``timely-llm sweep --features none all``, the node's ``features`` parameter.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class Features:
    timebill: bool = False
    """TimeBill: G(s) and WCET from the fitted execution-time estimator and predicted segment lengths."""
    amin: bool = False
    """Amin: admit by the lower bound of the remaining plan length; on KV overflow suspend the smallest bounds."""
    ala: bool = False
    """ALA: the batch controller predicts unseen batch sizes from the fitted throughput curve."""
    deferred_prefill: bool = False
    """Deferred prefill: under backlog, let K* departures accumulate before a prefill stall."""
    shed: bool = False
    """Overload control: end a request at once when even serving it next cannot give it utility >= 0."""

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def parse(cls, text: str) -> Features:
        """``a,b`` (exactly those on), ``all``, ``none`` or ``default``; ValueError naming the bad part."""
        words = [w.strip().replace("-", "_") for w in text.split(",") if w.strip()]
        if words in (["none"], []):
            return cls()
        if words == ["all"]:
            return cls(**dict.fromkeys(cls.names(), True))
        if words == ["default"]:
            return DEFAULT
        unknown = [w for w in words if w not in cls.names()]
        if unknown:
            raise ValueError(f"unknown scheduler feature(s) {', '.join(unknown)} "
                             f"(known: {', '.join(cls.names())}, or all, none, default)")
        return cls(**dict.fromkeys(words, True))

    @property
    def on(self) -> tuple[str, ...]:
        return tuple(n for n in self.names() if getattr(self, n))

    def label(self) -> str:
        """The inverse of ``parse``: ``none``, ``all`` or the comma list of the parts on."""
        if not self.on:
            return "none"
        return "all" if len(self.on) == len(self.names()) else ",".join(self.on)


DEFAULT = Features(amin=True, ala=True)
"""The parts on when nothing is said (bench, sweep, node): those the ablation shows helping urgent requests
where their resource is scarce (KV memory: amin; batch slots on edge GPUs: ala) and changing nothing elsewhere."""
