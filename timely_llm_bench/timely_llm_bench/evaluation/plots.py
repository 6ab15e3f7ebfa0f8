"""Figure 5/6-style plots from ``timely-llm bench`` results, and load maps from ``timely-llm sweep``.

Figure 5: per workload, mean time utility, response time and waiting time per task
type (trace id, grouped by category), one bar per policy; means are over succeeded
requests, and results of the same workload and policy (e.g. several seeds) are pooled.
Figure 6: per result, a time trace of a few requests around the first urgent request
that overlaps normal ones: generation and execution of each segment, arrival, ERT.
Load map: per hardware profile, mean utility (urgent, normal) and mean urgent response
time against the number of agents (the load), one line per policy, one column per batch cap.
"""

from __future__ import annotations

import re
import statistics
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, NullFormatter

from timely_llm.errors import ConfigError
from timely_llm_bench.evaluation.sweep import series

FIG5_METRICS = (("utility", "Time utility"), ("response_time", "Response time (s)"),
                ("waiting_time", "Waiting time (s)"))
TIMELINE_REQUESTS = 6
GEN_COLOR, EXEC_COLOR, ERT_COLOR = "tab:blue", "tab:orange", "tab:red"


def plot_results(results: list[dict], out_dir: Path) -> list[Path]:
    """Write ``fig5_<workload>.png`` per workload and ``fig6_<workload>_<policy>.png`` per result."""
    for i, result in enumerate(results):
        _validate(result, i)
    out_dir.mkdir(parents=True, exist_ok=True)
    by_workload: dict[str, list[dict]] = {}
    for result in results:
        by_workload.setdefault(result["workload"], []).append(result)
    written = [_plot_fig5(workload, rs, out_dir) for workload, rs in by_workload.items()]
    for result in results:
        written.append(_plot_fig6(result, _fig6_path(result, out_dir, written)))
    return written


def _validate(result: object, index: int) -> None:
    where = f"results[{index}]"
    if not isinstance(result, dict) or not isinstance(result.get("requests"), list):
        raise ConfigError(where, "requests", "missing or not a list; expected a `timely-llm bench` result")
    for key in ("policy", "workload"):
        if not isinstance(result.get(key), str):
            raise ConfigError(where, key, "missing or not a string")


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text)


def task_types(requests: list[dict]) -> list[tuple[str, int]]:
    """(category, trace) pairs, categories in order of their lowest trace id, then by trace."""
    first: dict[str, int] = {}
    for r in requests:
        first[r["category"]] = min(first.get(r["category"], r["trace"]), r["trace"])
    return sorted({(r["category"], r["trace"]) for r in requests}, key=lambda ct: (first[ct[0]], ct[1]))


def mean_metric(requests: list[dict], trace: int, metric: str) -> float:
    """Mean ``metric`` over the succeeded requests of ``trace``; NaN when there are none."""
    values = [r[metric] for r in requests if r["trace"] == trace and r["status"] == "succeeded"]
    return statistics.fmean(values) if values else float("nan")


def _plot_fig5(workload: str, results: list[dict], out_dir: Path) -> Path:
    pooled: dict[str, list[dict]] = {}
    for result in results:
        pooled.setdefault(result["policy"], []).extend(result["requests"])
    types = task_types([r for rs in pooled.values() for r in rs])
    fig = Figure(figsize=(5 * len(FIG5_METRICS), 4), layout="constrained")
    axes = fig.subplots(1, len(FIG5_METRICS))
    for ax, (metric, label) in zip(axes, FIG5_METRICS, strict=True):
        _grouped_bars(ax, pooled, types, metric)
        ax.set_ylabel(label)
    axes[0].legend(title="policy", fontsize="small")
    fig.suptitle(f"{workload} ({', '.join(sorted({r.get('hw', '?') for r in results}))})")
    return _save(fig, out_dir / f"fig5_{_slug(workload)}.png")


def _grouped_bars(ax: Axes, pooled: dict[str, list[dict]], types: list[tuple[str, int]], metric: str) -> None:
    width = 0.8 / len(pooled)
    for p, (policy, requests) in enumerate(pooled.items()):
        heights = [mean_metric(requests, trace, metric) for _, trace in types]
        ax.bar([x + (p - (len(pooled) - 1) / 2) * width for x in range(len(types))], heights, width, label=policy)
    ax.set_xticks(range(len(types)), [str(trace) for _, trace in types])
    ax.set_xlabel("task type (trace id)")
    categories = [c for c, _ in types]
    for category in dict.fromkeys(categories):
        xs = [x for x, c in enumerate(categories) if c == category]
        ax.text((xs[0] + xs[-1]) / 2, -0.22, category, ha="center", transform=ax.get_xaxis_transform())
        if xs[0] > 0:
            ax.axvline(xs[0] - 0.5, color="grey", linewidth=0.8, linestyle=":")


