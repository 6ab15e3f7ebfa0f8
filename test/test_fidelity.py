"""``timely-llm fidelity``: one workload on the simulator and on embedded vLLM, side by side."""

from __future__ import annotations

import dataclasses
import os
import statistics
import subprocess
import sys

import pytest

from timely_llm.engines.hardware import load_profile
from timely_llm.plan.robot_file import load_skill_models
from timely_llm.traces import TraceCatalog, load_catalog
from timely_llm_bench.evaluation import fidelity
from timely_llm_bench.workloads.generator import Workload
from timely_llm_bench.workloads.peer import PEER_WORKLOADS, generate_peer


def _bursty_start(catalog: TraceCatalog) -> Workload:
    """The first 40 requests of the bursty peer workload (seed 0)."""
    workload = generate_peer(PEER_WORKLOADS["bursty"], catalog, seed=0)
    return dataclasses.replace(workload, requests=workload.requests[:40])


@pytest.fixture(scope="module")
def simulated() -> list[fidelity.FidelityRun]:
    catalog = load_catalog()
    return fidelity.simulated(load_profile("cpu-2core-smollm2-135m"), None, _bursty_start(catalog),
                              ["timelyllm", "vllm-stream"], load_skill_models(), catalog, seed=0, max_batch=8)


def _row(table: str, *cells: str) -> list[str]:
    for line in table.splitlines():
        row = [c.strip() for c in line.strip("| ").split("|")]
        if row[:len(cells)] == list(cells):
            return row
    raise AssertionError(f"no row {cells} in\n{table}")


def test_the_outcome_table_holds_each_runs_means_and_the_first_segments_split(simulated) -> None:
    table = fidelity.outcome_table(simulated)
    for run in simulated:
        for category in ("urgent", "normal"):
            done = [r for r in run.result["requests"] if r["category"] == category and r["status"] == "succeeded"]
            row = _row(table, run.policy, category, fidelity.SIM)
            assert int(row[4]) == len(done)
            assert float(row[5].split(" / ")[0]) == pytest.approx(
                statistics.fmean(r["response_time"] for r in done), abs=1e-3)
            assert float(row[6].split(" / ")[0]) == pytest.approx(
                statistics.fmean(r["waiting_time"] for r in done), abs=1e-3)
            # the steps during its wait (queued or not) and the time outside them make up the time to its dispatch
            prefill, decode, empty, outside = float(row[9]), float(row[10]), float(row[14]), float(row[15])
            assert 0 <= float(row[8]) <= prefill + decode + empty + outside
            assert prefill + decode + empty + outside == pytest.approx(
                statistics.fmean(r["segments"][0]["gen_end"] - r["arrival"] for r in done), abs=3e-3)


def test_the_step_table_counts_suspensions_and_resumes_only_where_the_policy_suspends(simulated) -> None:
    table = fidelity.step_table(simulated)
    streamed = _row(table, "vllm-stream", fidelity.SIM)
    segmented = _row(table, "timelyllm", fidelity.SIM)
    assert (streamed[-5], streamed[-4], streamed[-2]) == ("0", "0 (0)", "0")  # never suspended, never resumed
    assert int(segmented[-5]) > 0 and int(segmented[-2]) > 0
    # the simulator suspends in place and has memory to spare here: no resume prefills again
    assert segmented[-4] == "0 (0)"
    for run, row in ((simulated[0], segmented), (simulated[1], streamed)):
        origin = min(run.log["arrivals"].values())
        steps = [s for s in run.log["steps"] if s[0] >= origin]
        assert int(row[3].split(",")[0]) == sum(1 for s in steps if s[4])
        assert int(row[4].split(",")[0]) == sum(1 for s in steps if s[2] and not s[4])
        # each first start runs in exactly one step
        assert sum(s[4] for s in run.log["steps"]) == sum(1 for _, tokens, _ in run.log["starts"] if not tokens)
    assert streamed[4] == "0, -"  # it never resumes: each step that starts a generation starts a new one
    # a resume in place prefills nothing, so the steps that only resume cost less than those prefilling a prompt
    assert float(segmented[4].split(", ")[1]) < float(segmented[3].split(", ")[1])


