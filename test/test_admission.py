"""Memory-safe admission (Amin) and deferred prefill (K*): the pure rules, and their effect on the simulator."""

from timely_llm.engines.base import GenerationSpec
from timely_llm.engines.hardware import load_profile
from timely_llm.engines.sim import SimEngine


def tiny_card(num_blocks: int):
    profile = load_profile("rtx4090-llama3-8b")
    memory = {**profile.memory, "total_gib": 16 + 1.5 + num_blocks * 16 * 131072 / 2**30}
    object.__setattr__(profile, "memory", memory)
    assert profile.num_kv_blocks == num_blocks
    return profile


def test_simulator_reports_its_preemptions_and_the_tokens_it_recomputes():
    engine = SimEngine(tiny_card(12))
    for i in range(3):  # 3 x 64 tokens = 12 full blocks: the next token needs a 13th
        engine.start(GenerationSpec(f"g{i}", [500 + i] + list(range(63)), max_new_tokens=20,
                                    forced_ids=list(range(7000, 7020))))
    first = engine.step()
    assert first.preempted == [] and first.recomputed_tokens == 0
    second = engine.step()
    assert second.preempted == ["g2"]  # the latest started, as vLLM
    engine.release("g1")  # room again: g2 is prefilled anew
    third = engine.step()
    assert "g2" in third.started
    info = third.started["g2"]
    assert third.recomputed_tokens == info.context_tokens - info.cached_tokens > 0
