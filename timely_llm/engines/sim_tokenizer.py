"""A deterministic stand-in tokenizer for the simulator.

It splits text roughly as Llama-3's BPE does on plans and prompts: a word (with its
leading space) is one token, numbers split into runs of up to three digits, and
punctuation pairs such as ``('`` or ``==`` are one token. Ids are assigned on first
sight, so decoding is exact, for up to MAX_VOCAB pieces of up to MAX_PIECE_CHARS
characters each; any other piece (a very long word, or any new one once the
vocabulary is full) gets one of HASHED_IDS ids from its hash and decodes as ``<unk>``.
So a server fed endless unique words holds a bounded vocabulary; text it must decode
(the recorded plans it replays) is encoded first (the node does at configure).
"""

from __future__ import annotations

import re
import zlib

_PIECE = re.compile(r" ?[A-Za-z_]+| ?\d{1,3}| ?[^\w\s]{1,2}|\s+")

MAX_VOCAB = 32_768
MAX_PIECE_CHARS = 64
HASHED_IDS = 32_768
UNKNOWN = "<unk>"


class SimTokenizer:
    eos_token_id = 0

    def __init__(self) -> None:
        self._ids: dict[str, int] = {"</s>": 0}
        self._pieces: list[str] = ["</s>"]

    @property
    def vocabulary_size(self) -> int:
        """Pieces with an exact id so far (at most MAX_VOCAB)."""
        return len(self._pieces)

    def encode(self, text: str) -> list[int]:
        return [self._id(piece) for piece in _PIECE.findall(text)]

    def encode_continuation(self, text: str) -> list[int]:
        """As ``encode``: there are no special tokens to leave out."""
        return self.encode(text)

    def decode(self, ids: list[int]) -> str:
        return "".join(self._pieces[i] if i < len(self._pieces) else UNKNOWN for i in ids if i != self.eos_token_id)

    def _id(self, piece: str) -> int:
        known = self._ids.get(piece)
        if known is not None:
            return known
        if len(piece) > MAX_PIECE_CHARS or len(self._pieces) >= MAX_VOCAB:
            return MAX_VOCAB + zlib.crc32(piece.encode()) % HASHED_IDS
        self._ids[piece] = len(self._pieces)
        self._pieces.append(piece)
        return self._ids[piece]
