"""The server: joins the queue, the batch controller, the segmenter and an engine; ``serving.Driver`` is the loop
that steps it, in the benchmarks and on the node's thread alike.

One server serves every engine and every policy. Each ``step()`` is a scheduling
point: priorities are re-evaluated, admissible generations join the batch, the
engine runs one iteration, new text is segmented, and each finished segment is
dispatched (``on_segment``). Under segmented policies a generation that just
finished a segment is parked: it goes back to the queue but keeps its place in
the engine, and the next scheduling point either keeps it running (when the
batch has room for it and nothing more urgent waits for that room) or suspends it.
A request ends (``on_finish``) once its plan is generated and the robot has
reported every segment executed, or when it is aborted or canceled; no accepted
request ends any other way, and once ended it is forgotten.

A request's status and its place (queue, ``running``, ``parked``, the engine) change
together, in one method per transition of the state machine drawn in
``timely_llm.core.request``; ``_finish`` is the one exit.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from timely_llm.core.admission import AminAdmission, DeferredPrefill, KvAdmission, NoDeferral, departure_threshold
from timely_llm.core.batch import BatchController
from timely_llm.core.estimator import ExecutionTimeEstimator, ProfiledTimes, SegmentTimes
from timely_llm.core.features import DEFAULT as DEFAULT_FEATURES
from timely_llm.core.features import Features
from timely_llm.core.overload import (
    OVERRUN_NONE,
    OVERRUN_STRATEGIES,
    OverloadControl,
)
from timely_llm.core.policies import ServingPolicy
from timely_llm.core.queue import GenerationQueue
from timely_llm.core.request import OverloadState, Request, Segment, Status, call_text
from timely_llm.core.throughput import TYPICAL_CONTEXT, ThroughputModel, derive_curve
from timely_llm.core.tuf import TUF
from timely_llm.engines.base import (
    DEFAULT_MAX_NEW_TOKENS,
    Engine,
    EngineRejected,
    GenerationSpec,
    ResumeInfo,
    StepOutput,
)
from timely_llm.errors import RequestRejected
from timely_llm.plan.grammar import plan_grammar
from timely_llm.plan.plan_stream import PlanStream
from timely_llm.plan.skills import SkillModel
from timely_llm.scheduler import Call, Scheduler, SchedulerOutput

MAX_CHARS_PER_TOKEN = 64
"""More characters than any token of a plan model's vocabulary holds: a reported value longer than its token
limit times this is refused before it is tokenized."""
DEFAULT_MAX_BATCH = 256  # the batch cap of every policy unless one is given (vLLM's own default varies)


@dataclass
class PlanRequest:
    """What a robot asks for; validated by ``Server.submit``."""

    id: str
    agent: str
    robot: str
    prompt_ids: list[int]
    tuf: TUF
    category: str = "normal"
    max_new_tokens: int = 0
    forced_ids: list[int] | None = None
    trace: int | None = None
    arrival: float | None = None
    """When the request reached the server; defaults to the time of ``submit``."""
    constrained: bool = True
    """Generate within the robot's plan grammar (unless forced: a replayed plan needs none)."""
    keep_if_infeasible: bool = False
    """Overload control (features.shed): once its deadline cannot be met, keep waiting (told through
    ``on_infeasible``) instead of ending aborted."""
    overrun: str = OVERRUN_NONE
    """What to do with a segment that overruns its deadline: none, kill or skip-next (core/overload.py)."""

    def request(self, robot: SkillModel, arrival: float, default_max_new_tokens: int,
                decode: Callable[[list[int]], str], streaming: bool) -> Request:
        """The request the server serves for this one, arrived at ``arrival``; ``decode`` and ``streaming``:
        its plan stream's detokenizer and whether segments go out as they are cut."""
        return Request(
            id=self.id, agent=self.agent, robot=robot, tuf=self.tuf, arrival=arrival,
            prompt_ids=list(self.prompt_ids), max_new_tokens=self.max_new_tokens or default_max_new_tokens,
            forced_ids=self.forced_ids, category=self.category, trace=self.trace,
            grammar=plan_grammar(robot) if self.constrained and self.forced_ids is None else None,
            stream=PlanStream(robot, decode, streaming),
            overload=OverloadState(keep_if_infeasible=self.keep_if_infeasible, overrun=self.overrun),
        )

    def check(self, robots: dict[str, SkillModel]) -> None:
        """Raises RequestRejected, with the reason, for a request no robot of ``robots`` can be served."""
        if not self.agent:
            raise RequestRejected("agent id is empty")
        if self.robot not in robots:
            raise RequestRejected(f"unknown robot type {self.robot!r} (known: {', '.join(sorted(robots))})")
        if not self.prompt_ids:
            raise RequestRejected("empty prompt")
        if self.max_new_tokens < 0:
            raise RequestRejected(f"max_new_tokens must be >= 0, got {self.max_new_tokens}")
        if self.overrun not in OVERRUN_STRATEGIES:
            raise RequestRejected(f"unknown overrun strategy {self.overrun!r} (known: {', '.join(OVERRUN_STRATEGIES)})")