def pick_timeline(requests: list[dict], count: int = TIMELINE_REQUESTS) -> list[dict]:
    """``count`` requests by arrival around the first urgent one whose span overlaps a normal one."""
    ordered = sorted(requests, key=lambda r: (r["arrival"], r["id"]))
    normal = [_span(r) for r in ordered if r["category"] == "normal"]
    focus = next((i for i, r in enumerate(ordered) if r["category"] == "urgent"
                  and any(_overlaps(_span(r), span) for span in normal)), 0)
    start = max(0, min(focus - count // 2 + 1, len(ordered) - count))
    return ordered[start:start + count]


def _span(record: dict) -> tuple[float, float]:
    ends = [t for s in record["segments"] for t in (s["gen_end"], s["exec_end"]) if t is not None]
    return record["arrival"], max(ends, default=record["arrival"])


def _overlaps(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def _plot_fig6(result: dict, path: Path) -> Path:
    shown = pick_timeline(result["requests"])
    fig = Figure(figsize=(10, 0.6 * len(shown) + 1.5), layout="constrained")
    ax = fig.subplots()
    for y, record in enumerate(reversed(shown)):
        _timeline_row(ax, y, record)
    ax.set_yticks(range(len(shown)), [f"{r['id']} (trace {r['trace']}, {r['category']})" for r in reversed(shown)])
    ax.set_xlabel("time (s)")
    ax.set_title(f"{result['workload']}: {result['policy']} ({result.get('hw', '?')}, seed {result.get('seed', '?')})")
    ax.legend(handles=[
        Patch(color=GEN_COLOR, label="generation"),
        Patch(color=EXEC_COLOR, label="execution"),
        Line2D([], [], color="black", marker="v", linestyle="", label="arrival"),
        Line2D([], [], color=ERT_COLOR, label="arrival + ERT"),
    ], loc="upper left", bbox_to_anchor=(1.01, 1), fontsize="small")
    return _save(fig, path)


def _timeline_row(ax: Axes, y: int, record: dict) -> None:
    segments = record["segments"]
    ax.broken_barh([(s["gen_start"], s["gen_end"] - s["gen_start"]) for s in segments],
                   (y + 0.02, 0.35), facecolors=GEN_COLOR, edgecolors="white")
    executed = [s for s in segments if s["exec_start"] is not None and s["exec_end"] is not None]
    ax.broken_barh([(s["exec_start"], s["exec_end"] - s["exec_start"]) for s in executed],
                   (y - 0.37, 0.35), facecolors=EXEC_COLOR, edgecolors="white")
    ax.plot(record["arrival"], y + 0.45, marker="v", color="black")
    ert = record["arrival"] + record["tuf"]["ert"]
    ax.plot([ert, ert], [y - 0.45, y + 0.45], color=ERT_COLOR, linewidth=1.5)


def _fig6_path(result: dict, out_dir: Path, taken: list[Path]) -> Path:
    path = out_dir / f"fig6_{_slug(result['workload'])}_{_slug(result['policy'])}.png"
    if path in taken:  # same workload and policy again (another seed or hardware)
        suffix = _slug(f"{result.get('hw', 'hw')}_s{result.get('seed', len(taken))}")
        path = path.with_name(f"{path.stem}_{suffix}.png")
    return path


SWEEP_ROWS = (("urgent", "utility", "urgent utility"), ("normal", "utility", "normal utility"),
              ("urgent", "response_time", "urgent response (s)"))


def plot_sweep(sweep: dict, out_dir: Path) -> list[Path]:
    """Write ``map_<hw>.png`` per hardware profile of a ``timely-llm sweep`` result."""
    points = sweep.get("points")
    if not isinstance(points, list) or not points:
        raise ConfigError("sweep", "points", "missing or empty; expected a `timely-llm sweep` result")
    out_dir.mkdir(parents=True, exist_ok=True)
    by_hw: dict[str, list[dict]] = {}
    for p in points:
        by_hw.setdefault(p["hw"], []).append(p)
    return [_plot_map(hw, ps, out_dir / f"map_{_slug(hw)}.png") for hw, ps in by_hw.items()]


def _plot_map(hw: str, points: list[dict], path: Path) -> Path:
    caps = list(dict.fromkeys(p["cap"] for p in points))
    policies = list(dict.fromkeys(series(p) for p in points))
    fig = Figure(figsize=(4 * len(caps), 3.2 * len(SWEEP_ROWS)), layout="constrained")
    axes = fig.subplots(len(SWEEP_ROWS), len(caps), squeeze=False, sharex=True)
    for col, cap in enumerate(caps):
        at_cap = [p for p in points if p["cap"] == cap]
        for row, (category, metric, label) in enumerate(SWEEP_ROWS):
            ax = axes[row][col]
            for policy in policies:
                line = sorted((p["agents"], _summary_mean(p, category, metric)) for p in at_cap
                              if series(p) == policy)
                ax.plot([a for a, _ in line], [v for _, v in line], marker="o", markersize=3, label=policy)
            if metric == "response_time":
                bound = sorted((p["agents"], p["isolated_response"].get(category, float("nan"))) for p in at_cap)
                ax.plot([a for a, _ in bound], [v for _, v in bound], color="grey", linestyle=":", label="isolated")
                ax.set_yscale("log")
            else:
                ax.set_yscale("symlog", linthresh=2.0)
            ax.set_xscale("log", base=2)
            agents = sorted({p["agents"] for p in at_cap})
            ax.set_xticks(agents, [str(a) for a in agents])
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            ax.yaxis.set_minor_formatter(NullFormatter())
            ax.grid(True, linewidth=0.4, alpha=0.5)
            if col == 0:
                ax.set_ylabel(label)
            if row == 0:
                ax.set_title(f"batch cap {cap or 'none'}")
            if row == len(SWEEP_ROWS) - 1:
                ax.set_xlabel("agents (event rate grows with them)")
    axes[-1][0].legend(fontsize="small")
    fig.suptitle(f"load map: {hw}")
    return _save(fig, path)


def _summary_mean(point: dict, category: str, metric: str) -> float:
    value = point["summary"].get(category, {}).get(f"mean_{metric}")
    return float("nan") if value is None else value


def _save(fig: Figure, path: Path) -> Path:
    FigureCanvasAgg(fig).print_png(path)
    return path
