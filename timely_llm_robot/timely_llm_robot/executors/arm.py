"""A simulated pick-and-place arm that runs segments of skill calls: goto, pick, drop, scan.

Each skill takes the time a duration function gives (defaults: the profiled
means in ``skill_models/arm.yaml``), scaled by ``time_scale``. The arm knows
where each object lies; picking moves the gripper to the object.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from timely_llm_robot.executors.base import CallList, SegmentResult, run_calls, text_arg
from timely_llm_robot.executors.minispec import SkillFailed, Value

ArmDuration = Callable[[str, Sequence[Value]], float]
"""Seconds a skill takes, given its name and arguments."""

DEFAULT_SKILL_SECONDS = {"goto": 0.8, "pick": 3.0, "drop": 3.0, "scan": 1.0}
DEFAULT_OBJECTS = {"cyan_box": "table", "red_box": "table", "yellow_box": "shelf"}


def arm_skill_duration(skill: str, args: Sequence[Value]) -> float:
    return DEFAULT_SKILL_SECONDS[skill]


@dataclass(frozen=True)
class ArmState:
    position: str = "home"
    held: str | None = None


class SimulatedArm:
    """An arm over a scene of objects, each lying at a named place."""

    def __init__(self, objects: dict[str, str] | None = None, duration: ArmDuration = arm_skill_duration,
                 time_scale: float = 1.0) -> None:
        self.objects = dict(DEFAULT_OBJECTS if objects is None else objects)
        self.duration = duration
        self.time_scale = time_scale
        self.state = ArmState()

    def execute_calls(self, calls: CallList) -> SegmentResult:
        """Run a segment's skill calls in order, stopping at the first failure."""
        return run_calls(self.dispatch, calls)

    def dispatch(self, name: str, args: Sequence[Value]) -> Value:
        """Carry out one skill; SkillFailed with the reason if it cannot."""
        skills: dict[str, Callable[[str], Value]] = {
            "goto": self._goto, "pick": self._pick, "drop": self._drop, "scan": self._scan,
        }
        if name not in skills:
            raise SkillFailed(f"unknown skill {name!r}")
        outcome = skills[name](text_arg(name, args))
        time.sleep(self.duration(name, args) * self.time_scale)
        return outcome

    def _goto(self, target: str) -> None:
        self.state = replace(self.state, position=self.objects.get(target, target))

    def _pick(self, item: str) -> None:
        if self.state.held is not None:
            raise SkillFailed(f"pick({item}): already holding {self.state.held}")
        if item not in self.objects:
            raise SkillFailed(f"pick({item}): no {item} in the scene")
        self.state = ArmState(position=self.objects.pop(item), held=item)

    def _drop(self, place: str) -> None:
        held = self.state.held
        if held is None:
            raise SkillFailed(f"drop({place}): the gripper is empty")
        self.objects[held] = place
        self.state = ArmState(position=place, held=None)

    def _scan(self, item: str) -> bool:
        return item in self.objects or item == self.state.held
