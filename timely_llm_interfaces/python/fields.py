"""Interface v1's typed fields as Python values, for both ends of the wire: durations, stamps, a result's status
and a goal's overrun strategy."""

from __future__ import annotations

import math
import re

from builtin_interfaces.msg import Duration as DurationMsg
from builtin_interfaces.msg import Time as TimeMsg

from timely_llm_interfaces.action import RequestPlan

NANOS = 1_000_000_000
NO_DURATION_S = -1.0
"""A result's response or waiting time when it has none (the plan never executed)."""

_RESULT = RequestPlan.Result
STATUS_NAMES = {_RESULT.STATUS_SUCCEEDED: "succeeded", _RESULT.STATUS_ABORTED: "aborted",
                _RESULT.STATUS_CANCELED: "canceled"}
"""A result's status constant -> how the request ended (PlanResult's constants are the same numbers)."""

_GOAL = RequestPlan.Goal
OVERRUN_CODES = {"none": _GOAL.OVERRUN_NONE, "kill": _GOAL.OVERRUN_KILL, "skip-next": _GOAL.OVERRUN_SKIP_NEXT}
"""An overrun strategy's name -> the goal's overrun_strategy constant (TaskRequest's are the same numbers)."""
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
    """A result's status constant as a word (``succeeded``...); an undefined one says its number."""
    return STATUS_NAMES.get(code, f"status {code}")


def overrun_code(strategy: str) -> int:
    """The overrun_strategy constant of a strategy name (``none``, ``kill``, ``skip-next``; empty is none)."""
    try:
        return OVERRUN_CODES[strategy or "none"]
    except KeyError:
        raise FieldError(f"unknown overrun strategy {strategy!r} (known: {', '.join(OVERRUN_CODES)})") from None


def overrun_name(code: int) -> str:
    """The strategy name of an overrun_strategy constant; FieldError for one interface v1 does not define."""
    try:
        return _OVERRUN_NAMES[code]
    except KeyError:
        known = ", ".join(f"{c} {name}" for c, name in _OVERRUN_NAMES.items())
        raise FieldError(f"unknown overrun_strategy {code} (known: {known})") from None


def string_bound(msg_type: type, field: str) -> int | None:
    """The bound of a ``string<=N`` field of a message type, or of each string of a sequence of them (None for an
    unbounded one): the .msg file is its one definition, read here from the generated class."""
    bounded = re.search(r"string<(\d+)>", msg_type.get_fields_and_field_types()[field])  # rosidl writes string<N>
    return int(bounded.group(1)) if bounded else None


def clipped(text: str, msg_type: type, field: str) -> str:
    """``text`` cut to the bound of ``msg_type``'s string ``field``: what the node writes must fit, as rclpy refuses
    a longer string when the field is set."""
    bound = string_bound(msg_type, field)
    return text if bound is None or len(text) <= bound else text[:bound]


def oversized(msg: object) -> str | None:
    """Which string field of a received message is longer than its bound, in one line, or None. The bounds are in
    the type, but rclpy checks them only where ROS_PYTHON_CHECK_FIELDS=1 in the sender, and the middleware delivers
    longer strings: the receiver checks."""
    for field in msg.get_fields_and_field_types():
        bound = string_bound(type(msg), field)
        value = getattr(msg, field)
        texts = [value] if isinstance(value, str) else value if isinstance(value, list) else []
        longest = max((len(t) for t in texts if isinstance(t, str)), default=0)
        if bound is not None and longest > bound:
            return f"{field} of {longest} characters is longer than its bound {bound}"
    return None