def test_urgent_robots_alone_get_at_least_what_they_get_beside_the_others(simulated) -> None:
    """``fidelity --only urgent``: the same urgent requests at the same arrivals with nothing else to serve."""
    catalog = load_catalog()
    workload = _bursty_start(catalog)
    alone = workload.of_categories(["urgent"], catalog)
    assert [r.id for r in alone.requests] == [r.id for r in workload.requests if catalog[r.trace].category == "urgent"]
    assert 0 < len(alone.requests) < len(workload.requests)
    [run] = fidelity.simulated(load_profile("cpu-2core-smollm2-135m"), None, alone, ["timelyllm"],
                               load_skill_models(), catalog, seed=0, max_batch=8)
    beside = next(r for r in simulated if r.policy == "timelyllm")
    assert {r["id"] for r in run.result["requests"]} == {r.id for r in alone.requests}

    def urgent_mean(run: fidelity.FidelityRun) -> float:
        return statistics.fmean(r["response_time"] for r in run.result["requests"]
                                if r["category"] == "urgent" and r["status"] == "succeeded")

    assert urgent_mean(run) < urgent_mean(beside)


def test_each_run_says_what_its_resumes_reused(simulated) -> None:
    """In place, a resume keeps all its KV; a policy that never suspends has no resume to report."""
    segmented, streamed = fidelity.kv_lines(simulated)
    assert segmented.startswith("sim timelyllm round 1: KV reuse: 100.0% of resumed context") and \
        "0 recomputed" in segmented
    assert streamed == "sim vllm-stream round 1: KV reuse: no resume"


def test_only_real_runs_carry_the_machines_load(simulated) -> None:
    assert all(run.load is None for run in simulated)
    assert fidelity.load_lines(simulated) == []


@pytest.mark.vllm
def test_fidelity_prints_the_real_engine_beside_both_simulations(tmp_path) -> None:
    out = tmp_path / "f.json"
    proc = subprocess.run([sys.executable, "-m", "timely_llm.cli", "fidelity", "--model", "tiny", "--first", "6",
                           "--out", str(out)], capture_output=True, text=True, timeout=900, env=os.environ)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for engine in (fidelity.REAL, fidelity.SIM, fidelity.SIM_STAND_IN):
        for policy in ("timelyllm", "vllm-stream"):
            assert f"| {policy} | {engine} | 1 |" in proc.stdout, (policy, engine)
    assert "vLLM timelyllm: other processes kept" in proc.stdout
    assert out.is_file()


def test_the_cpu_profile_simulates_smollm2s_token_counts_and_vllm_cpus_blocks() -> None:
    from transformers import AutoTokenizer

    from timely_llm.engines.sim import SimEngine
    from timely_llm.engines.vllm_engine import CPU_BLOCK_SIZE
    from timely_llm.models import resolve_model

    catalog = load_catalog()
    engine = SimEngine(load_profile("cpu-2core-smollm2-135m"))
    hf = AutoTokenizer.from_pretrained(resolve_model("smollm2")[0])
    for trace in (1, 6):
        prompt = catalog.prompt_text(catalog[trace].robot, catalog[trace].prompt)
        assert engine.tokenizer.encode(prompt) == hf.encode(prompt)
        assert engine.tokenizer.decode(engine.tokenizer.encode(catalog[trace].plan)) == catalog[trace].plan
    assert engine.block_size == CPU_BLOCK_SIZE


def test_a_profile_naming_an_unknown_tokenizer_is_refused(tmp_path) -> None:
    import yaml

    from timely_llm.errors import ConfigError

    fields = load_profile("cpu-2core-smollm2-135m").to_dict() | {"tokenizer": "gpt-9"}
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(fields))
    with pytest.raises(ConfigError, match="tokenizer: must be one of smollm2, tiny, got 'gpt-9'"):
        load_profile(str(path))


