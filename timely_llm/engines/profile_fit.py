"""Fit the simulator's hardware profile to a real engine's measured step times.

Runs prefill-only steps of several lengths and decode steps at several batch sizes and
contexts on the engine, then solves the step-time model of ``engines/hardware.py`` by
non-negative least squares (TimeBill §4.2 fits its estimator the same way).
"""

from __future__ import annotations

import numpy as np

from timely_llm.engines.base import Engine, GenerationSpec
from timely_llm.engines.hardware import MEMORY_TERMS, STEP_TERMS, HardwareProfile

Sample = tuple[list[tuple[int, int]], list[int], int, float]
"""A measured step: (prefills as (new tokens, context), decode contexts, decode context tokens reread from blocks
another decoding generation holds too, seconds)."""

VOCAB_FLOOR = 10
CACHED_PREFILLS = (16, 64)
"""New tokens of the prefills measured on top of a cached prefix (a robot's task after its cached prompt)."""
BURST_STARTS = 4
"""Generations started together in a measured step, each with the ``CACHED_PREFILLS`` new tokens after the same cached
prefix: a burst of robots' tasks, the steps an urgent robot's first action waits on, weighed in the fit beside the
long fresh prefills."""


def measure_steps(engine: Engine, prefill_lengths: list[int], batch_sizes: list[int], decode_steps: int = 6,
                  contexts: tuple[int, ...] = (256,)) -> list[Sample]:
    """The measured steps: prefills of ``prefill_lengths`` fresh tokens, prefills of ``CACHED_PREFILLS`` new
    tokens after each of ``contexts`` cached, alone and ``BURST_STARTS`` at once, and decode steps at each batch
    size and context, once with prompts of their own and once sharing all but their last 64 tokens (a fleet's
    robot prompt).

    Decode steps are timed once every generation of the batch has its first token: a batch's
    prefill can take several steps (vLLM's chunked prefill caps the tokens of a step), and a step
    still prefilling is not a decode step. A batch whose contexts do not fit the free KV cache
    is left out.
    """
    samples: list[Sample] = []
    for i, n in enumerate(prefill_lengths):
        samples.append(_prefill_sample(engine, f"prefill-{i}", [_tokens(i * 7919, n)], 0))
    for context in contexts:
        prefix = _tokens(context * 3, _whole_blocks(engine, context))
        samples.append(_prefill_sample(engine, f"warm-{context}", [prefix], 0))  # cached from here on
        for starts in (1, BURST_STARTS):
            for n in CACHED_PREFILLS:
                tails = [_tokens(n * 31 + starts * 1009 + j * 101, n) for j in range(starts)]  # none cached
                samples.append(_prefill_sample(engine, f"cached-{context}-{n}-{starts}", [prefix + t for t in tails],
                                               len(prefix)))
        for b in batch_sizes:
            if b * engine.blocks_for(context + decode_steps + 2) > engine.free_kv_blocks():
                continue
            samples += _decode_samples(engine, b, context, decode_steps, shared=0)
            if b > 1:
                samples += _decode_samples(engine, b, context, decode_steps, shared=_whole_blocks(engine, context - 64))
    return samples


def _tokens(seed: int, n: int) -> list[int]:
    return [VOCAB_FLOOR + (seed + k) % 500 for k in range(n)]


def _whole_blocks(engine: Engine, tokens: int) -> int:
    return max(tokens // engine.block_size, 1) * engine.block_size


def _prefill_sample(engine: Engine, gen: str, prompts: list[list[int]], cached: int) -> Sample:
    """One step prefilling ``prompts`` together, the first ``cached`` tokens of each in the prefix cache."""
    gens = [f"{gen}-{j}" for j in range(len(prompts))]
    for g, prompt in zip(gens, prompts, strict=True):
        engine.start(GenerationSpec(g, prompt, max_new_tokens=1, forced_ids=[VOCAB_FLOOR]))
    out = engine.step()
    for g in gens:
        engine.release(g)
    if len(out.new_tokens) != len(gens):
        raise RuntimeError(f"{len(out.new_tokens)} of {len(gens)} prefills ended in one step: give the engine a batch "
                           "cap and a step token budget that hold them")
    return [(len(p) - cached, len(p)) for p in prompts], [], 0, out.duration


def _decode_samples(engine: Engine, batch: int, context: int, decode_steps: int, shared: int) -> list[Sample]:
    """Decode steps of ``batch`` generations of ``context`` prompt tokens, the first ``shared`` the same for all."""
    gens = [f"decode-{batch}-{context}-{shared}-{j}" for j in range(batch)]
    budget = decode_steps + 64  # the prefill steps give tokens too
    common = _tokens(batch * 131 + context, shared)
    for j, gen in enumerate(gens):
        prompt = common + _tokens(batch * 131 + j * 17 + context + 1, context - shared)
        engine.start(GenerationSpec(gen, prompt, max_new_tokens=budget, forced_ids=[VOCAB_FLOOR] * budget))
    produced = {gen: 0 for gen in gens}
    while min(produced.values()) == 0:  # the batch's prefill
        for gen, ids in engine.step().new_tokens.items():
            produced[gen] += len(ids)
    samples: list[Sample] = []
    for _ in range(decode_steps):
        out = engine.step()
        for gen, ids in out.new_tokens.items():
            produced[gen] += len(ids)
        samples.append(([], [context + produced[g] for g in gens], (batch - 1) * shared, out.duration))
    for gen in gens:
        engine.release(gen)
    return samples


def fit_profile(samples: list[Sample], name: str, memory: dict[str, float], max_model_len: int,
                relative: bool = False) -> HardwareProfile:
    """Without a step that rereads shared KV the fit cannot tell ``per_kv_reread``: it is ``per_kv_token``.
    ``relative``: least squares of the relative errors, so that a few steps of tens of ms weigh as much as a few of
    seconds (a server's profile has a dozen samples, not hundreds)."""
    rows = np.array([_features(prefills, decodes, reread) for prefills, decodes, reread, _ in samples])
    times = np.array([t for *_, t in samples])
    if relative:
        rows, times = rows / times[:, None], np.ones_like(times)
    rereads = bool(rows[:, -1].any())
    coef = _nnls(rows if rereads else rows[:, :-1], times)
    step = dict(zip(STEP_TERMS, map(float, coef), strict=False))
    step.setdefault("per_kv_reread", step["per_kv_token"])
    return HardwareProfile(name, step, {k: float(memory[k]) for k in MEMORY_TERMS}, max_model_len)


def _features(prefills: list[tuple[int, int]], decodes: list[int], reread: int) -> list[float]:
    """The step's quantities in ``STEP_TERMS`` order."""
    return [1.0, sum(n for n, _ in prefills), sum(n * c for n, c in prefills), len(decodes), sum(decodes) - reread,
            1.0 if prefills else 0.0, float(reread)]


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
