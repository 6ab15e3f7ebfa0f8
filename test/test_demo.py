"""``timely-llm demo``: every policy's results with the machine's load during its run, then a verdict or why not."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.ros


def test_demo_reports_each_runs_load_and_compares_only_comparable_runs(ros_domain: int) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "timely_llm.cli", "demo", "--engine", "sim", "--duration", "8", "--no-tello-sim",
         "--policies", "timelyllm", "vllm", "--rounds", "2", "--domain-id", str(ros_domain)],
        capture_output=True, text=True, timeout=600, env=os.environ | {"ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    # rounds alternate: timelyllm, vllm, then vllm, timelyllm
    starts = [line.split(":")[0] for line in out.splitlines() if line.endswith("starting the node (sim engine)")]
    assert starts == ["timelyllm (round 1)", "vllm (round 1)", "vllm (round 2)", "timelyllm (round 2)"]
    runs = [line for line in out.splitlines() if "requests succeeded; other processes kept" in line]
    assert len(runs) == 4 and all(" of 2 cores busy, at most " in line and " over 5 s, ours " in line
                                  for line in runs) if os.cpu_count() == 2 else len(runs) == 4
    results = out[out.index("results (merged over 2 rounds"):]
    for policy in ("timelyllm", "vllm"):
        assert f"  machine during {policy}: other processes kept" in results
    last = out.strip().splitlines()[-1]
    assert last.startswith(("timelyllm against vllm (mean): ", "no verdict: other processes kept")), last
