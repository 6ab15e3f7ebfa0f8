"""Segmented-generation overhead on the embedded vLLM engine (Table 4 analog).

Generates the same forced plan straight through and suspended/resumed at each
segment boundary, and compares a resume that hits the prefix cache with a full
re-prefill of a context of the same length.

    python -m timely_llm.evaluation.segment_overhead [--model DIR] [--prompt-tokens N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import replace

from timely_llm.engines.base import Engine, GenerationSpec
from timely_llm.models import CORPUS

DEFAULT_PLAN = "s('cat');?iv('cat')==True{g('cat');tp};tc(90);mf(100);tu(45);mf(50);tp;"


def measure(
    engine: Engine,
    prompt_ids: list[int],
    plan_ids: list[int],
    boundaries: list[int],
    repeats: int = 20,
) -> dict:
    """Time the plan straight vs. segmented at ``boundaries`` (token counts).

    Times are medians over ``repeats``; the overhead is the median paired difference.
    """
    spec = GenerationSpec("bench", prompt_ids, max_new_tokens=len(plan_ids) + 1, forced_ids=plan_ids)
    _generate(engine, spec, boundaries)  # warm-up; also caches the prompt
    # Interleaved pairs, so drift in machine load hits both sides alike.
    pairs = [(_generate(engine, spec, []), _generate(engine, spec, boundaries)) for _ in range(repeats)]
    straight = statistics.median(a for a, _ in pairs)
    segmented = statistics.median(b for _, b in pairs)
    overhead = statistics.median(b - a for a, b in pairs)
    return {
        "prompt_tokens": len(prompt_ids),
        "plan_tokens": len(plan_ids),
        "segments": len(boundaries) + 1,
        "straight_ms": straight * 1e3,
        "segmented_ms": segmented * 1e3,
        "overhead_ms": overhead * 1e3,
        "overhead_pct": 100 * overhead / straight,
        "resume_context_tokens": len(prompt_ids) + boundaries[-1],
        **_resume_costs(engine, spec, boundaries[-1], repeats),
    }


def _generate(engine: Engine, spec: GenerationSpec, boundaries: list[int]) -> float:
    """Wall seconds to generate ``spec`` to the end, suspending at ``boundaries``."""
    began = time.perf_counter()
    output: list[int] = []
    engine.start(spec)
    while True:
        out = engine.step()
        output += out.new_tokens.get(spec.gen_id, [])
        if spec.gen_id in out.finished or spec.gen_id in out.failed:
            break
        if len(output) in boundaries:
            engine.suspend(spec.gen_id)
            engine.start(replace(spec, output_ids=output))
    engine.release(spec.gen_id)
    return time.perf_counter() - began


def _resume_costs(engine: Engine, spec: GenerationSpec, at: int, repeats: int) -> dict[str, float]:
    """Resume at ``at`` generated tokens, to its first token: with the context
    cached, and with the cache defeated by a first token not used before."""
    resume = replace(spec, output_ids=spec.forced_ids[:at], max_new_tokens=at + 1)
    firsts = [t for t in dict.fromkeys(spec.prompt_ids) if t != spec.prompt_ids[0]]
    runs: dict[str, list[tuple[float, int]]] = {"cached": [], "reprefill": []}
    for first in firsts[:repeats]:
        runs["cached"].append(_first_token(engine, resume))
        defeated = replace(resume, prompt_ids=[first, *spec.prompt_ids[1:]])
        runs["reprefill"].append(_first_token(engine, defeated))
    result = {}
    for kind, samples in runs.items():
        result[f"resume_{kind}_ms"] = statistics.median(s for s, _ in samples) * 1e3
        result[f"resume_{kind}_hit_tokens"] = min(c for _, c in samples)
    return result


def _first_token(engine: Engine, spec: GenerationSpec) -> tuple[float, int]:
    """Seconds from start to the first new token, and the cached token count."""
    began = time.perf_counter()
    engine.start(spec)
    while not (out := engine.step()).new_tokens.get(spec.gen_id):
        pass
    elapsed = time.perf_counter() - began
    engine.release(spec.gen_id)
    return elapsed, out.started[spec.gen_id].cached_tokens


def segment_boundaries(engine: Engine, plan_ids: list[int]) -> list[int]:
    """Token counts after each statement-ending token of the plan, last excluded."""
    ends = [i + 1 for i, t in enumerate(plan_ids) if engine.tokenizer.decode([t]).endswith(";")]
    return [e for e in ends if e < len(plan_ids)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="HF model directory (default: the tiny model)")
    parser.add_argument("--prompt-tokens", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--kv-cache-gib", type=float, default=1.0)
    parser.add_argument("--plan", default=DEFAULT_PLAN)
    args = parser.parse_args()

    from timely_llm.engines.vllm_engine import VllmEngine

    engine = VllmEngine(
        args.model,
        max_model_len=args.prompt_tokens + 512,
        kv_cache_gib=args.kv_cache_gib,
    )
    tok = engine.tokenizer
    # ~3 characters per token; cutting the text first keeps the tokenizer quiet.
    prompt = tok.encode(CORPUS.read_text()[: 6 * args.prompt_tokens])[: args.prompt_tokens]
    plan = tok.encode(args.plan)
    if not tok.decode(plan[:1]):  # a leading special token (BOS) is no part of a plan
        plan = plan[1:]
    result = measure(engine, prompt, plan, segment_boundaries(engine, plan), args.repeats)
    print(json.dumps(result, indent=2))
    engine.close()


if __name__ == "__main__":
    main()
