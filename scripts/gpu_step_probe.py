"""Times a Llama-3.1-8B-shaped decoder step on an NVIDIA GPU with PyTorch alone (random bf16 weights, no vLLM),
to hold a GPU hardware profile's step terms (timely_llm/hw/*.yaml) against a measurement.

Decode steps run as CUDA graphs, as vLLM runs them, at batch B over contexts of C tokens (the KV cache
preallocated, attention over it by PyTorch's scaled-dot-product kernel); prefills run eagerly, P fresh tokens
of one sequence. Least squares over each gives the profile's terms: a decode step = base + per_decode_seq * B +
per_kv_token * B * C, a prefill = base + per_prefill_token * P. vLLM's own kernels (paged attention, fused
norms) differ, so this bounds the terms' order, not their last digit.

Usage: python3 scripts/gpu_step_probe.py OUT.json     (about a minute on an H100)
"""

from __future__ import annotations

import json
import sys

import torch
import torch.nn.functional as F

LAYERS, HIDDEN, FFN, HEADS, KV_HEADS, HEAD_DIM = 32, 4096, 14336, 32, 8, 128
BATCHES, CONTEXTS, PREFILLS = (1, 8, 32, 64), (512, 1024, 2048), (128, 256, 512, 1024, 2048)


def weights(device: str) -> list[dict[str, torch.Tensor]]:
    def w(rows: int, cols: int) -> torch.Tensor:
        return torch.randn(rows, cols, device=device, dtype=torch.bfloat16) * 0.02

    return [{"qkv": w(HIDDEN, (HEADS + 2 * KV_HEADS) * HEAD_DIM), "o": w(HEADS * HEAD_DIM, HIDDEN),
             "up": w(HIDDEN, 2 * FFN), "down": w(FFN, HIDDEN)} for _ in range(LAYERS)]


def layer(x: torch.Tensor, lw: dict[str, torch.Tensor], k_cache: torch.Tensor, v_cache: torch.Tensor,
          start: int) -> torch.Tensor:
    """One decoder layer over x [B, T, H]; its K/V written into the caches at ``start`` and attended over."""
    b, t, _ = x.shape
    h = F.rms_norm(x, (HIDDEN,))
    q, k, v = (h @ lw["qkv"]).split([HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], dim=-1)
    q = q.view(b, t, HEADS, HEAD_DIM).transpose(1, 2)
    k_cache[:, :, start:start + t] = k.view(b, t, KV_HEADS, HEAD_DIM).transpose(1, 2)
    v_cache[:, :, start:start + t] = v.view(b, t, KV_HEADS, HEAD_DIM).transpose(1, 2)
    keys, values = k_cache[:, :, :start + t], v_cache[:, :, :start + t]
    a = F.scaled_dot_product_attention(q, keys, values, is_causal=t > 1, enable_gqa=True)
    x = x + a.transpose(1, 2).reshape(b, t, HEADS * HEAD_DIM) @ lw["o"]
    gate, up = (F.rms_norm(x, (HIDDEN,)) @ lw["up"]).chunk(2, dim=-1)
    return x + (F.silu(gate) * up) @ lw["down"]


def timed(fn, repeat: int = 10) -> float:  # noqa: ANN001 - a callable
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeat):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / repeat / 1000


def decode_step(ws: list, batch: int, context: int) -> float:
    caches = [(torch.zeros(batch, KV_HEADS, context + 1, HEAD_DIM, device="cuda", dtype=torch.bfloat16),
               torch.zeros(batch, KV_HEADS, context + 1, HEAD_DIM, device="cuda", dtype=torch.bfloat16))
              for _ in ws]
    x = torch.randn(batch, 1, HIDDEN, device="cuda", dtype=torch.bfloat16)

    def step() -> torch.Tensor:
        y = x
        for lw, (kc, vc) in zip(ws, caches, strict=True):
            y = layer(y, lw, kc, vc, context)
        return y

    step()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return timed(graph.replay)


def prefill(ws: list, tokens: int) -> float:
    caches = [(torch.zeros(1, KV_HEADS, tokens, HEAD_DIM, device="cuda", dtype=torch.bfloat16),
               torch.zeros(1, KV_HEADS, tokens, HEAD_DIM, device="cuda", dtype=torch.bfloat16)) for _ in ws]
    x = torch.randn(1, tokens, HIDDEN, device="cuda", dtype=torch.bfloat16)

    def run() -> None:
        y = x
        for lw, (kc, vc) in zip(ws, caches, strict=True):
            y = layer(y, lw, kc, vc, 0)

    return timed(run, repeat=5)


def fit(rows: list[list[float]], ys: list[float]) -> list[float]:
    solution = torch.linalg.lstsq(torch.tensor(rows, dtype=torch.float64), torch.tensor(ys, dtype=torch.float64))
    return solution.solution.tolist()


def main(out: str) -> None:
    torch.manual_seed(0)
    ws = weights("cuda")
    decodes = [{"batch": b, "context": c, "seconds": decode_step(ws, b, c)} for b in BATCHES for c in CONTEXTS]
    prefills = [{"tokens": p, "seconds": prefill(ws, p)} for p in PREFILLS]
    base, per_seq, per_kv = fit([[1.0, d["batch"], d["batch"] * d["context"]] for d in decodes],
                                [d["seconds"] for d in decodes])
    prefill_base, per_token = fit([[1.0, p["tokens"]] for p in prefills], [p["seconds"] for p in prefills])
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "decodes": decodes,
              "prefills": prefills, "fit": {"base": base, "per_decode_seq": per_seq, "per_kv_token": per_kv,
                                            "prefill_base": prefill_base, "per_prefill_token": per_token}}
    json.dump(result, open(out, "w"), indent=1)
    for d in decodes:
        print(f"decode batch {d['batch']:3d} context {d['context']:5d}: {d['seconds'] * 1e3:7.2f} ms")
    for p in prefills:
        print(f"prefill {p['tokens']:5d} tokens: {p['seconds'] * 1e3:7.2f} ms")
    print(json.dumps(result["fit"]))


if __name__ == "__main__":
    main(sys.argv[1])
