"""The ablation command: points parse back from their names, every run lands in one table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from timely_llm.cli import main
from timely_llm.core.features import Features
from timely_llm.engines.hardware import load_profile
from timely_llm.plan.robot_file import load_skill_models
from timely_llm.traces import load_catalog
from timely_llm_bench.evaluation.ablation import POINTS, Point, feature_sets, is_ablation, markdown_table, run_ablation
from timely_llm_bench.evaluation.harness import run_bench
from timely_llm_bench.evaluation.sweep import with_kv_memory, workload_for


def test_points_round_trip_through_their_names():
    for point in (*POINTS, Point("map:400", "rtx4090-llama3-8b", None, kv_gib=0.5)):
        assert Point.parse(point.name) == point


@pytest.mark.parametrize("text", ["WID2", "WID9@rtx4090-llama3-8b/8", "map:x@rtx4090-llama3-8b", "WID1@h/0",
                                  "WID1@h/8/kv0/1"])
def test_bad_points_are_refused(text: str):
    with pytest.raises(ValueError, match="point"):
        Point.parse(text)


def test_default_sets_are_none_each_part_and_all():
    sets = feature_sets()
    assert sets[0] == "none" and sets[-1] == "all" and len(sets) == len(set(sets))


def test_every_point_and_set_is_one_row_of_the_table():
    points = (Point("map:25", "rtx4090-llama3-8b", 8),)
    result = run_ablation(points, ("none", "all"), duration=10.0)
    assert is_ablation(json.loads(json.dumps(result)))
    assert [(r["point"], r["features"]) for r in result["rows"]] == [(points[0].name, "none"), (points[0].name, "all")]
    table = markdown_table(result).splitlines()
    assert len(table) == 2 + 2 and all(points[0].name in line for line in table[2:])
    assert all(r["summary"]["all"]["count"] > 0 for r in result["rows"])


def test_cli_writes_the_json_and_table_reads_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    out = tmp_path / "ablation.json"
    assert main(["ablation", "--points", "map:25@rtx4090-llama3-8b/8", "--features", "none", "--duration", "10",
                 "--jobs", "1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert main(["table", str(out)]) == 0
    assert capsys.readouterr().out.strip() in printed
    assert main(["plot", str(out), "--out", str(tmp_path)]) == 2
    assert "ablation" in capsys.readouterr().err


def test_cli_refuses_a_point_on_unknown_hardware(capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit) as exc:
        main(["ablation", "--points", "WID1@no-such-gpu/8", "--out", "/tmp/never.json"])
    assert exc.value.code == 2 and "no-such-gpu" in capsys.readouterr().err


def test_rows_equal_runs_on_freshly_loaded_inputs_though_the_process_shares_them():
    point = Point("map:25", "rtx4090-llama3-8b", 8, kv_gib=0.15)
    plain = Point("map:25", "rtx4090-llama3-8b", 8)
    shared = run_ablation((plain, point, plain), ("amin",), duration=10.0)["rows"]
    skills, catalog = load_skill_models(), load_catalog()
    fresh = run_bench(workload_for(25, 10.0, 3, catalog, skills), "timelyllm",
                      with_kv_memory(load_profile(point.hw), 0.15), skills, catalog, 0, 8, Features(amin=True))
    assert shared[1]["summary"] == fresh["summary"] and shared[1]["counters"] == fresh["counters"]
    assert shared[0]["summary"] == shared[2]["summary"] != shared[1]["summary"]  # the KV cut is its own input
