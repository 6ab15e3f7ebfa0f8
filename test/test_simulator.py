"""Simulator invariants, record definitions for every policy, determinism."""

import json
from pathlib import Path

import pytest
from record_checks import check_record

from timely_llm.cli import main
from timely_llm.engines.base import GenerationSpec
from timely_llm.engines.block_manager import BlockManager, OutOfBlocks
from timely_llm.engines.hardware import load_profile
from timely_llm.engines.sim import SimEngine
from timely_llm.plan.robot_file import load_skill_models
from timely_llm.traces import load_catalog
from timely_llm_bench.evaluation.harness import BENCH_POLICIES, run_bench
from timely_llm_bench.workloads.generator import BUILTIN, WorkloadSpec, generate

SKILLS = load_skill_models()
CATALOG = load_catalog()
PROFILE = load_profile("rtx4090-llama3-8b")


def small_workload(seed=0, traces=tuple(range(1, 12)), duration=60.0):
    return generate(WorkloadSpec("mini", 0.3, 8, traces, 20, duration), CATALOG, SKILLS, seed)


def test_profile_matches_table_1():
    assert PROFILE.step_time([(2884, 2884)], []) == pytest.approx(0.328, abs=0.002)
    assert PROFILE.step_time([], [2900]) == pytest.approx(0.0219, abs=0.0003)


def test_the_h100_profile_gives_the_steps_measured_on_an_h100():
    h100 = load_profile("h100-llama3-8b")
    probe = json.loads((Path(__file__).resolve().parents[1] / "docs/gpu/h100-step-probe.json").read_text())
    assert probe["device"].startswith("NVIDIA H100")
    for step in probe["decodes"]:  # batch 1-64, contexts of 512-2,048 tokens
        assert h100.step_time([], [step["context"]] * step["batch"]) == pytest.approx(step["seconds"], rel=0.05)
    for step in probe["prefills"]:  # a short prefill leaves the GPU partly idle: the linear term fits long ones
        if step["tokens"] >= 1024:
            assert h100.step_time([(step["tokens"], step["tokens"])], []) == pytest.approx(step["seconds"], rel=0.15)


def _decode_step(profile, prompts):
    """The duration of the first step after ``prompts``' prefills."""
    engine = SimEngine(profile)
    for i, prompt in enumerate(prompts):
        engine.start(GenerationSpec(f"g{i}", prompt, forced_ids=[5] * 4))
    engine.step()
    return engine.step().duration


def test_decoding_generations_read_the_kv_blocks_they_share_once_where_the_profile_prices_that():
    cpu = load_profile("cpu-2core-smollm2-135m")
    assert cpu.reads_shared_kv_once and not PROFILE.reads_shared_kv_once  # the GPU file leaves the term out
    prefix = cpu.block_tokens * 10
    shared = [list(range(1000, 1000 + prefix)) + [i] * 5 for i in range(3)]
    apart = [list(range(5000 * i, 5000 * i + prefix + 5)) for i in range(3)]
    contexts = [prefix + 6] * 3  # the prompt and the token the prefill step gave
    sharing, alone = _decode_step(cpu, shared), _decode_step(cpu, apart)
    assert sharing == pytest.approx(cpu.step_time([], contexts, 2 * prefix))
    assert alone == pytest.approx(cpu.step_time([], contexts))
    assert sharing < alone
    assert _decode_step(PROFILE, shared) == pytest.approx(_decode_step(PROFILE, apart))


@pytest.mark.parametrize("policy", BENCH_POLICIES)
def test_every_request_completes_and_obeys_definitions(policy):
    workload = small_workload()
    result = run_bench(workload, policy, PROFILE, SKILLS, CATALOG, seed=0)
    assert len(result["requests"]) == len(workload.requests) > 10
    for rec in result["requests"]:
        check_record(rec, workload.network_latency)
    segmented = policy in ("fcfs", "edf", "timelyllm", "vllm-stream", "vllm-priority", "isolated")
    multi = [r for r in result["requests"] if len(r["segments"]) > 1]
    assert bool(multi) == segmented  # vllm dispatches the whole plan as one segment


