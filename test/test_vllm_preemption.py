"""vLLM's own recompute preemptions, as the engine reports them (alone in its module: its own small engine)."""

import pytest
from test_vllm_engine import check_recompute_preemptions_are_reported

from timely_llm.engines.vllm_engine import VllmEngine

pytestmark = pytest.mark.vllm


def test_vllm_recompute_preemptions_are_reported() -> None:
    # A cache of 2 MiB: 8 generations growing to 400 tokens outgrow it.
    engine = VllmEngine(max_model_len=1024, kv_cache_gib=0.002, max_batch=8)
    try:
        check_recompute_preemptions_are_reported(engine, 400)
    finally:
        engine.close()
