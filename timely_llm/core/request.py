"""A plan request and its life cycle: one status, changed only along checked transitions.

Every request the server accepts goes through this state machine (cf. vLLM v1's
``RequestStatus``). ``Request.advance`` is the only place its status changes and it
refuses any move not drawn here::

                    admit                   the engine finished the plan
        submit ──► WAITING ───► RUNNING ──────────────────────────────► GENERATED
                                 │  ▲  ▲ │                                     │
              segment dispatched │  │  │ │ evicted on KV overflow (Amin) or    │ the robot reported
              (segmented policy) │  │  │ │ yields its slot (engine.suspend)    │ every segment done
                                 │  │  │ └──────────────────┐                  │
                                 │  │  │ resumed            │                  │
                                 │  │  │ (engine.start)     │                  │
                                 │  │  └────────────────────┤                  │
                                 ▼  │ picked again          ▼                  ▼
                                PARKED ──passed over──► SUSPENDED            SUCCEEDED
                                       (engine.suspend)     ▲
                                                            │ the robot reported the value:
        RUNNING ──segment ending in a blocking call──► BLOCKED  its observation is appended
                  dispatched (engine.suspend)

        WAITING, RUNNING, PARKED, SUSPENDED, BLOCKED or GENERATED
            ──cancel / abort (robot failed or silent) / engine error or rejection──► CANCELED | ABORTED

Where each status lives in the server (``core/places.py`` changes status and place together):

=========  ===================  ===============================================
status     server               engine
=========  ===================  ===============================================
WAITING    queue                nothing
RUNNING    ``running``          in the batch
PARKED     queue, ``parked``    still in the batch until the next scheduling point
SUSPENDED  queue                suspended: its context cached for the resume
BLOCKED    ``blocked``          suspended: its context cached for the resume
GENERATED  ``Server.requests``  nothing (released)
ended      nowhere              nothing
=========  ===================  ===============================================

The three ended statuses are final; ``RequestPlaces.remove`` is the one way into them (``Scheduler._end``
calls it; the loop then releases what the engine holds and tells ``on_finish``).
"""

from __future__ import annotations

import dataclasses
import enum
import math
from dataclasses import dataclass, field

from timely_llm.core.tuf import TUF
from timely_llm.plan.grammar import PlanGrammar
from timely_llm.plan.plan_stream import PlanStream
from timely_llm.plan.skills import SkillCall, SkillModel


class Status(enum.Enum):
    WAITING = "waiting"  # queued, never started
    RUNNING = "running"  # in the engine's batch
    PARKED = "parked"  # a segment was dispatched; queued, still in the engine until the next scheduling point
    SUSPENDED = "suspended"  # passed over after a segment; queued for resume
    BLOCKED = "blocked"  # its last segment ended in a blocking call: out of the queue until the robot's value
    GENERATED = "generated"  # plan complete; robot still executing
    SUCCEEDED = "succeeded"
    ABORTED = "aborted"
    CANCELED = "canceled"

    @property
    def ended(self) -> bool:
        return self in ENDED

    @property
    def queued(self) -> bool:
        """In the generation queue."""
        return self in (Status.WAITING, Status.PARKED, Status.SUSPENDED)

    @property
    def in_engine(self) -> bool:
        """The engine holds the generation (running, or suspended with its context cached)."""
        return self in (Status.RUNNING, Status.PARKED, Status.SUSPENDED, Status.BLOCKED)


ENDED = frozenset({Status.SUCCEEDED, Status.ABORTED, Status.CANCELED})
_STOPS = {Status.ABORTED, Status.CANCELED}
TRANSITIONS: dict[Status, frozenset[Status]] = {
    Status.WAITING: frozenset({Status.RUNNING, *_STOPS}),
    Status.RUNNING: frozenset({Status.PARKED, Status.SUSPENDED, Status.BLOCKED, Status.GENERATED, *_STOPS}),
    Status.PARKED: frozenset({Status.RUNNING, Status.SUSPENDED, *_STOPS}),
    Status.SUSPENDED: frozenset({Status.RUNNING, *_STOPS}),
    Status.BLOCKED: frozenset({Status.SUSPENDED, *_STOPS}),
    Status.GENERATED: frozenset({Status.SUCCEEDED, *_STOPS}),
    **{s: frozenset() for s in ENDED},
}
"""The legal moves of the diagram above: status -> statuses it may go to."""