def test_resumes_hit_the_prefix_cache():
    # Generations are suspended only when capacity is scarce: a batch of 2 makes them.
    result = run_bench(small_workload(), "timelyllm", PROFILE, SKILLS, CATALOG, max_batch=2)
    resumed = [s for r in result["requests"] for s in r["segments"][1:] if s["cached_tokens"] is not None]
    assert resumed
    # the robot's system prompt (> 150 tokens) plus every full block generated so far
    assert all(s["cached_tokens"] > 150 and not s["evicted"] for s in resumed)


def test_same_seed_same_result_different_seed_different_arrivals():
    a = run_bench(small_workload(1), "timelyllm", PROFILE, SKILLS, CATALOG, seed=1)
    b = run_bench(small_workload(1), "timelyllm", PROFILE, SKILLS, CATALOG, seed=1)
    assert a == b
    c = small_workload(2)
    assert [r.arrival for r in c.requests] != [r.arrival for r in small_workload(1).requests]


def test_kv_memory_never_exceeds_capacity_and_eviction_costs_recompute():
    # A tiny card: 64 blocks of 16 tokens; contexts of ~300 tokens -> heavy pressure.
    profile = load_profile("rtx4090-llama3-8b")
    object.__setattr__(profile, "memory", {**profile.memory, "total_gib": 16 + 1.5 + 64 * 16 * 131072 / 2**30})
    assert profile.num_kv_blocks == 64
    engine = SimEngine(profile)
    prompts = {f"g{i}": [1000 + i] + list(range(300)) for i in range(5)}
    for gid, ids in prompts.items():
        engine.start(GenerationSpec(gid, ids, max_new_tokens=40, forced_ids=list(range(5000, 5040))))
    outputs = {gid: [] for gid in prompts}
    for _ in range(200):
        out = engine.step()
        held = {block for table in engine.blocks.tables.values() for block in table}
        assert len(held) == engine.blocks.num_blocks - engine.blocks.free_blocks  # no block leaked or handed out twice
        for gid, toks in out.new_tokens.items():
            outputs[gid].extend(toks)
        for gid in out.finished:
            engine.release(gid)
        if not engine.running_ids():
            break
    assert all(len(o) == 40 for o in outputs.values())  # everyone completed despite preemption


def test_block_manager_prefix_sharing_and_lru_eviction():
    bm = BlockManager(num_blocks=4, block_size=4)
    assert bm.allocate("a", list(range(10))) == 0  # 3 blocks, 2 full
    bm.release("a")
    assert bm.allocate("b", list(range(8)) + [99]) == 8  # both full blocks still cached
    bm.release("b")
    bm.allocate("c", list(range(100, 116)))  # needs all 4 blocks: evicts the cached ones
    bm.release("c")
    assert bm.allocate("d", list(range(10))) == 0


def test_block_manager_appends_all_or_nothing():
    bm = BlockManager(num_blocks=3, block_size=4)
    bm.allocate("a", [1, 2, 3])
    with pytest.raises(OutOfBlocks):
        bm.append("a", list(range(10)))  # 13 tokens need a fourth block
    bm.append("a", [4, 5, 6, 7, 8])  # 8 tokens: the append above left nothing behind
    bm.release("a")
    assert bm.allocate("b", [1, 2, 3, 4, 5, 6, 7, 8, 9]) == 8


