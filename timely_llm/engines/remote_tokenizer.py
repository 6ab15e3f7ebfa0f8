"""The served model's tokenizer for the remote engine: its local files (``tokenizers``), or the server's
``/tokenize`` and ``/detokenize``. Neither imports vLLM, torch or transformers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

if TYPE_CHECKING:
    from tokenizers import Tokenizer


class LocalTokenizer:
    """A Hugging Face tokenizer directory (or its ``tokenizer.json``) read with the ``tokenizers`` library."""

    def __init__(self, path: str | Path) -> None:
        from tokenizers import Tokenizer

        path = Path(path)
        directory = path.parent if path.is_file() else path
        file = path if path.is_file() else path / "tokenizer.json"
        if not file.is_file():
            raise ValueError(f"remote.tokenizer: no tokenizer.json at {path}")
        self._tokenizer = Tokenizer.from_file(str(file))
        eos = _eos_id(directory, self._tokenizer)
        if eos is None:
            raise ValueError(f"remote.tokenizer: {directory} names no EOS token (tokenizer_config.json, config.json)")
        self.eos_token_id: int = eos

    def encode(self, text: str) -> list[int]:
        """Ids with the model's own special tokens (BOS), as the server would tokenize the text."""
        return list(self._tokenizer.encode(text).ids)

    def encode_continuation(self, text: str) -> list[int]:
        """Ids of ``text`` written after other tokens (an observation): no BOS."""
        return list(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=True)


class ServerTokenizer:
    """The server's own tokenizer over HTTP: a call per ``encode``/``decode`` (give ``remote.tokenizer`` to save
    them). The server's ``/detokenize`` keeps special tokens; the end tokens, the only ones a plan can hold, are
    left out here once the engine has seen them end a completion (``saw_end``)."""

    eos_token_id: int = -1

    def __init__(self, client: httpx.Client, url: str, model: str) -> None:
        self._client, self._url, self._model = client, url, model
        self._ends: set[int] = set()

    def encode(self, text: str) -> list[int]:
        return self._tokenize(text, special_tokens=True)

    def encode_continuation(self, text: str) -> list[int]:
        """Ids of ``text`` written after other tokens (an observation): no BOS."""
        return self._tokenize(text, special_tokens=False)

    def _tokenize(self, text: str, special_tokens: bool) -> list[int]:
        answer = self._post("/tokenize", {"model": self._model, "prompt": text,
                                          "add_special_tokens": special_tokens})
        tokens = answer.get("tokens")
        if not isinstance(tokens, list):
            raise ValueError(f"{self._url}/tokenize answered without tokens")
        return tokens

    def decode(self, ids: list[int]) -> str:
        ids = [t for t in ids if t not in self._ends]
        if not ids:
            return ""
        text = self._post("/detokenize", {"model": self._model, "tokens": ids}).get("prompt")
        if not isinstance(text, str):
            raise ValueError(f"{self._url}/detokenize answered without text")
        return text

    def saw_end(self, token_id: int) -> None:
        """``token_id`` ended a completion (the EOS, or one of the model's stop tokens)."""
        if not self._ends:
            self.eos_token_id = token_id
        self._ends.add(token_id)

    def _post(self, path: str, body: dict) -> dict:
        answer = self._client.post(f"{self._url}{path}", json=body)
        if answer.status_code != 200:
            raise ValueError(f"{self._url}{path}: HTTP {answer.status_code} {answer.text[:200]!r}")
        return answer.json()


def _eos_id(directory: Path, tokenizer: Tokenizer) -> int | None:
    """The EOS id the model's files name: ``tokenizer_config.json``'s token, else ``config.json``'s id."""
    config = _read(directory / "tokenizer_config.json")
    eos = config.get("eos_token")
    if isinstance(eos, dict):
        eos = eos.get("content")
    if isinstance(eos, str) and tokenizer.token_to_id(eos) is not None:
        return tokenizer.token_to_id(eos)
    for name in ("generation_config.json", "config.json"):
        eos_id = _read(directory / name).get("eos_token_id")
        if isinstance(eos_id, list) and eos_id:
            eos_id = eos_id[0]
        if isinstance(eos_id, int):
            return eos_id
    return None


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
