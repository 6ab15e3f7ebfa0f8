"""The node's action messages built from the Server's requests: a segment's feedback, a request's result."""

from __future__ import annotations

import math
from collections.abc import Callable

from builtin_interfaces.msg import Time as TimeMsg

from timely_llm.core.request import Outcome, Request, Segment, Status, call_text
from timely_llm.ros.interfaces import RequestPlan, SkillCall
from timely_llm.ros.interfaces import Segment as SegmentMsg


def segment_message(request: Request, segment: Segment, stamp: Callable[[float], TimeMsg]) -> SegmentMsg:
    """The feedback message for a dispatched segment; ``stamp`` turns a server-clock time into ROS time."""
    return SegmentMsg(
        request_id=request.id, agent_id=request.agent, index=segment.index, text=segment.text,
        skills=[SkillCall(name=c.name, args=list(c.args)) for c in segment.calls],
        estimated_exec_time=float(segment.est_exec_time), gen_start=stamp(segment.gen_start),
        gen_end=stamp(segment.gen_end), dispatch_time=stamp(segment.gen_end), final=segment.final,
        waits_for=call_text(segment.waits_for) or "")


def result_message(outcome: Outcome) -> RequestPlan.Result:
    """The action result for how a request ended; a shed one's response time is the best it could still have had."""
    response = outcome.best_response if outcome.shed else outcome.response_time
    return RequestPlan.Result(
        status=outcome.status.value, reason=outcome.reason, plan=outcome.plan, num_segments=len(outcome.segments),
        response_time=_float_or_nan(response), waiting_time=_float_or_nan(outcome.waiting_time),
        utility=_float_or_nan(outcome.utility))


def aborted_result(reason: str) -> RequestPlan.Result:
    """The result of a goal that ends before its request could start."""
    return RequestPlan.Result(status=Status.ABORTED.value, reason=reason,
                              **dict.fromkeys(("response_time", "waiting_time", "utility"), math.nan))


def _float_or_nan(value: float | None) -> float:
    return math.nan if value is None else float(value)