class Server:
    """The loop: the scheduler decides, the loop applies its decision to the engine, steps the engine and
    turns each generation's new tokens into segments for its robot."""

    def __init__(self, engine: Engine, robots: dict[str, SkillModel], policy: ServingPolicy, clock,
                 network_latency: float = 0.008, max_batch: int | None = None,
                 default_max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
                 on_segment: Callable[[Request, Segment], None] | None = None,
                 on_finish: Callable[[Request], None] | None = None,
                 features: Features = DEFAULT_FEATURES, estimator: ExecutionTimeEstimator | None = None,
                 on_infeasible: Callable[[Request], None] | None = None,
                 on_start: Callable[[Request], None] | None = None) -> None:
        """``features``: the scheduler parts on; they apply to the segmented policies only (the unsegmented
        ones are the vLLM baselines). ``estimator``: the engine's step-time model, needed by the ``timebill``
        feature (``ala`` derives its throughput prior from it when given)."""
        self.engine = engine
        features = policy.parts(features)
        self.features = features
        self.robots = robots
        self.policy = policy
        self.clock = clock
        self.network_latency = network_latency
        self.default_max_new_tokens = default_max_new_tokens
        timebill = _segment_times(estimator, robots, engine.block_size) if features.timebill else None
        self.on_segment = on_segment or (lambda request, segment: None)
        self.on_finish = on_finish or (lambda request: None)
        self.on_infeasible = on_infeasible or (lambda request: None)
        """Told when a request that opted to keep waiting can no longer get utility >= 0."""
        self.on_start = on_start or (lambda request: None)
        """Told when a request's generation first starts in the engine."""
        self.requests: dict[str, Request] = {}
        self.lock = threading.RLock()
        self.counters: Counter[str] = Counter()
        """Events of the run by name (preemptions, shed requests...), for benchmarks and the status topic."""
        self.last_step_s = float("nan")
        """The last engine step's duration, as its output gives it (NaN before the first)."""
        running: dict[str, Request] = {}
        self.overload = OverloadControl(features.shed, running, timebill, network_latency, self.counters,
                                        finish=self._finish, notify=lambda request: self.on_infeasible(request))
        self.scheduler = _scheduler(engine, robots, policy, features, estimator, max_batch, network_latency,
                                    timebill, self.overload, running, self.counters)
        self.times = self.scheduler.times
        """TimeBill's G(s) and WCET (the ``timebill`` feature), or the robots' profiled constants."""
        self.memory = self.scheduler.memory
        self.queue = self.scheduler.queue
        self.batch = self.scheduler.batch
        self.running = running
        self.parked = self.scheduler.parked

    # ----- called by robots and front ends (any thread) -----

    def submit(self, plan: PlanRequest) -> Request:
        arrival = self.clock.now() if plan.arrival is None else plan.arrival  # before waiting for the lock
        with self.lock:
            if not plan.id or plan.id in self.requests:
                raise RequestRejected(f"request id {plan.id!r} is empty or already used")
            plan.check(self.robots)
            request = plan.request(self.robots[plan.robot], arrival, self.default_max_new_tokens,
                                   self.engine.tokenizer.decode, self.policy.streaming)
            self.requests[request.id] = request
            self.scheduler.add(request)
            self.overload.submitted(request, self.clock.now())
        self.clock.wake()
        return request

    def segment_done(self, request_id: str, index: int, exec_start: float, exec_end: float,
                     success: bool = True, reason: str = "", result: str | None = None) -> None:
        """A robot reports that it executed segment ``index`` (times on the server's clock); ``result``: the
        value of the blocking call the segment ended with (ignored for a segment that did not wait)."""
        with self.lock:
            request = self.requests.get(request_id)
            if (request is None or request.status.ended or index >= len(request.segments)
                    or request.segments[index].exec_end is not None):
                return
            segment = request.segments[index]
            segment.exec_start, segment.exec_end, segment.success = exec_start, exec_end, success
            if not success:
                self._finish(request, Status.ABORTED, f"robot failed segment {index}: {reason or 'no reason given'}")
                return
            if index == len(request.segments) - 1:
                self._set_prev_end(request, exec_end)
            if request.status is Status.BLOCKED and index == len(request.segments) - 1:
                self._observe(request, result)
            self._finish_if_done(request)
        self.clock.wake()

    def _observe(self, request: Request, value: str | None) -> None:
        """BLOCKED -> SUSPENDED: the value the plan waited for is written into its context as forced tokens
        (never sampled) and it joins the queue again; a missing or too long value ends it (the reason then
        names the call waited for, as ``_finish`` adds)."""
        index, form = len(request.segments) - 1, request.robot.observation
        if value is None:
            self._finish(request, Status.ABORTED, f"robot reported segment {index} without a value")
            return
        if len(value) > form.max_tokens * MAX_CHARS_PER_TOKEN:  # spares the loop tokenizing a flood
            self._finish(request, Status.ABORTED,
                         f"the value reported for segment {index} is {len(value)} characters, more than "
                         f"{form.max_tokens} tokens can hold")
            return
        call = request.waits_for
        assert call is not None  # only a BLOCKED request is observed
        observation = form.text(call.name, value)
        ids = self.engine.tokenizer.encode_continuation(observation)
        if len(ids) > form.max_tokens:
            self._finish(request, Status.ABORTED,
                         f"the value reported for segment {index} is {len(ids)} tokens written out, more than "
                         f"the {form.max_tokens} of {request.robot.robot}'s observation.max_tokens")
            return
        request.observe(observation, ids)
        self.scheduler.observed(request)

    def cancel(self, request_id: str, reason: str = "canceled by client") -> bool:
        return self._end_live(request_id, Status.CANCELED, reason)

    def abort(self, request_id: str, reason: str) -> bool:
        """End a request the server cannot complete (e.g. its robot stopped answering)."""
        return self._end_live(request_id, Status.ABORTED, reason)

    def _end_live(self, request_id: str, status: Status, reason: str) -> bool:
        with self.lock:
            request = self.requests.get(request_id)
            if request is None or request.status.ended:
                return False
            self._finish(request, status, reason)
        self.clock.wake()
        return True

    # ----- the loop -----

    def step(self) -> bool:
        """One scheduling point and engine iteration; False when there was nothing to run."""
        with self.lock:
            now = self.clock.now()
            self.overload.check(now)
            self._apply(self.scheduler.schedule(now))
            if not self.running:
                return False
            began, batch, kv_tokens = self.clock.now(), len(self.running), self.times.kv_tokens(self.running.values())
            out = self._step_engine()
        if out is None:
            return True
        self.last_step_s = out.duration
        # A modelled step elapses without the lock, so requests and robot reports are not held up.
        self.clock.sleep_until(began + out.duration)
        with self.lock:
            self._learn(out, batch, kv_tokens)
            self._process(out, self.clock.now())
        return True

    def warm_prefix(self, prompt_ids: list[int]) -> None:
        """Prefill a shared prompt prefix once so requests find it in the prefix cache.

        The paper's server keeps each robot's fixed prompt (skills, guidance, examples);
        this puts its KV in the cache before the first request needs it.
        """
        gen_id = f"warm-{len(prompt_ids)}-{hash(tuple(prompt_ids)) & 0xFFFF:x}"
        with self.lock:
            self.times.warmed(prompt_ids)
            self.engine.start(GenerationSpec(gen_id, list(prompt_ids), max_new_tokens=1, forced_ids=[]))
            while True:
                started = self.clock.now()
                out = self.engine.step()
                self.clock.sleep_until(started + out.duration)
                if gen_id in out.finished or gen_id in out.failed:
                    break
            self.engine.release(gen_id)

    # ----- internals -----

    def _apply(self, decision: SchedulerOutput) -> None:
        """Make the engine calls the scheduler decided, in its order."""
        for call, request in decision.calls:
            if call is Call.SUSPEND:
                self.engine.suspend(request.id)
            else:
                self._start(request, resumed=call is Call.RESUME)
        self._predict_gen_times(decision.started)

    def _start(self, request: Request, resumed: bool) -> None:
        priority = self.policy.engine_priority(request.tuf.ert)
        spec = GenerationSpec(request.id, request.prompt_ids, list(request.output_ids),
                              request.max_new_tokens, request.forced_ids, priority, request.grammar,
                              tuple(request.observed))
        try:
            self.engine.start(spec)
        except EngineRejected as exc:  # a resumed generation is still the engine's to release
            self._finish(request, Status.ABORTED, f"engine rejected the request: {exc}", in_engine=resumed)
            return
        if not resumed:
            self.on_start(request)

    def _step_engine(self) -> StepOutput | None:
        """One engine iteration; None when the engine failed, which ends the requests it was running."""
        try:
            return self.engine.step()
        except Exception as exc:  # noqa: BLE001 - an engine crash ends its requests, not the loop
            for request in list(self.running.values()):
                self._finish(request, Status.ABORTED, f"engine error: {exc}")
            return None

    def _learn(self, out: StepOutput, batch: int, kv_tokens: int) -> None:
        """Step-time models learn from steps that produced tokens (vLLM steps with nothing to run, grammars
        compiling, time nothing)."""
        if out.duration > 0 and out.new_tokens:
            self.batch.record_step(out.duration, len(out.new_tokens), prefill=bool(out.started))
            self.times.record_step(out.duration, batch, kv_tokens)

    def _predict_gen_times(self, started: list[tuple[Request, int]]) -> None:
        """G(s) of each segment whose generation (re)started at this scheduling point, for the records."""
        if started:
            self.times.join_running(self.running.values(), None)
        for request, uncached in started:
            if request.status is not Status.RUNNING or request.seg_tokens:
                continue  # the engine rejected it, or it resumed mid-segment: the prediction at its start stands
            request.seg_predicted = self.times.gen_time(request, uncached, len(self.running))

    # ----- ends: the scheduler moves the request, the loop frees what the engine holds -----

    def _generated(self, request: Request) -> None:
        """RUNNING -> GENERATED: the plan is complete; the engine forgets the generation."""
        self.scheduler.generated(request)
        self.engine.release(request.id)

    def _finish(self, request: Request, status: Status, reason: str, in_engine: bool | None = None) -> None:
        """Any live status -> SUCCEEDED, ABORTED or CANCELED: the one exit.

        Frees whatever the request held (queue row, batch or parked slot, engine state),
        records why it ended and tells ``on_finish``. ``in_engine``: whether the engine holds the
        generation, where its status cannot tell (a start the engine refused).
        """
        if request.waits_for is not None and status is Status.ABORTED:
            reason += f" (its plan was waiting for the value of {call_text(request.waits_for)})"
        came_from = self.scheduler.remove(request, status)
        request.reason = reason
        try:
            if came_from.in_engine if in_engine is None else in_engine:
                self.engine.release(request.id)
        finally:
            self.on_finish(request)
            self.requests.pop(request.id, None)  # an ended request lives on only in what on_finish kept

    # ----- engine output -----

    def _process(self, out: StepOutput, now: float) -> None:
        self._count_preemptions(out)
        for gen_id, info in out.started.items():
            if gen_id in self.running:
                self.running[gen_id].last_start_cache = (info.cached_tokens, info.evicted)
                _record_resume_prefill(self.running[gen_id], info)
            if gen_id in self.scheduler.evicted:  # Amin's eviction costs what its resume prefills again
                self.scheduler.evicted.discard(gen_id)
                self.counters["recomputed_tokens"] += info.context_tokens - info.cached_tokens
        for gen_id, cause in out.failed.items():
            if gen_id in self.running:
                self._finish(self.running[gen_id], Status.ABORTED, f"engine error: {cause}")
        for gen_id in [*out.new_tokens, *(g for g in out.finished if g not in out.new_tokens)]:
            request = self.running.get(gen_id)
            if request is not None:
                self._consume(request, out.new_tokens.get(gen_id, []), gen_id in out.finished, now)

    def _count_preemptions(self, out: StepOutput) -> None:
        """The engine's own recompute preemptions (what memory-safe admission avoids)."""
        if out.preempted:
            self.counters["preemptions"] += len(out.preempted)
        if out.recomputed_tokens:
            self.counters["recomputed_tokens"] += out.recomputed_tokens

    def _consume(self, request: Request, tokens: list[int], finished: bool, now: float) -> None:
        request.output_ids.extend(tokens)
        request.seg_tokens += len(tokens)
        assert request.stream is not None  # submit gave it one
        pieces, last = request.stream.push(request, tokens, finished)
        if finished:
            self._generated(request)
        segment = None
        for i, piece in enumerate(pieces):
            segment = self._dispatch(request, piece, now, final=last and i == len(pieces) - 1)
        if finished:
            self._finish_if_done(request)
        elif segment is not None and segment.waits_for is not None:
            self.scheduler.block(request)
        elif pieces and self.policy.segmented:
            self.scheduler.park(request)

    def _dispatch(self, request: Request, text: str, now: float, final: bool = False) -> Segment | None:
        """Send ``text`` to the robot as the next segment; None when skip-next dropped it."""
        if request.overload.skip_current and text.strip():
            self._skip(request, now, final)
            return None
        segment = request.cut_segment(text, now, self.network_latency, final)
        self.times.observe(request, segment.index, segment.tokens)
        self.memory.observe_segment(request.robot.robot, segment.tokens)
        # generation goes on unless it is parked (then the scheduling point predicts again)
        request.seg_predicted = self.times.gen_time(request, 0, len(self.running))
        self.on_segment(request, segment)
        if request.overload.overrun != OVERRUN_NONE and not final:
            self.overload.watch_segment(request)
        return segment

    def _skip(self, request: Request, now: float, final: bool) -> None:
        """Skip-next: the overrun segment is dropped; the next one's deadline counts from now."""
        request.skip_segment(now)
        self.counters["overruns_skipped"] += 1
        if final:  # the robot still has to learn that the plan ended
            self._dispatch(request, "", now, final=True)
        else:
            self.overload.watch_segment(request)

    def _set_prev_end(self, request: Request, exec_end: float) -> None:
        request.prev_end_est = exec_end
        if request.status.queued:  # its priority depends on this
            self.queue.update(request)
        if request.overload.overrun != OVERRUN_NONE and not request.finished_generating:
            self.overload.watch_segment(request)  # its next segment's deadline moved

    def _finish_if_done(self, request: Request) -> None:
        if request.status is Status.GENERATED and all(s.exec_end is not None for s in request.segments):
            self._finish(request, Status.SUCCEEDED, "")


