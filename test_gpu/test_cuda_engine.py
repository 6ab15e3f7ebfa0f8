"""The embedded engine on vLLM's CUDA build: SmolLM2 in bfloat16 and float16 generating plans in the robot's
grammar, segmented generation equal to straight generation token for token, resumes served from the prefix
cache, KV offloading to host memory, and tensor parallel across GPUs."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from test_vllm_engine import drive

from timely_llm.engines.base import GenerationSpec
from timely_llm.engines.vllm_engine import VllmEngine
from timely_llm.plan.grammar import plan_grammar
from timely_llm.plan.robot_file import load_skill_models
from timely_llm.planning import generate_plan, task_prompt
from timely_llm.traces import load_catalog

pytestmark = pytest.mark.gpu

TELLO = load_skill_models()["tello"]
CATALOG = load_catalog()
TASK = "Scene: [], Task: [A] Could you find the cat? If so, go to it."
MAX_TOKENS = 48
SHARE = {"gpu_memory_utilization": 0.3}
"""Each engine claims this fraction of the GPU at start-up, so one test's engine may start beside the module's."""


@pytest.fixture(scope="module", params=["bfloat16", "float16"])
def engine(request: pytest.FixtureRequest) -> Iterator[VllmEngine]:
    eng = VllmEngine("smollm2", kv_cache_gib=2.0, max_model_len=2048, max_batch=64, dtype=request.param, **SHARE)
    yield eng
    eng.close()


def test_the_engine_runs_on_the_gpu_in_the_dtype_asked(engine: VllmEngine) -> None:
    import torch
    from vllm.platforms import current_platform

    assert current_platform.is_cuda() and torch.cuda.is_available()
    assert str(engine._engine.model_config.dtype).removeprefix("torch.") in ("bfloat16", "float16")
    assert engine.max_batch == 64


def test_a_generated_plan_is_grammatical_and_segmented_equals_straight(engine: VllmEngine) -> None:
    straight = generate_plan(engine, TELLO, TASK, segmented=False, max_new_tokens=MAX_TOKENS)
    segmented = generate_plan(engine, TELLO, TASK, segmented=True, max_new_tokens=MAX_TOKENS)
    assert segmented.status == "succeeded", segmented.reason
    assert plan_grammar(TELLO).accepts(segmented.text), segmented.text
    assert segmented.output_ids == straight.output_ids
    assert len(segmented.segments) > 1, segmented.text


def test_resumes_hit_the_prefix_cache(engine: VllmEngine) -> None:
    prompt = engine.tokenizer.encode(task_prompt(CATALOG, "tello", TASK))
    spec = GenerationSpec("resumed", prompt, max_new_tokens=24, forced_ids=engine.tokenizer.encode(
        "s('cat');?iv('cat')==True{g('cat');tp};tc(90);")[1:24])
    run = drive(engine, [spec], every=6)
    assert run.resumes
    for info in run.resumes:
        full_blocks = (info.context_tokens - 1) // engine.block_size * engine.block_size
        assert info.cached_tokens == full_blocks and not info.evicted, info


def test_kv_offloading_serves_the_same_plan() -> None:
    plain = VllmEngine("smollm2", kv_cache_gib=1.0, max_model_len=2048, dtype="bfloat16", **SHARE)
    try:
        expected = generate_plan(plain, TELLO, TASK, max_new_tokens=MAX_TOKENS).output_ids
    finally:
        plain.close()
    offloading = VllmEngine("smollm2", kv_cache_gib=1.0, kv_offloading_gib=2.0, max_model_len=2048,
                            dtype="bfloat16", **SHARE)
    try:
        plan = generate_plan(offloading, TELLO, TASK, segmented=True, max_new_tokens=MAX_TOKENS)
    finally:
        offloading.close()
    assert plan.status == "succeeded" and plan.output_ids == expected


@pytest.mark.multi_gpu
def test_tensor_parallel_over_two_gpus_segments_and_resumes_from_the_cache() -> None:
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "0,1")
    eng = VllmEngine("smollm2", kv_cache_gib=1.0, max_model_len=2048, dtype="bfloat16", tensor_parallel_size=2,
                     distributed_executor_backend="mp", **SHARE)
    try:
        assert eng._core.executor_name() == "MultiprocExecutor"
        straight = generate_plan(eng, TELLO, TASK, segmented=False, max_new_tokens=MAX_TOKENS)
        segmented = generate_plan(eng, TELLO, TASK, segmented=True, max_new_tokens=MAX_TOKENS)
        assert segmented.output_ids == straight.output_ids and segmented.status == "succeeded"
        assert eng.free_kv_blocks() > 0
    finally:
        eng.close()
