"""The Engine contract (engines/base.py), checked the same way on the simulator, on embedded vLLM and on the
remote engine over a real ``vllm serve``."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace

import pytest

from timely_llm.engines.base import Engine, EngineRejected, GenerationSpec, StepOutput
from timely_llm.engines.hardware import load_profile
from timely_llm.engines.remote import RemoteEngine
from timely_llm.engines.sim import SimEngine

VLLM_MAX_BATCH = 8
REMOTE_PATIENCE_S = 300.0
"""How long a step on the remote engine may wait for its server (a loaded 2-core CPU may give 1 token/s)."""


@pytest.fixture(scope="module", params=["sim", "sim-in-place", pytest.param("vllm", marks=pytest.mark.vllm),
                                        pytest.param("remote", marks=pytest.mark.remote)])
def engine(request: pytest.FixtureRequest) -> Iterator[Engine]:
    if request.param.startswith("sim"):
        yield SimEngine(load_profile("rtx4090-llama3-8b"), suspends_in_place=request.param == "sim-in-place")
        return
    if request.param == "remote":
        from remote_servers import settings

        eng = RemoteEngine(settings(request.getfixturevalue("vllm_serve").url))
        yield eng
        eng.close()
        return
    from timely_llm.engines.vllm_engine import VllmEngine

    eng = VllmEngine(max_model_len=512, kv_cache_gib=0.02, max_batch=VLLM_MAX_BATCH)
    yield eng
    eng.close()


def spec(engine: Engine, gen_id: str, plan_tokens: int = 8) -> GenerationSpec:
    """A forced plan of ``plan_tokens`` tokens (the simulator and vLLM replay it exactly); on the remote engine,
    which cannot force, the model's own greedy continuation of that plan, ``plan_tokens`` long."""
    prompt = engine.tokenizer.encode(f"plan for {gen_id}:")
    plan = engine.tokenizer.encode("mf(100);tc(90);" * 4)[-plan_tokens:]
    if isinstance(engine, RemoteEngine):
        return GenerationSpec(gen_id, prompt + plan, max_new_tokens=plan_tokens)
    return GenerationSpec(gen_id, prompt, max_new_tokens=plan_tokens + 1, forced_ids=plan)


def step(engine: Engine) -> StepOutput:
    """One engine step. The remote engine's step returns after a few ms with nothing while its server computes:
    there, steps until something arrives, so the step counts below bound the same work on every engine."""
    out = engine.step()
    deadline = time.monotonic() + REMOTE_PATIENCE_S
    while isinstance(engine, RemoteEngine) and not (out.new_tokens or out.finished or out.failed):
        assert time.monotonic() < deadline, f"nothing from the server in {REMOTE_PATIENCE_S} s"
        out = engine.step()
    return out


def step_until_output(engine: Engine, gen_id: str) -> None:
    for _ in range(50):
        out = step(engine)
        if out.new_tokens.get(gen_id) or gen_id in out.finished:
            return
    raise AssertionError(f"{gen_id} produced nothing in 50 steps")


def run_to_end(engine: Engine, gen_id: str) -> str:
    for _ in range(100):
        out = step(engine)
        assert gen_id not in out.failed, out.failed
        if gen_id in out.finished:
            return out.finished[gen_id]
    raise AssertionError(f"{gen_id} did not finish in 100 steps")


def test_unknown_ids_raise_key_error(engine: Engine) -> None:
    with pytest.raises(KeyError):
        engine.suspend("never-started")
    with pytest.raises(KeyError):
        engine.release("never-started")


def test_starting_a_running_generation_is_rejected_and_it_keeps_running(engine: Engine) -> None:
    engine.start(spec(engine, "twice"))
    with pytest.raises(EngineRejected):
        engine.start(spec(engine, "twice"))
    assert run_to_end(engine, "twice") in ("eos", "length")
    engine.release("twice")


