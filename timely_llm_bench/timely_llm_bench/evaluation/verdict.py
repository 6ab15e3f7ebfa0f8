"""The demo's conclusions in words: per baseline, one sentence saying which policy got each category of robots
its first action sooner and by how much, and which requests missed their deadline.

A request's deadline is its TUF's cut-off: the response time (first action at the robot) past which its utility
is below zero. Two means count as level when they differ by at most ``LEVEL_SHARE`` of the larger or
``LEVEL_SECONDS``: one run's noise on a shared machine.
"""

from __future__ import annotations

from collections.abc import Mapping

from timely_llm.core.tuf import TUF

LEVEL_SHARE = 0.1
LEVEL_SECONDS = 0.03


def deadline(record: dict) -> float:
    """The request's deadline: its TUF's cut-off, in seconds after it was sent."""
    return TUF(**record["tuf"]).cutoff


def missed_deadlines(records: list[dict]) -> list[dict]:
    """The records of requests whose first action came after their deadline, or never (shed, failed)."""
    return [r for r in records if r["response_time"] is None or r["response_time"] > deadline(r)]


def deadline_lines(records: list[dict]) -> list[str]:
    """Per category, how many met their deadline; then each miss: which request and by how much."""
    by_category: dict[str, list[dict]] = {}
    for record in records:
        by_category.setdefault(record["category"], []).append(record)
    missed = missed_deadlines(records)
    met = ", ".join(f"{sum(r not in missed for r in rs)} of {len(rs)} {category}"
                    for category, rs in sorted(by_category.items()))
    lines = [f"  deadlines met: {met}" + (f"; {len(missed)} missed:" if missed else "")]
    for r in missed:
        late = ("no first action" if r["response_time"] is None
                else f"first action at {r['response_time']:.2f} s, {r['response_time'] - deadline(r):.2f} s late")
        lines.append(f"    missed: {r['id']} ({r['agent']}, {r['category']}): {late} "
                     f"(deadline {deadline(r):.2f} s)")
    return lines


def first_actions(records: list[dict]) -> dict:
    """Per category, as a summary's ``mean_response_time``: the mean first action over every request that got one,
    whatever its end (a run cut short still counts what its robots saw); ``without`` counts those that got none."""
    out: dict = {}
    for record in records:
        out.setdefault(record["category"], []).append(record["response_time"])
    return {category: {"mean_response_time": (sum(got) / len(got)) if (got := [t for t in times if t is not None])
                       else None, "without": sum(t is None for t in times)} for category, times in out.items()}


def verdict_sentences(summaries: Mapping[str, dict], met: Mapping[str, str], level_reason: str) -> list[str]:
    """One sentence per baseline: the first policy of ``summaries`` (per-category ``first_actions`` or summaries, by
    policy) against it, per category the mean response (time to the first action) with the direction spelled out,
    and the deadlines met (``met``: by policy, e.g. "5 of 7"); where every category is level, ``level_reason``
    says why."""
    first, *others = summaries
    return [_sentence(first, other, summaries[first], summaries[other], met, level_reason) for other in others]


def _sentence(first: str, other: str, mine: dict, theirs: dict, met: Mapping[str, str], level_reason: str) -> str:
    compared = [(category, a, b) for category in sorted(set(mine) & set(theirs) - {"all"}, key=_urgent_first)
                if (a := mine[category]["mean_response_time"]) and (b := theirs[category]["mean_response_time"])]
    if not compared:
        return f"{first} against {other}: no category had a first action under both to compare."
    deadlines = f"; deadlines met {met[first]} against {met[other]}" if first in met and other in met else ""
    none = [f"{theirs[c]['without']} {c}" for c, _, _ in compared if theirs[c].get("without")]
    without = f"; under {other} {' and '.join(none)} got no first action at all" if none else ""
    if all(_level(a, b) for _, a, b in compared):
        times = ", ".join(f"{category} {a:.2f} s vs {b:.2f} s" for category, a, b in compared)
        return (f"{first} and {other} are level (first action, mean: {times}){deadlines}; "
                f"as expected here: {level_reason}.")
    cells = []
    for i, (category, a, b) in enumerate(compared):
        times = f"({a:.2f} s vs {b:.2f} s)"
        than = f" than under {other}" if i == 0 else ""
        if _level(a, b):
            how = f"as soon as under {other} {times}" if i == 0 else f"level {times}"
        else:
            how = f"{b / a:.2f}x sooner{than} {times}" if a < b else f"{a / b:.2f}x later{than} {times}"
        cells.append(f"{category} robots got their first action {how}" if i == 0 else f"{category} robots {how}")
    return f"{first}: " + "; ".join(cells) + without + deadlines + "."


def _level(a: float, b: float) -> bool:
    return abs(a - b) <= max(LEVEL_SHARE * max(a, b), LEVEL_SECONDS)


def _urgent_first(category: str) -> tuple[bool, str]:
    return category != "urgent", category
