"""Figure 5/6 plots from real (tiny) bench runs through the CLI."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from timely_llm.cli import main
from timely_llm_bench.evaluation.plots import pick_timeline, plot_results

POLICIES = ("vllm", "timelyllm")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    tmp = tmp_path_factory.mktemp("bench")
    traces = [1, 4, 7, 2, 6, 3, 8, 5, 6, 1]
    workload = {"name": "tiny", "network_latency": 0.008, "requests": [
        {"id": f"r{i}", "arrival": 0.4 * (i // 3) + 0.001 * i, "agent": f"a{i}", "trace": t}
        for i, t in enumerate(traces)]}
    (tmp / "tiny.json").write_text(json.dumps(workload))
    paths = []
    for policy in POLICIES:
        out = tmp / f"{policy}.json"
        assert main(["bench", "--workload", str(tmp / "tiny.json"), "--policy", policy, "--out", str(out)]) == 0
        paths.append(out)
    return paths


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def test_plot_writes_fig5_and_fig6(results: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "plots"
    assert main(["plot", *map(str, results), "--out", str(out)]) == 0
    expected = {"fig5_tiny.png", *(f"fig6_tiny_{p}.png" for p in POLICIES)}
    assert {p.name for p in out.iterdir()} == expected
    for name in expected:
        width, height = _png_size(out / name)
        assert width >= 600 and height >= 200
        assert (out / name).stat().st_size > 10_000


def test_plot_results_returns_written_paths(results: list[Path], tmp_path: Path) -> None:
    loaded = [json.loads(p.read_text()) for p in results]
    paths = plot_results(loaded + loaded[:1], tmp_path)
    assert len(paths) == len(set(paths)) == 4  # a repeated workload/policy gets its own fig6
    assert all(p.is_file() for p in paths)


def test_result_without_requests_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="requests"):
        plot_results([{"policy": "vllm", "workload": "tiny"}], tmp_path)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"policy": "vllm", "workload": "tiny"}))
    assert main(["plot", str(bad), "--out", str(tmp_path / "plots")]) == 2


def _record(rid: str, category: str, arrival: float, end: float) -> dict:
    segment = {"gen_start": arrival, "gen_end": arrival + 0.1, "exec_start": arrival + 0.1, "exec_end": end}
    return {"id": rid, "category": category, "arrival": arrival, "segments": [segment]}


def test_timeline_centres_on_first_urgent_overlapping_a_normal() -> None:
    records = [_record(f"n{i}", "normal", 10.0 * i, 10.0 * i + 1) for i in range(8)]
    records.append(_record("alone", "urgent", 15.0, 16.0))  # between normal requests: skipped
    records.append(_record("hit", "urgent", 40.5, 41.0))
    shown = [r["id"] for r in pick_timeline(records, count=4)]
    assert shown == ["n4", "hit", "n5", "n6"]
