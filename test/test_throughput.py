"""ALA's throughput model (core/throughput.py) and its use by the batch controller (Features.ala)."""

import math

import pytest

from timely_llm.core import batch as batch_module
from timely_llm.core.batch import BatchController
from timely_llm.core.features import Features
from timely_llm.core.request import Request, Segment
from timely_llm.core.throughput import (
    CONFIDENT,
    ThroughputCurve,
    ThroughputModel,
    confidence,
    derive_curve,
    fit_curve,
)
from timely_llm.core.tuf import NORMAL_TUF
from timely_llm.engines.hardware import load_profile
from timely_llm.plan.robot_file import load_skill_models
from timely_llm_bench.evaluation import sweep
from timely_llm_bench.evaluation.harness import run_bench

TELLO = load_skill_models()["tello"]
NET = 0.008
JETSON = "jetson-agx-orin-64gb-llama3-8b-q4"


def linear_steps(base=0.018, per_seq=0.008):
    return lambda b: base + per_seq * b


@pytest.mark.parametrize("a,b,c", [(80.0, 0.15, 120.0), (1200.0, 0.03, 1250.0), (5.0, 1.2, 40.0)])
def test_fit_recovers_known_parameters(a, b, c):
    truth = ThroughputCurve(a, b, c)
    sizes = [1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64]
    fitted = fit_curve(sizes, [truth.thpt(x) for x in sizes])
    assert fitted.a == pytest.approx(a, rel=1e-3)
    assert fitted.b == pytest.approx(b, rel=1e-3)
    assert fitted.c == pytest.approx(c, rel=1e-3)


def test_fit_needs_three_batch_sizes_and_keeps_throughput_rising():
    assert fit_curve([4, 4, 8], [10.0, 11.0, 20.0]) is None
    falling = [50.0, 40.0, 30.0, 20.0]  # no saturating rise to fit: the best constant in relative error
    flat = fit_curve([1, 2, 4, 8], falling)
    assert flat.a == 0.0
    assert flat.c == pytest.approx(sum(1 / y for y in falling) / sum(1 / y**2 for y in falling))


def test_fit_of_a_linear_step_model_predicts_step_times_within_ten_percent():
    step = linear_steps()
    curve = derive_curve(step)
    for b in (1, 2, 4, 8, 16, 32, 64):
        assert curve.step_time(b) == pytest.approx(step(b), rel=0.1)


def test_confidence_is_high_near_measured_sizes_and_low_far_from_them():
    seen = (2, 3, 4)
    assert confidence(3, seen) == 1.0
    assert confidence(6, seen) >= CONFIDENT  # one doubling past the largest
    assert confidence(64, seen) < 0.25  # four doublings away
    assert confidence(1, seen) > confidence(64, seen)
    assert confidence(5, ()) == 0.0


def test_knee_is_where_each_generation_decodes_at_half_its_speed_alone():
    # step = 0.018 + 0.008 b: step(b) = 2 step(1) at b = 4.25.
    curve = derive_curve(linear_steps())
    assert 3 <= curve.knee(1024) <= 5
    assert derive_curve(linear_steps(base=0.021, per_seq=0.00055)).knee(1024) > 30  # cheap batching: far knee
    assert curve.knee(2) == 2  # never past the cap


def test_online_fit_takes_over_from_the_prior_where_it_has_measured():
    prior = derive_curve(linear_steps(per_seq=0.002))  # the profile says batching is cheap...
    model = ThroughputModel(prior)
    step = linear_steps(per_seq=0.008)  # ...the engine shows it is not
    for _ in range(20):
        for b in (1, 2, 3, 4):
            model.record(b, step(b))
    assert model.step_time(4) == pytest.approx(step(4), rel=0.05)
    assert model.step_time(32) == pytest.approx(prior.step_time(32))  # five doublings out: the prior's word


def test_controller_falls_back_to_the_conservative_rule_where_no_curve_is_confident():
    model = ThroughputModel()  # no prior, nothing measured
    c = BatchController(adaptive=True, network_latency=NET, throughput=model)
    c.record_step(0.02, batch=2)
    assert c.step_time(8) == pytest.approx(0.08)  # StepModel: proportional from the one size seen
    for _ in range(20):
        for b in (1, 2, 3):
            c.record_step(0.018 + 0.008 * b, batch=b)
    assert c.step_time(3) == pytest.approx(0.042, rel=0.05)  # measured sizes: the curve
    assert c.step_time(64) == pytest.approx(c.steps.predict(64))  # far past them: the fitted line again


def normal(rid, arrival, prev_end=None):
    r = Request(rid, "a", TELLO, NORMAL_TUF, arrival, [1], 64)
    if prev_end is not None:
        r.segments.append(Segment(0, "mf(50);", [], 0, 0, 2.0))
        r.prev_end_est = prev_end
    return r


def test_growth_stops_at_the_knee_unless_the_newcomer_is_already_late():
    model = ThroughputModel(derive_curve(linear_steps()))
    knee = model.knee(1024)
    c = BatchController(adaptive=True, network_latency=NET, throughput=model)
    batch = [normal(f"r{i}", 0.0, prev_end=50.0) for i in range(knee)]  # nothing urgent to protect
    on_time = normal("new", 10.0)  # budget ~1 s
    late = normal("late", 8.0)  # budget < 0 at t = 10
    assert c.admits(batch[:-1], 10.0, 100, 1, on_time)
    assert not c.admits(batch, 10.0, 100, 1, on_time)
    assert c.admits(batch, 10.0, 100, 1, late)
    assert BatchController(adaptive=True, network_latency=NET).admits(batch, 10.0, 100, 1, on_time)  # ala off


