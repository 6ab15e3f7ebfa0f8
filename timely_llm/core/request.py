"""A plan request and the state the scheduler keeps for it (cf. vLLM's ``Request``)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from timely_llm.core.segmenter import IncrementalDetokenizer, Segmenter
from timely_llm.core.skills import SkillCall, SkillModel
from timely_llm.core.tuf import TUF


class Status(enum.Enum):
    WAITING = "waiting"  # queued, never started
    RUNNING = "running"  # in the engine's batch
    SUSPENDED = "suspended"  # a segment was dispatched; queued for resume
    GENERATED = "generated"  # plan complete; robot still executing
    SUCCEEDED = "succeeded"
    ABORTED = "aborted"
    CANCELED = "canceled"

    @property
    def ended(self) -> bool:
        return self in (Status.SUCCEEDED, Status.ABORTED, Status.CANCELED)


@dataclass
class Segment:
    index: int
    text: str
    calls: list[SkillCall]
    gen_start: float
    gen_end: float
    est_exec_time: float
    exec_start: float | None = None
    exec_end: float | None = None
    success: bool | None = None
    cached_tokens: int | None = None
    """Prefix-cache hit when the generation was (re)started for this segment."""
    evicted: bool = False

    def to_dict(self) -> dict:
        return {
            "index": self.index, "text": self.text, "gen_start": self.gen_start, "gen_end": self.gen_end,
            "exec_start": self.exec_start, "exec_end": self.exec_end,
            "est_exec_time": self.est_exec_time, "cached_tokens": self.cached_tokens, "evicted": self.evicted,
        }


@dataclass
class Request:
    id: str
    agent: str
    robot: SkillModel
    tuf: TUF
    arrival: float
    prompt_ids: list[int]
    max_new_tokens: int
    forced_ids: list[int] | None = None
    category: str = "normal"
    trace: int | None = None
    status: Status = Status.WAITING
    reason: str = ""
    output_ids: list[int] = field(default_factory=list)
    segments: list[Segment] = field(default_factory=list)
    seg_tokens: int = 0
    """Tokens generated for the segment in progress."""
    seg_gen_start: float | None = None
    prev_end_est: float = 0.0
    """Estimated end of the previous segment's execution (for k > 0)."""
    finished_generating: bool = False
    last_start_cache: tuple[int, bool] | None = None
    detok: IncrementalDetokenizer | None = None
    segmenter: Segmenter | None = None

    @property
    def seg_index(self) -> int:
        return len(self.segments)

    def dispatch_deadline(self, network_latency: float) -> float:
        """Latest dispatch that still lets the next segment's action start on time."""
        if self.seg_index == 0:
            return self.arrival + self.tuf.ert - network_latency
        return self.prev_end_est - network_latency

    @property
    def context_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)
