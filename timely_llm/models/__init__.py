"""A tiny Llama-shaped model directory that vLLM can load without downloading anything.

The tokenizer is a byte-level BPE trained on the shipped corpus of robot plans and
task prompts. The weights are seeded random values at initialisation scale, written
as safetensors. vLLM's ``load_format="dummy"`` is not used because it fills every
tensor, norms included, with values in +-1e-3. Attention then adds about 1e-5 of the
residual stream, so the next token depends only on the last one, and a resume from
a wrong KV cache would produce the same tokens as a correct one.
Weights and config are float32, which keeps greedy argmax choices identical between
prefill and decode kernels; vLLM must be asked for float32 explicitly on CPU.
The directory is built once into a cache keyed by its inputs and is deterministic.

The real default model, SmolLM2-135M-Instruct, is converted by ``smollm2.py``;
``resolve_model`` maps a model name (``smollm2``, ``tiny``), a directory or a Hugging Face id to what vLLM loads.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from timely_llm.models.cache import build_atomically, cache_root

if TYPE_CHECKING:
    from tokenizers import Tokenizer

CORPUS = Path(__file__).with_name("tiny_corpus.txt")
VOCAB_SIZE = 2000
BOS, EOS = "<s>", "</s>"
WEIGHT_SEED = 20240501

DEFAULT_MODEL = "smollm2"
"""What ``--model`` means when not given: the real instruction-tuned model."""
MODEL_NAMES = ("smollm2", "tiny")

# Llama shape without the tokenizer-dependent fields (vocab size, BOS/EOS ids).
_LLAMA_CONFIG = json.loads(Path(__file__).with_name("tiny").joinpath("config.json").read_text())


def tiny_model_dir() -> Path:
    """Return the tiny model directory, building it on first use."""
    corpus = CORPUS.read_bytes()
    # The builder's own source is part of the key: changing it rebuilds the model.
    inputs = json.dumps(_LLAMA_CONFIG, sort_keys=True).encode() + Path(__file__).read_bytes()
    key = hashlib.sha256(corpus + inputs)
    target = cache_root() / f"tiny-{key.hexdigest()[:12]}"
    if not (target / "config.json").exists():
        build_atomically(target, lambda directory: _write_model(directory, corpus.decode()))
    return target


def resolve_model(model: str | Path) -> tuple[str, str | None]:
    """(what vLLM loads, dtype) for a shipped model name, a model directory or a Hugging Face model id.

    Shipped models are float32: vLLM's CPU platform would otherwise downcast their weights to bfloat16.
    A Hub id must be cached or downloadable now (see ``hub.check_hub_model``); vLLM downloads it.
    """
    if model == "tiny":
        return str(tiny_model_dir()), "float32"
    if model == "smollm2":
        from timely_llm.models.smollm2 import smollm2_dir

        return str(smollm2_dir(cache_root())), "float32"
    path = Path(model)
    if (path / "config.json").is_file():
        return str(path), None
    from timely_llm.models.hub import check_hub_model, is_hub_id

    if is_hub_id(str(model)) and not path.exists():
        check_hub_model(str(model))
        return str(model), None
    raise ValueError(f"model {str(model)!r} is none of {MODEL_NAMES}, a model directory with config.json "
                     "or a Hugging Face model id (org/name)")


def _write_model(out: Path, corpus: str) -> None:
    from safetensors.numpy import save_file

    tok = train_tokenizer(corpus)
    tok.save(str(out / "tokenizer.json"))
    bos, eos = tok.token_to_id(BOS), tok.token_to_id(EOS)
    config = _LLAMA_CONFIG | {
        "vocab_size": tok.get_vocab_size(),
        "bos_token_id": bos,
        "eos_token_id": eos,
    }
    _write_json(out / "config.json", config)
    save_file(random_weights(config), str(out / "model.safetensors"))
    _write_json(out / "generation_config.json", {"bos_token_id": bos, "eos_token_id": eos})
    _write_json(
        out / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": BOS,
            "eos_token": EOS,
            "model_max_length": _LLAMA_CONFIG["max_position_embeddings"],
        },
    )


def train_tokenizer(corpus: str) -> Tokenizer:
    """Train the byte-level BPE on ``corpus``; prompts get a leading ``<s>``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus.splitlines(), trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(single=f"{BOS} $A", special_tokens=[(BOS, tok.token_to_id(BOS))])
    return tok


def random_weights(config: dict) -> dict[str, np.ndarray]:
    """Seeded Llama weights: unit norms, matrices with std 1/sqrt(fan_in)."""
    rng = np.random.default_rng(WEIGHT_SEED)
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    q_dim = config["num_attention_heads"] * config["head_dim"]
    kv_dim = config["num_key_value_heads"] * config["head_dim"]

    def matrix(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

    ones = np.ones(hidden, dtype=np.float32)
    weights = {
        "model.embed_tokens.weight": matrix(config["vocab_size"], hidden),
        "model.norm.weight": ones,
        "lm_head.weight": matrix(config["vocab_size"], hidden),
    }
    for i in range(config["num_hidden_layers"]):
        layer = f"model.layers.{i}"
        weights |= {
            f"{layer}.input_layernorm.weight": ones,
            f"{layer}.post_attention_layernorm.weight": ones,
            f"{layer}.self_attn.q_proj.weight": matrix(q_dim, hidden),
            f"{layer}.self_attn.k_proj.weight": matrix(kv_dim, hidden),
            f"{layer}.self_attn.v_proj.weight": matrix(kv_dim, hidden),
            f"{layer}.self_attn.o_proj.weight": matrix(hidden, q_dim),
            f"{layer}.mlp.gate_proj.weight": matrix(inter, hidden),
            f"{layer}.mlp.up_proj.weight": matrix(inter, hidden),
            f"{layer}.mlp.down_proj.weight": matrix(hidden, inter),
        }
    return weights


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
