"""What every executor reports for a segment, and how it runs a flat list of skill calls."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from timely_llm_robot.executors.minispec import (
    MiniSpecError,
    SkillDispatch,
    SkillFailed,
    Value,
)

CallList = Sequence[tuple[str, Sequence[Value]]]
"""A parsed segment: ``[("mf", ["50"]), ("tc", [90])]``; string arguments that read as numbers count as numbers."""


@dataclass(frozen=True)
class SegmentResult:
    success: bool
    reason: str
    duration: float
    """Wall-clock seconds the segment took to execute."""
    returned: Value = None
    """The value of a MiniSpec ``->value`` the segment reached, if any."""
    last_value: Value = None
    """What the segment's last call returned: for a segment ending in a blocking call, the value the robot
    reports (``SegmentDone.result``)."""


def run_timed(body: Callable[[], Value], last_value: Callable[[], Value] = lambda: None) -> SegmentResult:
    """Run a segment's body and time it; a skill failure or malformed plan becomes a failed result.
    ``last_value``: what the last call returned, asked once the body ran."""
    start = time.monotonic()
    try:
        returned = body()
    except SkillFailed as failure:
        return SegmentResult(False, str(failure), time.monotonic() - start)
    except MiniSpecError as error:
        return SegmentResult(False, f"malformed plan: {error}", time.monotonic() - start)
    return SegmentResult(True, "", time.monotonic() - start, returned, last_value())


def run_calls(dispatch: SkillDispatch, calls: CallList) -> SegmentResult:
    """Run skill calls one after another, stopping at the first failure."""
    values: list[Value] = [None]

    def body() -> Value:
        for name, args in calls:
            values.append(dispatch(name, [as_number(arg) for arg in args]))
        return None

    return run_timed(body, lambda: values[-1])


def as_number(arg: Value) -> Value:
    """``"50"`` -> 50, ``"1.5"`` -> 1.5; anything else unchanged."""
    if not isinstance(arg, str):
        return arg
    for kind in (int, float):
        try:
            return kind(arg)
        except ValueError:
            continue
    return arg


def number_arg(name: str, args: Sequence[Value], low: float | None = None, high: float | None = None) -> float:
    """The single numeric argument of skill ``name``; SkillFailed if missing or out of [low, high]."""
    if len(args) != 1 or isinstance(args[0], bool) or not isinstance(args[0], int | float):
        raise SkillFailed(f"{name} expects one number, got {list(args)}")
    value = float(args[0])
    if (low is not None and value < low) or (high is not None and value > high):
        raise SkillFailed(f"{name}({args[0]}) out of range [{low}, {high}]")
    return value


def text_arg(name: str, args: Sequence[Value]) -> str:
    """The single argument of skill ``name`` as text; SkillFailed if there is not exactly one."""
    if len(args) != 1:
        raise SkillFailed(f"{name} expects one argument, got {list(args)}")
    return str(args[0])


SegmentRunner = Callable[[Any, str], SegmentResult]
"""Executes one segment (a ``timely_llm_interfaces/Segment``) of the task labelled ``label``, says how it went."""


def calls_runner(execute_calls: Callable[[CallList], SegmentResult]) -> SegmentRunner:
    """A runner that executes each segment's skill calls (name, args) through ``execute_calls``."""
    return lambda segment, label: execute_calls([(c.name, list(c.args)) for c in segment.skills])
