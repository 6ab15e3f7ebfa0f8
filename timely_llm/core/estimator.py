"""TimeBill's execution-time estimator (ETE) and segment-length predictor, as the scheduler uses them.

Prefill of N new tokens over a context of C tokens takes ``a·N·C + b·N + c`` (TimeBill's
``a·N² + b·N + c`` when nothing is cached, C = N); one decode step of a batch of B
generations attending over K context tokens in all takes ``c + s·B + p·K`` (TimeBill's
``p·N_kv + q`` for one generation, q = c + s). The coefficients are the step terms of a
hardware profile: the simulator's own, or the one ``timely-llm profile`` fits to a real
engine by least squares.

A segment's length is predicted as TimeBill predicts a response's: as a class (bucket of
token counts), here learned online per robot type and segment index from the segments
the server dispatches, starting from a prior taken from the skill model.

G(s), a queued generation's segment generation time, is its resume prefill (the tokens
the prefix cache does not hold) plus its expected segment tokens times the decode step
of the batch it would join. The worst case (WCET) takes the pessimistic length
``min(k·N̂, N_max)`` instead, with TimeBill's pessimistic factor k.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from timely_llm.core.features import Features
from timely_llm.core.request import Request, Status
from timely_llm.engines.base import most_cached
from timely_llm.plan.skills import SkillModel

if TYPE_CHECKING:
    from timely_llm.engines.hardware import HardwareProfile

PESSIMISTIC_FACTOR = 5.0
"""TimeBill's default k (§6.1): the worst case assumes k times the predicted length, capped at N_max."""
BUCKET_TOKENS = 2
"""Width of a length class in tokens (TimeBill's B); segments are a few to a few tens of tokens."""
INDEX_CLASSES = 4
"""Segment indices 0, 1, 2 each have their own length classes; later segments share the last."""
PRIOR_WEIGHT = 0.5
"""The skill model's prior counts as half an observation: the first real segment outweighs it."""
MAX_TASKS = 20_000
"""Task-level length histories kept (a node serving endless new prompts stays bounded)."""
STEP_FACTOR_WEIGHT = 0.05
"""Weight of each new engine step in the running mean of measured step time over the decode model's."""