def _replay_burst_at_cap_2(paused_slots: int | None) -> fidelity.FidelityRun:
    """The first 10 requests of the bursty workload, arriving at once, at a batch cap of 2 on the tiny model."""
    from dataclasses import replace

    from timely_llm.clock import WallClock
    from timely_llm.engines.vllm_engine import VllmEngine

    catalog = load_catalog()
    burst = generate_peer(PEER_WORKLOADS["bursty"], catalog, seed=0)
    first = burst.requests[0].arrival
    burst = replace(burst, requests=tuple(replace(r, arrival=r.arrival - first) for r in burst.requests[:10]))
    room = {} if paused_slots is None else {"paused_slots": paused_slots}
    engine = VllmEngine("tiny", max_model_len=2048, kv_cache_gib=0.25, max_batch=2, **room)
    try:
        assert engine.max_batch == 2
        run = fidelity.replay(fidelity.REAL, engine, WallClock(), None, burst, "timelyllm", load_skill_models(),
                              catalog, seed=0, max_batch=2)
    finally:
        engine.close()
    assert run.result["summary"]["all"]["succeeded"] == len(burst.requests)
    return run


@pytest.mark.vllm
def test_a_burst_at_a_full_batch_cap_ends_with_vllm_slots_at_the_cap() -> None:
    """At a batch cap of 2 with no vLLM slot beyond it, under a burst of 10, newcomers take the batch while
    suspended generations' robots execute: the engine gives a paused request's slot to a waiting one, so every
    request is served (before it did, a resume waited in vLLM's queue behind paused requests and never ended)."""
    run = _replay_burst_at_cap_2(paused_slots=0)
    assert run.log["suspends"] > 0 and run.log["reprefilled"] > 0


@pytest.mark.vllm
def test_generations_suspended_at_a_full_batch_cap_keep_their_kv_in_the_slots_beyond_it() -> None:
    """The same burst with vLLM's default room beyond the cap: newcomers run while suspended generations stay
    paused in vLLM's extra slots, so no resume prefills again (the tax normal robots paid at capped batches)."""
    run = _replay_burst_at_cap_2(paused_slots=None)
    assert run.log["suspends"] > 0 and run.log["reprefilled"] == 0


def test_the_remote_paths_simulator_replays_the_plans_the_remote_run_generated() -> None:
    """A stand-in for a remote run (the remote path's simulator, each plan cut to its first half as if the server
    had generated another plan than the recorded one): its replay forces those plans, not the recorded ones, so it
    gives the same figures and an error of 0.0%."""
    from dataclasses import replace

    from timely_llm.clock import VirtualClock
    from timely_llm.engines.sim_remote import RemoteSimEngine

    catalog, skills = load_catalog(), load_skill_models()
    profile = replace(load_profile("cpu-2core-smollm2-135m"), http={"request_overhead": 0.01, "token_delay": 0.001,
                                                                          "servers": 1.0})
    workload = generate_peer(PEER_WORKLOADS["bursty"], catalog, seed=0)
    workload = type(workload)(workload.name, workload.network_latency, workload.requests[:16])
    engine = RemoteSimEngine(profile)
    halves = {r.id: (ids := engine.tokenizer.encode(catalog[r.trace].plan))[:len(ids) // 2] for r in workload.requests}
    real = fidelity.replay(fidelity.REMOTE, engine, VirtualClock(), profile, workload, "timelyllm", skills, catalog,
                           0, 8, forced_plans=halves)
    assert real.log["sampled"] == halves
    [again] = fidelity.replayed_remote(profile, [real], workload, skills, catalog, 0, 8)
    assert again.engine == fidelity.SIM_REMOTE and again.log["sampled"] == halves
    assert [r["completion_time"] for r in again.result["requests"]] == [r["completion_time"]
                                                                         for r in real.result["requests"]]
    lines = fidelity.error_lines([real, again], fidelity.REMOTE, fidelity.SIM_REMOTE)
    assert any(line.startswith("timelyllm urgent: vllm serve ") and line.endswith("error +0.0%") for line in lines)
