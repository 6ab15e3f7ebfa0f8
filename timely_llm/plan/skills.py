"""Robot skill tables and their execution-time models, as a robot file (``skill_models/*.yaml``) gives them
(:mod:`timely_llm.plan.robot_file` loads one).

A skill's time model is one of:
  ``{fixed: S}``                         always S seconds;
  ``{linear: {slope: A, intercept: B}}`` A * x + B for the skill's first numeric argument x;
  ``{samples: [S1, S2, ...]}``           scene-dependent: the robot draws one of the profiled times.
The scheduler plans with the lower bound (the minimum execution time, §4.3); the
simulated robot samples.

Each argument has a type, which the plan grammar (``plan/grammar.py``) enforces:
  ``{NAME: int LOW..HIGH}`` an integer in that range;
  ``{NAME: name}``          an object or place name, quoted (or a MiniSpec variable);
  ``{NAME: text}``          free text, quoted (or a MiniSpec variable);
a bare ``NAME`` is untyped (any of those). ``returns: bool | number | text`` marks a skill
whose value plans may test in a condition or store in a variable. ``description`` says
what the skill does, for the prompt.

A skill with ``returns`` may say ``blocking: true``: the model's next words depend on its value.
A segment ending in a blocking call is dispatched and the generation waits for the robot's
report, which carries the value; the value is then written into the model's context after the
call, in the robot's ``observation`` form (``form``, holding ``{value}`` and optionally
``{skill}``; ``max_tokens``, the longest value taken), and generation goes on from there.

A robot with skills also has a ``prompt:`` section, from which its system prompt is built
(see :mod:`timely_llm.plan.robot_prompt`): the file is the one source of the robot's
grammar, prompt, stop-checker and time estimates.
"""

from __future__ import annotations

import copy
import random
import re
from dataclasses import dataclass

SEGMENT_LANGUAGES = ("minispec", "calls", "sentence", "paragraph")
ARG_TYPES = ("int", "name", "text", "any")
DEFAULT_MAX_CHARS = {"name": 32, "text": 64, "any": 64}
"""The most characters a quoted argument holds unless its robot file says (``text ..N``): the grammar closes the
quote there, so a model caught repeating itself inside a string cannot spend a segment's whole token budget."""
RETURN_TYPES = ("bool", "number", "text")
BLOCKING_LANGUAGES = ("minispec", "calls")
"""Plan languages made of statements, after which an observation can be written."""
DEFAULT_OBSERVATION_FORM = " # {value}\n"
"""How a blocking call's value is written after it (both statement languages read it as a comment)."""
DEFAULT_OBSERVATION_MAX_TOKENS = 48
SIMULATED_VALUES = {"bool": ("true", "false"), "number": ("0", "1", "2", "5"), "text": ("nothing unusual",)}
"""What a simulated robot reports for a blocking skill, by its return type, when nothing says what it sees."""


@dataclass(frozen=True)
class TimeModel:
    kind: str
    values: tuple[float, ...]

    def lower_bound(self, arg: float | None) -> float:
        if self.kind == "samples":
            return min(self.values)
        return self._deterministic(arg)

    def sample(self, arg: float | None, rng: random.Random) -> float:
        if self.kind == "samples":
            return rng.choice(self.values)
        return self._deterministic(arg)

    def _deterministic(self, arg: float | None) -> float:
        if self.kind == "fixed":
            return self.values[0]
        slope, intercept = self.values
        return max(0.0, slope * abs(arg or 0.0) + intercept)


@dataclass(frozen=True)
class ObservationForm:
    """How a blocking call's value is written into the model's context, and the longest value taken."""

    form: str = DEFAULT_OBSERVATION_FORM
    max_tokens: int = DEFAULT_OBSERVATION_MAX_TOKENS

    def text(self, skill: str, value: str) -> str:
        """The observation of ``value`` (its whitespace runs made single spaces: it stays on one line)."""
        return self.form.replace("{skill}", skill).replace("{value}", " ".join(value.split()))

    def pattern(self) -> re.Pattern[str]:
        """Matches an observation written in this form (a worked example's)."""
        parts = [re.escape(p) for p in self.form.split("{value}")]
        return re.compile(parts[0].replace(re.escape("{skill}"), r"\w+") + r"(?P<value>[^\n]+?)"
                          + parts[1].replace(re.escape("{skill}"), r"\w+"))