def test_an_empty_prompt_is_rejected(engine: Engine) -> None:
    with pytest.raises(EngineRejected):
        engine.start(GenerationSpec("empty", [], forced_ids=[5]))
    with pytest.raises(KeyError):  # a rejected start leaves nothing behind
        engine.release("empty")


def test_suspend_applies_to_running_generations_and_release_to_known_ones(engine: Engine) -> None:
    engine.start(spec(engine, "life"))
    step_until_output(engine, "life")
    engine.suspend("life")
    with pytest.raises(KeyError):  # suspended: not running any more
        engine.suspend("life")
    engine.release("life")  # a suspended generation is still known
    with pytest.raises(KeyError):
        engine.release("life")


def test_a_generation_the_engine_ended_can_be_released_once(engine: Engine) -> None:
    engine.start(spec(engine, "ends"))
    run_to_end(engine, "ends")
    engine.release("ends")
    with pytest.raises(KeyError):
        engine.release("ends")


def test_released_ids_can_start_again(engine: Engine) -> None:
    engine.start(spec(engine, "again"))
    engine.release("again")
    engine.start(spec(engine, "again"))
    assert run_to_end(engine, "again") in ("eos", "length")
    engine.release("again")


def test_batch_cap_is_declared(engine: Engine) -> None:
    expected = None if isinstance(engine, SimEngine) else VLLM_MAX_BATCH  # remote: the servers' cap (8)
    assert engine.max_batch == expected


def collect(engine: Engine, gen_id: str, until: int = 1000) -> tuple[list[int], bool]:
    """Step until ``gen_id`` has ``until`` new tokens or ends; its tokens and whether it ended."""
    tokens: list[int] = []
    for _ in range(100):
        out = step(engine)
        tokens += out.new_tokens.get(gen_id, [])
        if gen_id in out.finished:
            return tokens, True
        if len(tokens) >= until:
            return tokens, False
    raise AssertionError(f"{gen_id} did not get {until} tokens or end in 100 steps")


def test_a_suspended_generation_resumes_where_it_was_and_its_memory_counts_as_free(engine: Engine) -> None:
    straight = spec(engine, "straight", plan_tokens=12)
    engine.start(straight)
    expected, _ = collect(engine, "straight")
    engine.release("straight")
    idle = engine.free_kv_blocks()
    paused = replace(straight, gen_id="paused")
    engine.start(paused)
    output, ended = collect(engine, "paused", until=4)
    assert not ended
    engine.suspend("paused")
    assert engine.free_kv_blocks() == idle  # a newcomer may have its blocks
    engine.start(replace(paused, output_ids=output))
    rest, _ = collect(engine, "paused")
    engine.release("paused")
    assert output + rest == expected


def test_kv_after_foretells_the_free_memory_of_suspends_and_resumes(engine: Engine) -> None:
    """What the scheduler counts on while it decides: ``kv_after`` says what ``free_kv_blocks`` will say."""
    outputs: dict[str, list[int]] = {gen_id: [] for gen_id in ("fore-a", "fore-b", "fore-c")}
    for gen_id in outputs:
        engine.start(spec(engine, gen_id, plan_tokens=12))
    for _ in range(100):
        for gen_id, tokens in step(engine).new_tokens.items():
            outputs[gen_id] += tokens
        if min(map(len, outputs.values())) >= 4:
            break
    assert min(map(len, outputs.values())) < 12  # all three still running
    assert engine.kv_after([], []).free_blocks == engine.free_kv_blocks()
    both = engine.kv_after(["fore-a", "fore-b"], [])
    engine.suspend("fore-a")
    engine.suspend("fore-b")
    assert engine.free_kv_blocks() == both.free_blocks
    resumed = engine.kv_after([], ["fore-a"])
    engine.start(replace(spec(engine, "fore-a", plan_tokens=12), output_ids=outputs["fore-a"]))
    assert engine.free_kv_blocks() == resumed.free_blocks
    for gen_id in ("fore-a", "fore-b", "fore-c"):
        engine.release(gen_id)
