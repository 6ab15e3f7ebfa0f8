"""The node's messages built from the Server's requests (a segment's feedback, a request's result), and the one place
interface v1's typed fields (docs/interfaces.md) turn into Python values and back: durations, stamps, the status and
overrun-strategy constants."""

from __future__ import annotations

import math
from collections.abc import Callable

from builtin_interfaces.msg import Duration as DurationMsg
from builtin_interfaces.msg import Time as TimeMsg

from timely_llm.core.overload import OVERRUN_KILL, OVERRUN_NONE, OVERRUN_SKIP_NEXT
from timely_llm.core.request import Outcome, Request, Segment, Status, call_text
from timely_llm.ros.interfaces import RequestPlan, SkillCall
from timely_llm.ros.interfaces import Segment as SegmentMsg

NANOS = 1_000_000_000
NO_DURATION_S = -1.0
"""A result's response or waiting time when it has none (the plan never executed)."""

_RESULT = RequestPlan.Result
STATUS_CODES = {Status.SUCCEEDED: _RESULT.STATUS_SUCCEEDED, Status.ABORTED: _RESULT.STATUS_ABORTED,
                Status.CANCELED: _RESULT.STATUS_CANCELED}
"""A result's status constant for each way a request ends (PlanResult's constants are the same numbers)."""
_STATUS_NAMES = {code: status.value for status, code in STATUS_CODES.items()}

OVERRUN_CODES = {OVERRUN_NONE: RequestPlan.Goal.OVERRUN_NONE, OVERRUN_KILL: RequestPlan.Goal.OVERRUN_KILL,
                 OVERRUN_SKIP_NEXT: RequestPlan.Goal.OVERRUN_SKIP_NEXT}
"""A goal's overrun_strategy constant for each of the Server's strategies (TaskRequest's are the same numbers)."""
_OVERRUN_NAMES = {code: name for name, code in OVERRUN_CODES.items()}


class FieldError(ValueError):
    """A typed field holds a value interface v1 does not define; the message says which, in one line."""


def duration_msg(seconds: float) -> DurationMsg:
    """``seconds`` (finite) as a Duration: whole seconds rounded down, nanoseconds in [0, 1e9)."""
    sec, nanosec = divmod(round(seconds * NANOS), NANOS)
    return DurationMsg(sec=sec, nanosec=nanosec)


def duration_seconds(duration: DurationMsg, field: str = "duration") -> float:
    """A Duration in seconds; FieldError for nanoseconds out of [0, 1e9)."""
    if duration.nanosec >= NANOS:
        raise FieldError(f"{field} nanosec {duration.nanosec} is not below 1e9")
    return duration.sec + duration.nanosec / NANOS


def optional_duration(seconds: float | None) -> DurationMsg:
    """A result's time, or -1 s when it has none (None, NaN)."""
    return duration_msg(NO_DURATION_S if seconds is None or math.isnan(seconds) else seconds)


def optional_seconds(duration: DurationMsg) -> float | None:
    """A result's time in seconds, None when it has none (negative)."""
    seconds = duration_seconds(duration)
    return None if seconds < 0 else seconds


def stamp_seconds(stamp: TimeMsg) -> float | None:
    """A report's stamp in seconds of ROS time; None for the zero stamp (none given). FieldError: out of range."""
    if stamp.nanosec >= NANOS:
        raise FieldError(f"stamp nanosec {stamp.nanosec} is not below 1e9")
    if not stamp.sec and not stamp.nanosec:
        return None
    return stamp.sec + stamp.nanosec / NANOS


def status_name(code: int) -> str:
    """A result's status constant as the Server's word (``succeeded``...); an undefined one says its number."""
    return _STATUS_NAMES.get(code, f"status {code}")


def overrun_code(strategy: str) -> int:
    """The overrun_strategy constant of a strategy name (``none``, ``kill``, ``skip-next``; empty is none)."""
    try:
        return OVERRUN_CODES[strategy or OVERRUN_NONE]
    except KeyError:
        raise FieldError(f"unknown overrun strategy {strategy!r} (known: {', '.join(OVERRUN_CODES)})") from None


def overrun_name(code: int) -> str:
    """The Server's strategy for an overrun_strategy constant; FieldError for one interface v1 does not define."""
    try:
        return _OVERRUN_NAMES[code]
    except KeyError:
        known = ", ".join(f"{c} {name}" for c, name in _OVERRUN_NAMES.items())
        raise FieldError(f"unknown overrun_strategy {code} (known: {known})") from None


def segment_message(request: Request, segment: Segment, stamp: Callable[[float], TimeMsg]) -> SegmentMsg:
    """The feedback message for a segment about to be dispatched; ``stamp`` turns a server-clock time into ROS
    time. Its dispatch_time is set as it is sent (``dispatched``)."""
    return SegmentMsg(
        request_id=request.id, agent_id=request.agent, index=segment.index, text=segment.text,
        skills=[SkillCall(name=c.name, args=list(c.args)) for c in segment.calls],
        estimated_exec_time=duration_msg(segment.est_exec_time), gen_start=stamp(segment.gen_start),
        gen_end=stamp(segment.gen_end), final=segment.final, waits_for=call_text(segment.waits_for) or "")


def result_message(outcome: Outcome) -> RequestPlan.Result:
    """The action result for how a request ended; a shed one's response time is the best it could still have had."""
    response = outcome.best_response if outcome.shed else outcome.response_time
    return RequestPlan.Result(
        status=STATUS_CODES[outcome.status], reason=outcome.reason, plan=outcome.plan,
        num_segments=len(outcome.segments), response_time=optional_duration(response),
        waiting_time=optional_duration(outcome.waiting_time), utility=_float_or_nan(outcome.utility))


def aborted_result(reason: str) -> RequestPlan.Result:
    """The result of a goal that ends before its request could start."""
    return RequestPlan.Result(status=RequestPlan.Result.STATUS_ABORTED, reason=reason,
                              response_time=optional_duration(None), waiting_time=optional_duration(None),
                              utility=math.nan)


def _float_or_nan(value: float | None) -> float:
    return math.nan if value is None else float(value)
