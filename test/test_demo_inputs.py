"""``timely-llm demo``'s default point: the bursty one, its first burst when the real model generates the plans."""

from __future__ import annotations

from timely_llm.cli import build_parser
from timely_llm_bench.cli.ros import DEMO_LEAD_S, _demo_inputs


def _inputs(*argv: str):  # noqa: ANN202 - the demo's inputs
    return _demo_inputs(build_parser().parse_args(["demo", *argv]))


def test_the_default_point_is_one_burst_above_the_batch_cap_with_several_urgent_robots() -> None:
    args = build_parser().parse_args(["demo", "--engine", "vllm"])
    _, catalog, workload, max_batch = _demo_inputs(args)
    assert args.point == "bursty"
    urgent = [r for r in workload.requests if catalog[r.trace].category == "urgent"]
    assert (len(workload.requests), len(urgent), max_batch) == (14, 4, 8)
    assert min(r.arrival for r in workload.requests) == DEMO_LEAD_S  # no idle lead before the burst
    assert max(r.arrival for r in workload.requests) < DEMO_LEAD_S + 1.0


def test_the_sim_engine_replays_the_whole_bursty_workload_and_light_stays_available() -> None:
    _, _, bursty, _ = _inputs("--engine", "sim")
    assert len(bursty.requests) == 106
    _, _, light, _ = _inputs("--engine", "sim", "--point", "light")
    assert light.name == "WID1"
    args = build_parser().parse_args(["demo", "--engine", "sim", "--workload", "WID2"])  # a workload: light
    assert _demo_inputs(args)[2].name == "WID2" and args.point == "light"
