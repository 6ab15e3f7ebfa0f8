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
                  context: int = 256) -> list[Sample]:
    """(prefills, decode contexts, seconds) for each measured step."""
    samples: list[Sample] = []
    vocab_floor = 10
    for i, n in enumerate(prefill_lengths):
        prompt = [vocab_floor + (i * 7919 + k) % 500 for k in range(n)]  # unique: no cache hits
        gen = f"prefill-{i}"
        engine.start(GenerationSpec(gen, prompt, max_new_tokens=1, forced_ids=[vocab_floor]))
        out = engine.step()
        samples.append(([(n, n)], [], out.duration))
        engine.release(gen)
    for b in batch_sizes:
        gens = [f"decode-{b}-{j}" for j in range(b)]
        for j, gen in enumerate(gens):
            prompt = [vocab_floor + (b * 131 + j * 17 + k) % 500 for k in range(context)]
            engine.start(GenerationSpec(gen, prompt, max_new_tokens=decode_steps + 1,
                                        forced_ids=[vocab_floor] * (decode_steps + 1)))
        engine.step()  # the batch's prefill
        for step in range(decode_steps):
            out = engine.step()
            samples.append(([], [context + step + 1] * b, out.duration))
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
