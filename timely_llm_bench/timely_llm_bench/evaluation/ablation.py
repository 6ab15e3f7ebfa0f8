"""The ablation of the scheduler's parts: none, each part alone, the default set and all, on chosen points.

A point is a workload (a built-in one, or a load-map workload of N agents), a hardware
profile, a batch cap and optionally the KV memory; every point runs ``timelyllm`` once
per set of parts, on the virtual clock.

    timely-llm ablation --out docs/ablation.json
"""

from __future__ import annotations

import contextlib
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass

from timely_llm.core.features import DEFAULT, Features
from timely_llm.core.policies import TIMELYLLM
from timely_llm_bench.evaluation.harness import run_bench
from timely_llm_bench.evaluation.metrics import fmt_metric
from timely_llm_bench.evaluation.sweep import shared_models, shared_profile, shared_workload
from timely_llm_bench.workloads.generator import BUILTIN

KIND = "timely-llm ablation"
RTX, AGX = "rtx4090-llama3-8b", "jetson-agx-orin-64gb-llama3-8b-q4"


@dataclass(frozen=True)
class Point:
    workload: str
    """A built-in workload (WID1, WID2, ...) or ``map:N``, the load map's workload of N agents."""
    hw: str
    cap: int | None
    kv_gib: float | None = None

    @property
    def name(self) -> str:
        """The point as ``parse`` reads it."""
        memory = "" if self.kv_gib is None else f"/kv{self.kv_gib:g}"
        return f"{self.workload}@{self.hw}/{self.cap or 'none'}{memory}"

    @classmethod
    def parse(cls, text: str) -> Point:
        """``WORKLOAD@HW[/CAP][/kvGIB]``: ``WID2@rtx4090-llama3-8b/8``, ``map:400@rtx4090-llama3-8b/none/kv0.5``."""
        workload, _, rest = text.partition("@")
        hw, *options = rest.split("/")
        if not workload or not hw or len(options) > 2:
            raise ValueError(f"point {text!r}: expected WORKLOAD@HW[/CAP][/kvGIB]")
        cap: int | None = None
        kv_gib: float | None = None
        for option in options:
            if option.startswith("kv"):
                kv_gib = float(option[2:])
            elif option != "none":
                cap = int(option)
        if workload not in BUILTIN and not (workload.startswith("map:") and workload[4:].isdigit()):
            raise ValueError(f"point {text!r}: workload must be one of {', '.join(BUILTIN)} or map:N")
        if (cap is not None and cap < 1) or (kv_gib is not None and kv_gib <= 0):
            raise ValueError(f"point {text!r}: cap and kv must be positive")
        return cls(workload, hw, cap, kv_gib)


POINTS = (
    Point("WID1", RTX, 8), Point("WID2", RTX, 8), Point("WID3", RTX, 8),
    Point("map:200", RTX, 8), Point("map:400", RTX, 8), Point("map:800", RTX, 8), Point("map:800", RTX, 16),
    Point("map:200", RTX, 64, kv_gib=0.15),
    Point("map:50", AGX, 8), Point("map:200", AGX, 8), Point("map:50", AGX, None),
)
"""The load map's scarce points (batch cap, KV memory, an edge GPU, overload) and WID1-3."""


def feature_sets() -> tuple[str, ...]:
    """None, each part alone, the default set, all of them (each once)."""
    return tuple(dict.fromkeys(("none", *Features.names(), DEFAULT.label(), "all")))


def run_ablation(points: tuple[Point, ...], sets: tuple[str, ...], duration: float = 100.0, seed: int = 3,
                 bench_seed: int = 0, jobs: int = 1) -> dict:
    """Every point under every set of parts; ``duration`` seconds of arrivals for ``map:N`` workloads."""
    runs = [(point, parts, duration, seed, bench_seed) for point in points for parts in sets]
    started = time.perf_counter()
    rows = []
    with ProcessPoolExecutor(jobs) if jobs > 1 else contextlib.nullcontext() as pool:
        results = pool.map(_run, runs) if pool else map(_run, runs)
        for i, row in enumerate(results, 1):
            rows.append(row)
            print(f"[{i}/{len(runs)}] {row['point']} [{row['features']}]: {row['wall_s']:.1f} s",
                  file=sys.stderr, flush=True)
    return {"kind": KIND, "duration": duration, "seed": seed, "bench_seed": bench_seed,
            "wall_s": time.perf_counter() - started, "rows": rows}


def _run(job: tuple[Point, str, float, int, int]) -> dict:
    point, parts, duration, seed, bench_seed = job
    skills, catalog = shared_models()
    profile = shared_profile(point.hw, point.kv_gib)
    workload = shared_workload(point.workload if point.workload in BUILTIN else int(point.workload[4:]), duration, seed)
    started = time.perf_counter()
    features = Features.parse(parts)
    result = run_bench(workload, TIMELYLLM.name, profile, skills, catalog, bench_seed, point.cap, features)
    return {"point": point.name, **asdict(point), "features": features.label(), "summary": result["summary"],
            "counters": result["counters"], "wall_s": time.perf_counter() - started}


COUNTERS = ("preemptions", "amin_evictions", "recomputed_tokens", "shed")
CATEGORIES = ("urgent", "normal", "arm")


def markdown_table(ablation: dict) -> str:
    """One row per (point, set of parts): utility and response per category, then the counters.

    A utility cell is the mean over served requests; where requests were shed it is followed by the
    mean with them put back in (``metrics.summarize``), in parentheses.
    """
    head = ["point", "parts", *(f"{c} u" for c in CATEGORIES), *(f"{c} resp (s)" for c in CATEGORIES), *COUNTERS]
    lines = ["| " + " | ".join(head) + " |", "|---|---|" + "---:|" * (len(head) - 2)]
    for row in ablation["rows"]:
        summary = row["summary"]
        cells = [_utility(summary.get(c, {})) for c in CATEGORIES]
        cells += [fmt_metric(summary.get(c, {}).get("mean_response_time")) for c in CATEGORIES]
        cells += [str(row["counters"].get(c, 0)) for c in COUNTERS]
        lines.append(f"| {row['point']} | {row['features']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _utility(summary: dict) -> str:
    served = fmt_metric(summary.get("mean_utility"))
    return f"{served} ({fmt_metric(summary['mean_utility_with_shed'])})" if summary.get("shed") else served


def is_ablation(data: object) -> bool:
    return isinstance(data, dict) and data.get("kind") == KIND
