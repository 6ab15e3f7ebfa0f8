"""The embedded vLLM engine on the tiny model: segmenting, caching, forcing, limits."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from guards import bounded

from timely_llm.engines.base import EngineRejected, GenerationSpec, ResumeInfo
from timely_llm.engines.vllm_args import EngineArgsError
from timely_llm.engines.vllm_engine import PAUSED_SLOTS, VllmEngine
from timely_llm.models import CORPUS

pytestmark = pytest.mark.vllm

MAX_MODEL_LEN = 1024
PLAN = "s('cat');?iv('cat')==True{g('cat');tp};tc(90);mf(100);"
ARM_PLAN = "goto('red_box');pick('red_box');goto('tray');drop('red_box');"


@pytest.fixture(scope="module")
def engine() -> Iterator[VllmEngine]:
    # A small cache (about 160 blocks) so that a test can evict from it.
    eng = VllmEngine(max_model_len=MAX_MODEL_LEN, kv_cache_gib=0.02, max_batch=16)
    yield eng
    eng.close()


def test_the_batch_cap_is_max_batch_and_vllm_has_slots_beyond_it_for_paused_generations(engine: VllmEngine) -> None:
    assert engine.max_batch == 16
    assert engine._engine.vllm_config.scheduler_config.max_num_seqs == 16 + PAUSED_SLOTS


def test_vllms_max_num_seqs_is_refused_naming_max_batch_before_vllm_loads() -> None:
    with pytest.raises(EngineArgsError, match=r"^vllm\.max_num_seqs: set it through parameter max_batch"):
        VllmEngine("no-such-model-directory", max_num_seqs=16)


def corpus_prompt(engine: VllmEngine, first_line: int, min_tokens: int) -> list[int]:
    """A prompt of at least ``min_tokens`` tokens cut from the shipped corpus."""
    lines = CORPUS.read_text().splitlines()[first_line:]
    ids = engine.tokenizer.encode("")
    for line in lines:
        ids = engine.tokenizer.encode(f"{engine.tokenizer.decode(ids)}\n{line}")
        if len(ids) >= min_tokens:
            return ids
    raise AssertionError("corpus too short")


@dataclass
class Run:
    outputs: dict[str, list[int]]
    finished: dict[str, str] = field(default_factory=dict)
    resumes: list[ResumeInfo] = field(default_factory=list)


def drive(engine: VllmEngine, specs: list[GenerationSpec], every: int = 0) -> Run:
    """Run ``specs`` to the end; with ``every`` > 0, suspend each generation after
    every ``every`` new tokens and resume it one step later."""
    by_id = {s.gen_id: s for s in specs}
    run = Run({s.gen_id: list(s.output_ids) for s in specs})
    segment = dict.fromkeys(by_id, 0)
    running, to_resume = set(by_id), []
    for spec in specs:
        engine.start(spec)
    guard = bounded()
    while running or to_resume:
        next(guard)
        for gen_id in to_resume:
            engine.start(replace(by_id[gen_id], output_ids=run.outputs[gen_id]))
            running.add(gen_id)
        to_resume = []
        out = engine.step()
        assert not out.failed
        run.resumes += [info for gid, info in out.started.items() if run.outputs[gid]]
        for gen_id, tokens in out.new_tokens.items():
            assert gen_id in running, "a suspended generation produced tokens"
            run.outputs[gen_id] += tokens
            segment[gen_id] += len(tokens)
        for gen_id, reason in out.finished.items():
            run.finished[gen_id] = reason
            running.discard(gen_id)
            engine.release(gen_id)
        for gen_id in sorted(running):
            assert not every or segment[gen_id] <= every, "tokens past the boundary"
            if every and segment[gen_id] == every:
                engine.suspend(gen_id)
                running.discard(gen_id)
                to_resume.append(gen_id)
                segment[gen_id] = 0
    return run


def start_then_suspend(engine: VllmEngine, spec: GenerationSpec, tokens: int) -> list[int]:
    """Start ``spec``, step until it has ``tokens`` new tokens, suspend it; its tokens."""
    engine.start(spec)
    output: list[int] = []
    guard = bounded()
    while len(output) < tokens:
        next(guard)
        output += engine.step().new_tokens.get(spec.gen_id, [])
    engine.suspend(spec.gen_id)
    return output


def check_recompute_preemptions_are_reported(engine: VllmEngine, context_tokens: int) -> None:
    """Force ``engine.max_batch`` generations to ``context_tokens`` tokens each, more than the cache holds for all of
    them: vLLM must preempt some of them, and each preemption must be reported with at least its prompt recomputed."""
    prompt = engine.tokenizer.encode("Plan for the drone: find a cat, go to it and take a picture.")
    plan = engine.tokenizer.encode(PLAN * 40)[1:][: context_tokens - len(prompt)]  # forced: no early EOS
    count = engine.max_batch
    assert count * engine.blocks_for(len(prompt) + len(plan)) > engine.free_kv_blocks()
    for i in range(count):
        engine.start(GenerationSpec(f"grow{i}", [10 + i, *prompt[1:]], max_new_tokens=len(plan) + 1,
                                    forced_ids=plan))
    preempted: list[str] = []
    recomputed = 0
    finished: set[str] = set()
    guard = bounded()
    while len(finished) < count:
        next(guard)
        out = engine.step()
        assert not out.failed, out.failed
        preempted += out.preempted
        recomputed += out.recomputed_tokens
        finished |= set(out.finished)
    for gen_id in finished:
        engine.release(gen_id)
    assert preempted and set(preempted) <= {f"grow{i}" for i in range(count)}
    assert recomputed >= len(preempted) * len(prompt)  # each held at least its prompt


def vllm_request(engine: VllmEngine, gen_id: str) -> Any:
    """vLLM's own request object behind ``gen_id``'s live request."""
    request = engine._requests.live_request(gen_id)
    assert request is not None, f"{gen_id} has no live request"
    return request


@pytest.fixture(scope="module")
def prompts(engine: VllmEngine) -> list[list[int]]:
    return [corpus_prompt(engine, start, n) for start, n in [(0, 140), (40, 260), (90, 400)]]


def test_model_depends_on_more_than_the_last_token(engine: VllmEngine) -> None:
    # Otherwise a resume from a wrong KV cache could not change the output.
    tail = engine.tokenizer.encode(" Plan:")[1:]
    heads = ["Find a cat and go to it.", "Put the red_box on the tray."]
    specs = [
        GenerationSpec(f"ctx{i}", engine.tokenizer.encode(h) + tail, max_new_tokens=12) for i, h in enumerate(heads)
    ]
    run = drive(engine, specs)
    assert run.outputs["ctx0"] != run.outputs["ctx1"]


@pytest.mark.parametrize("every", [1, 3, 7])
def test_segmenting_does_not_change_greedy_output(engine: VllmEngine, prompts: list[list[int]], every: int) -> None:
    specs = [GenerationSpec(f"p{i}", p, max_new_tokens=30) for i, p in enumerate(prompts)]
    straight = drive(engine, specs)
    segmented = drive(engine, [replace(s, gen_id=f"{s.gen_id}-k{every}") for s in specs], every)
    for spec in specs:
        assert segmented.outputs[f"{spec.gen_id}-k{every}"] == straight.outputs[spec.gen_id]
    assert segmented.resumes, "no generation was resumed"


def test_every_resume_hits_the_prefix_cache(engine: VllmEngine, prompts: list[list[int]]) -> None:
    specs = [GenerationSpec(f"c{i}", p, max_new_tokens=40) for i, p in enumerate(prompts)]
    run = drive(engine, specs, every=5)
    assert len(run.resumes) >= len(specs) * 6
    for info in run.resumes:
        # vLLM recomputes the last context token, so only full blocks before it hit.
        full_blocks = (info.context_tokens - 1) // engine.block_size
        assert info.context_tokens > engine.block_size
        assert info.cached_tokens >= full_blocks * engine.block_size, info
        assert not info.evicted


def test_suspend_keeps_the_request_in_place_and_resume_prefills_nothing(
    engine: VllmEngine, prompts: list[list[int]]
) -> None:
    spec = GenerationSpec("inplace", prompts[1], max_new_tokens=12)
    straight = drive(engine, [replace(spec, gen_id="inplace-straight")])
    output = start_then_suspend(engine, spec, 5)
    request = vllm_request(engine, "inplace")
    computed = request.num_computed_tokens
    other = drive(engine, [GenerationSpec("meanwhile", prompts[0], max_new_tokens=6)])
    assert len(other.outputs["meanwhile"]) == 6
    assert request.num_computed_tokens == computed, "a paused request was scheduled"
    engine.start(replace(spec, output_ids=output))
    out = engine.step()
    assert vllm_request(engine, "inplace") is request
    assert request.num_computed_tokens == computed + 1, "the resume prefilled again"
    assert out.started["inplace"] == ResumeInfo(len(prompts[1]) + 5, len(prompts[1]) + 5, False)
    output += out.new_tokens["inplace"]
    guard = bounded()
    while "inplace" not in out.finished:
        next(guard)
        out = engine.step()
        output += out.new_tokens.get("inplace", [])
    engine.release("inplace")
    assert output == straight.outputs["inplace-straight"]


def test_crowded_out_pause_resumes_from_the_prefix_cache_at_an_exact_block_multiple(engine: VllmEngine) -> None:
    prompt = corpus_prompt(engine, 200, 2 * engine.block_size)[: 2 * engine.block_size - 4]
    edge = GenerationSpec("edge", prompt, max_new_tokens=8)
    straight = drive(engine, [replace(edge, gen_id="edge-straight")])
    output = start_then_suspend(engine, edge, 4)
    # Newcomers that fill vLLM's slots, those beyond the batch cap too, take the paused request's: it is aborted,
    # its full blocks cached.
    crowd = [GenerationSpec(f"crowd{i}", [20 + i, 30, 40], max_new_tokens=1)
             for i in range(engine.max_batch + PAUSED_SLOTS)]
    drive(engine, crowd)
    resumed = drive(engine, [replace(edge, output_ids=output)])
    info = resumed.resumes[0]
    assert info.context_tokens == 2 * engine.block_size
    assert info.cached_tokens == engine.block_size
    assert not info.evicted
    assert resumed.outputs["edge"] == straight.outputs["edge-straight"]


@pytest.mark.parametrize("every", [0, 4])
def test_forcing_reproduces_a_recorded_plan_then_eos(engine: VllmEngine, prompts: list[list[int]], every: int) -> None:
    tok = engine.tokenizer
    plans = {"drone": tok.encode(PLAN)[1:], "arm": tok.encode(ARM_PLAN)[1:]}
    specs = [
        GenerationSpec(f"force-{name}-{every}", prompts[0], max_new_tokens=64, forced_ids=ids)
        for name, ids in plans.items()
    ]
    free = GenerationSpec(f"free-{every}", prompts[1], max_new_tokens=20)
    run = drive(engine, [*specs, free], every)
    for spec in specs:
        assert run.outputs[spec.gen_id] == [*spec.forced_ids, tok.eos_token_id]
        assert run.finished[spec.gen_id] == "eos"
        assert tok.decode(run.outputs[spec.gen_id]) in (PLAN, ARM_PLAN)
    # Forcing one row of the batch leaves its neighbours' greedy choices alone.
    alone = drive(engine, [replace(free, gen_id=f"alone-{every}")])
    assert run.outputs[free.gen_id] == alone.outputs[f"alone-{every}"]


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ([5] * (MAX_MODEL_LEN + 10), "max_model_len"),
        ([], "empty prompt"),
        ([5, 10**6], "outside the vocabulary"),
    ],
)
def test_rejects_then_keeps_serving(
    engine: VllmEngine, prompts: list[list[int]], prompt: list[int], message: str
) -> None:
    with pytest.raises(EngineRejected, match=message):
        engine.start(GenerationSpec("bad", prompt))
    with pytest.raises(EngineRejected, match="outside the vocabulary"):
        engine.start(GenerationSpec("bad-plan", prompts[0], forced_ids=[5, -1]))
    run = drive(engine, [GenerationSpec("after-reject", prompts[0], max_new_tokens=5)])
    assert len(run.outputs["after-reject"]) == 5
    assert run.finished["after-reject"] == "length"


def test_free_kv_blocks_drop_while_running_and_recover_on_release(engine: VllmEngine, prompts: list[list[int]]) -> None:
    idle = engine.free_kv_blocks()
    plan = engine.tokenizer.encode(PLAN * 12)[1:]
    engine.start(GenerationSpec("long", prompts[2], max_new_tokens=len(plan) + 1, forced_ids=plan))
    generated = 0
    guard = bounded()
    while generated < engine.block_size + 10:
        next(guard)
        out = engine.step()
        generated += len(out.new_tokens.get("long", []))
        assert "long" not in out.finished
    held = engine.blocks_for(len(prompts[2]) + generated)
    assert engine.free_kv_blocks() <= idle - held
    engine.release("long")
    assert engine.free_kv_blocks() == idle


def test_resume_after_eviction_reports_it_and_recomputes(engine: VllmEngine, prompts: list[list[int]]) -> None:
    victim = GenerationSpec("victim", prompts[1], max_new_tokens=12)
    straight = drive(engine, [replace(victim, gen_id="victim-straight")])
    output = start_then_suspend(engine, victim, 6)
    # Distinct first tokens: no flood prompt shares a cached block with another.
    # Only full blocks stay cached; vLLM hands out partial ones again first. Each flood holds its blocks while it
    # decodes, so the memory runs out and those still waiting need the paused victim's: it is aborted and its
    # cached blocks reused.
    per_prompt = len(prompts[2]) // engine.block_size
    floods = [
        GenerationSpec(f"flood{i}", [10 + i, *prompts[2][1:]], max_new_tokens=48)
        for i in range(engine.free_kv_blocks() // per_prompt + 4)
    ]
    drive(engine, floods)
    resumed = drive(engine, [replace(victim, output_ids=output)])
    assert resumed.resumes[0].evicted
    assert resumed.resumes[0].cached_tokens < engine.block_size
    assert resumed.outputs["victim"] == straight.outputs["victim-straight"]
