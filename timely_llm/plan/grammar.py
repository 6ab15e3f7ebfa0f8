"""Plan grammars built from the skill models: what a robot's plan may look like.

One grammar per robot, derived from its ``skill_models/*.yaml`` (skills, argument
types, return types), so adding a skill there extends the grammar:

* ``minispec`` (drone): statements ``call;``, ``_1=call;``, ``->value``, conditionals
  ``?cond{...}`` and loops ``N{...}`` nested up to ``MAX_DEPTH``, only known skills with
  arguments of their declared types and ranges, conditions only on skills that return
  a value (or on variables);
* ``calls`` (arm): a sequence of ``skill(args);``;
* ``sentence`` (chatbot): sentences separated by single spaces.

The grammar is regular (nesting is bounded), kept as a :mod:`~timely_llm.plan.regex`
expression. A generation is constrained by the grammar of what may follow the text
generated so far (its derivative), written as EBNF for the engine: a fresh one by the
whole grammar, a resumed one by the continuation from exactly where it stopped, e.g.
inside an open conditional or in the middle of a statement. Continuation and whole
grammar allow the same next tokens, so a resumed greedy generation produces the same
tokens as one that never stopped.
"""

from __future__ import annotations

from functools import cache, lru_cache

from timely_llm.plan.regex import (
    EMPTY,
    Regex,
    alt,
    cat,
    char_range,
    chars,
    derive_text,
    int_range,
    lit,
    matches,
    nullable,
    opt,
    render_ebnf,
    repeat,
    star,
)
from timely_llm.plan.skills import DEFAULT_MAX_CHARS, ArgSpec, Skill, SkillModel

MAX_DEPTH = 2
"""Blocks nest at most this deep (TypeFly's examples use two: a loop holding a conditional)."""
MAX_STATEMENTS = 8
"""Statements at the top level of a MiniSpec plan."""
MAX_BLOCK_STATEMENTS = 4
MAX_CALLS = 24
"""Calls in an arm plan."""
MAX_SENTENCES = 4
MAX_LOOP = 5

_LOWER = char_range("a", "z")
_DIGIT = char_range("0", "9")


def _name(max_chars: int) -> Regex:
    return cat(lit("'"), _LOWER, repeat(alt(_LOWER, _DIGIT, chars("_")), 0, max_chars - 1), lit("'"))


def _text(max_chars: int) -> Regex:
    return cat(lit("'"), repeat(alt(_LOWER, char_range("A", "Z"), _DIGIT, chars(" _,.?!-")), 1, max_chars), lit("'"))


_NAME = _name(DEFAULT_MAX_CHARS["name"])
_TEXT = _text(DEFAULT_MAX_CHARS["text"])
_VAR = cat(lit("_"), char_range("1", "9"))
_NUMBER = cat(int_range(0, 9999), opt(cat(lit("."), repeat(_DIGIT, 1, 2))))
_BOOL = alt(lit("True"), lit("False"))
_EQUALITY = alt(lit("=="), lit("!="))
_ORDER = alt(_EQUALITY, lit("<"), lit(">"), lit("<="), lit(">="))


class PlanGrammar:
    """The plan language of one robot type."""

    def __init__(self, model: SkillModel, root: Regex) -> None:
        self.model = model
        self.root = root

    def continuation(self, generated: str) -> str | None:
        """The EBNF grammar every continuation of ``generated`` must match (the whole grammar
        for ``""``); None if ``generated`` already left the grammar."""
        rest = derive_text(self.root, generated)
        return None if rest is EMPTY else _ebnf(rest)

    def accepts(self, plan: str) -> bool:
        """Whether ``plan`` is a complete plan."""
        return matches(self.root, plan)

    def accepts_prefix(self, text: str) -> bool:
        """Whether ``text`` can be continued into a complete plan."""
        return derive_text(self.root, text) is not EMPTY

    def complete_after(self, text: str) -> bool:
        """Whether the plan may end right after ``text``."""
        return nullable(derive_text(self.root, text))

    def close(self, done: str, pending: str) -> str:
        """The last segment of a plan whose generation stopped early (token budget spent).

        ``done`` was dispatched already; ``pending`` is the text after it. Nothing the model did
        not write is added: ``pending`` is cut back to its last complete statement and the blocks
        still open get their closing braces. A block without a complete statement cannot close
        (a body holds at least one), so it is dropped with the blocks holding it; one whose header
        was dispatched already can only be closed empty (its robot has run that header, no more).
        """
        if self.complete_after(done + pending) or not self.accepts_prefix(done):
            return pending  # finished, or ``done`` itself left the grammar: nothing to repair
        for end in reversed(_statement_ends(pending, self.model.language)):
            kept = pending[:end]
            closed = kept + "}" * _open_blocks(done + kept)
            if self.accepts(done + closed):
                return closed
        return "}" * _open_blocks(done)