@dataclass(frozen=True)
class SkillCall:
    name: str
    args: tuple[str, ...]

    @property
    def numeric_arg(self) -> float | None:
        for arg in self.args:
            try:
                return float(arg)
            except ValueError:
                continue
        return None


@dataclass(frozen=True)
class ArgSpec:
    name: str
    type: str
    """One of ARG_TYPES."""
    low: int = 0
    high: int = 0
    """Inclusive bounds of an ``int`` argument."""
    max_chars: int = 0
    """The most characters between the quotes of a ``name`` or ``text`` argument (either, for ``any``); 0: the
    type's ``DEFAULT_MAX_CHARS``, which the grammar applies."""


@dataclass(frozen=True)
class Skill:
    abbr: str
    name: str
    args: tuple[ArgSpec, ...]
    time: TimeModel
    returns: str | None = None
    """What the skill's value is (one of RETURN_TYPES), None for actions without a useful value."""
    description: str = ""
    """What the skill does, in the words the prompt uses."""
    blocking: bool = False
    """The plan waits for the skill's value (reported by the robot) before it goes on."""

    @property
    def takes_args(self) -> bool:
        return bool(self.args)


DEFAULT_LAYOUT = "{intro}\nSkills:\n{skills}\n{guidance}\n{examples}\n"
DEFAULT_EXAMPLE_FORMAT = "Example {n}:\nTask: {task}\nResponse: {plan}"
"""As a request reads (see :func:`request_prompt`), so the examples show the model the very form it continues."""
@dataclass(frozen=True)
class WorkedExample:
    task: str
    plan: str
    off_grammar: str | None = None
    """Why this example is kept although its plan does not parse in the robot's grammar."""


@dataclass(frozen=True)
class PromptParts:
    intro: str
    guidance: str
    examples: tuple[WorkedExample, ...]
    skills_text: str | None = None
    layout: str = DEFAULT_LAYOUT
    example_format: str = DEFAULT_EXAMPLE_FORMAT


def request_prompt(system_prompt: str, task: str) -> str:
    """The full prompt of a request: the robot's fixed system part, then the task (the part that varies)."""
    return f"{system_prompt}\nTask: {task}\nResponse: "


