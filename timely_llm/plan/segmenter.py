"""Incremental detokenisation and the segment stop-checker (§4.1).

Generated token ids are turned into text as they arrive; the segmenter cuts the
text into segments, each ending at a statement boundary once the text since the
last cut holds a complete executable skill call. Text may arrive split anywhere,
including inside a skill name or a quoted argument. Where the generation is bound to
its robot's grammar, a statement is cut as soon as the grammar leaves it one ending:
the robot gets its action a token or more before the model writes that ending.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from timely_llm.plan.regex import EMPTY, Regex, derive_text, forced_text
from timely_llm.plan.skills import SkillModel

REPLACEMENT_CHAR = "\ufffd"
KEEP_TOKENS = 4
"""Tokens decoded again with the next ones: a character split across tokens, or a word whose spacing
depends on the token before it, comes out whole."""
REANCHOR_AFTER = 12
"""Tokens in the decoded window before it is cut back to KEEP_TOKENS."""
AHEAD_LIMIT = 8
"""Characters of a statement's ending looked ahead for: more than any closing of a call (``');``, ``)}``)."""


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

    def __init__(self, model: SkillModel, grammar: Regex | None = None) -> None:
        """``grammar``: the grammar the generation is bound to, if any. A statement that it lets end one way only
        (``mb(80`` of a move of at most 500 cm can only go on ``);``) is then cut with that ending, which the
        model must still write: it is owed, and taken off the text the model writes next."""
        self.model = model
        self.pending = ""
        self._scanned = 0
        self._quote: str | None = None
        self._state = grammar
        """The grammar's derivative by the text fed and the endings owed; None without one, EMPTY once left."""
        self._owed = ""

    def feed(self, text: str) -> list[str]:
        """Add generated text; return the segments it completed (often none)."""
        text = self._paid(text)
        if self._state is not None:
            self._state = derive_text(self._state, text)
        self.pending += text
        segments = []
        while (cut := self._next_cut()) is not None:
            segments.append(self._cut(cut))
        if (ahead := self._cut_ahead()) is not None:
            segments.append(ahead)
        return segments

    def _cut(self, cut: int) -> str:
        segment = self.pending[:cut]
        self.pending, self._scanned, self._quote = self.pending[cut:], 0, None
        return segment

    def _paid(self, text: str) -> str:
        """``text`` less the part of the owed ending it writes. Text other than the owed ending can only come
        from a generation not bound to the grammar after all: the cuts go on without looking ahead."""
        paid = 0
        while paid < min(len(text), len(self._owed)) and text[paid] == self._owed[paid]:
            paid += 1
        if paid < min(len(text), len(self._owed)):
            self._state, self._owed = None, ""
        else:
            self._owed = self._owed[paid:]
        return text[paid:]

    def _cut_ahead(self) -> str | None:
        """The pending statement with the only ending the grammar allows it, where that ending completes an
        executable segment (not one ending in a blocking call: its robot's value must follow the model's own
        text)."""
        if self._state is None or self._state is EMPTY or self._owed or not self.pending:
            return None
        ending = forced_text(self._state, AHEAD_LIMIT)
        if not ending:
            return None
        written, scanned, quote = self.pending, self._scanned, self._quote
        self.pending += ending
        cut = self._next_cut()
        if cut is None or self.model.blocking_call(self.pending[:cut]) is not None:
            self.pending, self._scanned, self._quote = written, scanned, quote
            return None
        self._owed = self.pending[len(written):cut]
        self._state = derive_text(self._state, self._owed)
        segment, self.pending = self._cut(cut), ""  # what followed the cut was not written either
        return segment

    def hold(self, text: str) -> None:
        """Add text without cutting it (whole-plan dispatch); ``flush`` returns it all."""
        self.pending += text

    def flush(self) -> str:
        """End of generation: whatever text is left (may hold no skill, e.g. a closing brace)."""
        rest, self.pending, self._scanned, self._quote, self._owed = self.pending, "", 0, None, ""
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