@lru_cache(maxsize=4096)
def _ebnf(rest: Regex) -> str:
    """A continuation's EBNF, rendered once: generations resumed at the same point of the grammar (after
    the same statements, often) share it, and the engine finds its compiled grammar cached by that text."""
    return render_ebnf(rest)


def _statement_ends(text: str, language: str) -> list[int]:
    """0 and every position right after a complete statement: after a ';' or '}' outside quotes
    (MiniSpec, calls), after a sentence's end mark (sentences, whose quotes are apostrophes)."""
    if language == "sentence":
        return [0, *(i + 1 for i, ch in enumerate(text) if ch in ".!?")]
    cuts, quote = [0], None
    for i, ch in enumerate(text):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in ";}":
            cuts.append(i + 1)
    return cuts


def _open_blocks(text: str) -> int:
    """How many blocks ``text`` (a grammatical prefix) leaves open."""
    depth, quote = 0, None
    for ch in text:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "{}":
            depth += 1 if ch == "{" else -1
    return depth


@cache
def plan_grammar(model: SkillModel) -> PlanGrammar | None:
    """The robot's grammar, or None for a language without one (free paragraphs)."""
    root = _build(model)
    return None if root is None else PlanGrammar(model, root)


def _build(model: SkillModel) -> Regex | None:
    skills = list(model.skills.values())
    lead = opt(lit(" "))  # a prompt ending "Response: " may be continued with or without a space
    if model.language == "minispec":
        return cat(lead, _minispec(skills))
    if model.language == "calls":
        return cat(lead, repeat(cat(_calls(skills, variables=False), lit(";")), 1, MAX_CALLS))
    if model.language == "sentence":
        sentence = cat(char_range("A", "Z"), star(alt(_LOWER, char_range("A", "Z"), _DIGIT, chars(" ,;:'-"))),
                       chars(".!?"))
        return cat(lead, sentence, repeat(cat(lit(" "), sentence), 0, MAX_SENTENCES - 1))
    return None


def _arg(spec: ArgSpec, variables: bool) -> Regex:
    """An argument of its declared type; MiniSpec may pass a variable instead (``variables``)."""
    var = _VAR if variables else EMPTY
    if spec.type == "int":
        return int_range(spec.low, spec.high)
    longest = spec.max_chars or DEFAULT_MAX_CHARS[spec.type]
    if spec.type == "name":
        return alt(_name(longest), var)
    if spec.type == "text":
        return alt(_text(longest), var)
    return alt(_NUMBER, _name(longest), _text(longest), var)


def _call(skill: Skill, variables: bool = True) -> Regex:
    if not skill.args:
        return cat(lit(skill.abbr), opt(lit("()")))
    args = [_arg(a, variables) for a in skill.args]
    joined = [args[0], *(cat(lit(","), a) for a in args[1:])]
    return cat(lit(skill.abbr), lit("("), *joined, lit(")"))


def _calls(skills: list[Skill], variables: bool = True) -> Regex:
    return alt(*(_call(s, variables) for s in skills))


def _minispec(skills: list[Skill]) -> Regex:
    valued = [s for s in skills if s.returns]
    value = alt(_BOOL, _NUMBER, _NAME, _VAR)
    simple = alt(
        _calls(skills),
        cat(_VAR, lit("="), _calls(valued)) if valued else EMPTY,
    )
    ret = cat(lit("->"), value)
    comparison = alt(
        *(cat(_call(s), opt(cat(*_comparator(s.returns)))) for s in valued),
        cat(_VAR, opt(alt(cat(_EQUALITY, alt(_BOOL, _NAME, _TEXT)), cat(_ORDER, _NUMBER)))),
    )
    condition = cat(comparison, repeat(cat(chars("&|"), comparison), 0, 2))
    head = alt(cat(lit("?"), condition), int_range(2, MAX_LOOP))
    statement = cat(simple, lit(";"))
    for _ in range(MAX_DEPTH):
        body = cat(repeat(statement, 1, MAX_BLOCK_STATEMENTS), opt(ret))
        statement = alt(cat(simple, lit(";")), cat(head, lit("{"), body, lit("}"), opt(lit(";"))))
    return alt(cat(repeat(statement, 1, MAX_STATEMENTS), opt(cat(ret, opt(lit(";"))))), cat(ret, opt(lit(";"))))


def _comparator(returns: str | None) -> tuple[Regex, Regex]:
    if returns == "bool":
        return _EQUALITY, _BOOL
    if returns == "number":
        return _ORDER, _NUMBER
    return _EQUALITY, alt(_NAME, _TEXT)

