"""Workloads: Poisson events of 1..MaxTPE tasks over a pool of agents (Table 3), as JSON.

An agent runs one task at a time. Since completion depends on the policy under
test, the generator reserves an agent for its task's execution time (from the
skill models' lower bounds) plus ``AGENT_GUARD`` seconds, identically for every
policy; an event finding too few free agents gets fewer tasks.
"""

from __future__ import annotations

import math
import random
from collections.abc import Collection
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TypeGuard

from timely_llm.core.overload import OVERRUN_NONE, OVERRUN_STRATEGIES
from timely_llm.core.tuf import DEFAULT_TUFS, TUF
from timely_llm.errors import ConfigError, read_mapping
from timely_llm.plan.skills import SkillModel
from timely_llm.traces import TraceCatalog

AGENT_GUARD = 5.0
EVENT_SPACING = 0.001  # tasks of one event arrive 1 ms apart, in a fixed order


@dataclass(frozen=True)
class WorkloadSpec:
    name: str
    events_per_second: float
    max_tasks_per_event: int
    trace_ids: tuple[int, ...]
    agents: int
    duration: float


BUILTIN = {
    "WID1": WorkloadSpec("WID1", 0.25, 8, tuple(range(1, 9)), 25, 260.0),
    "WID1-high": WorkloadSpec("WID1-high", 1.0, 8, tuple(range(1, 9)), 25, 260.0),
    "WID2": WorkloadSpec("WID2", 0.25, 16, tuple(range(1, 9)), 42, 300.0),
    "WID3": WorkloadSpec("WID3", 0.1, 8, (9, 10, 11), 40, 900.0),
}


@dataclass(frozen=True)
class WorkloadRequest:
    id: str
    arrival: float
    agent: str
    trace: int
    tuf: TUF
    overrun: str = OVERRUN_NONE
    """TimeBill's overrun strategy for its late segments: none, kill or skip-next (core/overload.py)."""


@dataclass(frozen=True)
class Workload:
    name: str
    network_latency: float
    requests: tuple[WorkloadRequest, ...]

    def to_json(self) -> dict:
        return {
            "name": self.name, "network_latency": self.network_latency,
            "requests": [{"id": r.id, "arrival": r.arrival, "agent": r.agent, "trace": r.trace, "tuf": r.tuf.to_dict(),
                          **({"overrun": r.overrun} if r.overrun != OVERRUN_NONE else {})} for r in self.requests],
        }

    def with_overrun(self, strategy: str) -> Workload:
        """The same workload with every request's overrun strategy ``strategy``."""
        if strategy not in OVERRUN_STRATEGIES:
            raise ValueError(f"unknown overrun strategy {strategy!r} (one of {', '.join(OVERRUN_STRATEGIES)})")
        return replace(self, requests=tuple(replace(r, overrun=strategy) for r in self.requests))

    def of_categories(self, categories: Collection[str], catalog: TraceCatalog) -> Workload:
        """Only the requests whose trace is of one of ``categories`` (their arrivals as they were)."""
        return replace(self, name=f"{self.name} ({', '.join(categories)} only)",
                       requests=tuple(r for r in self.requests if catalog[r.trace].category in categories))


def default_tuf(category: str) -> TUF:
    return DEFAULT_TUFS[category]


def generate(spec: WorkloadSpec, catalog: TraceCatalog, robots: dict[str, SkillModel], seed: int,
             network_latency: float = 0.008) -> Workload:
    rng = random.Random(seed)
    robot = catalog[spec.trace_ids[0]].robot
    prefix = "drone" if robot == "tello" else robot
    width = len(str(spec.agents))
    names = [f"{prefix}-{i:0{width}d}" for i in range(1, spec.agents + 1)]
    busy_until = dict.fromkeys(names, -math.inf)
    requests: list[WorkloadRequest] = []
    t = rng.expovariate(spec.events_per_second)
    while t < spec.duration:
        wanted = rng.randint(1, spec.max_tasks_per_event)
        free = [a for a in names if busy_until[a] <= t]
        for i, agent in enumerate(rng.sample(free, min(wanted, len(free)))):
            trace = catalog[rng.choice(spec.trace_ids)]
            arrival = round(t + i * EVENT_SPACING, 6)
            busy_until[agent] = arrival + robots[trace.robot].min_exec_time(trace.plan) + AGENT_GUARD
            requests.append(WorkloadRequest(f"r{len(requests):05d}", arrival, agent, trace.id,
                                            default_tuf(trace.category)))
        t += rng.expovariate(spec.events_per_second)
    return Workload(spec.name, network_latency, tuple(requests))


def load_workload(path: str | Path, catalog: TraceCatalog) -> Workload:
    """Read a workload JSON file; ConfigError names the file and the bad field."""
    source = str(path)
    data = read_mapping(path)
    latency = data.get("network_latency", 0.008)
    if not _finite_number(latency) or latency < 0:
        raise ConfigError(source, "network_latency", "must be a number >= 0")
    raw_requests = data.get("requests")
    if not isinstance(raw_requests, list) or not raw_requests:
        raise ConfigError(source, "requests", "expected a non-empty list")
    requests = [_parse_request(r, i, source, catalog) for i, r in enumerate(raw_requests)]
    ids = [r.id for r in requests]
    if len(set(ids)) != len(ids):
        raise ConfigError(source, "requests", "request ids must be unique")
    return Workload(str(data.get("name", Path(path).stem)), float(latency),
                    tuple(sorted(requests, key=lambda r: r.arrival)))


def _parse_request(raw: object, index: int, source: str, catalog: TraceCatalog) -> WorkloadRequest:
    where = f"requests[{index}]"
    if not isinstance(raw, dict):
        raise ConfigError(source, where, "expected an object")
    arrival = raw.get("arrival")
    if not _finite_number(arrival) or arrival < 0:
        raise ConfigError(source, f"{where}.arrival", f"must be a finite number >= 0, got {arrival!r}")
    agent = raw.get("agent")
    if not isinstance(agent, str) or not agent:
        raise ConfigError(source, f"{where}.agent", "must be a non-empty string")
    trace = raw.get("trace")
    if not isinstance(trace, int) or isinstance(trace, bool) or trace not in catalog.traces:
        raise ConfigError(source, f"{where}.trace", f"unknown trace {trace!r} (known: {sorted(catalog.traces)})")
    tuf = _parse_tuf(raw.get("tuf"), catalog[trace].category, f"{where}.tuf", source)
    overrun = raw.get("overrun", OVERRUN_NONE)
    if overrun not in OVERRUN_STRATEGIES:
        raise ConfigError(source, f"{where}.overrun",
                          f"must be one of {', '.join(OVERRUN_STRATEGIES)}, got {overrun!r}")
    return WorkloadRequest(str(raw.get("id", f"r{index:05d}")), float(arrival), agent, trace, tuf, overrun)


def _parse_tuf(raw: object, category: str, where: str, source: str) -> TUF:
    if raw is None:
        return default_tuf(category)
    if not isinstance(raw, dict):
        raise ConfigError(source, where, "expected an object with ert, alpha, beta")
    for key in ("ert", "alpha", "beta"):
        if not _finite_number(raw.get(key)):
            raise ConfigError(source, f"{where}.{key}", f"must be a finite number, got {raw.get(key)!r}")
    try:
        return TUF(float(raw["ert"]), float(raw["alpha"]), float(raw["beta"]))
    except ValueError as exc:
        raise ConfigError(source, where, str(exc)) from exc


def _finite_number(value: object) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
