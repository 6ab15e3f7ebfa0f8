"""Simulated robots' execution: each segment sleeps its skills' times drawn from the robot file, the way the
bench harness draws them, and a blocking call answers with a value of its return type."""

from __future__ import annotations

import random
import time
import zlib
from dataclasses import dataclass

from timely_llm.plan.skills import SIMULATED_VALUES, SkillModel
from timely_llm_interfaces.msg import Segment as SegmentMsg
from timely_llm_robot.executors.base import SegmentResult, run_timed


@dataclass
class SimulatedSkills:
    """Sleeps each segment's execution time, drawn like the bench harness's robots draw it; a segment that
    waits for a value gets one of its blocking call's return type (``SIMULATED_VALUES``)."""

    model: SkillModel
    seed: int = 0
    time_scale: float = 1.0

    def __call__(self, segment: SegmentMsg, label: str) -> SegmentResult:
        rng = segment_rng(self.seed, label, segment.index)
        seconds = self.model.sample_exec_time(segment.text, rng) * self.time_scale
        value = simulated_value(self.model, segment, rng)
        return run_timed(lambda: time.sleep(seconds), lambda: value)


def simulated_value(model: SkillModel, segment: SegmentMsg, rng: random.Random) -> str | None:
    """The value of the segment's last call when the plan waits for it: one of its return type's."""
    if not segment.waits_for or not segment.skills:
        return None
    skill = model.skills.get(segment.skills[-1].name)
    return rng.choice(SIMULATED_VALUES[(skill.returns if skill else None) or "text"])


def segment_rng(seed: int, label: str, index: int) -> random.Random:
    """The generator execution times of segment ``index`` of task ``label`` are drawn from."""
    return random.Random(zlib.crc32(f"{seed}/{label}/{index}".encode()))
