"""The generation queue: initial and suspended generations, fetched by current priority."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from timely_llm.core.priority import PriorityPolicy, QueueColumns
from timely_llm.core.request import Request

GenTerms = Callable[[Request], tuple[float, float]]
"""A queued generation's G(s) as (fixed seconds, expected tokens): G = fixed + tokens x the token time."""


class GenerationQueue:
    def __init__(self, policy: PriorityPolicy, gen_terms: GenTerms | None = None) -> None:
        """``gen_terms`` estimates each generation's G(s) (default: its robot's profiled constant)."""
        self.policy = policy
        self.gen_terms = gen_terms or _profiled_gen_time
        self.token_time: float | None = None
        """Seconds per token in the batch a queued generation would join; when set, every row's G is
        recomputed from its terms at each fetch (one vector operation, however long the queue)."""
        self._columns = QueueColumns()
        self._requests: list[Request] = []
        self._slot: dict[str, int] = {}
        self._scores: np.ndarray | None = None
        """Every row's score as last computed, for ``_scored_at`` (now, token time); a scheduling point
        fetches many times at one ``now``, removing what it picks. Dropped when a row is pushed or rewritten,
        kept in step with the rows when one is removed (scores are per row: the rest stand)."""
        self._scored_at: tuple[float, float | None] | None = None

    def __len__(self) -> int:
        return len(self._requests)

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._slot

    def __iter__(self):  # noqa: ANN204 - iterator over queued requests
        return iter(list(self._requests))

    def push(self, request: Request) -> None:
        if request.id in self._slot:
            raise ValueError(f"{request.id} is already queued")
        self._slot[request.id] = self._columns.append(self._row(request))
        self._requests.append(request)
        self._scores = None

    def update(self, request: Request) -> None:
        """Rewrite a queued request's row in place after its scheduling parameters changed."""
        self._columns.set(self._slot[request.id], self._row(request))
        self._scores = None

    def remove(self, request_id: str) -> Request:
        slot = self._slot.pop(request_id)
        moved_from = self._columns.remove(slot)
        if self._scores is not None:  # the same move as the rows'
            self._scores[slot] = self._scores[moved_from]
            self._scores = self._scores[:moved_from]
        request = self._requests[slot]
        last = self._requests.pop()
        if moved_from != slot:
            self._requests[slot] = last
            self._slot[last.id] = slot
        return request

    def best(self, now: float, first_segments_only: bool = False) -> Request | None:
        """The highest-priority generation at ``now`` (among those in their first segment: ``first_segments_only``)."""
        if not self._requests:
            return None
        if self._scores is None or self._scored_at != (now, self.token_time):
            if self.token_time is not None:
                cols = self._columns
                cols.column("gen_time")[:] = cols.column("gen_fixed") + cols.column("gen_tokens") * self.token_time
            self._scores = np.array(self.policy.scores(self._columns, now))  # a copy: removals edit it
            self._scored_at = (now, self.token_time)
        if not first_segments_only:
            return self._requests[int(self._scores.argmax())]
        scores = np.where(self._columns.column("seg_index") == 0, self._scores, -np.inf)
        best = int(scores.argmax())
        return self._requests[best] if scores[best] > -np.inf else None

    def _row(self, request: Request) -> tuple[float, ...]:
        """The request's values for ``QueueColumns.NAMES``."""
        tuf = request.tuf
        origin, segment_tuf = request.segment_tuf(request.seg_index)
        fixed, tokens = self.gen_terms(request)
        gen_time = fixed + tokens * self.token_time if self.token_time is not None else fixed
        return (request.arrival, tuf.ert, tuf.alpha, tuf.beta, request.seg_index, origin, segment_tuf.ert,
                gen_time, fixed, tokens, request.robot.segment_generation_time)


def _profiled_gen_time(request: Request) -> tuple[float, float]:
    return request.robot.segment_generation_time, 0.0
