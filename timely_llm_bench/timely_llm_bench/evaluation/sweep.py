"""The load map: policies x hardware profiles x batch caps x agent counts on the simulator, in one JSON.

Each point is a WID2-like workload (up to 16 tasks per event, traces 1-8) whose event
rate grows with the number of agents (0.25 events/s per 42 agents, as WID2), run
under one policy, one hardware profile and one batch cap on the virtual clock.
Every point also carries the isolated bound: the mean response time its requests
would have alone on an idle server (each trace replayed alone once per profile).

    timely-llm sweep --hw rtx4090-llama3-8b --caps 8 16 64 none --out sweep.json
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from timely_llm.core.features import Features
from timely_llm.core.policies import POLICIES as SERVING_POLICIES
from timely_llm.core.policies import TIMELYLLM, VLLM_PRIORITY, VLLM_STREAM
from timely_llm.engines.hardware import HardwareProfile, load_profile
from timely_llm.plan.robot_file import load_skill_models
from timely_llm.plan.skills import SkillModel
from timely_llm.traces import TraceCatalog, load_catalog
from timely_llm_bench.evaluation.harness import ISOLATED, EngineSetup, run_bench
from timely_llm_bench.evaluation.metrics import fmt_metric
from timely_llm_bench.workloads.generator import BUILTIN, Workload, WorkloadRequest, WorkloadSpec, default_tuf, generate

AGENTS = (25, 50, 100, 200, 400, 800)
CAPS: tuple[int | None, ...] = (8, 16, 64, None)
POLICIES = (VLLM_STREAM.name, VLLM_PRIORITY.name, TIMELYLLM.name)
BASELINES = tuple(name for name, policy in SERVING_POLICIES.items() if not policy.segmented)
EVENTS_PER_AGENT = 0.25 / 42  # WID2: 0.25 events/s over 42 agents
MAX_TASKS_PER_EVENT = 16
TRACES = tuple(range(1, 9))
KIND = "timely-llm sweep"


@dataclass(frozen=True)
class Grid:
    hw: tuple[str, ...]
    policies: tuple[str, ...] = POLICIES
    agents: tuple[int, ...] = AGENTS
    caps: tuple[int | None, ...] = CAPS
    duration: float = 200.0
    seed: int = 3
    """Workload seed (arrivals, agents, traces)."""
    bench_seed: int = 0
    """Robot execution-time draws."""
    kv_gib: float | None = None
    """KV-cache memory in GiB for every profile instead of what the profile's card leaves."""
    features: tuple[str, ...] = ("default",)
    """Sets of scheduler parts (``Features.parse``), each run under every policy of ours; the baselines
    (``BASELINES``: what a vLLM user gets without us) run once, without any."""
    suspends_in_place: bool = False
    """Simulate embedded vLLM's suspension, which keeps the KV in place (``SimEngine``)."""

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def workload_for(agents: int, duration: float, seed: int, catalog: TraceCatalog,
                 skills: dict[str, SkillModel]) -> Workload:
    spec = WorkloadSpec(f"WID2x{agents}", EVENTS_PER_AGENT * agents, MAX_TASKS_PER_EVENT, TRACES, agents, duration)
    return generate(spec, catalog, skills, seed)


def with_kv_memory(profile: HardwareProfile, kv_gib: float | None) -> HardwareProfile:
    if kv_gib is None:
        return profile
    if kv_gib <= 0:
        raise ValueError(f"kv_gib must be > 0, got {kv_gib}")
    memory = {**profile.memory, "total_gib": profile.memory["weights_gib"] + profile.memory["reserved_gib"] + kv_gib}
    return dataclasses.replace(profile, memory=memory)


def isolated_responses(profile: HardwareProfile, catalog: TraceCatalog, skills: dict[str, SkillModel],
                       traces: Iterable[int], seed: int) -> dict[int, float]:
    """Response time of each trace alone on an idle server (the isolated bound)."""
    out = {}
    for trace in traces:
        request = WorkloadRequest("alone", 0.0, "agent", trace, default_tuf(catalog[trace].category))
        result = run_bench(Workload(f"trace{trace}", 0.008, (request,)), VLLM_STREAM.name, profile, skills, catalog,
                           seed)
        out[trace] = result["requests"][0]["response_time"]
    return out


def run_grid(grid: Grid, jobs: int = 1) -> dict:
    """Run every point of ``grid``; ``jobs`` worker processes."""
    points = [(hw, agents, cap, policy, features) for hw in grid.hw for cap in grid.caps
              for agents in grid.agents for policy in grid.policies
              for features in (("none",) if policy in BASELINES else grid.features)]
    started = time.perf_counter()
    results = []
    with ProcessPoolExecutor(jobs) if jobs > 1 else contextlib.nullcontext() as pool:
        jobs_in = [(grid, p) for p in points]
        runs = pool.map(_run_point, jobs_in) if pool else map(_run_point, jobs_in)
        for i, result in enumerate(runs, 1):
            results.append(result)
            print(f"[{i}/{len(points)}] {result['hw']} cap {result['cap']} {result['agents']} agents "
                  f"{result['series']}: {result['wall_s']:.1f} s", file=sys.stderr, flush=True)
    return {"kind": KIND, "grid": grid.to_dict(), "wall_s": time.perf_counter() - started, "points": results}