@pytest.mark.parametrize("in_place", [True, False])
def test_a_resume_with_an_observation_prefills_only_it_where_the_kv_was_kept(in_place):
    engine = SimEngine(load_profile("cpu-2core-smollm2-135m"), suspends_in_place=in_place)
    prompt, plan = list(range(1000, 1300)), list(range(2000, 2010))
    engine.start(GenerationSpec("g", prompt, forced_ids=plan))
    for _ in range(4):
        engine.step()
    engine.suspend("g")
    output, observation = plan[:4], [7, 8, 9]
    engine.start(GenerationSpec("g", prompt, output + observation, forced_ids=plan, observed=((4, 7),)))
    step = engine.step()
    info = step.started["g"]
    prefilled = info.context_tokens - info.cached_tokens
    assert info.context_tokens == 307 and step.new_tokens["g"] == [plan[4]]
    # in place: the call's last token and the observation; dropped: all past the last full block written before
    assert prefilled == (4 if in_place else 307 - 303 // engine.block_size * engine.block_size)
    assert step.duration == engine.profile.step_time([(prefilled, 307)], [])


def test_a_resume_whose_observation_fills_a_block_is_no_eviction():
    engine = SimEngine(load_profile("cpu-2core-smollm2-135m"))  # drops a suspended generation's KV
    prompt, plan = list(range(1000, 1250)), list(range(2000, 2010))
    engine.start(GenerationSpec("g", prompt, forced_ids=plan))
    for _ in range(4):
        engine.step()
    engine.suspend("g")  # KV written for 253 tokens, the last block not full
    engine.start(GenerationSpec("g", prompt, plan[:4] + [7, 8, 9], forced_ids=plan, observed=((4, 7),)))
    info = engine.step().started["g"]
    written = 253 // engine.block_size * engine.block_size
    assert (info.context_tokens, info.cached_tokens, info.evicted) == (257, written, False)
    engine.suspend("g")  # now with the observation's KV written: its block is cached too
    engine.start(GenerationSpec("g", prompt, plan[:4] + [7, 8, 9, plan[4]], forced_ids=plan, observed=((4, 7),)))
    info = engine.step().started["g"]
    assert (info.cached_tokens, info.evicted) == (256, False)


def test_timelyllm_beats_vllm_on_urgent_utility_in_a_short_wid1():
    workload = generate(WorkloadSpec("wid1-short", 0.5, 8, tuple(range(1, 9)), 25, 60.0), CATALOG, SKILLS, 0)
    util = {p: run_bench(workload, p, PROFILE, SKILLS, CATALOG)["summary"]["urgent"]["mean_utility"]
            for p in ("vllm", "timelyllm")}
    assert util["timelyllm"] > util["vllm"]


def test_builtin_workloads_follow_table_3():
    for name, spec in BUILTIN.items():
        w = generate(spec, CATALOG, SKILLS, 0)
        assert all(0 <= r.arrival < spec.duration for r in w.requests)
        assert {r.trace for r in w.requests} <= set(spec.trace_ids)
        assert len({r.agent for r in w.requests}) <= spec.agents
        # an agent runs one task at a time
        by_agent = {}
        for r in w.requests:
            by_agent.setdefault(r.agent, []).append(r.arrival)
        for arrivals in by_agent.values():
            assert arrivals == sorted(arrivals) and len(set(arrivals)) == len(arrivals), name


def test_bench_cli_writes_result(tmp_path):
    out = tmp_path / "r.json"
    workload = tmp_path / "w.json"
    workload.write_text(json.dumps(small_workload(duration=20).to_json()))
    assert main(["bench", "--workload", str(workload), "--policy", "timelyllm", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["policy"] == "timelyllm" and result["requests"]
    for rec in result["requests"]:
        check_record(rec, 0.008)


def tiny_card(num_blocks):
    profile = load_profile("rtx4090-llama3-8b")
    memory = {**profile.memory, "total_gib": 16 + 1.5 + num_blocks * 16 * 131072 / 2**30}
    object.__setattr__(profile, "memory", memory)
    assert profile.num_kv_blocks == num_blocks
    return profile


@pytest.mark.parametrize(("priorities", "victim"), [((0, 0, 0), "g2"), ((1000, 200, 200), "g0")])
def test_kv_preemption_takes_the_lowest_priority_latest_started(priorities, victim):
    # vLLM's rule: on a KV shortage preempt max (priority, start order). Under FCFS (all 0) that is the
    # latest started; with priorities the least urgent even if it started first.
    engine = SimEngine(tiny_card(12))
    for i, priority in enumerate(priorities):  # 3 x 64 tokens = 12 full blocks: the next token needs a block
        engine.start(GenerationSpec(f"g{i}", [500 + i] + list(range(63)), max_new_tokens=20,
                                    forced_ids=list(range(7000, 7020)), priority=priority))
    engine.step()  # prefill all three
    engine.step()  # each needs a 13th block for its first token's KV: one generation is preempted
    assert {g.spec.gen_id for g in engine._running.values() if not g.prefilled} == {victim}
