"""Fit the simulator's hardware profile to a real engine's measured step times.

Runs prefill-only steps of several lengths and decode steps at several batch sizes and
contexts on the engine, then solves the step-time model of ``engines/hardware.py`` by
non-negative least squares (TimeBill §4.2 fits its estimator the same way).
"""

from __future__ import annotations

import numpy as np

from timely_llm.engines.base import Engine, GenerationSpec
from timely_llm.engines.hardware import MEMORY_TERMS, STEP_TERMS, HardwareProfile

Sample = tuple[list[tuple[int, int]], list[int], float]


def measure_steps(engine: Engine, prefill_lengths: list[int], batch_sizes: list[int], decode_steps: int = 6,
                  contexts: tuple[int, ...] = (256,)) -> list[Sample]:
    """(prefills, decode contexts, seconds) for each measured step.

    Decode steps are timed once every generation of the batch has its first token: a batch's
    prefill can take several steps (vLLM's chunked prefill caps the tokens of a step), and a step
    still prefilling is not a decode step. A batch whose contexts do not fit the free KV cache
    is left out.
    """
    samples: list[Sample] = []
    vocab_floor = 10
    for i, n in enumerate(prefill_lengths):
        prompt = [vocab_floor + (i * 7919 + k) % 500 for k in range(n)]  # unique: no cache hits
        gen = f"prefill-{i}"
        engine.start(GenerationSpec(gen, prompt, max_new_tokens=1, forced_ids=[vocab_floor]))
        out = engine.step()
        samples.append(([(n, n)], [], out.duration))
        engine.release(gen)
    for context in contexts:
        for b in batch_sizes:
            if b * engine.blocks_for(context + decode_steps + 2) > engine.free_kv_blocks():
                continue
            samples += _decode_samples(engine, b, context, decode_steps, vocab_floor)
    return samples


def _decode_samples(engine: Engine, batch: int, context: int, decode_steps: int, vocab_floor: int) -> list[Sample]:
    gens = [f"decode-{batch}-{context}-{j}" for j in range(batch)]
    budget = decode_steps + 64  # the prefill steps give tokens too
    for j, gen in enumerate(gens):
        prompt = [vocab_floor + (batch * 131 + j * 17 + context + k) % 500 for k in range(context)]
        engine.start(GenerationSpec(gen, prompt, max_new_tokens=budget, forced_ids=[vocab_floor] * budget))
    produced = {gen: 0 for gen in gens}
    while min(produced.values()) == 0:  # the batch's prefill
        for gen, ids in engine.step().new_tokens.items():
            produced[gen] += len(ids)
    samples = []
    for _ in range(decode_steps):
        out = engine.step()
        for gen, ids in out.new_tokens.items():
            produced[gen] += len(ids)
        samples.append(([], [context + produced[g] for g in gens], out.duration))
    for gen in gens:
        engine.release(gen)
    return samples


def fit_profile(samples: list[Sample], name: str, memory: dict[str, float], max_model_len: int) -> HardwareProfile:
    rows = [_features(prefills, decodes) for prefills, decodes, _ in samples]
    times = np.array([t for _, _, t in samples])
    coef = _nnls(np.array(rows), times)
    return HardwareProfile(name, dict(zip(STEP_TERMS, map(float, coef), strict=True)),
                           {k: float(memory[k]) for k in MEMORY_TERMS}, max_model_len)


def _features(prefills: list[tuple[int, int]], decodes: list[int]) -> list[float]:
    return [1.0, sum(n for n, _ in prefills), sum(n * c for n, c in prefills), len(decodes), sum(decodes),
            1.0 if prefills else 0.0]


def _nnls(a: np.ndarray, b: np.ndarray, iterations: int = 50) -> np.ndarray:
    """Least squares with coefficients kept >= 0 (a time model has no negative costs)."""
    active = np.ones(a.shape[1], dtype=bool)
    coef = np.zeros(a.shape[1])
    for _ in range(iterations):
        sol, *_ = np.linalg.lstsq(a[:, active], b, rcond=None)
        coef[:] = 0
        coef[active] = sol
        if (sol >= 0).all():
            return coef
        active[np.flatnonzero(active)[sol < 0]] = False
    return coef
