"""``timely-llm demo``: one engine load for every policy, progress that says what it waits for, missed deadlines
flagged, each run's machine load, and one verdict sentence per baseline; third-party output in the log file."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.ros

STAGES = ("the node has not accepted it yet", "its plan: generating the first segment", "robot executing segment ",
          "its plan: generating segment ", "its result: the robot executed the whole plan")


def test_demo_loads_once_says_what_it_waits_for_and_ends_with_one_verdict_per_baseline(ros_domain: int,
                                                                                       tmp_path: Path) -> None:
    log = tmp_path / "demo.log"
    proc = subprocess.run(
        [sys.executable, "-m", "timely_llm.cli", "demo", "--engine", "sim", "--point", "light", "--duration", "8",
         "--no-tello-sim", "--policies", "timelyllm", "vllm", "--rounds", "2", "--domain-id", str(ros_domain),
         "--log", str(log)],
        capture_output=True, text=True, timeout=600, env=os.environ | {"ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    lines = out.splitlines()
    # one engine load for both policies and both rounds
    assert "loading the sim engine once for all 2 policies" in lines
    assert sum(line.endswith("engine loaded in 0 s (kept for the other runs)") for line in lines) == 1
    assert re.search(r"^engine loads in all: 1 \(\d+ s\)$", out, re.M), out
    # rounds alternate: timelyllm, vllm, then vllm, timelyllm
    starts = [line.split(":")[0] for line in lines if line.endswith("starting the node (sim engine)")]
    assert starts == ["timelyllm (round 1)", "vllm (round 1)", "vllm (round 2)", "timelyllm (round 2)"]
    # each run outlasts a progress period (the robots execute for seconds): the open requests are named
    progress = [line for line in lines if re.match(r"  (timelyllm|vllm): \d+/\d+ requests done", line)]
    assert progress, out
    for line in progress:
        done, total = map(int, re.search(r"(\d+)/(\d+) requests done", line).groups())
        assert (done < total) == ("; waiting for " in line), line
        if done < total:
            assert any(stage in line for stage in STAGES), line
    runs = [line for line in lines if "requests succeeded; other processes kept" in line]
    assert len(runs) == 4 and all(" of 2 cores busy, at most " in line and " over 5 s, ours " in line
                                  for line in runs) if os.cpu_count() == 2 else len(runs) == 4
    results = out[out.index("results (merged over 2 rounds"):]
    for policy in ("timelyllm", "vllm"):
        assert f"  machine during {policy}: other processes kept" in results
    assert results.count("  deadlines met: ") == 2
    # the last line: the verdict sentence against the one baseline, its direction spelled out; before it, where the
    # runs saw unequal machines, a caution that says so
    last = lines[-1]
    assert re.match(r"timelyllm: urgent robots got their first action \d+\.\d\dx (sooner|later) than under vllm "
                    r"\(\d+\.\d\d s vs \d+\.\d\d s\); .*deadlines met \d+ of \d+ against \d+ of \d+\.$", last) \
        or re.match(r"timelyllm: urgent robots got their first action as soon as under vllm ", last) \
        or re.match(r"timelyllm and vllm are level .*; as expected here: at the light point ", last), last
    assert lines[-3].startswith(("timelyllm against vllm (mean): ", "caution, the runs saw unequal machines: other "
                                 "processes kept")), lines[-3]
    # third-party output and the node's ROS log (readable times) in the log file, not on the terminal
    assert "[INFO]" not in out and "[WARN]" not in out
    assert re.search(r"^\[INFO\] \[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}\] \[timely_llm_server\]: ", log.read_text(),
                     re.M)
    assert lines[-1] in log.read_text()  # the demo's own lines too
