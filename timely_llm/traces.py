"""The LRTrace catalog: task prompts and their recorded plans (Table 2).

A robot's system prompt is not the catalog's: it is built from the robot's skill-model file
(:attr:`SkillModel.system_prompt`); the catalog reads it from there.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from timely_llm.core.tuf import DEFAULT_TUFS
from timely_llm.errors import ConfigError, read_mapping
from timely_llm.plan.robot_file import load_skill_models
from timely_llm.plan.skills import SkillModel, request_prompt

CATALOG_PATH = Path(__file__).with_name("lrtrace.yaml")
CATEGORIES = tuple(DEFAULT_TUFS)


@dataclass(frozen=True)
class Trace:
    id: int
    category: str
    robot: str
    description: str
    prompt: str
    plan: str


class TraceCatalog:
    def __init__(self, traces: dict[int, Trace], robots: Mapping[str, SkillModel]) -> None:
        self.traces = traces
        self.robots = robots
        """The skill models the traces' robots' prompts come from."""

    def __getitem__(self, trace_id: int) -> Trace:
        return self.traces[trace_id]

    def system_prompt(self, robot: str) -> str:
        return self.robots[robot].system_prompt if robot in self.robots else ""

    def prompt_text(self, robot: str, task: str) -> str:
        """The full prompt of ``robot``'s request for ``task`` (see :meth:`SkillModel.prompt_text`)."""
        return request_prompt(self.system_prompt(robot), task)


def load_catalog(path: str | Path = CATALOG_PATH, robots: Mapping[str, SkillModel] | None = None) -> TraceCatalog:
    """The traces in ``path``; prompts from ``robots`` (default: the shipped skill models)."""
    source = str(path)
    data = read_mapping(path)
    if not isinstance(data.get("tasks"), list):
        raise ConfigError(source, "tasks", "expected a list of tasks")
    if "system_prompts" in data:
        raise ConfigError(source, "system_prompts", "a robot's prompt lives in its skill-model file (prompt:)")
    traces = {}
    for i, raw in enumerate(data["tasks"]):
        trace = _parse_trace(raw, f"tasks[{i}]", source)
        if trace.id in traces:
            raise ConfigError(source, f"tasks[{i}].id", f"duplicate trace id {trace.id}")
        traces[trace.id] = trace
    return TraceCatalog(traces, load_skill_models() if robots is None else robots)


def _parse_trace(raw: object, where: str, source: str) -> Trace:
    if not isinstance(raw, dict):
        raise ConfigError(source, where, "expected a mapping")
    if not isinstance(raw.get("id"), int) or isinstance(raw.get("id"), bool) or raw["id"] <= 0:
        raise ConfigError(source, f"{where}.id", "must be a positive integer")
    if raw.get("category") not in CATEGORIES:
        raise ConfigError(source, f"{where}.category", f"must be one of {CATEGORIES}")
    for key in ("robot", "description", "prompt", "plan"):
        if not isinstance(raw.get(key), str) or not raw[key].strip():
            raise ConfigError(source, f"{where}.{key}", "must be a non-empty string")
    return Trace(raw["id"], raw["category"], raw["robot"], raw["description"], raw["prompt"], raw["plan"])
