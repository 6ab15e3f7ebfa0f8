"""A deterministic stand-in tokenizer for the simulator.

It splits text roughly as Llama-3's BPE does on plans and prompts: a word (with its
leading space) is one token, numbers split into runs of up to three digits, and
punctuation pairs such as ``('`` or ``==`` are one token. Ids are assigned on first
sight, so decoding is exact.
"""

from __future__ import annotations

import re

_PIECE = re.compile(r" ?[A-Za-z_]+| ?\d{1,3}| ?[^\w\s]{1,2}|\s+")


class SimTokenizer:
    eos_token_id = 0

    def __init__(self) -> None:
        self._ids: dict[str, int] = {"</s>": 0}
        self._pieces: list[str] = ["</s>"]

    def encode(self, text: str) -> list[int]:
        return [self._id(piece) for piece in _PIECE.findall(text)]

    def decode(self, ids: list[int]) -> str:
        return "".join(self._pieces[i] for i in ids if i != self.eos_token_id)

    def _id(self, piece: str) -> int:
        if piece not in self._ids:
            self._ids[piece] = len(self._pieces)
            self._pieces.append(piece)
        return self._ids[piece]
