"""The server loop on the real engine: a replayed LRTrace workload, and profile fitting."""

from collections.abc import Iterator
from dataclasses import replace

import pytest
from record_checks import check_record, check_shed_record

from timely_llm.core.features import Features
from timely_llm.core.tuf import TUF
from timely_llm.engines.hardware import load_profile
from timely_llm.engines.profile_fit import BURST_STARTS, fit_profile, measure_steps
from timely_llm.engines.vllm_engine import VllmEngine
from timely_llm.plan.robot_file import load_skill_models
from timely_llm.traces import load_catalog
from timely_llm_bench.evaluation.harness import EngineSetup, run_bench
from timely_llm_bench.workloads.generator import Workload, WorkloadRequest, WorkloadSpec, generate

pytestmark = pytest.mark.vllm

SKILLS = load_skill_models()
CATALOG = load_catalog()


@pytest.fixture(scope="module")
def engine() -> Iterator[VllmEngine]:
    e = VllmEngine(max_model_len=2048, kv_cache_gib=0.5)
    yield e
    e.close()


def test_without_max_batch_the_cap_is_vllms_default_max_num_seqs(engine):
    from vllm import EngineArgs

    default = EngineArgs(model=engine._engine.model_config.model).create_engine_config().scheduler_config
    assert engine.max_batch == engine._engine.vllm_config.scheduler_config.max_num_seqs == default.max_num_seqs


@pytest.mark.parametrize("policy", ["timelyllm", "vllm"])
def test_replayed_workload_on_vllm_obeys_the_record_definitions(engine, policy):
    workload = generate(WorkloadSpec("short", 1.0, 3, (1, 6, 7, 9), 6, 4.0), CATALOG, SKILLS, seed=3)
    # One generation at a time: a generation at a segment boundary is suspended for a waiting one
    # and resumed later (with room to spare, the scheduler lets it run on and nothing resumes).
    result = run_bench(workload, policy, EngineSetup.real("vllm:tiny", engine), SKILLS, CATALOG, seed=3,
                       max_batch=1)
    assert len(result["requests"]) == len(workload.requests) >= 3
    for rec in result["requests"]:
        check_record(rec, workload.network_latency)  # forced decoding reproduces each plan exactly
    if policy == "timelyllm":
        resumed = [s for r in result["requests"] for s in r["segments"][1:] if s["cached_tokens"] is not None]
        assert resumed and all(s["cached_tokens"] >= engine.block_size and not s["evicted"] for s in resumed)


def test_isolated_needs_the_simulator(engine):
    workload = generate(WorkloadSpec("one", 1.0, 1, (6,), 1, 2.0), CATALOG, SKILLS, seed=0)
    with pytest.raises(ValueError, match="simulator"):
        run_bench(workload, "isolated", EngineSetup.real("vllm:tiny", engine), SKILLS, CATALOG)


def test_profile_fit_recovers_a_known_model_and_runs_on_vllm(engine):
    shipped = load_profile("rtx4090-llama3-8b")
    truth = replace(shipped, step=shipped.step | {"per_kv_reread": shipped.step["per_kv_token"] / 4})
    shapes = [([(n, n)], [], 0) for n in (64, 256, 1024, 2048)] + [([(16, 900)], [], 0), ([(64, 300)], [], 0)]
    shapes += [([], [c] * b, shared * (b - 1)) for b in (1, 4, 16) for c in (300, 900) for shared in (0, c - 100)]
    samples = [(p, d, r, truth.step_time(p, d, r)) for p, d, r in shapes]
    fitted = fit_profile(samples, "fit", truth.memory, truth.max_model_len)
    assert fitted.step == pytest.approx(truth.step, rel=1e-6)
    unshared = fit_profile([s for s in samples if not s[2]], "fit", truth.memory, truth.max_model_len)
    assert unshared.step["per_kv_reread"] == unshared.step["per_kv_token"] == pytest.approx(truth.step["per_kv_token"])
    measured = measure_steps(engine, [128, 512], [1, 4], decode_steps=3)
    # 2 fresh prefills; the context cached and 2 prefills on it alone and 2 of 4 at once; batch 1, batch 4 alone and
    # sharing all but 64 tokens
    assert len(measured) == 2 + 5 + 3 * 3 and all(t > 0 for *_, t in measured)
    shared = 192 // engine.block_size * engine.block_size
    assert {r for _, d, r, _ in measured if len(d) == 4} == {0, 3 * shared}
    assert [p for p, d, _, _ in measured if p and p[0][0] < p[0][1]] == [
        [(16, 272)], [(64, 320)], [(16, 272)] * BURST_STARTS, [(64, 320)] * BURST_STARTS]
    real = fit_profile(measured, "tiny-cpu", truth.memory, 2048)
    assert all(v >= 0 for v in real.step.values()) and real.step_time([(512, 512)], []) > 0


