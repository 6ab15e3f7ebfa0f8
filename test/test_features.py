"""The scheduler's switchable parts: one parser for bench, sweep and the node."""

import pytest

from timely_llm.core.features import DEFAULT, Features
from timely_llm.serving import ServerConfig, build_server


def test_parse_names_all_none_default():
    assert Features.parse("timebill,amin").on == ("timebill", "amin")
    assert Features.parse("deferred-prefill").deferred_prefill
    assert Features.parse("all").on == Features.names()
    assert Features.parse("none").on == ()
    assert Features.parse("default") == DEFAULT


def test_label_inverts_parse():
    for text in ("none", "all", "amin,shed", "timebill"):
        assert Features.parse(Features.parse(text).label()) == Features.parse(text)


def test_unknown_part_is_named():
    with pytest.raises(ValueError, match="unknown scheduler feature.*warp"):
        Features.parse("timebill,warp")


def test_sweep_runs_each_set_under_our_policies_and_the_baselines_once_without():
    from timely_llm_bench.evaluation.sweep import Grid, run_grid, series

    grid = Grid(("rtx4090-llama3-8b",), ("vllm-stream", "timelyllm"), (25,), (8,), duration=10.0,
                features=("none", "all"))
    points = run_grid(grid)["points"]
    assert sorted((p["policy"], p["features"]) for p in points) == [
        ("timelyllm", "all"), ("timelyllm", "none"), ("vllm-stream", "none")]
    assert sorted(map(series, points)) == ["timelyllm [all]", "timelyllm [none]", "vllm-stream"]


def test_the_vllm_baselines_run_without_parts_and_ours_with_them():
    from timely_llm.clock import VirtualClock
    from timely_llm.core.admission import AminAdmission
    from timely_llm.core.policies import POLICIES
    from timely_llm.engines.hardware import load_profile
    from timely_llm.engines.sim import SimEngine
    from timely_llm.plan.robot_file import load_skill_models

    parts = Features.parse("amin,ala")
    for name, policy in POLICIES.items():
        server = build_server(ServerConfig(name, 0.008, parts), SimEngine(load_profile("rtx4090-llama3-8b")),
                              load_skill_models(), VirtualClock())
        assert server.features == (parts if policy.segmented else Features()), name
        assert isinstance(server.memory, AminAdmission) == policy.segmented, name
