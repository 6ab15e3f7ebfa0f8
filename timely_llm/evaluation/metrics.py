"""Per-category summaries of request records."""

from __future__ import annotations

import statistics

METRICS = ("utility", "response_time", "waiting_time", "completion_time")


def summarize(records: list[dict]) -> dict:
    """Mean metrics per category and overall, over requests that succeeded; counts of the rest."""
    groups: dict[str, list[dict]] = {"all": list(records)}
    for r in records:
        groups.setdefault(r["category"], []).append(r)
    return {name: _summary(rs) for name, rs in sorted(groups.items())}


def _summary(records: list[dict]) -> dict:
    done = [r for r in records if r["status"] == "succeeded"]
    out: dict = {"count": len(records), "succeeded": len(done),
                 "aborted": sum(r["status"] == "aborted" for r in records),
                 "canceled": sum(r["status"] == "canceled" for r in records)}
    for metric in METRICS:
        values = [r[metric] for r in done]
        out[f"mean_{metric}"] = statistics.fmean(values) if values else None
    return out


def markdown_table(results: list[dict]) -> str:
    """One row per (workload, policy, category): mean utility, response and waiting time."""
    lines = ["| workload | policy | category | n | utility | response (s) | waiting (s) |",
             "|---|---|---|---:|---:|---:|---:|"]
    for result in results:
        for category, s in result["summary"].items():
            if category == "all":
                continue
            cells = [fmt_metric(s[f"mean_{m}"]) for m in ("utility", "response_time", "waiting_time")]
            lines.append(f"| {result['workload']} | {result['policy']} | {category} | {s['count']} | "
                         + " | ".join(cells) + " |")
    return "\n".join(lines)


def fmt_metric(value: float | None) -> str:
    """A mean for display: three decimals, '-' when there is none."""
    return "-" if value is None else f"{value:.3f}"