def test_timebill_runs_on_vllm_with_the_estimator_fitted_there(engine):
    measured = measure_steps(engine, [64, 256], [1, 2], decode_steps=3)
    fitted = fit_profile(measured, "tiny-cpu", load_profile("rtx4090-llama3-8b").memory, 2048)
    workload = generate(WorkloadSpec("short", 1.0, 3, (1, 6, 7, 9), 6, 4.0), CATALOG, SKILLS, seed=3)
    result = run_bench(workload, "timelyllm", EngineSetup.real("vllm:tiny", engine, fitted), SKILLS, CATALOG,
                       seed=3, max_batch=2, features=Features(timebill=True))
    assert result["features"] == "timebill" and len(result["requests"]) == len(workload.requests)
    for rec in result["requests"]:
        check_record(rec, workload.network_latency)
    constants = {m.segment_generation_time for m in SKILLS.values()}
    predicted = [s["predicted_gen_time"] for r in result["requests"] for s in r["segments"] if s["tokens"]]
    assert predicted and not constants & set(predicted)  # every G(s) came from the fitted estimator


def test_shed_runs_on_vllm_ending_what_cannot_meet_its_cut_off(engine):
    impossible, generous = TUF(0.0, -100.0, 1.0), TUF(60.0, -1.0, 1.0)  # cut-offs 10 ms and 61 s
    workload = Workload("mixed", 0.008, tuple(WorkloadRequest(f"r{i}", 0.1 * i, f"a{i}", trace, tuf) for i, (trace, tuf)
                                             in enumerate([(6, generous), (7, impossible), (1, generous)])))
    result = run_bench(workload, "timelyllm", EngineSetup.real("vllm:tiny", engine), SKILLS, CATALOG, seed=3,
                       max_batch=1, features=Features(shed=True))
    records = {r["id"]: r for r in result["requests"]}
    check_shed_record(records["r1"], SKILLS["tello"].segment_generation_time, workload.network_latency)
    for rid in ("r0", "r2"):
        check_record(records[rid], workload.network_latency)
    assert result["counters"] == {"shed": 1} and result["summary"]["all"]["shed"] == 1


def test_ala_runs_on_vllm_with_a_prior_from_the_fitted_profile(engine):
    measured = measure_steps(engine, [64, 256], [1, 2, 4], decode_steps=3)
    fitted = fit_profile(measured, "tiny-cpu", load_profile("rtx4090-llama3-8b").memory, 2048)
    workload = generate(WorkloadSpec("short", 1.0, 4, (1, 6, 7, 9), 8, 4.0), CATALOG, SKILLS, seed=3)
    for profile in (fitted, None):  # with a prior, and learning from measured steps alone
        result = run_bench(workload, "timelyllm", EngineSetup.real("vllm:tiny", engine, profile), SKILLS, CATALOG,
                           seed=3, max_batch=4, features=Features(ala=True))
        assert result["features"] == "ala" and len(result["requests"]) == len(workload.requests)
        for rec in result["requests"]:
            check_record(rec, workload.network_latency)


def test_amin_and_deferred_prefill_run_on_vllm(engine):
    # K* > 1 from a step model with a prefill stall: the deferral path runs too; every request still ends.
    workload = generate(WorkloadSpec("short", 2.0, 4, (1, 6, 7, 9), 8, 6.0), CATALOG, SKILLS, seed=3)
    gpu = load_profile("rtx4090-llama3-8b")
    stalled = replace(gpu, step={**gpu.step, "prefill_stall": gpu.step["base"]})
    setup = EngineSetup.real("vllm:tiny", engine, stalled)
    result = run_bench(workload, "timelyllm", setup, SKILLS, CATALOG, seed=3, max_batch=4,
                       features=Features(amin=True, deferred_prefill=True))
    assert result["features"] == "amin,deferred_prefill" and len(result["requests"]) == len(workload.requests)
    for rec in result["requests"]:
        check_record(rec, workload.network_latency)