_CACHE: dict = {}
"""Per process: the inputs runs of a sweep or an ablation share (no run changes them)."""
T = TypeVar("T")


def _cached(key: tuple, make: Callable[[], T]) -> T:
    if key not in _CACHE:
        _CACHE[key] = make()
    return _CACHE[key]


def shared_models() -> tuple[dict[str, SkillModel], TraceCatalog]:
    """The shipped skill models and trace catalog, loaded once per process."""
    return _cached(("models",), lambda: (load_skill_models(), load_catalog()))


def shared_profile(hw: str, kv_gib: float | None) -> HardwareProfile:
    """A hardware profile (with ``kv_gib`` of KV memory if given), loaded once per process."""
    return _cached(("hw", hw, kv_gib), lambda: with_kv_memory(load_profile(hw), kv_gib))


def shared_workload(workload: int | str, duration: float, seed: int) -> Workload:
    """The load map's workload of ``workload`` agents (``duration`` s of arrivals), or the built-in workload of
    that name, generated once per process."""
    skills, catalog = shared_models()
    if isinstance(workload, str):
        return _cached(("w", workload, seed), lambda: generate(BUILTIN[workload], catalog, skills, seed))
    return _cached(("w", workload, duration, seed), lambda: workload_for(workload, duration, seed, catalog, skills))


def _inputs(grid: Grid, hw: str, agents: int) -> tuple:
    """The skills, catalog, profile, isolated bounds and workload of a point of ``grid``."""
    skills, catalog = shared_models()
    profile = shared_profile(hw, grid.kv_gib)
    isolated = _cached((ISOLATED, hw, grid.kv_gib, grid.bench_seed),
                       lambda: isolated_responses(profile, catalog, skills, TRACES, grid.bench_seed))
    return skills, catalog, profile, isolated, shared_workload(agents, grid.duration, grid.seed)


def _run_point(job: tuple[Grid, tuple[str, int, int | None, str, str]]) -> dict:
    grid, (hw, agents, cap, policy, features) = job
    skills, catalog, profile, isolated, workload = _inputs(grid, hw, agents)
    started = time.perf_counter()
    parts = Features.parse(features)
    setup = EngineSetup.simulator(profile, grid.suspends_in_place)
    result = run_bench(workload, policy, setup, skills, catalog, grid.bench_seed, cap, parts)
    records = result["requests"]
    by_category: dict[str, list[float]] = {}
    for r in records:
        by_category.setdefault(r["category"], []).append(isolated[r["trace"]])
    ends = [s["exec_end"] for r in records for s in r["segments"] if s["exec_end"] is not None]
    return {
        "hw": setup.name, "agents": agents, "cap": cap, "policy": policy, "features": parts.label(),
        "series": policy if len(grid.features) == 1 or policy in BASELINES else f"{policy} [{parts.label()}]",
        "events_per_second": EVENTS_PER_AGENT * agents, "requests": len(records),
        "summary": result["summary"],
        "isolated_response": {c: statistics.fmean(v) for c, v in sorted(by_category.items())},
        "peak_queue": result["peak_queue"], "counters": result["counters"], "makespan": max(ends, default=0.0),
        "wall_s": time.perf_counter() - started,
    }


def series(point: dict) -> str:
    """The line a point belongs to: its policy, with its scheduler parts when the grid compared several."""
    return point.get("series", point["policy"])


def is_sweep(data: object) -> bool:
    return isinstance(data, dict) and data.get("kind") == KIND


def markdown_table(sweep: dict, categories: tuple[str, ...] = ("urgent", "normal")) -> str:
    """One row per (hardware, cap, agents); per policy, each category's mean utility, then urgent response.

    When overload control shed requests anywhere in the sweep, each policy also gets its shed count
    and each category's mean utility with the shed requests counted (``metrics.summarize``).
    """
    policies = list(dict.fromkeys(series(p) for p in sweep["points"]))
    rows: dict[tuple, dict[str, dict]] = {}
    for p in sweep["points"]:
        rows.setdefault((p["hw"], p["cap"], p["agents"]), {})[series(p)] = p
    shed = any(p["summary"].get("all", {}).get("shed") for p in sweep["points"])
    head = ["hw", "cap", "agents"] + [f"{pol} {c[0]}" for pol in policies for c in categories] \
        + [f"{pol} urgent resp (s)" for pol in policies]
    if shed:
        head += [f"{pol} shed" for pol in policies] \
            + [f"{pol} {c[0]} with shed" for pol in policies for c in categories]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * 3 + "---:|" * (len(head) - 3)]
    for (hw, cap, agents), by_policy in rows.items():
        cells = [_mean(by_policy.get(pol), c, "utility") for pol in policies for c in categories]
        cells += [_mean(by_policy.get(pol), "urgent", "response_time") for pol in policies]
        if shed:
            cells += [str((by_policy.get(pol) or {}).get("summary", {}).get("all", {}).get("shed", "-"))
                      for pol in policies]
            cells += [_mean(by_policy.get(pol), c, "utility_with_shed") for pol in policies for c in categories]
        lines.append(f"| {hw} | {cap or 'none'} | {agents} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _mean(point: dict | None, category: str, metric: str) -> str:
    summary = (point or {}).get("summary", {}).get(category)
    return fmt_metric(summary.get(f"mean_{metric}") if summary else None)


def default_jobs() -> int:
    return max(1, min(4, os.cpu_count() or 1))
