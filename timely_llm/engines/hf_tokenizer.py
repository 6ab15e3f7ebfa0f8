"""A model's Hugging Face tokenizer behind the small ``Tokenizer`` protocol: embedded vLLM's, and the
simulator's for a profile measured on a model we ship (its token counts are the real engine's)."""

from __future__ import annotations

import functools
from typing import Any


class HfTokenizer:
    """A Hugging Face tokenizer behind the small ``Tokenizer`` protocol."""

    def __init__(self, hf: Any) -> None:
        self._hf = hf
        self.eos_token_id: int = hf.eos_token_id

    def encode(self, text: str) -> list[int]:
        """Ids for a prompt, with the model's own special tokens (BOS)."""
        return list(self._hf.encode(text))

    def encode_continuation(self, text: str) -> list[int]:
        """Ids of ``text`` written after other tokens (an observation): no BOS."""
        return list(self._hf.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        return self._hf.decode(ids, skip_special_tokens=True)


@functools.cache
def model_tokenizer(model: str) -> HfTokenizer:
    """The tokenizer of a shipped model (``MODEL_NAMES``), loaded once per process."""
    from transformers import AutoTokenizer

    from timely_llm.models import resolve_model

    return HfTokenizer(AutoTokenizer.from_pretrained(resolve_model(model)[0]))
