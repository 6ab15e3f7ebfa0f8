"""The machine's load during a real-time run: what other processes took, and when it forbids a verdict."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from timely_llm_bench.evaluation.machine_load import (
    CpuSample,
    MachineLoad,
    combined,
    load_verdict,
    measured,
    verdict_lines,
)

BUSY = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.6: pass\nprint(time.process_time())"


def load(others: float, cores: int = 2, seconds: float = 60.0) -> MachineLoad:
    return MachineLoad(seconds, others, 1.0, cores, 1.0)


def summary(response: float, waiting: float, utility: float) -> dict:
    return {"all": {"mean_response_time": response, "mean_waiting_time": waiting, "mean_utility": utility},
            "urgent": {"mean_response_time": response / 2, "mean_waiting_time": 0.0, "mean_utility": utility}}


def test_between_takes_our_tree_out_of_what_every_process_spent() -> None:
    got = MachineLoad.between(CpuSample(10.0, 100.0, 5.0), CpuSample(20.0, 118.0, 13.0), cores=2, loadavg=1.5)
    assert (got.seconds, got.ours_cores, got.others_cores) == (10.0, pytest.approx(0.8), pytest.approx(1.0))


def test_a_neighbour_busy_for_part_of_a_run_shows_as_its_busiest_stretch() -> None:
    # a 60 s run sampled every second; other processes kept both cores busy from 10 s to 15 s only
    samples = [CpuSample(t, 2.0 * (min(max(t, 10), 15) - 10) + 0.5 * t, 0.5 * t) for t in range(1, 60)]
    got = MachineLoad.between(CpuSample(0.0, 0.0, 0.0), CpuSample(60.0, 40.0, 30.0), 2, 1.0, samples)
    assert got.others_cores == pytest.approx(10 / 60) and got.others_peak_cores == pytest.approx(2.0)
    assert "at most 2.00 over 5 s" in got.describe()
    assert MachineLoad.from_json(got.to_json()) == MachineLoad(60.0, 0.167, 0.5, 2, 1.0, 2.0)
    # a run shorter than the stretch: its whole span; no samples: not reported
    short = MachineLoad.between(CpuSample(0.0, 0.0, 0.0), CpuSample(2.0, 3.0, 1.0), 2, 1.0, [])
    assert short.others_peak_cores == pytest.approx(1.0)
    unsampled = MachineLoad.between(CpuSample(0.0, 0.0, 0.0), CpuSample(2.0, 3.0, 1.0), 2, 1.0)
    assert unsampled.others_peak_cores is None and "at most" not in unsampled.describe()
    assert "others_peak_cores" not in unsampled.to_json()


def test_comparable_loads_give_a_verdict_and_swamping_ones_do_not() -> None:
    assert load_verdict({"timelyllm": load(0.3), "vllm": load(0.45)}) is None
    refusal = load_verdict({"timelyllm": load(1.6), "vllm-stream": load(0.9), "vllm": load(0.2)})
    assert refusal is not None and refusal.startswith("no verdict")
    assert "timelyllm's run" in refusal and "vllm's" in refusal and "1.60" in refusal and "0.20" in refusal
    # 0.3 of a core: swamping on 2 cores, within the margin (a tenth of the cores) on 8
    assert load_verdict({"a": load(0.8), "b": load(0.5)}) is not None
    assert load_verdict({"a": load(0.8, cores=8), "b": load(0.5, cores=8)}) is None
    assert load_verdict({"a": load(1.5)}) is None


def test_verdict_lines_compare_the_first_policy_with_each_other_one_only_on_comparable_machines() -> None:
    summaries = {"timelyllm": summary(1.0, 0.5, 1.5), "vllm-stream": summary(1.0, 1.0, 1.0),
                 "vllm": summary(2.0, 2.0, 0.5)}
    lines = verdict_lines(summaries, {"timelyllm": load(0.1), "vllm-stream": load(0.2), "vllm": load(0.1)})
    assert len(lines) == 2
    assert lines[0].startswith("timelyllm against vllm-stream (mean): urgent response 0.50 s against 0.50 s")
    assert "waiting 0.50 s against 1.00 s (0.50x)" in lines[0] and "utility 1.50 against 1.00" in lines[0]
    assert lines[1].startswith("timelyllm against vllm (mean)") and "waiting 0.50 s against 2.00 s (0.25x)" in lines[1]
    # the second policy ran on a much lighter machine than the first: said, and no comparison
    (refusal,) = verdict_lines(summaries, {"timelyllm": load(1.4), "vllm-stream": load(0.1), "vllm": load(0.1)})
    assert refusal.startswith("no verdict") and "--rounds" in refusal


def test_rounds_combine_weighted_by_their_seconds() -> None:
    got = combined([MachineLoad(10.0, 1.0, 0.5, 2, 0.4, 1.8), MachineLoad(30.0, 0.2, 1.0, 2, 1.7, 0.6)])
    assert (got.seconds, got.loadavg, got.others_peak_cores) == (40.0, 1.7, 1.8)
    assert got.others_cores == pytest.approx(0.4) and got.ours_cores == pytest.approx(0.875)


def test_a_child_counts_as_ours_and_an_orphaned_process_as_another_one() -> None:
    with measured() as meter:
        child = subprocess.run([sys.executable, "-c", BUSY], capture_output=True, text=True, check=True)
    child_cpu = float(child.stdout)
    assert meter.load.ours_cores * meter.load.seconds >= 0.9 * child_cpu
    # started through a shell that exits at once: reparented away from this process tree
    with measured() as meter:
        out = subprocess.run(["sh", "-c", f"{sys.executable} -c '{BUSY}' > /dev/null 2>&1 & echo $!"],
                             capture_output=True, text=True, check=True)
        orphan = int(out.stdout)
        while subprocess.run(["kill", "-0", str(orphan)], capture_output=True).returncode == 0:
            time.sleep(0.05)
    assert meter.load.others_cores * meter.load.seconds >= 0.5
    assert meter.load.ours_cores * meter.load.seconds < 0.5
    assert meter.load.others_peak_cores >= meter.load.others_cores  # sampled through the block
