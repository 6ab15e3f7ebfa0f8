"""How well G(s) predicts a segment's generation time on the simulator (TimeBill's estimator vs the constant).

Each bench record carries, per segment, the G(s) predicted when its generation started
and the time it actually took (``gen_end - gen_start``). The workload runs twice: with
the profiled constant G (feature ``timebill`` off) and with TimeBill's estimate (on).
Segments of no tokens (a second segment cut from the same token) have no generation
time of their own and are left out.

    timely-llm estimate-error --workload WID2 [--max-batch 8] [--hw rtx4090-llama3-8b]
    timely-llm estimate-error --results bench.json ...     # the same error in any bench records
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from timely_llm.core.features import Features
from timely_llm.core.policies import TIMELYLLM
from timely_llm.engines.hardware import HardwareProfile
from timely_llm.plan.skills import SkillModel
from timely_llm.traces import TraceCatalog
from timely_llm_bench.evaluation.harness import run_bench
from timely_llm_bench.workloads.generator import Workload


@dataclass(frozen=True)
class ErrorSummary:
    """Absolute relative errors |G - actual| / actual of one run's segments."""

    label: str
    segments: int
    median: float
    p90: float
    median_first: float
    """Over first segments (a prefill of the prompt past the cached prefix, then decoding)."""
    median_later: float

    HEADER = "G(s) from                               segments  median |err|  p90 |err|  first segs  later segs"

    def row(self) -> str:
        return (f"{self.label:39s} {self.segments:8d}  {_pct(self.median):>12s}  {_pct(self.p90):>9s}  "
                f"{_pct(self.median_first):>10s}  {_pct(self.median_later):>10s}")


def segment_errors(result: dict) -> list[tuple[int, float]]:
    """(segment index, |predicted - actual| / actual) for every segment that generated tokens."""
    errors = []
    for record in result["requests"]:
        for s in record["segments"]:
            actual = s["gen_end"] - s["gen_start"]
            if s["tokens"] and actual > 0 and s["predicted_gen_time"] is not None:
                errors.append((s["index"], abs(s["predicted_gen_time"] - actual) / actual))
    return errors


def summarize_errors(label: str, errors: list[tuple[int, float]]) -> ErrorSummary:
    if not errors:
        raise ValueError(f"{label}: no segment generated tokens")
    values = sorted(e for _, e in errors)
    first = [e for i, e in errors if i == 0] or [float("nan")]
    later = [e for i, e in errors if i > 0] or [float("nan")]
    return ErrorSummary(label, len(values), statistics.median(values), values[int(0.9 * (len(values) - 1))],
                        statistics.median(first), statistics.median(later))


def measure(workload: Workload, profile: HardwareProfile, skills: dict[str, SkillModel], catalog: TraceCatalog,
            policy: str = TIMELYLLM.name, seed: int = 0, max_batch: int | None = None) -> list[ErrorSummary]:
    """The constant G (off) and TimeBill's G (on), each over one simulated run of ``workload``."""
    runs = (("profiled constant (off)", Features()), ("TimeBill estimator (timebill)", Features(timebill=True)))
    return [summarize_errors(label, segment_errors(run_bench(workload, policy, profile, skills, catalog, seed,
                                                             max_batch, features)))
            for label, features in runs]


def _pct(value: float) -> str:
    return f"{100 * value:.1f}%"
