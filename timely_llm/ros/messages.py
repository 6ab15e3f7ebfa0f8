"""The node's messages built from the Server's requests (a segment's feedback, a request's result); interface v1's
typed fields turn into Python values in ``timely_llm_interfaces.fields``, shared with the robots."""

from __future__ import annotations

import math
from collections.abc import Callable

from builtin_interfaces.msg import Time as TimeMsg
from timely_llm_interfaces.fields import (
    STATUS_NAMES,
    FieldError,
    clipped,
    duration_msg,
    duration_seconds,
    optional_duration,
    optional_seconds,
    overrun_name,
    stamp_seconds,
    status_name,
)

from timely_llm.core.request import Outcome, Request, Segment, Status, call_text
from timely_llm.ros.interfaces import RequestPlan, SkillCall
from timely_llm.ros.interfaces import Segment as SegmentMsg

__all__ = ["FieldError", "duration_msg", "duration_seconds", "optional_seconds", "overrun_name", "stamp_seconds",
           "status_name"]

STATUS_CODES = {Status(name): code for code, name in STATUS_NAMES.items()}
"""A result's status constant for each way a request ends."""


def segment_message(request: Request, segment: Segment, stamp: Callable[[float], TimeMsg]) -> SegmentMsg:
    """The feedback message for a segment about to be dispatched; ``stamp`` turns a server-clock time into ROS
    time. Its dispatch_time is set as it is sent (``dispatched``)."""
    return SegmentMsg(
        request_id=request.id, agent_id=request.agent, index=segment.index,
        text=clipped(segment.text, SegmentMsg, "text"),
        skills=[SkillCall(name=c.name, args=[clipped(a, SkillCall, "args") for a in c.args]) for c in segment.calls],
        estimated_exec_time=duration_msg(segment.est_exec_time), gen_start=stamp(segment.gen_start),
        gen_end=stamp(segment.gen_end), final=segment.final,
        waits_for=clipped(call_text(segment.waits_for) or "", SegmentMsg, "waits_for"))


def result_message(outcome: Outcome) -> RequestPlan.Result:
    """The action result for how a request ended; a shed one's response time is the best it could still have had."""
    response = outcome.best_response if outcome.shed else outcome.response_time
    return RequestPlan.Result(
        status=STATUS_CODES[outcome.status], reason=clipped(outcome.reason, RequestPlan.Result, "reason"),
        plan=clipped(outcome.plan, RequestPlan.Result, "plan"),
        num_segments=len(outcome.segments), response_time=optional_duration(response),
        waiting_time=optional_duration(outcome.waiting_time), utility=_float_or_nan(outcome.utility))


def aborted_result(reason: str) -> RequestPlan.Result:
    """The result of a goal that ends before its request could start."""
    return RequestPlan.Result(status=RequestPlan.Result.STATUS_ABORTED,
                              reason=clipped(reason, RequestPlan.Result, "reason"),
                              response_time=optional_duration(None), waiting_time=optional_duration(None),
                              utility=math.nan)


def _float_or_nan(value: float | None) -> float:
    return math.nan if value is None else float(value)
