"""The LRTrace catalog: task prompts and their recorded plans (Table 2)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from timely_llm.core.tuf import DEFAULT_TUFS
from timely_llm.errors import ConfigError, read_mapping

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
    def __init__(self, traces: dict[int, Trace], system_prompts: dict[str, str]) -> None:
        self.traces = traces
        self.system_prompts = system_prompts

    def __getitem__(self, trace_id: int) -> Trace:
        return self.traces[trace_id]

    def system_prompt(self, robot: str) -> str:
        return self.system_prompts.get(robot, "")

    def prompt_text(self, robot: str, task: str) -> str:
        """The full prompt: the robot's fixed system part, then the task (the part that varies)."""
        return f"{self.system_prompt(robot)}\nTask: {task}\nResponse: "


def load_catalog(path: str | Path = CATALOG_PATH) -> TraceCatalog:
    source = str(path)
    data = read_mapping(path)
    if not isinstance(data.get("tasks"), list):
        raise ConfigError(source, "tasks", "expected a list of tasks")
    prompts = data.get("system_prompts", {})
    if not isinstance(prompts, dict) or not all(isinstance(v, str) for v in prompts.values()):
        raise ConfigError(source, "system_prompts", "expected a mapping of robot -> text")
    traces = {}
    for i, raw in enumerate(data["tasks"]):
        trace = _parse_trace(raw, f"tasks[{i}]", source)
        if trace.id in traces:
            raise ConfigError(source, f"tasks[{i}].id", f"duplicate trace id {trace.id}")
        traces[trace.id] = trace
    return TraceCatalog(traces, prompts)


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
