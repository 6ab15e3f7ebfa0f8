"""A small interpreter for MiniSpec, the plan language of TypeFly drones.

Grammar (TypeFly's, with the lenient corners LLM output needs)::

    program    := { statement [';'] }
    statement  := loop | conditional | return | assignment | call
    loop       := INT '{' program '}'
    conditional:= '?' condition '{' program '}'
    return     := '->' operand
    assignment := VAR '=' call
    call       := NAME [ '(' [ operand { ',' operand } ] ')' ]
    condition  := conjunction { '|' conjunction }
    conjunction:= comparison { '&' comparison }
    comparison := operand [ ('==' | '!=' | '>' | '<' | '>=' | '<=') operand ]
    operand    := INT | FLOAT | STRING | 'True' | 'False' | 'None' | VAR | call

A comparison without a comparator tests the operand's truth (``?iv('cat'){...}``).
``&`` binds tighter than ``|``. ``->value`` ends the whole program, from inside
loops and conditionals too. Skills are run by a dispatch function the caller
supplies; it raises :class:`SkillFailed` to abort the program.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

Value = int | float | bool | str | None
SkillDispatch = Callable[[str, Sequence[Value]], Value]


class MiniSpecError(Exception):
    """The program is malformed or uses an undefined variable or bad comparison."""


class SkillFailed(Exception):
    """Raised by a skill dispatch function: the skill could not be carried out."""


@dataclass(frozen=True)
class Literal:
    value: Value


@dataclass(frozen=True)
class Variable:
    name: str


@dataclass(frozen=True)
class Call:
    name: str
    args: tuple[Operand, ...] = ()


Operand = Literal | Variable | Call


@dataclass(frozen=True)
class Comparison:
    left: Operand
    comparator: str | None = None
    right: Operand | None = None


@dataclass(frozen=True)
class BoolOp:
    operator: str
    operands: tuple[Condition, ...]


Condition = Comparison | BoolOp


@dataclass(frozen=True)
class Assignment:
    variable: str
    call: Call


@dataclass(frozen=True)
class Conditional:
    condition: Condition
    body: tuple[Statement, ...]


@dataclass(frozen=True)
class Loop:
    count: int
    body: tuple[Statement, ...]


@dataclass(frozen=True)
class Return:
    value: Operand


Statement = Call | Assignment | Conditional | Loop | Return

_TOKEN_RE = re.compile(
    r"""\s*(?:
        (?P<float>\d+\.\d*|\.\d+)
      | (?P<int>\d+)
      | (?P<string>'[^']*'|"[^"]*")
      | (?P<variable>_\d+)
      | (?P<name>[A-Za-z][A-Za-z0-9_]*)
      | (?P<symbol>->|==|!=|>=|<=|[;{}(),?=&|<>])
    )""",
    re.VERBOSE,
)
_KEYWORDS: dict[str, Value] = {"True": True, "False": False, "None": None}
_COMPARATORS: dict[str, Callable[[Any, Any], bool]] = {  # any values: an unorderable pair raises TypeError
    "==": operator.eq, "!=": operator.ne, ">": operator.gt,
    "<": operator.lt, ">=": operator.ge, "<=": operator.le,
}


@dataclass(frozen=True)
class _Token:
    kind: str
    text: str
    position: int


def tokenize(source: str) -> list[_Token]:
    """Split MiniSpec source into tokens; MiniSpecError at the first unknown character."""
    tokens = []
    position = 0
    source = source.rstrip()
    while position < len(source):
        match = _TOKEN_RE.match(source, position)
        if match is None or match.lastgroup is None:
            raise MiniSpecError(f"unexpected character {source[position:].lstrip()[:1]!r} at {position}")
        tokens.append(_Token(match.lastgroup, match.group(match.lastgroup), match.start(match.lastgroup)))
        position = match.end()
    return tokens


class _Parser:
    def __init__(self, source: str) -> None:
        self.tokens = tokenize(source)
        self.index = 0

    def peek(self) -> _Token | None:
        return self.tokens[self.index] if self.index < len(self.tokens) else None

    def at(self, text: str) -> bool:
        token = self.peek()
        return token is not None and token.kind == "symbol" and token.text == text

    def take(self) -> _Token:
        token = self.peek()
        if token is None:
            raise MiniSpecError("unexpected end of program")
        self.index += 1
        return token

    def expect(self, text: str) -> None:
        token = self.take()
        if token.text != text or token.kind not in ("symbol", "name"):
            raise MiniSpecError(f"expected {text!r} at {token.position}, found {token.text!r}")

    def program(self, closing: str | None = None) -> tuple[Statement, ...]:
        statements = []
        while self.peek() is not None and not (closing and self.at(closing)):
            if self.at(";"):
                self.take()
                continue
            statements.append(self.statement())
        return tuple(statements)

    def block(self) -> tuple[Statement, ...]:
        self.expect("{")
        body = self.program(closing="}")
        self.expect("}")
        return body

    def statement(self) -> Statement:
        token = self.peek()
        assert token is not None
        if token.kind == "int":
            self.take()
            return Loop(int(token.text), self.block())
        if self.at("?"):
            self.take()
            condition = self.condition()
            return Conditional(condition, self.block())
        if self.at("->"):
            self.take()
            return Return(self.operand())
        if token.kind == "variable":
            self.take()
            self.expect("=")
            return Assignment(token.text, self.call())
        return self.call()

    def condition(self) -> Condition:
        return self._chain("|", self.conjunction)

    def conjunction(self) -> Condition:
        return self._chain("&", self.comparison)

    def _chain(self, symbol: str, parse_operand: Callable[[], Condition]) -> Condition:
        operands = [parse_operand()]
        while self.at(symbol):
            self.take()
            operands.append(parse_operand())
        return operands[0] if len(operands) == 1 else BoolOp(symbol, tuple(operands))

    def comparison(self) -> Comparison:
        left = self.operand()
        token = self.peek()
        if token is not None and token.kind == "symbol" and token.text in _COMPARATORS:
            self.take()
            return Comparison(left, token.text, self.operand())
        return Comparison(left)

    def operand(self) -> Operand:
        token = self.peek()
        if token is None:
            raise MiniSpecError("unexpected end of program, expected a value")
        if token.kind == "int":
            self.take()
            return Literal(int(token.text))
        if token.kind == "float":
            self.take()
            return Literal(float(token.text))
        if token.kind == "string":
            self.take()
            return Literal(token.text[1:-1])
        if token.kind == "variable":
            self.take()
            return Variable(token.text)
        if token.kind == "name" and token.text in _KEYWORDS:
            self.take()
            return Literal(_KEYWORDS[token.text])
        return self.call()

    def call(self) -> Call:
        token = self.take()
        if token.kind != "name" or token.text in _KEYWORDS:
            raise MiniSpecError(f"expected a skill name at {token.position}, found {token.text!r}")
        if not self.at("("):
            return Call(token.text)
        self.take()
        args: list[Operand] = []
        while not self.at(")"):
            if args:
                self.expect(",")
            args.append(self.operand())
        self.take()
        return Call(token.text, tuple(args))


def parse(source: str) -> tuple[Statement, ...]:
    """Parse MiniSpec source into statements; MiniSpecError if it is malformed."""
    parser = _Parser(source)
    program = parser.program()
    leftover = parser.peek()
    if leftover is not None:
        raise MiniSpecError(f"unexpected {leftover.text!r} at {leftover.position}")
    return program


class _Returned(Exception):
    def __init__(self, value: Value) -> None:
        super().__init__(value)
        self.value = value


@dataclass
class Outcome:
    """How a program ended: by ``->value`` (returned) or by running off its end."""

    returned: bool
    value: Value = None


class Interpreter:
    """Runs MiniSpec programs; variables persist across ``run`` calls (one plan, many segments)."""

    def __init__(self, dispatch: SkillDispatch) -> None:
        self.dispatch = dispatch
        self.variables: dict[str, Value] = {}

    def run(self, program: str | Sequence[Statement]) -> Outcome:
        """Execute a program; SkillFailed from a skill and MiniSpecError propagate."""
        statements = parse(program) if isinstance(program, str) else program
        try:
            self._execute(statements)
        except _Returned as returned:
            return Outcome(True, returned.value)
        return Outcome(False)

    def _execute(self, statements: Sequence[Statement]) -> None:
        for statement in statements:
            self._execute_one(statement)

    def _execute_one(self, statement: Statement) -> None:
        if isinstance(statement, Loop):
            for _ in range(statement.count):
                self._execute(statement.body)
        elif isinstance(statement, Conditional):
            if self._holds(statement.condition):
                self._execute(statement.body)
        elif isinstance(statement, Return):
            raise _Returned(self._evaluate(statement.value))
        elif isinstance(statement, Assignment):
            self.variables[statement.variable] = self._evaluate(statement.call)
        else:
            self._evaluate(statement)

    def holds(self, condition: str) -> bool:
        """Evaluate a condition's source (``iv('cat')==True``); MiniSpecError if it is malformed."""
        parser = _Parser(condition)
        parsed = parser.condition()
        extra = parser.peek()
        if extra is not None:
            raise MiniSpecError(f"unexpected {extra.text!r} in condition {condition!r}")
        return self._holds(parsed)

    def _holds(self, condition: Condition) -> bool:
        if isinstance(condition, BoolOp):
            combine = all if condition.operator == "&" else any
            return combine(self._holds(operand) for operand in condition.operands)
        left = self._evaluate(condition.left)
        if condition.comparator is None or condition.right is None:
            return bool(left)
        right = self._evaluate(condition.right)
        try:
            return _COMPARATORS[condition.comparator](left, right)
        except TypeError as exc:
            raise MiniSpecError(f"cannot compare {left!r} {condition.comparator} {right!r}") from exc

    def _evaluate(self, operand: Operand) -> Value:
        if isinstance(operand, Literal):
            return operand.value
        if isinstance(operand, Variable):
            if operand.name not in self.variables:
                raise MiniSpecError(f"variable {operand.name} used before assignment")
            return self.variables[operand.name]
        return self.dispatch(operand.name, [self._evaluate(arg) for arg in operand.args])