def test_jetson_run_keeps_the_batch_at_the_knee_for_everyone_on_time(monkeypatch):
    grid = sweep.Grid(hw=(JETSON,), duration=40.0)
    skills, catalog, profile, _, workload = sweep._inputs(grid, JETSON, 50)
    grown = []
    admits = BatchController.admits

    def watched(self, running, now, free_blocks, needed_blocks, newcomer=None):
        ok = admits(self, running, now, free_blocks, needed_blocks, newcomer)
        if ok and running and self.throughput is not None:
            knee = self.throughput.knee(self.max_batch or batch_module.KNEE_SEARCH_LIMIT)
            if knee is not None and len(running) >= knee:
                grown.append(self.budget(newcomer, now))
        return ok

    monkeypatch.setattr(BatchController, "admits", watched)
    result = run_bench(workload, "timelyllm", profile, skills, catalog, 0, None, Features(ala=True))
    records = result["requests"]
    assert len(records) == len(workload.requests)
    assert all(r["status"] == "succeeded" for r in records)
    assert all(budget < 0 for budget in grown)  # past the knee only the already late got in
    assert result["counters"].get("ala_knee_refusals", 0) > 0


def test_ala_off_never_consults_a_throughput_model(monkeypatch):
    grid = sweep.Grid(hw=(JETSON,), duration=20.0)
    skills, catalog, profile, _, workload = sweep._inputs(grid, JETSON, 25)

    def refuse(*args, **kwargs):
        raise AssertionError("throughput model built with ala off")

    monkeypatch.setattr(ThroughputModel, "__init__", refuse)
    off = run_bench(workload, "timelyllm", profile, skills, catalog, 0, None, Features())
    assert len(off["requests"]) == len(workload.requests)
    assert "ala_knee_refusals" not in off["counters"]


def test_ala_on_jetson_improves_urgent_utility_without_losing_normal():
    grid = sweep.Grid(hw=(JETSON,), duration=40.0)
    skills, catalog, profile, _, workload = sweep._inputs(grid, JETSON, 50)
    off, on = (run_bench(workload, "timelyllm", profile, skills, catalog, 0, None, Features(ala=ala))["summary"]
               for ala in (False, True))
    assert on["urgent"]["mean_utility"] > off["urgent"]["mean_utility"] + 0.5
    assert on["normal"]["mean_utility"] >= 0.95 * off["normal"]["mean_utility"]
    assert math.isfinite(on["urgent"]["mean_response_time"])


def test_profile_prior_knee_is_small_on_the_edge_and_large_on_the_rtx4090():
    def knee(name):
        profile = load_profile(name)
        return derive_curve(lambda b: profile.step_time([], [1024] * b)).knee(1024)

    assert knee(JETSON) <= 6
    assert knee("rtx4090-llama3-8b") >= 30


def test_where_the_cap_bounds_the_batch_the_knee_yields_to_a_newcomer_at_its_latest_start():
    # step = 0.018 + 0.008 b: knee 4; at a cap of 8 each generation still decodes at >= 1/8 its speed alone.
    model = ThroughputModel(derive_curve(linear_steps()))
    knee = model.knee(8)
    capped = BatchController(adaptive=True, max_batch=8, network_latency=NET, throughput=model)
    uncapped = BatchController(adaptive=True, max_batch=1024, network_latency=NET, throughput=model)
    batch = [normal(f"r{i}", 0.0, prev_end=50.0) for i in range(knee)]
    wcet = TELLO.segment_max_tokens * capped.step_time(knee + 1)
    step = capped.step_time(knee)
    ample = normal("ample", 10.0)  # budget ~1 s, far more than its worst case and one more step
    latest = normal("latest", 10.0 - (1.0 - NET - wcet - 0.5 * step))  # half a step of waiting left
    assert not capped.admits(batch, 10.0, 100, 1, ample)
    assert capped.admits(batch, 10.0, 100, 1, latest)
    assert not uncapped.admits(batch, 10.0, 100, 1, latest)  # no cap bounds the batch: the knee holds
    assert capped.counters["ala_knee_latest_starts"] == 1
    assert capped.admits(batch, 10.0, 100, 1, normal("late", 8.0))  # already late: admitted as before


def test_ala_under_a_jetson_cap_keeps_its_urgent_gain_without_costing_normal():
    grid = sweep.Grid(hw=(JETSON,), duration=40.0)
    skills, catalog, profile, _, workload = sweep._inputs(grid, JETSON, 50)
    off, on = (run_bench(workload, "timelyllm", profile, skills, catalog, 0, 8, Features(ala=ala))
               for ala in (False, True))
    off, on = off["summary"], on["summary"]
    assert on["urgent"]["mean_utility"] > off["urgent"]["mean_utility"] + 0.2
    assert on["normal"]["mean_utility"] >= off["normal"]["mean_utility"] - 0.01 * abs(off["normal"]["mean_utility"])