class IllegalTransition(RuntimeError):
    """A request was asked to move along a transition the state machine does not have."""


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
    final: bool = False
    """The plan's last segment."""
    tokens: int = 0
    """Tokens generated for this segment."""
    predicted_gen_time: float | None = None
    """G(s) predicted when the segment's generation started (compare with gen_end - gen_start)."""
    waits_for: SkillCall | None = None
    """The blocking call the segment ends with: the plan goes on once the robot reports its value."""
    observation: str | None = None
    """The text written into the context after the segment: the value of ``waits_for``, in the robot's form."""
    resume_prefill: int | None = None
    """Tokens the engine prefilled to resume after ``observation`` (its cache report)."""
    est_end: float = 0.0
    """When its execution is estimated to end, on the server's clock, as estimated when it was cut."""

    def to_dict(self) -> dict:
        closed_loop = {"waits_for": call_text(self.waits_for), "observation": self.observation,
                       "resume_prefill": self.resume_prefill} if self.waits_for else {}
        return {
            "index": self.index, "text": self.text, "gen_start": self.gen_start, "gen_end": self.gen_end,
            "exec_start": self.exec_start, "exec_end": self.exec_end,
            "est_exec_time": self.est_exec_time, "cached_tokens": self.cached_tokens, "evicted": self.evicted,
            "tokens": self.tokens, "predicted_gen_time": self.predicted_gen_time, **closed_loop,
        }


def call_text(call: SkillCall | None) -> str | None:
    """A call as a plan would write it, names quoted (for reasons and records)."""
    if call is None:
        return None
    return f"{call.name}({','.join(a if _is_number(a) else repr(a) for a in call.args)})"


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


