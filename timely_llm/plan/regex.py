"""Regular expressions as values, with Brzozowski derivatives.

The derivative of a language L by a string p is {s : p + s in L}. For a plan grammar
that is exactly what a resumed generation must still produce after the text it has
generated so far, whatever character it stopped after (inside an open block, in the
middle of a statement). Expressions are built through smart constructors that keep
them in a normal form, so ``EMPTY`` is the only expression with an empty language and
derivatives stay small; ``render`` writes one in the common regex syntax that vLLM's
structured-output backends accept.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache, lru_cache

INF = -1
"""``Repeat.high`` for no upper bound."""

_META = set("\\.^$|?*+()[]{}")


class Regex:
    """Base of the expression nodes; immutable and interned (equal expressions are one object).

    Interning makes equality and hashing O(1), which the derivative caches rely on.
    """


_INTERNED: dict[tuple, Regex] = {}


def _intern(key: tuple, make: type[Regex], *fields: object) -> Regex:
    node = _INTERNED.get(key)
    if node is None:
        node = _INTERNED[key] = make(*fields)
    return node


@dataclass(frozen=True, eq=False)
class _Empty(Regex):
    pass


@dataclass(frozen=True, eq=False)
class _Eps(Regex):
    pass


EMPTY: Regex = _Empty()
"""Matches nothing."""
EPS: Regex = _Eps()
"""Matches the empty string only."""


@dataclass(frozen=True, eq=False)
class Chars(Regex):
    """One character from ``chars`` (or, ``negated``, one not in it)."""

    chars: frozenset[str]
    negated: bool = False

    def matches(self, ch: str) -> bool:
        return (ch in self.chars) != self.negated


@dataclass(frozen=True, eq=False)
class Cat(Regex):
    parts: tuple[Regex, ...]


@dataclass(frozen=True, eq=False)
class Alt(Regex):
    options: frozenset[Regex]


@dataclass(frozen=True, eq=False)
class Repeat(Regex):
    inner: Regex
    low: int
    high: int
    """``INF`` for unbounded."""


# ----- smart constructors -----

def lit(text: str) -> Regex:
    return cat(*(chars(ch) for ch in text))


def chars(text: str, negated: bool = False) -> Regex:
    if not text and not negated:
        return EMPTY
    charset = frozenset(text)
    return _intern(("chars", charset, negated), Chars, charset, negated)


def char_range(first: str, last: str) -> Regex:
    return chars("".join(chr(c) for c in range(ord(first), ord(last) + 1)))


def cat(*parts: Regex) -> Regex:
    flat: list[Regex] = []
    for part in parts:
        if part is EMPTY:
            return EMPTY
        if isinstance(part, Cat):
            flat.extend(part.parts)
        elif part is not EPS:
            flat.append(part)
    if not flat:
        return EPS
    if len(flat) == 1:
        return flat[0]
    return _intern(("cat", *map(id, flat)), Cat, tuple(flat))


def alt(*options: Regex) -> Regex:
    flat: set[Regex] = set()
    for option in options:
        if isinstance(option, Alt):
            flat |= option.options
        elif option is not EMPTY:
            flat.add(option)
    plain = [o for o in flat if isinstance(o, Chars) and not o.negated]
    if len(plain) > 1:  # one class instead of several alternatives
        flat = (flat - set(plain)) | {chars("".join("".join(o.chars) for o in plain))}
    if not flat:
        return EMPTY
    if len(flat) == 1:
        return next(iter(flat))
    return _intern(("alt", frozenset(map(id, flat))), Alt, frozenset(flat))


def repeat(inner: Regex, low: int = 0, high: int = INF) -> Regex:
    if inner is EMPTY:
        return EPS if low == 0 else EMPTY
    if inner is EPS or high == 0:
        return EPS
    if nullable(inner):
        low = 0  # r{2,5} = r{0,5} when r matches the empty string
    if low == high == 1:
        return inner
    return _intern(("repeat", id(inner), low, high), Repeat, inner, low, high)


def opt(inner: Regex) -> Regex:
    return alt(EPS, inner)


def star(inner: Regex) -> Regex:
    return repeat(inner, 0, INF)


# ----- language operations -----

@cache
def nullable(r: Regex) -> bool:
    """Whether ``r`` matches the empty string."""
    if r is EPS:
        return True
    if r is EMPTY or isinstance(r, Chars):
        return False
    if isinstance(r, Cat):
        return all(nullable(p) for p in r.parts)
    if isinstance(r, Alt):
        return any(nullable(o) for o in r.options)
    assert isinstance(r, Repeat)
    return r.low == 0 or nullable(r.inner)


@lru_cache(maxsize=200_000)
def derive(r: Regex, ch: str) -> Regex:
    """The derivative of ``r`` by one character."""
    if isinstance(r, Chars):
        return EPS if r.matches(ch) else EMPTY
    if isinstance(r, Alt):
        return alt(*(derive(o, ch) for o in r.options))
    if isinstance(r, Cat):
        head, rest = r.parts[0], cat(*r.parts[1:])
        first = cat(derive(head, ch), rest)
        return alt(first, derive(rest, ch)) if nullable(head) else first
    if isinstance(r, Repeat):
        high = INF if r.high == INF else r.high - 1
        return cat(derive(r.inner, ch), repeat(r.inner, max(r.low - 1, 0), high))
    return EMPTY  # EPS and EMPTY


def derive_text(r: Regex, text: str) -> Regex:
    for ch in text:
        r = derive(r, ch)
        if r is EMPTY:
            break
    return r


def matches(r: Regex, text: str) -> bool:
    return nullable(derive_text(r, text))


@cache
def first_chars(r: Regex) -> frozenset[str] | None:
    """The characters a non-empty match of ``r`` may start with; None where a negated class makes them
    unbounded."""
    if isinstance(r, Chars):
        return None if r.negated else r.chars
    parts: tuple[Regex, ...] = ()
    if isinstance(r, Alt):
        parts = tuple(r.options)
    elif isinstance(r, Repeat):
        parts = (r.inner,)
    elif isinstance(r, Cat):
        leading = 1 + next((i for i, p in enumerate(r.parts) if not nullable(p)), len(r.parts) - 1)
        parts = r.parts[:leading]
    found: set[str] = set()
    for part in parts:
        more = first_chars(part)
        if more is None:
            return None
        found |= more
    return frozenset(found)


def forced_text(r: Regex, limit: int) -> str:
    """The text every match of ``r`` begins with, up to ``limit`` characters: as long as ``r`` cannot end
    and allows one next character only."""
    text = ""
    while len(text) < limit and not nullable(r):
        options = first_chars(r)
        if options is None or len(options) != 1:
            break
        ch = next(iter(options))
        text += ch
        r = derive(r, ch)
    return text


# ----- rendering -----

@lru_cache(maxsize=50_000)
def render(r: Regex) -> str:
    """``r`` in the usual regex syntax (groups, classes, ``{m,n}``), deterministically."""
    if r is EPS:
        return ""
    if r is EMPTY:
        return "[^\\s\\S]"
    if isinstance(r, Chars):
        return _render_chars(r)
    if isinstance(r, Cat):
        return "".join(_group(p) if isinstance(p, Alt) else render(p) for p in r.parts)
    if isinstance(r, Alt):
        options = sorted(render(o) for o in r.options if o is not EPS)
        body = "|".join(options)
        if EPS in r.options:
            return f"({body})?" if len(options) > 1 or not _atomic(next(iter(r.options - {EPS}))) else f"{body}?"
        return body
    assert isinstance(r, Repeat)
    inner = render(r.inner) if _atomic(r.inner) else f"({render(r.inner)})"
    return inner + _quantifier(r.low, r.high, exact_short=True)


def _quantifier(low: int, high: int, exact_short: bool) -> str:
    """The repeat suffix shared by the regex and EBNF renderings; ``exact_short`` writes {n,n} as {n}."""
    if (low, high) == (0, INF):
        return "*"
    if (low, high) == (1, INF):
        return "+"
    if high == INF:
        return f"{{{low},}}"
    return f"{{{low}}}" if exact_short and low == high else f"{{{low},{high}}}"


def _group(r: Regex) -> str:
    text = render(r)
    return text if isinstance(r, Alt) and EPS in r.options else f"({text})"


def _atomic(r: Regex) -> bool:
    return isinstance(r, Chars)


def _render_chars(r: Chars) -> str:
    if len(r.chars) == 1 and not r.negated:
        ch = next(iter(r.chars))
        return _escape(ch, _META)
    codes = sorted(ord(ch) for ch in r.chars)
    runs: list[tuple[int, int]] = []
    for code in codes:
        if runs and code == runs[-1][1] + 1:
            runs[-1] = (runs[-1][0], code)
        else:
            runs.append((code, code))
    special = set("\\]^-[")
    body = "".join(
        _escape(chr(a), special) + ("" if a == b else ("-" if b > a + 1 else "") + _escape(chr(b), special))
        for a, b in runs
    )
    return f"[{'^' if r.negated else ''}{body}]"


def _escape(ch: str, special: set[str]) -> str:
    if ch == "\n":
        return "\\n"
    if ch == "\t":
        return "\\t"
    return "\\" + ch if ch in special else ch


# ----- numbers -----

def int_range(low: int, high: int) -> Regex:
    """Decimal integers from ``low`` to ``high`` (>= 0), without leading zeros."""
    if not 0 <= low <= high:
        raise ValueError(f"bad integer range {low}..{high}")
    options = []
    for digits in range(len(str(low)), len(str(high)) + 1):
        start = max(low, 10 ** (digits - 1) if digits > 1 else 0)
        end = min(high, 10 ** digits - 1)
        if start <= end:
            options.append(_same_length_range(str(start), str(end)))
    return alt(*options)


def _same_length_range(low: str, high: str) -> Regex:
    rest = len(low) - 1
    if low[1:] == "0" * rest and high[1:] == "9" * rest:
        return cat(char_range(low[0], high[0]), repeat(char_range("0", "9"), rest, rest))
    if low[0] == high[0]:
        return cat(lit(low[0]), _same_length_range(low[1:], high[1:]))
    any_digits = repeat(char_range("0", "9"), rest, rest)
    middle = (
        cat(char_range(chr(ord(low[0]) + 1), chr(ord(high[0]) - 1)), any_digits)
        if ord(high[0]) - ord(low[0]) > 1 else EMPTY
    )
    return alt(
        cat(lit(low[0]), _same_length_range(low[1:], "9" * rest)),
        middle,
        cat(lit(high[0]), _same_length_range("0" * rest, high[1:])),
    )


# ----- EBNF (GBNF) rendering with shared rules -----

def render_ebnf(r: Regex, min_shared_size: int = 12) -> str:
    """``r`` as an EBNF grammar (``root ::= ...``) where every sizeable sub-expression
    used more than once becomes a rule of its own.

    Grammar backends compile one state per position of each rule, so sharing keeps a
    grammar built from many copies of the same pieces (argument types, statements)
    small, where the flat regex repeats them.
    """
    uses: dict[Regex, int] = {}
    _count_uses(r, uses)
    names: dict[Regex, str] = {}
    for node, count in uses.items():
        if node is not r and count > 1 and len(render(node)) >= min_shared_size:
            names[node] = f"r{len(names)}"
    rules = [f"root ::= {_ebnf(r, names, top=True)}"]
    rules += [f"{name} ::= {_ebnf(node, names, top=True)}" for node, name in names.items()]
    return "\n".join(rules) + "\n"


def _count_uses(r: Regex, uses: dict[Regex, int]) -> None:
    uses[r] = uses.get(r, 0) + 1
    if uses[r] > 1:
        return
    for child in _children(r):
        _count_uses(child, uses)


def _children(r: Regex) -> tuple[Regex, ...]:
    if isinstance(r, Cat):
        return r.parts
    if isinstance(r, Alt):
        return tuple(r.options)
    if isinstance(r, Repeat):
        return (r.inner,)
    return ()


def _ebnf(r: Regex, names: dict[Regex, str], top: bool = False) -> str:
    if not top and r in names:
        return names[r]
    if r is EPS:
        return '""'
    if r is EMPTY:
        raise ValueError("the empty language has no grammar")
    if isinstance(r, Chars):
        text = _render_chars(r)
        if len(r.chars) == 1 and not r.negated:
            return '"' + _ebnf_string_escape(next(iter(r.chars))) + '"'
        return text
    if isinstance(r, Cat):
        parts, run = [], ""
        for part in r.parts:  # literal characters in a row become one string
            if isinstance(part, Chars) and len(part.chars) == 1 and not part.negated and part not in names:
                run += _ebnf_string_escape(next(iter(part.chars)))
                continue
            if run:
                parts.append(f'"{run}"')
                run = ""
            parts.append(_ebnf_group(part, names))
        if run:
            parts.append(f'"{run}"')
        return " ".join(parts)
    if isinstance(r, Alt):
        options = sorted(_ebnf(o, names) for o in r.options if o is not EPS)
        body = " | ".join(options)
        return f"({body})?" if EPS in r.options else body
    assert isinstance(r, Repeat)
    return _ebnf_group(r.inner, names) + _quantifier(r.low, r.high, exact_short=False)


def _ebnf_group(r: Regex, names: dict[Regex, str]) -> str:
    text = _ebnf(r, names)
    if r in names or isinstance(r, Chars) or (isinstance(r, Alt) and EPS in r.options):
        return text
    return f"({text})"


def _ebnf_string_escape(ch: str) -> str:
    if ch == "\n":
        return "\\n"
    return "\\" + ch if ch in '"\\' else ch