def _record_resume_prefill(request: Request, info: ResumeInfo) -> None:
    """The first (re)start after an observation: how much of the context the engine prefilled."""
    last = request.segments[-1] if request.segments else None
    if last is not None and last.observation is not None and last.resume_prefill is None:
        last.resume_prefill = info.context_tokens - info.cached_tokens


def _scheduler(engine: Engine, robots: dict[str, SkillModel], policy: ServingPolicy, features: Features,
               estimator: ExecutionTimeEstimator | None, max_batch: int | None, network_latency: float,
               timebill: SegmentTimes | None, overload: OverloadControl, running: dict[str, Request],
               counters: Counter[str]) -> Scheduler:
    """The scheduler of a server, with the parts ``features`` switches on and stand-ins for the rest."""
    batch = BatchController(policy.adaptive_batch, _batch_cap(max_batch, engine), network_latency,
                            throughput=_throughput_model(estimator) if features.ala else None,
                            wcet_model=timebill.wcet if timebill else None, counters=counters)
    queue = GenerationQueue(policy.queue_order(network_latency), timebill.queue_terms if timebill else None)
    deferral = _deferred_prefill(estimator, robots, batch.max_batch) if features.deferred_prefill else NoDeferral()
    memory = (AminAdmission if features.amin else KvAdmission)(engine.blocks_for)
    return Scheduler(engine, queue, batch, overload, running, timebill or ProfiledTimes(), memory, deferral,
                     network_latency, counters)


