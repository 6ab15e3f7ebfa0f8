"""vLLM's own recompute preemptions, as the engine reports them (alone in its module: its own small engine)."""

import pytest
from guards import bounded

from timely_llm.engines.base import GenerationSpec
from timely_llm.engines.vllm_engine import VllmEngine

pytestmark = pytest.mark.vllm

PLAN = "s('cat');?iv('cat')==True{g('cat');tp};tc(90);mf(100);"


def test_vllm_recompute_preemptions_are_reported() -> None:
    # A cache of 2 MiB: 8 generations growing to 400 tokens outgrow it,
    # so vLLM preempts some and recomputes them later.
    engine = VllmEngine(max_model_len=1024, kv_cache_gib=0.002, max_batch=8)
    try:
        prompt = engine.tokenizer.encode("Plan for the drone: find a cat, go to it and take a picture.")
        plan = engine.tokenizer.encode(PLAN * 12)[1:][: 400 - len(prompt)]  # forced: no early EOS
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
            preempted += out.preempted
            recomputed += out.recomputed_tokens
            finished |= set(out.finished)
        assert preempted and set(preempted) <= {f"grow{i}" for i in range(count)}
        assert recomputed >= len(preempted) * len(prompt)  # each held at least its prompt
    finally:
        engine.close()