def split_units(text: str) -> tuple[list[str], str]:
    """Cut streamed plan text into its complete units and the unfinished rest.

    A unit is a statement, a block's header (``?condition{`` or ``N{``) or a block's closing
    ``}``. A call or assignment is complete once its argument list closes, any other
    statement at the ``;`` or ``}`` after it.
    """
    units: list[str] = []
    start, parens = 0, 0
    quote: str | None = None
    for index, char in enumerate(text):
        if quote:
            quote = None if char == quote else quote
            continue
        statement = text[start:index + 1].lstrip("; \t\n")
        if char in "'\"":
            quote = char
        elif char == "(":
            parens += 1
        elif char == ")":
            parens -= 1
            if parens == 0 and (statement[:1].isalpha() or statement[:1] == "_"):
                units.append(statement)
                start = index + 1
        elif parens == 0 and char in "{};":
            if char == "{":
                units.append(statement)
            else:
                units.extend(filter(None, (statement[:-1].strip(), "}" if char == "}" else "")))
            start = index + 1
    return units, text[start:]


@dataclass
class _Block:
    """An open block: whether its statements run as they arrive, how many more rounds it runs at its ``}``
    (a loop's), and its statements so far."""

    header: str
    runs: bool
    more_rounds: int
    body: list[str]


