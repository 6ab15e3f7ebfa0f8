"""How busy the machine was while a policy ran in real time, and whether two runs can be compared.

A real-time comparison of policies runs them one after the other on a machine others may use too. What
the other processes took is the CPU time all processes spent (``/proc/stat``) less what this process and
its descendants spent (``/proc/PID/stat``, reaped children included): a policy whose run shared the cores
with a busy neighbour looks slower for that alone. It is sampled every second through the run too, so that
a neighbour busy for part of it, which hides in the mean, shows as the busiest stretch. ``load_verdict``
says when the runs' loads differ enough to swamp the difference between policies.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
SWAMPING_SHARE = 0.1
"""Runs whose other processes' CPU differs by more than this share of the machine's cores (at least
``SWAMPING_CORES``) are not compared: on a 2-core machine 0.25-0.4 of a core more for the neighbours went
with 2.5-7x longer decode steps of vLLM CPU (its OpenMP threads wait for each other)."""
SWAMPING_CORES = 0.2
SAMPLE_EVERY = 1.0
"""Seconds between the samples taken through a run."""
PEAK_WINDOW = 5.0
"""The stretch over which other processes' busiest CPU is reported."""


@dataclass(frozen=True)
class CpuSample:
    """CPU seconds spent so far by every process (busy) and by this process tree (ours)."""

    at: float
    busy: float
    ours: float


@dataclass(frozen=True)
class MachineLoad:
    """The machine over one run: cores kept busy by other processes and by ours, on average."""

    seconds: float
    others_cores: float
    ours_cores: float
    cores: int
    loadavg: float
    """1-minute load average at the run's end."""
    others_peak_cores: float | None = None
    """Other processes' cores over their busiest ``PEAK_WINDOW`` of the run; None where not sampled."""

    @classmethod
    def between(cls, start: CpuSample, end: CpuSample, cores: int, loadavg: float,
                samples: list[CpuSample] | None = None) -> MachineLoad:
        """The load from ``start`` to ``end``; with the ``samples`` taken between them, its busiest stretch too."""
        peak = max(_others_cores(a, b) for a, b in _windows([start, *samples, end])) if samples is not None else None
        return cls(max(end.at - start.at, 1e-9), _others_cores(start, end), _ours_cores(start, end), cores, loadavg,
                   peak)

    def describe(self) -> str:
        peak = self.others_peak_cores
        peak_text = "" if peak is None else f", at most {peak:.2f} over {PEAK_WINDOW:.0f} s"
        return (f"other processes kept {self.others_cores:.2f} of {self.cores} cores busy{peak_text}, ours "
                f"{self.ours_cores:.2f} (load average {self.loadavg:.1f}, {self.seconds:.0f} s)")

    def to_json(self) -> dict:
        peak = {} if self.others_peak_cores is None else {"others_peak_cores": round(self.others_peak_cores, 3)}
        return {"seconds": round(self.seconds, 2), "others_cores": round(self.others_cores, 3),
                "ours_cores": round(self.ours_cores, 3), "cores": self.cores, "loadavg": self.loadavg} | peak

    @classmethod
    def from_json(cls, data: dict) -> MachineLoad:
        return cls(**data)


def load_verdict(loads: Mapping[str, MachineLoad]) -> str | None:
    """None when the runs (by label) saw comparable machines; otherwise why they cannot be compared."""
    if len(loads) < 2:
        return None
    busiest = max(loads, key=lambda label: loads[label].others_cores)
    quietest = min(loads, key=lambda label: loads[label].others_cores)
    gap = loads[busiest].others_cores - loads[quietest].others_cores
    cores = max(load.cores for load in loads.values())
    if gap <= max(SWAMPING_SHARE * cores, SWAMPING_CORES):
        return None
    return (f"no verdict: other processes kept {loads[busiest].others_cores:.2f} cores busy during {busiest}'s run "
            f"but {loads[quietest].others_cores:.2f} during {quietest}'s, enough to swamp the difference between "
            "policies; rerun on a quiet machine, or with --rounds 2 or more so each policy sees the same machine")


def _ours_cores(start: CpuSample, end: CpuSample) -> float:
    return max(end.ours - start.ours, 0.0) / max(end.at - start.at, 1e-9)


def _others_cores(start: CpuSample, end: CpuSample) -> float:
    others = end.busy - start.busy - max(end.ours - start.ours, 0.0)
    return max(others, 0.0) / max(end.at - start.at, 1e-9)


