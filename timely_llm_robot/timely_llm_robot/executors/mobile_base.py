"""A simulated mobile base that runs segments of skill calls: go_to, dock, look_for, follow, say, turn.

The base lives in a world of named places, each holding the objects and people there.
With a world given, driving to a place not on the map and following someone who is not
where the base is fail, as on a real base; without one (``world=None``) every place is
reachable and nothing is found. Each skill takes the time ``duration`` gives (default:
none), scaled by ``time_scale``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from timely_llm_robot.executors.base import CallList, SegmentResult, run_calls, text_arg
from timely_llm_robot.executors.minispec import SkillFailed, Value

BaseDuration = Callable[[str, Sequence[Value]], float]
"""Seconds a skill takes, given its name and arguments."""

DOCK = "dock"


@dataclass
class BaseState:
    position: str = DOCK
    docked: bool = True
    said: list[str] = field(default_factory=list)


class SimulatedMobileBase:
    """A base on a map of places (place -> what is there), or on an open map (``world=None``)."""

    def __init__(self, world: dict[str, set[str]] | None = None, duration: BaseDuration = lambda skill, args: 0.0,
                 time_scale: float = 1.0) -> None:
        self.world = None if world is None else {place: set(things) for place, things in world.items()}
        self.duration = duration
        self.time_scale = time_scale
        self.state = BaseState()

    def execute_calls(self, calls: CallList) -> SegmentResult:
        """Run a segment's skill calls in order, stopping at the first failure."""
        return run_calls(self.dispatch, calls)

    def dispatch(self, name: str, args: Sequence[Value]) -> Value:
        """Carry out one skill; SkillFailed with the reason if it cannot."""
        skills: dict[str, Callable[[Sequence[Value]], Value]] = {
            "go_to": self._go_to, "dock": self._dock, "look_for": self._look_for, "follow": self._follow,
            "say": self._say, "turn": self._turn,
        }
        if name not in skills:
            raise SkillFailed(f"unknown skill {name!r}")
        outcome = skills[name](args)
        time.sleep(self.duration(name, args) * self.time_scale)
        return outcome

    def _go_to(self, args: Sequence[Value]) -> None:
        place = text_arg("go_to", args)
        if self.world is not None and place not in self.world and place != DOCK:
            raise SkillFailed(f"go_to({place}): no place {place!r} on the map")
        self.state.position, self.state.docked = place, False

    def _dock(self, args: Sequence[Value]) -> None:
        if args:
            raise SkillFailed(f"dock takes no argument, got {list(args)}")
        self.state.position, self.state.docked = DOCK, True

    def _look_for(self, args: Sequence[Value]) -> str:
        """Where ``thing`` is, as the robot tells it (the plan waits for it): here at this place, or not here."""
        thing = text_arg("look_for", args)
        found = self.world is not None and thing in self.world.get(self.state.position, set())
        return f"here, at {self.state.position}" if found else "not here"

    def _follow(self, args: Sequence[Value]) -> None:
        if len(args) != 2 or isinstance(args[1], bool) or not isinstance(args[1], int | float):
            raise SkillFailed(f"follow expects a person and seconds, got {list(args)}")
        person = str(args[0])
        if self.world is not None and person not in self.world.get(self.state.position, set()):
            raise SkillFailed(f"follow({person}): {person} is not at {self.state.position}")
        self.state.docked = False

    def _say(self, args: Sequence[Value]) -> None:
        self.state.said.append(text_arg("say", args))

    def _turn(self, args: Sequence[Value]) -> None:
        text_arg("turn", args)
        self.state.docked = False