class StreamedPlan:
    """Runs a plan that arrives segment by segment, each statement as soon as it is complete.

    A conditional's condition is evaluated when its ``{`` arrives and, where it holds, the
    statements inside run as they arrive; a loop's first round runs as it arrives and the
    other rounds when its ``}`` does. So a robot spends on each segment the time of the
    skill calls it holds, as the node's skill models estimate it. After ``->value`` the plan
    is over and later text is ignored.
    """

    def __init__(self, dispatch: SkillDispatch) -> None:
        self.interpreter = Interpreter(dispatch)
        self.pending = ""
        self.outcome = Outcome(False)
        self._blocks: list[_Block] = []

    def feed(self, text: str, final: bool = False) -> Outcome:
        """Run the statements ``text`` completes; with ``final`` run everything left (a block left open is an
        error)."""
        units, self.pending = split_units(self.pending + text)
        if final and self.pending.strip():
            units.append(self.pending.strip())
            self.pending = ""
        for unit in units:
            if self.outcome.returned:
                break
            self._take(unit)
        if final and self._blocks and not self.outcome.returned:
            raise MiniSpecError(f"block {self._blocks[-1].header!r} is never closed")
        return self.outcome

    def _take(self, unit: str) -> None:
        if unit.endswith("{"):
            self._open(unit)
        elif unit == "}":
            self._close()
        else:
            self._run(unit, self._runs())

    def _runs(self) -> bool:
        return not self._blocks or self._blocks[-1].runs

    def _open(self, header: str) -> None:
        head = header[:-1].strip()
        if head.startswith("?"):
            runs, more_rounds = self._runs() and self.interpreter.holds(head[1:]), 0
        elif head.isdigit():
            runs, more_rounds = self._runs() and int(head) > 0, max(int(head) - 1, 0)
        else:
            raise MiniSpecError(f"a block opens after '?condition' or a count, not after {head!r}")
        self._blocks.append(_Block(header, runs, more_rounds, []))

    def _close(self) -> None:
        if not self._blocks:
            raise MiniSpecError("'}' closes no block")
        block = self._blocks.pop()
        body = ";".join(block.body)
        for _ in range(block.more_rounds if block.runs else 0):
            if self.outcome.returned:
                return
            self._run(body, True, record=False)
        self._record(block.header + body + "}")

    def _run(self, statements: str, runs: bool, record: bool = True) -> None:
        if runs:
            self.outcome = self.interpreter.run(statements)
        if record:
            self._record(statements)

    def _record(self, statements: str) -> None:
        if self._blocks:
            self._blocks[-1].body.append(statements)