def _windows(samples: list[CpuSample]) -> Iterator[tuple[CpuSample, CpuSample]]:
    """Each sample with the first at least ``PEAK_WINDOW`` after it (the whole span, if shorter)."""
    later = 0
    for first in samples:
        while later < len(samples) - 1 and samples[later].at - first.at < PEAK_WINDOW:
            later += 1
        yield first, samples[later]
        if samples[later].at - first.at < PEAK_WINDOW:
            return


def cpu_sample() -> CpuSample:
    """Now: CPU seconds of every process and of this process and its descendants (live ones, plus the
    children they reaped)."""
    tick = os.sysconf("SC_CLK_TCK")
    fields = (PROC / "stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[:8])
    busy = user + nice + system + irq + softirq + steal  # steal: another guest held our vCPU
    return CpuSample(time.monotonic(), busy / tick, _tree_ticks(os.getpid()) / tick)


def _tree_ticks(root: int) -> int:
    """utime + stime + cutime + cstime of ``root`` and every live descendant."""
    parents: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # ended meanwhile
            continue
        rest = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": state ppid ...
        parents[int(entry.name)] = int(rest[1])
        ticks[int(entry.name)] = sum(int(v) for v in rest[11:15])
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += ticks.get(pid, 0)
        todo += children.get(pid, [])
    return total


@dataclass
class LoadMeter:
    """What ``measured`` found: ``load`` once its block ends (None where there is no /proc)."""

    load: MachineLoad | None = None


@contextmanager
def measured() -> Iterator[LoadMeter]:
    """``with measured() as meter: ...``, then ``meter.load`` is the machine's load over the block, sampled
    every ``SAMPLE_EVERY`` s by a thread."""
    meter = LoadMeter()
    if not (PROC / "stat").exists():
        yield meter
        return
    samples: list[CpuSample] = []
    start, done = cpu_sample(), threading.Event()
    sampler = threading.Thread(target=_sample_until, args=(done, samples), name="machine-load", daemon=True)
    sampler.start()
    try:
        yield meter
    finally:
        done.set()
        sampler.join()
        meter.load = MachineLoad.between(start, cpu_sample(), os.cpu_count() or 1, os.getloadavg()[0], samples)


def _sample_until(done: threading.Event, samples: list[CpuSample]) -> None:
    while not done.wait(SAMPLE_EVERY):
        samples.append(cpu_sample())


def combined(loads: list[MachineLoad]) -> MachineLoad:
    """Several runs of one policy as one: cores weighted by each run's seconds, the highest load average and
    busiest stretch."""
    seconds = sum(load.seconds for load in loads)
    peaks = [load.others_peak_cores for load in loads if load.others_peak_cores is not None]
    return MachineLoad(seconds, sum(load.others_cores * load.seconds for load in loads) / seconds,
                       sum(load.ours_cores * load.seconds for load in loads) / seconds,
                       max(load.cores for load in loads), max(load.loadavg for load in loads),
                       max(peaks) if peaks else None)


def verdict_lines(summaries: Mapping[str, dict], loads: Mapping[str, MachineLoad]) -> list[str]:
    """The first policy against each other one (``summaries``: a result's per-category summary, by policy,
    first the policy compared), per category mean response and over all requests mean waiting and
    utility; or, where the runs' loads differ too much (``load_verdict``), why there is no verdict."""
    refusal = load_verdict(loads)
    if refusal:
        return [refusal]
    first, *others = summaries
    lines = []
    for other in others:
        cells = []
        for category in sorted(set(summaries[first]) & set(summaries[other]) - {"all"}):
            cells.append(_ratio(f"{category} response", summaries[first][category], summaries[other][category],
                                "mean_response_time"))
        cells.append(_ratio("waiting", summaries[first]["all"], summaries[other]["all"], "mean_waiting_time"))
        mine, theirs = summaries[first]["all"]["mean_utility"], summaries[other]["all"]["mean_utility"]
        if mine is not None and theirs is not None:
            cells.append(f"utility {mine:.2f} against {theirs:.2f}")
        cells = [c for c in cells if c]
        lines.append(f"{first} against {other} (mean): " + ("; ".join(cells) or "nothing succeeded on both to compare"))
    return lines


def _ratio(label: str, mine: dict, theirs: dict, metric: str) -> str:
    a, b = mine[metric], theirs[metric]
    if a is None or b is None:
        return ""
    return f"{label} {a:.2f} s against {b:.2f} s" + (f" ({a / b:.2f}x)" if b > 0 else "")