def _segment_times(estimator: ExecutionTimeEstimator | None, robots: dict[str, SkillModel],
                   block_size: int) -> SegmentTimes:
    if estimator is None:
        raise ValueError("the timebill feature needs an execution-time estimator (a hardware profile)")
    return SegmentTimes(estimator, robots, block_size)


def _batch_cap(max_batch: int | None, engine: Engine) -> int:
    """The batch cap: the one asked for (DEFAULT_MAX_BATCH otherwise), at most what the engine runs at once
    (more would only wait inside the engine, out of our scheduling)."""
    max_batch = max_batch or DEFAULT_MAX_BATCH
    return max_batch if engine.max_batch is None else min(max_batch, engine.max_batch)


def _deferred_prefill(estimator: ExecutionTimeEstimator | None, robots: dict[str, SkillModel],
                      max_batch: int | None) -> DeferredPrefill | NoDeferral:
    """K* from the engine's step model read as paper 004's affine one: a prefill stalls decoding for
    c_p (the profile's ``prefill_stall``) plus its tokens' time, TBT = the step intercept + t_d·B; a
    generation leaves the batch after a segment (alpha = 1 / the robots' mean maximum segment length).
    None of it where K* = 1: without a fixed stall, as in the simulated GPUs and vLLM V1's chunked prefill,
    holding prefills back saves nothing and only delays first actions (the paper's Remark 2)."""
    if estimator is None:
        raise ValueError("the deferred_prefill feature needs the engine's step-time model (a hardware profile)")
    mean_segment = sum(r.segment_max_tokens for r in robots.values()) / max(len(robots), 1)
    threshold = departure_threshold(estimator.stall, estimator.c, max_batch or 1, 1.0 / max(mean_segment, 1.0))
    return DeferredPrefill(threshold) if threshold > 1 else NoDeferral()


def _throughput_model(estimator: ExecutionTimeEstimator | None) -> ThroughputModel:
    """ALA's throughput model: a prior from the engine's step-time model where there is one, refined online
    from the decode steps measured."""
    if estimator is None:
        return ThroughputModel()
    return ThroughputModel(derive_curve(lambda batch: estimator.decode_step(batch, batch * TYPICAL_CONTEXT)))