@dataclass
class OverloadState:
    """What overload control (core/overload.py) knows and decided of one request."""

    keep_if_infeasible: bool = False
    """Overload control: keep waiting (told, not ended) when the deadline can no longer be met."""
    overrun: str = "none"
    """TimeBill's overrun strategy for a late segment: none, kill or skip-next (core/overload.py)."""
    infeasible_at: float | None = None
    """When the server found it could no longer get utility >= 0 (and told the robot)."""
    fastest_first_segment: float = 0.0
    """Overload control: the shortest generation of its first segment the server predicted at submit."""
    best_response: float | None = None
    """At ``infeasible_at``: the earliest response time it could still have had."""
    shed: bool = False
    """Ended by overload control at ``infeasible_at`` (aborted, reason INFEASIBLE_REASON)."""
    skip_current: bool = False
    """Skip-next: the segment being generated overran and will not be sent."""
    skipped_segments: int = 0
    """Segments generated but dropped by skip-next."""
    killed_at: float | None = None
    """Kill: when its plan was ended because a segment overran its deadline."""


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
    grammar: PlanGrammar | None = None
    """The plan grammar generation is constrained to (resumes continue it)."""
    category: str = "normal"
    trace: int | None = None
    reason: str = ""
    """Why the request ended, when it did not succeed."""
    output_ids: list[int] = field(default_factory=list)
    observed: list[tuple[int, int]] = field(default_factory=list)
    """Spans ``[start, end)`` of ``output_ids`` that are observations the server wrote, not sampled."""
    segments: list[Segment] = field(default_factory=list)
    seg_tokens: int = 0
    """Tokens generated for the segment in progress."""
    seg_gen_start: float | None = None
    seg_predicted: float | None = None
    """G(s) predicted for the segment in progress when its generation (re)started."""
    task_key: int | None = None
    """Hash of the prompt (set by TimeBill's length predictor): requests for the same task share a history."""
    prev_end_est: float = 0.0
    """Estimated end of the previous segment's execution (for k > 0)."""
    last_start_cache: tuple[int, bool] | None = None
    stream: PlanStream | None = None
    """Turns the generated tokens into the segments to dispatch."""
    overload: OverloadState = field(default_factory=OverloadState)
    """What overload control knows and decided of it."""
    path: list[Status] = field(default_factory=lambda: [Status.WAITING], init=False)
    """Every status the request has had, in order; the last is its status now."""

    @property
    def status(self) -> Status:
        return self.path[-1]

    def advance(self, to: Status) -> Status:
        """Move to status ``to``; returns the status left. Raises IllegalTransition off the diagram."""
        came_from = self.path[-1]
        if to not in TRANSITIONS[came_from]:
            raise IllegalTransition(f"request {self.id}: {came_from.value} -> {to.value} is not a transition")
        self.path.append(to)
        return came_from

    def cut_segment(self, text: str, now: float, network_latency: float, final: bool) -> Segment:
        """The segment generated since the last cut, dispatched at ``now``; the next one starts here."""
        calls = self.robot.find_calls(text)
        estimate = self.robot.min_exec_time(text, calls)
        arrives = now + network_latency
        start_est = max(arrives, self.prev_end_est) if self.segments else arrives
        cached, evicted = self.last_start_cache or (None, False)
        segment = Segment(len(self.segments), text, calls,
                          gen_start=self.seg_gen_start if self.seg_gen_start is not None else now,
                          gen_end=now, est_exec_time=estimate, cached_tokens=cached, evicted=evicted, final=final,
                          tokens=self.seg_tokens, predicted_gen_time=self.seg_predicted,
                          waits_for=None if final else self.robot.blocking_call(text), est_end=start_est + estimate)
        self.segments.append(segment)
        self.prev_end_est = segment.est_end
        self._next_segment(now)
        return segment

    def skip_segment(self, now: float) -> None:
        """Skip-next: the segment generated since the last cut is dropped; the next one's deadline counts
        from ``now``."""
        self.overload.skip_current = False
        self.overload.skipped_segments += 1
        self.prev_end_est = max(self.prev_end_est, now)
        self._next_segment(now)

    def _next_segment(self, now: float) -> None:
        self.seg_tokens = 0
        self.seg_gen_start = now
        self.last_start_cache = None

    @property
    def finished_generating(self) -> bool:
        """The whole plan was generated (so the last segment dispatched is the final one)."""
        return Status.GENERATED in self.path

    @property
    def seg_index(self) -> int:
        return len(self.segments)

    def segment_tuf(self, index: int) -> tuple[float, TUF]:
        """Segment ``index``'s TUF and the time its response counts from: TUF_0 from the arrival for the
        first segment, TUF_1 from the previous segment's estimated end for later ones (§4.2)."""
        if index == 0:
            return self.arrival, self.tuf
        return self.prev_end_est, self.tuf.for_segment(index)

    def dispatch_deadline(self, network_latency: float) -> float:
        """Latest dispatch that still lets the next segment's action start on time."""
        origin, tuf = self.segment_tuf(self.seg_index)
        return origin + tuf.ert - network_latency

    @property
    def context_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def dispatched_text(self) -> str:
        """The text of the segments dispatched so far (without observations)."""
        return "".join(s.text for s in self.segments)

    @property
    def ended_plan(self) -> bool:
        """The last segment dispatched ended the plan."""
        return bool(self.segments) and self.segments[-1].final

    @property
    def sampled_tokens(self) -> int:
        """Tokens of ``output_ids`` the engine generated (observations not counted)."""
        return len(self.output_ids) - sum(end - start for start, end in self.observed)

    @property
    def waits_for(self) -> SkillCall | None:
        """The blocking call whose value the plan waits for (its last segment's), if it waits."""
        return self.segments[-1].waits_for if self.status is Status.BLOCKED else None

    def observe(self, observation: str, ids: list[int]) -> None:
        """Write the observation of the value the plan waited for after its last segment (``ids``: its tokens)."""
        self.segments[-1].observation = observation
        self.observed.append((len(self.output_ids), len(self.output_ids) + len(ids)))
        self.output_ids.extend(ids)


