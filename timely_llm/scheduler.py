"""The scheduler: decides, and the server applies. ``schedule(now)`` carries out overload control and returns what
the engine must start, resume and suspend; ``update_from_output(out, now)`` takes an engine step's output and
owns what follows (tokens into plan streams, segments cut, generations parked, blocked or done). Both return
what the server must then do, in order: engine releases and what robots are told (``Notice``). It runs nothing.

The blocked set is the paper's waiting queue (§8): a generation whose dispatched segment ends in a
blocking call leaves the schedulable set, suspended in the engine (which keeps its KV in place while
memory allows and gives it back to the prefix cache under pressure), until the robot reports the
value; it then joins the queue again, its next segment's TUF counted from the report.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from timely_llm.core.admission import AminAdmission, DeferredPrefill, KvAdmission, NoDeferral
from timely_llm.core.batch import BatchController
from timely_llm.core.estimator import ProfiledTimes, SegmentTimes
from timely_llm.core.filling import BatchFilling
from timely_llm.core.kv_reuse import count_resume
from timely_llm.core.overload import OVERRUN_NONE, OverloadControl, Verdict
from timely_llm.core.places import Call, RequestPlaces
from timely_llm.core.request import Request, Segment, Status, call_text
from timely_llm.engines.base import Engine, ResumeInfo, StepOutput, trailing_observation

MAX_CHARS_PER_TOKEN = 64
"""More characters than any token of a plan model's vocabulary holds: a reported value longer than its token
limit times this is refused before it is tokenized."""


@dataclass
class Ended:
    """A request ended (``request.status`` and ``reason`` say how): the server tells its robot."""

    request: Request
    in_engine: bool
    """The engine still holds its generation: the server releases it first."""


@dataclass
class Generated:
    """A plan is complete: the engine can forget its generation."""

    request: Request


@dataclass
class Dispatched:
    """A segment is cut: the server sends it to the robot."""

    request: Request
    segment: Segment


@dataclass
class Infeasible:
    """A request that keeps waiting can no longer get utility >= 0: the server tells its robot."""

    request: Request


Notice = Ended | Generated | Dispatched | Infeasible


@dataclass
class SchedulerOutput:
    notices: list[Notice] = field(default_factory=list)
    """What overload control ended or told, before any engine call."""
    calls: list[tuple[Call, Request]] = field(default_factory=list)
    """Engine calls in the order decided."""
    started: list[tuple[Request, int]] = field(default_factory=list)
    """Generations (re)started or kept running at this point, with their uncached context tokens."""


class Scheduler:
    def __init__(self, engine: Engine, places: RequestPlaces, batch: BatchController, overload: OverloadControl,
                 times: SegmentTimes | ProfiledTimes, memory: AminAdmission | KvAdmission,
                 deferral: DeferredPrefill | NoDeferral, network_latency: float, segmented: bool) -> None:
        """``engine``: asked about KV memory (what is free, what a context takes) and for its tokenizer (a
        robot's value written into a plan); ``times``, ``memory`` and ``deferral``: the scheduler parts (TimeBill,
        Amin, deferred prefill) or their do-nothing stand-ins; ``segmented``: a generation is parked after each
        segment (else it runs on to its plan's end)."""
        self.engine = engine
        self.places = places
        self.queue = places.queue
        self.running, self.parked, self.blocked = places.running, places.parked, places.blocked
        self.batch = batch
        self.overload = overload
        self.times = times
        self.memory = memory
        self.network_latency = network_latency
        self.segmented = segmented
        self.counters = places.counters
        self.filling = BatchFilling(places, batch, overload, times, memory, deferral, engine, network_latency)
        self._notices: list[Notice] = []
        self._step_batch = (0, 0)
        """The batch the engine step runs and its KV tokens, for the step-time models (``applied``)."""

    # ----- requests and robot reports -----

    def add(self, request: Request) -> None:
        self.places.add(request)
        self.overload.submitted(request)

    def end(self, request: Request, status: Status, reason: str, in_engine: bool | None = None) -> list[Notice]:
        """End a live request (canceled, aborted by the server); ``in_engine``: whether the engine holds the
        generation, where its status cannot tell (a start the engine refused)."""
        self._end(request, status, reason, in_engine)
        return self._take_notices()

    def reported(self, request: Request, index: int, exec_start: float, exec_end: float, success: bool,
                 reason: str, value: str | None) -> list[Notice]:
        """A robot executed segment ``index`` (server-clock times); ``value``: what the blocking call the
        segment ended with returned (ignored for a segment that did not wait)."""
        segment = request.segments[index]
        segment.exec_start, segment.exec_end, segment.success = exec_start, exec_end, success
        last = index == len(request.segments) - 1
        if not success:
            self._end(request, Status.ABORTED, f"robot failed segment {index}: {reason or 'no reason given'}")
        else:
            if last:
                self._set_prev_end(request, exec_end)
            if last and request.status is Status.BLOCKED:
                self._observe(request, value)
            self._finish_if_done(request)
        return self._take_notices()

    # ----- the scheduling point -----

    def schedule(self, now: float) -> SchedulerOutput:
        """Overload control, then the generations blocked since the last point suspended, then the batch
        filled from the queue in priority order (core/filling.py)."""
        for verdict in self.overload.check(now):
            self._carry_out(verdict)
        notices = self._take_notices()
        self.places.suspend_blocked()
        started = self.filling.fill(now)
        return SchedulerOutput(notices, self.places.take_calls(), started)

    def applied(self, output: SchedulerOutput) -> None:
        """The loop made the calls of ``output`` (ending those the engine refused): G(s) predicted for each
        segment whose generation (re)started, and the batch the step runs noted for the step-time models."""
        if output.started:
            self.times.join_running(self.running.values(), None)
        for request, uncached in output.started:
            if request.status is not Status.RUNNING or request.seg_tokens:
                continue  # the engine rejected it, or it resumed mid-segment: the prediction at its start stands
            request.seg_predicted = self.times.gen_time(request, uncached, len(self.running))
        self._step_batch = len(self.running), self.times.kv_tokens(self.running.values())

    def _carry_out(self, verdict: Verdict) -> None:
        if verdict.reason is None:
            self._notices.append(Infeasible(verdict.request))
        else:
            self._end(verdict.request, Status.ABORTED, verdict.reason)

    # ----- the engine step's output -----

    def update_from_output(self, out: StepOutput, now: float) -> list[Notice]:
        """What follows an engine step: the step-time models learn, each generation's new tokens go into its
        plan stream and the segments they complete are cut, and each generation is parked, blocked or done."""
        self._learn(out)
        self._note_starts(out)
        for gen_id, cause in out.failed.items():
            if gen_id in self.running:
                self._end(self.running[gen_id], Status.ABORTED, f"engine error: {cause}")
        for gen_id in [*out.new_tokens, *(g for g in out.finished if g not in out.new_tokens)]:
            request = self.running.get(gen_id)
            if request is not None:
                self._consume(request, out.new_tokens.get(gen_id, []), gen_id in out.finished, now)
        return self._take_notices()

    def _learn(self, out: StepOutput) -> None:
        """Step-time models learn from steps that produced tokens (vLLM steps with nothing to run, grammars
        compiling, time nothing), on an engine whose steps are its iterations; the engine's own recompute
        preemptions are counted (what memory-safe admission avoids)."""
        if out.duration > 0 and out.new_tokens and self.engine.steps_are_iterations:
            batch, kv_tokens = self._step_batch
            self.batch.record_step(out.duration, len(out.new_tokens), prefill=bool(out.started))
            self.times.record_step(out.duration, batch, kv_tokens)
        if out.preempted:
            self.counters["preemptions"] += len(out.preempted)
        if out.recomputed_tokens:
            self.counters["recomputed_tokens"] += out.recomputed_tokens

    def _note_starts(self, out: StepOutput) -> None:
        for gen_id, info in out.started.items():
            request = self.running.get(gen_id)
            if request is not None:
                request.last_start_cache = (info.cached_tokens, info.evicted)
                _record_resume_prefill(request, info)
                if request.output_ids and info.reported:
                    appended = trailing_observation(request.observed, len(request.output_ids))
                    count_resume(self.counters, info.context_tokens, info.cached_tokens, appended)
            if gen_id in self.places.evicted:  # a mid-segment suspension costs what its resume prefills again
                self.places.evicted.discard(gen_id)
                self.counters["recomputed_tokens"] += info.context_tokens - info.cached_tokens

    def _consume(self, request: Request, tokens: list[int], finished: bool, now: float) -> None:
        request.output_ids.extend(tokens)
        request.seg_tokens += len(tokens)
        assert request.stream is not None  # submit gave it one
        pieces, last = request.stream.push(request, tokens, finished)
        if finished:
            self.places.generated(request)
            self._notices.append(Generated(request))
            if not request.segments and not request.overload.skipped_segments and not "".join(pieces).strip():
                self._end(request, Status.ABORTED, _empty_plan_reason(request))
                return
        segment = None
        for i, piece in enumerate(pieces):
            segment = self._dispatch(request, piece, now, final=last and i == len(pieces) - 1)
        if finished:
            self._finish_if_done(request)
        elif segment is not None and segment.waits_for is not None:
            self.places.block(request)
        elif pieces and self.segmented:
            self.places.park(request)

    def _dispatch(self, request: Request, text: str, now: float, final: bool = False) -> Segment | None:
        """``text`` goes to the robot as the next segment; None when skip-next dropped it."""
        if request.overload.skip_current and text.strip():
            self._skip(request, now, final)
            return None
        segment = request.cut_segment(text, now, self.network_latency, final)
        self.times.observe(request, segment.index, segment.tokens)
        self.memory.observe_segment(request.robot.robot, segment.tokens)
        # generation goes on unless it is parked (then the scheduling point predicts again)
        request.seg_predicted = self.times.gen_time(request, 0, len(self.running))
        self._notices.append(Dispatched(request, segment))
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

    # ----- ends and reports -----

    def _end(self, request: Request, status: Status, reason: str, in_engine: bool | None = None) -> None:
        """Any live status -> SUCCEEDED, ABORTED or CANCELED: the one exit; the server frees what the engine holds."""
        if request.waits_for is not None and status is Status.ABORTED:
            reason += f" (its plan was waiting for the value of {call_text(request.waits_for)})"
        came_from = self.places.remove(request, status)
        request.reason = reason
        self._notices.append(Ended(request, came_from.in_engine if in_engine is None else in_engine))

    def _take_notices(self) -> list[Notice]:
        notices, self._notices = self._notices, []
        return notices

    def _finish_if_done(self, request: Request) -> None:
        if request.status is Status.GENERATED and all(s.exec_end is not None for s in request.segments):
            self._end(request, Status.SUCCEEDED, "")

    def _set_prev_end(self, request: Request, exec_end: float) -> None:
        request.prev_end_est = exec_end
        if request.status.queued:  # its priority depends on this
            self.queue.update(request)
        if request.overload.overrun != OVERRUN_NONE and not request.finished_generating:
            self.overload.watch_segment(request)  # its next segment's deadline moved

    def _observe(self, request: Request, value: str | None) -> None:
        """BLOCKED -> SUSPENDED: the value the plan waited for is written into its context as forced tokens
        (never sampled) and it joins the queue again; a missing or too long value ends it."""
        index, form = len(request.segments) - 1, request.robot.observation
        if value is None:
            self._end(request, Status.ABORTED, f"robot reported segment {index} without a value")
            return
        if len(value) > form.max_tokens * MAX_CHARS_PER_TOKEN:  # spares the server tokenizing a flood
            self._end(request, Status.ABORTED, f"the value reported for segment {index} is {len(value)} "
                      f"characters, more than {form.max_tokens} tokens can hold")
            return
        call = request.waits_for
        assert call is not None  # only a BLOCKED request is observed
        observation = form.text(call.name, value)
        ids = self.engine.tokenizer.encode_continuation(observation)
        if len(ids) > form.max_tokens:
            self._end(request, Status.ABORTED, f"the value reported for segment {index} is {len(ids)} tokens "
                      f"written out, more than the {form.max_tokens} of {request.robot.robot}'s observation.max_tokens")
            return
        request.observe(observation, ids)
        self.places.observed(request)


def _empty_plan_reason(request: Request) -> str:
    """Why a generation that ended without a statement for its robot ends the goal: nothing was executed."""
    if request.sampled_tokens >= request.max_new_tokens:
        return f"the plan's {request.max_new_tokens}-token budget ran out before its first complete statement"
    return "the model ended the plan without a statement for the robot to execute"


def _record_resume_prefill(request: Request, info: ResumeInfo) -> None:
    """The first (re)start after an observation: how much of the context the engine prefilled."""
    last = request.segments[-1] if request.segments else None
    if last is not None and last.observation is not None and last.resume_prefill is None:
        last.resume_prefill = info.context_tokens - info.cached_tokens
