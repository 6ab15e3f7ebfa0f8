"""vLLM's own priority scheduling, reached through the embedded engine (the vllm-priority baseline)."""

from __future__ import annotations

import pytest

from timely_llm.engines.base import GenerationSpec
from timely_llm.engines.vllm_engine import VllmEngine

pytestmark = pytest.mark.vllm


def first_token_order(engine: VllmEngine, priorities: list[int]) -> list[str]:
    """Start one generation per priority, in list order, all before a step; the order they get tokens."""
    prompt = engine.tokenizer.encode("The robot checks the table and then")
    for i, priority in enumerate(priorities):
        engine.start(GenerationSpec(f"g{i}", prompt, max_new_tokens=3, priority=priority))
    order: list[str] = []
    for _ in range(60):
        out = engine.step()
        order += [g for g in out.new_tokens if g not in order]
        for gen_id in out.finished:
            engine.release(gen_id)
        if len(order) == len(priorities):
            break
    return order


def test_priority_argument_reaches_vllm_and_orders_its_waiting_queue():
    # One sequence at a time, and no slot beyond it: vLLM runs its waiting queue in its own order. Started 2, 1, 0,
    # the requests run lowest priority value first, i.e. against their arrival order.
    engine = VllmEngine(max_model_len=256, kv_cache_gib=0.02, max_batch=1, paused_slots=0,
                        scheduling_policy="priority")
    try:
        assert first_token_order(engine, [2, 1, 0]) == ["g2", "g1", "g0"]
    finally:
        engine.close()
