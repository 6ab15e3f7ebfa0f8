"""A generation's plan stream: its new token ids in, the segments to dispatch out (detokenize, cut at
executable statements, close a plan cut short in its grammar)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from timely_llm.plan.grammar import PlanGrammar, plan_grammar
from timely_llm.plan.segmenter import IncrementalDetokenizer, Segmenter
from timely_llm.plan.skills import SkillModel


class Generation(Protocol):
    """What a plan stream reads of the generation it cuts (a scheduler's request)."""

    robot: SkillModel
    max_new_tokens: int
    forced_ids: list[int] | None
    grammar: PlanGrammar | None

    @property
    def sampled_tokens(self) -> int: ...

    @property
    def dispatched_text(self) -> str:
        """The text of the segments dispatched so far."""

    @property
    def ended_plan(self) -> bool:
        """The last segment dispatched ended the plan."""


class PlanStream:
    def __init__(self, robot: SkillModel, decode: Callable[[list[int]], str], streaming: bool,
                 grammar: PlanGrammar | None = None) -> None:
        """``streaming``: cut each segment as soon as it exists; otherwise hold the plan to its end. ``grammar``:
        the one the generation is bound to, if any: a statement is cut as soon as it allows one ending only (a
        replayed plan has none: it goes out as recorded, in the simulator as on a real engine)."""
        self.detok = IncrementalDetokenizer(decode)
        self.segmenter = Segmenter(robot, grammar.root if grammar is not None else None)
        self.streaming = streaming

    def push(self, request: Generation, tokens: list[int], finished: bool) -> tuple[list[str], bool]:
        """``tokens``, just added to ``request.output_ids``; ``finished``: the engine ended the generation.
        Returns the pieces to dispatch and whether the last of them ends the plan."""
        text = self.detok.push(tokens) if tokens else ""
        pieces: list[str] = []
        if self.streaming:
            pieces = self.segmenter.feed(text)
        else:
            self.segmenter.hold(text)
        if finished:
            rest = self.segmenter.flush()
            if (grammar := _closing_grammar(request)) is not None:  # a plan cut short still closes its blocks
                rest = grammar.close(request.dispatched_text + "".join(pieces), rest)
            # An empty last segment tells the robot a plan ended after a segment already sent as not final.
            if rest.strip() or not pieces and not request.ended_plan:
                pieces.append(rest)
        return pieces, bool(pieces) and (finished or self._out_of_tokens(request))

    def _out_of_tokens(self, request: Generation) -> bool:
        """No text can follow what was cut: the recorded plan or the token budget is used up."""
        produced = request.sampled_tokens
        budget_spent = produced >= request.max_new_tokens and request.grammar is None  # else it may close blocks
        plan_replayed = request.forced_ids is not None and produced >= len(request.forced_ids)
        return (budget_spent or plan_replayed) and not self.segmenter.pending.strip()


def _closing_grammar(request: Generation) -> PlanGrammar | None:
    """The grammar a finished plan is closed in: its own, or its robot's for a recorded plan replayed only
    in part (its token budget ran out first); a whole replayed plan is dispatched as recorded."""
    if request.forced_ids is None:
        return request.grammar
    return plan_grammar(request.robot) if request.sampled_tokens < len(request.forced_ids) else None