class SkillModel:
    """One robot type: its skills, how to spot them in text, how long they take."""

    def __init__(self, robot: str, language: str, skills: list[Skill], segment_max_tokens: int,
                 segment_generation_time: float, words_per_minute: float | None = None,
                 source: str = "<memory>", prompt: PromptParts | None = None,
                 observation: ObservationForm | None = None, system_prompt: str = "") -> None:
        """``system_prompt``: built from ``prompt`` by the loader (:mod:`timely_llm.plan.robot_file`)."""
        self.robot = robot
        self.language = language
        self.skills = {s.abbr: s for s in skills}
        self.segment_max_tokens = segment_max_tokens
        self.segment_generation_time = segment_generation_time
        self.words_per_minute = words_per_minute
        self.source = source
        self.prompt = prompt
        self.observation = observation or ObservationForm()
        self.system_prompt = system_prompt
        """The fixed part of every prompt of this robot (empty for a robot without a prompt section)."""
        self._call_re = _call_regex(skills) if skills else None
        self.has_blocking = any(s.blocking for s in skills)
        """Some skill is blocking: a plan may wait for a value."""

    def served_open_loop(self) -> SkillModel:
        """This robot, prompt and all, its blocking skills served as any other: the plan goes on without their
        values (the closed-loop benchmark's baseline; what a server that streams each plan whole can serve)."""
        served = copy.copy(self)
        served.has_blocking = False
        return served

    def prompt_text(self, task: str) -> str:
        """The exact text the model is asked to continue for ``task``."""
        return request_prompt(self.system_prompt, task)

    def find_calls(self, text: str) -> list[SkillCall]:
        """Every complete skill call in ``text``, in order."""
        if self._call_re is None:
            return []
        calls = []
        for m in self._call_re.finditer(_mask_strings(text)):
            if m.group("bare"):
                calls.append(SkillCall(m.group("bare"), ()))
            else:
                calls.append(SkillCall(m.group("abbr"), _split_args(text[m.start("args"):m.end("args")])))
        return calls

    def blocking_call(self, segment: str) -> SkillCall | None:
        """The blocking call ``segment`` ends with (only its statement's terminator after it), else None."""
        if not self.has_blocking or self._call_re is None:
            return None
        masked = _mask_strings(segment)
        calls = list(self._call_re.finditer(masked))
        if not calls or masked[calls[-1].end():].strip(" ;") or not self.skills[_abbr_of(calls[-1])].blocking:
            return None
        return self.find_calls(segment[calls[-1].start():])[0]

    def without_observations(self, text: str) -> str:
        """``text`` (a worked example's plan) without the observations written after its blocking calls;
        ValueError naming an observation that follows no blocking call."""
        pattern, kept, start = self.observation.pattern(), [], 0
        for m in pattern.finditer(text):
            if self.blocking_call(text[start:m.start()]) is None:
                raise ValueError(f"observation {m.group(0)!r} does not follow a blocking call")
            kept.append(text[start:m.start()])
            start = m.end()
        return "".join(kept) + text[start:]

    def has_call(self, text: str) -> bool:
        return self._call_re is not None and self._call_re.search(_mask_strings(text)) is not None

    def min_exec_time(self, text: str, calls: list[SkillCall] | None = None) -> float:
        """Lower bound of the time the robot needs to execute ``text`` (``calls``: its calls, when found already)."""
        if self.words_per_minute:
            return _reading_time(text, self.words_per_minute)
        calls = self.find_calls(text) if calls is None else calls
        return sum(self.skills[c.name].time.lower_bound(c.numeric_arg) for c in calls)

    def sample_exec_time(self, text: str, rng: random.Random) -> float:
        """One draw of the time a simulated robot takes to execute ``text``."""
        if self.words_per_minute:
            return _reading_time(text, self.words_per_minute)
        return sum(self.skills[c.name].time.sample(c.numeric_arg, rng) for c in self.find_calls(text))


def _abbr_of(call: re.Match[str]) -> str:
    return call.group("abbr") or call.group("bare")


def _reading_time(text: str, words_per_minute: float) -> float:
    return len(text.split()) * 60.0 / words_per_minute


def _call_regex(skills: list[Skill]) -> re.Pattern[str]:
    def alternatives(with_args: bool) -> str:
        names = sorted((re.escape(s.abbr) for s in skills if s.takes_args == with_args), key=len, reverse=True)
        return "|".join(names) or "(?!)"

    # A bare skill (no arguments) is complete only once the next character shows its name has ended.
    return re.compile(
        rf"(?<![\w.])(?:(?P<abbr>{alternatives(True)})\((?P<args>[^()]*)\)"
        rf"|(?P<bare>{alternatives(False)})(?:\(\))?(?=[;}}\s)]|$))"
    )


_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")


def _mask_strings(text: str) -> str:
    """Blank out quoted literals so skill names inside strings are not taken as calls."""
    if "'" not in text and '"' not in text:  # nothing to blank: spare the substitution (the loop runs this per cut)
        return text
    return _QUOTED.sub(_blank, text)


def _blank(quoted: re.Match[str]) -> str:
    literal = quoted.group(0)
    return literal[0] + "_" * (len(literal) - 2) + literal[-1]


def _split_args(raw: str) -> tuple[str, ...]:
    """A call's arguments: split at the commas outside quoted literals, each stripped of its one pair of quotes
    (``'Hi, there', 3`` -> ``Hi, there`` and ``3``). The grammars have no escapes: a literal ends at its quote."""
    args, start, quote = [], 0, None
    for i, ch in enumerate(raw):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == ",":
            args.append(raw[start:i])
            start = i + 1
    args.append(raw[start:])
    return tuple(_unquoted(a.strip()) for a in args if a.strip())


def _unquoted(arg: str) -> str:
    if len(arg) >= 2 and arg[0] == arg[-1] and arg[0] in "'\"":
        return arg[1:-1]
    return arg
