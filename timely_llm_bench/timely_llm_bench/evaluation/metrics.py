"""Per-category summaries of request records."""

from __future__ import annotations

import statistics

METRICS = ("utility", "response_time", "waiting_time", "completion_time")


def summarize(records: list[dict]) -> dict:
    """Mean metrics per category and overall, over requests that succeeded; counts of the rest.

    Requests overload control ended are aborted, left out of the means like every request that
    did not succeed, and counted again: ``shed`` (even served at once they could no longer get
    utility >= 0) and ``killed`` (the kill overrun strategy ended the plan at a late segment).
    ``mean_utility_with_shed`` puts both back in so neither can hide losses. A killed request
    counts at its first action's utility if it had one. A shed request, or one killed before its
    first action, counts at the utility it would have had served after all the work the run did,
    so that no served request's figure would have to change for it: its best response when it was
    shed (the moment it was killed), delayed from then to the run's end (the last segment executed,
    request shed or plan killed). That is below zero and no better than serving it earlier, which
    would have delayed others.
    """
    end = run_end(records) if any(r.get("shed") or r.get("killed_at") is not None for r in records) else 0.0
    groups: dict[str, list[dict]] = {"all": list(records)}
    for r in records:
        groups.setdefault(r["category"], []).append(r)
    return {name: _summary(rs, end) for name, rs in sorted(groups.items())}


def _summary(records: list[dict], end: float) -> dict:
    done = [r for r in records if r["status"] == "succeeded"]
    shed = [r for r in records if r.get("shed")]
    killed = [r for r in records if r.get("killed_at") is not None]
    out: dict = {"count": len(records), "succeeded": len(done),
                 "aborted": sum(r["status"] == "aborted" for r in records),
                 "canceled": sum(r["status"] == "canceled" for r in records), "shed": len(shed)}
    if killed:
        out["killed"] = len(killed)
    for metric in METRICS:
        values = [r[metric] for r in done]
        out[f"mean_{metric}"] = statistics.fmean(values) if values else None
    with_shed = [r["utility"] for r in done] + [shed_utility(r, end) for r in shed + killed]
    out["mean_utility_with_shed"] = statistics.fmean(with_shed) if with_shed else None
    return out


def run_end(records: list[dict]) -> float:
    """The last moment the records show: a segment's execution end, a request shed or a plan killed."""
    times = [s["exec_end"] for r in records for s in r.get("segments", ()) if s["exec_end"] is not None]
    # fleet records (from the robots' side) have no segment times: a served request's last ended at its completion
    times += [r["arrival"] + r["completion_time"] for r in records
              if "segments" not in r and r["completion_time"] is not None]
    times += [r["infeasible_at"] for r in records if r.get("shed")]
    times += [r["killed_at"] for r in records if r.get("killed_at") is not None]
    return max(times, default=0.0)


def shed_utility(record: dict, end: float) -> float:
    """What a shed or killed request counts in ``mean_utility_with_shed`` (see ``summarize``)."""
    if record.get("killed_at") is not None:
        started = [s["exec_start"] for s in record["segments"] if s["exec_start"] is not None]
        response = min(started) - record["arrival"] if started else end - record["arrival"]
    else:
        response = record["best_response"] + max(end - record["infeasible_at"], 0.0)
    tuf = record["tuf"]
    return min(tuf["beta"], tuf["alpha"] * (response - tuf["ert"]) + tuf["beta"])


def markdown_table(results: list[dict]) -> str:
    """One row per (workload, policy, category): mean utility, response and waiting time; when any
    request was shed or killed, also the shed count and the utility with those requests counted."""
    shed = any(s.get("shed") or s.get("killed") for result in results for s in result["summary"].values())
    head = "| workload | policy | category | n | utility | response (s) | waiting (s) |"
    lines = [head + (" shed | utility with shed |" if shed else ""),
             "|---|---|---|---:|---:|---:|---:|" + ("---:|---:|" if shed else "")]
    for result in results:
        for category, s in result["summary"].items():
            if category == "all":
                continue
            cells = [fmt_metric(s[f"mean_{m}"]) for m in ("utility", "response_time", "waiting_time")]
            if shed:
                cells += [str(s.get("shed", 0)), fmt_metric(s.get("mean_utility_with_shed"))]
            lines.append(f"| {result['workload']} | {result['policy']} | {category} | {s['count']} | "
                         + " | ".join(cells) + " |")
    return "\n".join(lines)


def fmt_metric(value: float | None) -> str:
    """A mean for display: three decimals, '-' when there is none."""
    return "-" if value is None else f"{value:.3f}"