@dataclass(frozen=True)
class Outcome:
    """How a request ended, with the metrics of a succeeded one (times in the server clock's seconds).

    For a succeeded request (segment times as reported by its robot):
    response time = first segment's execution start - arrival;
    completion time = last segment's execution end - arrival;
    execution time = sum of the segments' execution times;
    waiting time = completion time - execution time (all the time the robot spent not executing);
    utility = the request's TUF at its response time.
    They are None for a request that did not succeed.

    Overload control (core/overload.py): ``shed`` marks a request ended because even
    served at once it could no longer get utility >= 0; ``infeasible_at`` is when the
    server found that (and told the robot, shed or kept waiting), ``best_response`` the
    earliest response it could still have had then; ``skipped_segments`` counts the
    segments skip-next dropped (``plan`` holds only the segments sent); ``killed_at`` is when
    the kill strategy ended the plan (aborted; ``segments`` holds what was sent before).
    ``plan`` shows the observations (the values of blocking calls) where they came in.
    """

    id: str
    agent: str
    trace: int | None
    category: str
    robot: str
    status: Status
    reason: str
    arrival: float
    tuf: TUF
    plan: str
    output_tokens: int
    segments: tuple[Segment, ...]
    response_time: float | None = None
    waiting_time: float | None = None
    exec_time: float | None = None
    completion_time: float | None = None
    utility: float | None = None
    shed: bool = False
    infeasible_at: float | None = None
    best_response: float | None = None
    skipped_segments: int = 0
    killed_at: float | None = None

    @classmethod
    def of(cls, request: Request) -> Outcome:
        """What ``request`` ended with; times from its segments' execution when it succeeded."""
        if not request.status.ended:
            raise ValueError(f"request {request.id} has not ended ({request.status.value})")
        segments = request.segments
        outcome = cls(request.id, request.agent, request.trace, request.category, request.robot.robot,
                      request.status, request.reason, request.arrival, request.tuf,
                      "".join(s.text + (s.observation or "") for s in segments), request.sampled_tokens,
                      tuple(segments),
                      shed=request.overload.shed, infeasible_at=request.overload.infeasible_at,
                      best_response=request.overload.best_response,
                      skipped_segments=request.overload.skipped_segments, killed_at=request.overload.killed_at)
        if request.status is not Status.SUCCEEDED or not segments:
            return outcome
        spans = [executed_span(s) for s in segments]
        response = spans[0][0] - request.arrival
        completion = spans[-1][1] - request.arrival
        exec_time = math.fsum(end - start for start, end in spans)
        return dataclasses.replace(outcome, response_time=response, completion_time=completion,
                                   exec_time=exec_time, waiting_time=completion - exec_time,
                                   utility=request.tuf(response))

    def to_record(self) -> dict:
        """The per-request JSON record ``timely-llm bench`` writes."""
        return {
            "id": self.id, "agent": self.agent, "trace": self.trace, "category": self.category,
            "robot": self.robot, "status": self.status.value, "reason": self.reason,
            "arrival": self.arrival, "tuf": self.tuf.to_dict(),
            "response_time": self.response_time, "waiting_time": self.waiting_time, "exec_time": self.exec_time,
            "completion_time": self.completion_time, "utility": self.utility,
            "plan": self.plan, "output_tokens": self.output_tokens,
            "segments": [s.to_dict() for s in self.segments],
            "shed": self.shed, "infeasible_at": self.infeasible_at, "best_response": self.best_response,
            "skipped_segments": self.skipped_segments, "killed_at": self.killed_at,
        }


def executed_span(segment: Segment) -> tuple[float, float]:
    """When ``segment`` started and ended executing; a succeeded plan's segments all did."""
    if segment.exec_start is None or segment.exec_end is None:
        raise ValueError(f"segment {segment.index} of a succeeded plan has no execution times")
    return segment.exec_start, segment.exec_end
