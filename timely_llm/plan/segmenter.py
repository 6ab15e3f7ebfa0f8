"""Incremental detokenisation and the segment stop-checker (§4.1).

Generated token ids are turned into text as they arrive; the segmenter cuts the
text into segments, each ending at a statement boundary once the text since the
last cut holds a complete executable skill call. Text may arrive split anywhere,
including inside a skill name or a quoted argument.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from timely_llm.plan.skills import SkillModel

REPLACEMENT_CHAR = "\ufffd"
KEEP_TOKENS = 4
"""Tokens decoded again with the next ones: a character split across tokens, or a word whose spacing
depends on the token before it, comes out whole."""
REANCHOR_AFTER = 12
"""Tokens in the decoded window before it is cut back to KEEP_TOKENS."""


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text without re-decoding it all each step.

    Byte-level tokenizers can split one character across tokens; text that still ends
    in a replacement character is held back until the next token completes it.
    """

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self._decode = decode
        self.ids: list[int] = []
        self._prefix = 0  # ids before this are already emitted and never re-decoded
        self._emitted = 0  # characters of decode(ids[_prefix:]) already emitted

    def push(self, new_ids: list[int]) -> str:
        self.ids.extend(new_ids)
        text = self._decode(self.ids[self._prefix:])
        if text.endswith(REPLACEMENT_CHAR):
            return ""
        delta = text[self._emitted:]
        self._emitted = len(text)
        if len(self.ids) - self._prefix > REANCHOR_AFTER:
            # Re-anchor so the next decode starts a few tokens back, not at the beginning; only now and
            # then, as that costs a second decode.
            self._prefix = len(self.ids) - KEEP_TOKENS
            self._emitted = len(self._decode(self.ids[self._prefix:]))
        return delta


_SENTENCE_END = re.compile(r"[.!?][\"')\]]*\s")


class Segmenter:
    """Cuts a generation's text into executable segments for one robot's language."""

    def __init__(self, model: SkillModel) -> None:
        self.model = model
        self.pending = ""
        self._scanned = 0
        self._quote: str | None = None

    def feed(self, text: str) -> list[str]:
        """Add generated text; return the segments it completed (often none)."""
        self.pending += text
        segments = []
        while (cut := self._next_cut()) is not None:
            segments.append(self.pending[:cut])
            self.pending = self.pending[cut:]
            self._scanned = 0
            self._quote = None
        return segments

    def hold(self, text: str) -> None:
        """Add text without cutting it (whole-plan dispatch); ``flush`` returns it all."""
        self.pending += text

    def flush(self) -> str:
        """End of generation: whatever text is left (may hold no skill, e.g. a closing brace)."""
        rest, self.pending, self._scanned, self._quote = self.pending, "", 0, None
        return rest

    def _next_cut(self) -> int | None:
        language = self.model.language
        if language == "sentence":
            return self._regex_cut(_SENTENCE_END, "\n")
        if language == "paragraph":
            return self._regex_cut(None, "\n\n")
        return self._statement_cut(";{}" if language == "minispec" else ";\n")

    def _statement_cut(self, terminators: str) -> int | None:
        text = self.pending
        while self._scanned < len(text):
            ch = text[self._scanned]
            self._scanned += 1
            if self._quote:
                self._quote = None if ch == self._quote else self._quote
            elif ch in "'\"":
                self._quote = ch
            elif ch in terminators and self.model.has_call(text[:self._scanned]):
                return self._scanned
        return None

    def _regex_cut(self, pattern: re.Pattern[str] | None, separator: str) -> int | None:
        ends = []
        if pattern and (m := pattern.search(self.pending)):
            ends.append(m.end())
        if (i := self.pending.find(separator)) >= 0:
            ends.append(i + len(separator))
        return min(ends) if ends else None