@dataclass(frozen=True)
class ExecutionTimeEstimator:
    """Step-time coefficients in TimeBill's form (seconds)."""

    a: float
    """Prefill: per new token per context token (the attention term, a·N² uncached)."""
    b: float
    """Prefill: per new token."""
    c: float
    """Per step, whatever it runs."""
    s: float
    """Decode: per generation in the batch."""
    p: float
    """Decode: per context token attended over."""
    stall: float = 0.0
    """Prefill: a fixed cost of any step that prefills (paper 004's c_p); 0 where prefill is chunked into decode."""
    servers: int = 1
    """Servers a batch is spread over, each stepping its share at the same time (``spread_over``)."""

    @classmethod
    def from_profile(cls, profile: HardwareProfile) -> ExecutionTimeEstimator:
        return cls.from_terms(profile.step)

    @classmethod
    def from_terms(cls, step: Mapping[str, float]) -> ExecutionTimeEstimator:
        """From a profile's ``step`` section (``engines/hardware.py``: base, per_prefill_token...)."""
        return cls(a=step["per_prefill_attention"], b=step["per_prefill_token"], c=step["base"],
                   s=step["per_decode_seq"], p=step["per_kv_token"], stall=step.get("prefill_stall", 0.0))

    @property
    def q(self) -> float:
        """TimeBill's decode intercept for one generation."""
        return self.c + self.s

    def prefill_time(self, new_tokens: int, context_tokens: int | None = None) -> float:
        """A prefill-only step of ``new_tokens`` (the context defaults to them: nothing cached)."""
        context = new_tokens if context_tokens is None else context_tokens
        return self.c + self.prefill_extra(new_tokens, context)

    def prefill_extra(self, new_tokens: int, context_tokens: int) -> float:
        """What prefilling adds to the step it runs in (the whole stall: as if it prefilled alone)."""
        return self.stall + (self.b + self.a * context_tokens) * new_tokens

    def decode_step(self, batch: int, kv_tokens: float) -> float:
        """One decode step of ``batch`` generations attending over ``kv_tokens`` context tokens in all: over
        several servers, the step of the busiest one, running its even share of both."""
        share = -(-batch // self.servers)
        if share < batch:
            kv_tokens *= share / batch
        return self.c + self.s * share + self.p * kv_tokens

    def spread_over(self, servers: int) -> ExecutionTimeEstimator:
        """The same hardware's steps for a batch spread over ``servers`` identical servers."""
        if servers < 1:
            raise ValueError(f"a batch is spread over one server or more, got {servers}")
        return replace(self, servers=servers)


def estimator_for(features: Features, profile: HardwareProfile | None,
                  missing: str) -> ExecutionTimeEstimator | None:
    """The engine's step-time model as the server's parts take it (bench and node alike): ``timebill`` and
    ``deferred_prefill`` need it (ValueError saying ``missing`` without a profile), ``ala`` derives its
    throughput prior from it where there is a profile (else it fits online only); None when no part uses it."""
    if profile is None:
        if features.timebill or features.deferred_prefill:
            raise ValueError(f"the timebill and deferred_prefill features need {missing}")
        return None
    if features.timebill or features.deferred_prefill or features.ala:
        return ExecutionTimeEstimator.from_profile(profile)
    return None


class SegmentLengths:
    """Expected segment length in tokens, learned online from dispatched segments.

    TimeBill predicts a response's length class from its input; here the input is the task
    (the prompt) and the segment's index. A task seen before is predicted from its own
    history at that index; a new one from its robot type's history at that index class
    (indices past INDEX_CLASSES - 1 share one), which starts from a prior: half the skill
    model's maximum segment length. Each history is a histogram over length classes of
    BUCKET_TOKENS tokens; the prediction is the most frequent class (ties go to the longer),
    reported as the mean length observed in it rather than its upper edge, which would
    overestimate by up to a bucket. At most MAX_TASKS task histories are kept (oldest dropped).
    """

    def __init__(self, robots: Mapping[str, SkillModel]) -> None:
        self._max = {name: robot.segment_max_tokens for name, robot in robots.items()}
        self._robot: dict[tuple[str, int], Histogram] = {}
        self._task: dict[tuple[int, int], Histogram] = {}

    def expected(self, robot: str, index: int, task: int | None = None) -> float:
        if task is not None:
            found = self._task.get((task, index))
            if found is not None:
                return found.prediction()
        return self._robot_histogram(robot, index).prediction()

    def observe(self, robot: str, index: int, tokens: int, task: int | None = None) -> None:
        if tokens <= 0:
            return
        self._robot_histogram(robot, index).add(tokens)
        if task is not None:
            history = self._task.get((task, index))
            if history is None:
                if len(self._task) >= MAX_TASKS:
                    del self._task[next(iter(self._task))]
                history = self._task[(task, index)] = Histogram()
            history.add(tokens)

    def _robot_histogram(self, robot: str, index: int) -> Histogram:
        key = (robot, min(index, INDEX_CLASSES - 1))
        histogram = self._robot.get(key)
        if histogram is None:
            histogram = self._robot[key] = Histogram()
            histogram.add(max(round(self._max.get(robot, 2) / 2), 1), PRIOR_WEIGHT)
        return histogram


class Histogram:
    """Counts and token sums per length class, with the prediction cached until the next observation."""

    def __init__(self) -> None:
        self._cells: dict[int, list[float]] = {}
        self._prediction: float | None = None

    def add(self, tokens: int, weight: float = 1.0) -> None:
        cell = self._cells.setdefault((max(tokens, 1) - 1) // BUCKET_TOKENS, [0.0, 0.0])
        cell[0] += weight
        cell[1] += weight * tokens
        self._prediction = None

    def prediction(self) -> float:
        if self._prediction is None:
            cells = self._cells
            count, total = cells[max(cells, key=lambda b: (cells[b][0], b))]
            self._prediction = total / count
        return self._prediction


class ProfiledTimes:
    """TimeBill off: each segment takes its robot's profiled generation time G, and nothing is learned."""

    def warmed(self, prompt_ids: Sequence[int]) -> None:
        pass

    def join_running(self, running: Collection[Request], max_batch: int | None) -> None:
        pass

    def kv_tokens(self, running: Iterable[Request]) -> int:
        return 0

    def record_step(self, duration: float, batch: int, kv_tokens: int) -> None:
        pass

    def observe(self, request: Request, index: int, tokens: int) -> None:
        pass

    def token_time(self) -> None:
        """No token time: the queue ranks by the profiled G."""

    def uncached_tokens(self, request: Request) -> int:
        return 0

    def gen_time(self, request: Request, uncached: int, batch: int) -> float:
        return request.robot.segment_generation_time


class SegmentTimes:
    """G(s) and the WCET of a segment for the server and its batch controller.

    ``join`` must be called at each scheduling point: it fixes the batch a queued
    generation would join and the context each generation in it attends over.
    ``record_step`` keeps a running mean of measured step times over the decode model's:
    what it misses is mostly the prefills of generations joining the batch, which every
    generation in it waits for, and on a real engine whatever the fitted profile does not
    see (a machine busier than when it was fitted slows every step alike).
    """

    def __init__(self, estimator: ExecutionTimeEstimator, robots: Mapping[str, SkillModel], block_tokens: int,
                 k: float = PESSIMISTIC_FACTOR) -> None:
        if k < 1:
            raise ValueError(f"TimeBill's pessimistic factor k must be >= 1, got {k}")
        self.estimator = estimator
        self.lengths = SegmentLengths(robots)
        self.block_tokens = block_tokens
        self.k = k
        self.step_factor = 1.0
        """Running mean of measured engine step time / ``estimator.decode_step``."""
        self._warm: list[np.ndarray] = []
        self._warm_hits: dict[int, int] = {}
        self._batch = 1
        self._kv_per_seq = 0.0
        self._token_time_at: dict[int, float] = {}

    def warmed(self, prompt_ids: Sequence[int]) -> None:
        """A prompt prefix the server put in the prefix cache (requests starting with it find it there)."""
        self._warm.append(np.asarray(prompt_ids))
        self._warm_hits.clear()

    def join_running(self, running: Collection[Request], max_batch: int | None) -> None:
        """The running generations now, and the batch cap."""
        self.join([r.context_tokens for r in running], max_batch)

    @staticmethod
    def kv_tokens(running: Iterable[Request]) -> int:
        """Context tokens a step over ``running`` attends over (``record_step``'s ``kv_tokens``)."""
        return sum(r.context_tokens for r in running)

    def join(self, contexts: Sequence[int], max_batch: int | None) -> None:
        """The running generations' context lengths now, and the batch cap."""
        batch = len(contexts) + 1
        self._batch = batch if max_batch is None else min(batch, max_batch)
        self._kv_per_seq = sum(contexts) / len(contexts) if contexts else 0.0
        self._token_time_at.clear()

    def record_step(self, duration: float, batch: int, kv_tokens: int) -> None:
        """One engine step over ``batch`` generations attending over ``kv_tokens`` context tokens."""
        modelled = self.estimator.decode_step(batch, kv_tokens)
        if modelled > 0:
            self.step_factor += STEP_FACTOR_WEIGHT * (duration / modelled - self.step_factor)
            self._token_time_at.clear()

    def token_time(self, batch: int | None = None, context: float = 0.0) -> float:
        """Predicted time per generated token at ``batch`` (default: the batch a queued generation would
        join), each generation attending over the running ones' mean context (``context`` when none runs)."""
        batch = self._batch if batch is None else max(batch, 1)
        step = self.estimator.decode_step(batch, batch * (self._kv_per_seq or context))
        return step * self.step_factor

    def uncached_tokens(self, request: Request) -> int:
        """Tokens a (re)start of ``request`` must prefill, if nothing it relies on was evicted.

        In the engine (running, parked): none. Suspended: what its last full KV block does not
        cover (the engine keeps full blocks cached). Never started: the prompt past the longest
        warmed prefix it begins with.
        """
        status = request.status
        if status in (Status.RUNNING, Status.PARKED):
            return 0
        context = request.context_tokens
        cacheable = most_cached(context, self.block_tokens)
        if status is Status.WAITING:
            cacheable = min(cacheable, self._warm_prefix(request) // self.block_tokens * self.block_tokens)
        return context - cacheable

    def expected_tokens(self, request: Request) -> float:
        """Tokens ``request`` is expected to generate before its current segment ends (TimeBill's N̂ less
        what a generation suspended mid-segment already has; at least one)."""
        expected = self.lengths.expected(request.robot.robot, request.seg_index, self._task(request))
        return max(expected - request.seg_tokens, 1.0)

    def prefill_time(self, request: Request, uncached: int) -> float:
        return self.estimator.prefill_extra(uncached, request.context_tokens) if uncached else 0.0

    def queue_terms(self, request: Request) -> tuple[float, float]:
        """G(s) of a queued generation as (resume prefill seconds, expected segment tokens)."""
        return self.prefill_time(request, self.uncached_tokens(request)), self.expected_tokens(request)

    def gen_time(self, request: Request, uncached: int, batch: int) -> float:
        """G(s) of ``request``'s next segment, started now with ``uncached`` tokens to prefill, in ``batch``."""
        tokens = self.expected_tokens(request)
        return self.prefill_time(request, uncached) + tokens * self.token_time(batch, request.context_tokens)

    def wcet(self, request: Request, batch: int) -> float:
        """Worst case for ``request`` to finish its current segment in a batch of ``batch`` (TimeBill Eq. 9).

        The batch controller asks this for every running generation at every admission: the token
        time per batch size is computed once per scheduling point.
        """
        robot = request.robot
        expected = self.lengths.expected(robot.robot, len(request.segments), self._task(request))
        left = max(min(self.k * expected, robot.segment_max_tokens) - request.seg_tokens, 1.0)
        step = self._token_time_at.get(batch)
        if step is None:
            step = self._token_time_at[batch] = self.token_time(batch, request.context_tokens)
        if request.status is Status.RUNNING:
            return left * step
        return self.prefill_time(request, self.uncached_tokens(request)) + left * step

    def observe(self, request: Request, index: int, tokens: int) -> None:
        """Segment ``index`` of ``request`` was dispatched after ``tokens`` generated tokens."""
        self.lengths.observe(request.robot.robot, index, tokens, self._task(request))

    @staticmethod
    def _task(request: Request) -> int:
        if request.task_key is None:
            request.task_key = hash(tuple(request.prompt_ids))
        return request.task_key

    def _warm_prefix(self, request: Request) -> int:
        """Longest common prefix of ``request``'s prompt and a warmed prefix (cached per task)."""
        task = self._task(request)
        found = self._warm_hits.get(task)
        if found is None:
            if len(self._warm_hits) >= MAX_TASKS:
                del self._warm_hits[next(iter(self._warm_hits))]
            found = self._warm_hits[task] = max((_common_prefix(request.prompt_ids, w) for w in self._warm), default=0)
        return found


def _common_prefix(a: Sequence[int], b: np.ndarray) -> int:
    n = min(len(a), len(b))
    differ = np.flatnonzero(np.asarray(a[:n]) != b[:n])
    return int(differ[0]) if len(differ) else n
