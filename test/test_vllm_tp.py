"""Tensor parallel through vLLM itself: ``tensor_parallel_size=2`` on the CPU build, two worker processes
(vLLM's multiprocessing executor) with the engine core, its scheduler and KV-cache manager, in this process.

vLLM's CPU build binds each worker's OpenMP threads to a NUMA node of its own unless told which CPUs to use
(vllm/utils/ompmultiprocessing.py); a machine with one NUMA node needs VLLM_CPU_OMP_THREADS_BIND, one CPU list
per worker.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from test_vllm_engine import check_recompute_preemptions_are_reported, corpus_prompt, drive

from timely_llm.engines.base import GenerationSpec
from timely_llm.engines.vllm_engine import VllmEngine

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def engine() -> Iterator[VllmEngine]:
    first, second = sorted(os.sched_getaffinity(0))[:2]
    with pytest.MonkeyPatch.context() as env:
        env.setenv("VLLM_CPU_OMP_THREADS_BIND", f"{first}|{second}")
        eng = VllmEngine(max_model_len=1024, kv_cache_gib=0.002, max_batch=8, tensor_parallel_size=2,
                         distributed_executor_backend="mp")
    yield eng
    eng.close()


def test_the_scheduler_stays_in_process_and_the_workers_do_not(engine: VllmEngine) -> None:
    assert engine._core.executor_name() == "MultiprocExecutor"
    assert engine._engine.vllm_config.parallel_config.tensor_parallel_size == 2
    assert engine.free_kv_blocks() > 0 and engine.max_batch == 8


def test_segmented_equals_straight_and_resumes_in_place(engine: VllmEngine) -> None:
    prompt = corpus_prompt(engine, 0, 100)
    straight = drive(engine, [GenerationSpec("straight", prompt, max_new_tokens=24)])
    segmented = drive(engine, [GenerationSpec("segmented", prompt, max_new_tokens=24)], every=6)
    assert segmented.outputs["segmented"] == straight.outputs["straight"]
    assert len(segmented.resumes) == 3
    for info in segmented.resumes:  # the workers kept the KV: nothing was prefilled again
        assert info.cached_tokens == info.context_tokens and not info.evicted, info


def test_vllm_recompute_preemptions_are_reported(engine: VllmEngine) -> None:
    check_recompute_preemptions_are_reported(engine, 700)  # the workers' 2 MiB cache outgrown
