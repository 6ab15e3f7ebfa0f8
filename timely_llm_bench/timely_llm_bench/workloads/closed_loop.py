"""The closed-loop workload: drone and mobile-base tasks whose plans wait for what the robot sees.

Its tasks (``closed_loop.yaml``) are traces like LRTrace's, each with the values its robot may report
for every blocking skill; its robots are the shipped ones plus the camera drone of
``closed_loop_drone.yaml``. Arrivals are generated as the built-in workloads' (Table 3's Poisson events).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from timely_llm.errors import ConfigError, read_mapping
from timely_llm.plan.robot_file import load_skill_model, load_skill_models
from timely_llm.plan.skills import SkillModel
from timely_llm.traces import TraceCatalog, load_catalog
from timely_llm_bench.workloads.generator import Workload, WorkloadSpec, generate

TASKS_PATH = Path(__file__).with_name("closed_loop.yaml")
DRONE_PATH = Path(__file__).with_name("closed_loop_drone.yaml")


@dataclass(frozen=True)
class ClosedLoopTasks:
    catalog: TraceCatalog
    values: dict[int, dict[str, tuple[str, ...]]]
    """Per trace, per blocking skill: the values its robot may report."""

    @property
    def robots(self) -> Mapping[str, SkillModel]:
        return self.catalog.robots

    def workload(self, seed: int, events_per_second: float = 0.5, max_tasks_per_event: int = 8,
                 agents: int = 40, duration: float = 240.0) -> Workload:
        spec = WorkloadSpec("closed-loop", events_per_second, max_tasks_per_event, tuple(sorted(self.catalog.traces)),
                            agents, duration)
        return generate(spec, self.catalog, dict(self.robots), seed)


def load_closed_loop(path: str | Path = TASKS_PATH) -> ClosedLoopTasks:
    """The tasks in ``path`` with their robots; ConfigError names a value list that is not one of strings or a
    skill that is not one of the task's robot's blocking skills."""
    robots = {**load_skill_models(), "drone": load_skill_model(DRONE_PATH)}
    catalog = load_catalog(path, robots)
    values = {}
    for i, raw in enumerate(read_mapping(path)["tasks"]):
        trace = catalog[raw["id"]]
        values[trace.id] = _values(raw.get("values"), robots[trace.robot], f"tasks[{i}].values", str(path))
    return ClosedLoopTasks(catalog, values)


def _values(raw: object, robot: SkillModel, where: str, source: str) -> dict[str, tuple[str, ...]]:
    if not isinstance(raw, dict) or not raw:
        raise ConfigError(source, where, "expected a mapping of blocking skill -> list of values")
    for skill, listed in raw.items():
        if skill not in robot.skills or not robot.skills[skill].blocking:
            raise ConfigError(source, f"{where}.{skill}", f"not a blocking skill of {robot.robot}")
        if not isinstance(listed, list) or not listed or not all(isinstance(v, str) and v.strip() for v in listed):
            raise ConfigError(source, f"{where}.{skill}", "expected a non-empty list of non-empty strings")
    return {skill: tuple(listed) for skill, listed in raw.items()}
