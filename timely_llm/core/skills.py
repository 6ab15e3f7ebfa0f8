"""Robot skill tables and their execution-time models, loaded from ``skill_models/*.yaml``.

A skill's time model is one of:
  ``{fixed: S}``                         always S seconds;
  ``{linear: {slope: A, intercept: B}}`` A * x + B for the skill's first numeric argument x;
  ``{samples: [S1, S2, ...]}``           scene-dependent: the robot draws one of the profiled times.
The scheduler plans with the lower bound (the minimum execution time, §4.3); the
simulated robot samples.

Each argument has a type, which the plan grammar (``core/grammar.py``) enforces:
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
(see :mod:`timely_llm.core.robot_prompt`): the file is the one source of the robot's
grammar, prompt, stop-checker and time estimates.
"""

from __future__ import annotations

import copy
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from timely_llm.core.robot_prompt import PromptParts, build_system_prompt, check_examples, parse_prompt, request_prompt
from timely_llm.errors import ConfigError, read_mapping
from timely_llm.share import share_dir

SEGMENT_LANGUAGES = ("minispec", "calls", "sentence", "paragraph")
ARG_TYPES = ("int", "name", "text", "any")
RETURN_TYPES = ("bool", "number", "text")
FILE_KEYS = ("robot", "language", "segment", "words_per_minute", "skills", "prompt", "observation")
SKILL_KEYS = ("abbr", "name", "args", "returns", "blocking", "time", "description")
OBSERVATION_KEYS = ("form", "max_tokens")
BLOCKING_LANGUAGES = ("minispec", "calls")
"""Plan languages made of statements, after which an observation can be written."""
DEFAULT_OBSERVATION_FORM = " # {value}\n"
"""How a blocking call's value is written after it (both statement languages read it as a comment)."""
DEFAULT_OBSERVATION_MAX_TOKENS = 48
SIMULATED_VALUES = {"bool": ("true", "false"), "number": ("0", "1", "2", "5"), "text": ("nothing unusual",)}
"""What a simulated robot reports for a blocking skill, by its return type, when nothing says what it sees."""
_INT_TYPE = re.compile(r"int\s+(\d+)\s*\.\.\s*(\d+)")


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


class SkillModel:
    """One robot type: its skills, how to spot them in text, how long they take."""

    def __init__(self, robot: str, language: str, skills: list[Skill], segment_max_tokens: int,
                 segment_generation_time: float, words_per_minute: float | None = None,
                 source: str = "<memory>", prompt: PromptParts | None = None,
                 observation: ObservationForm | None = None) -> None:
        self.robot = robot
        self.language = language
        self.skills = {s.abbr: s for s in skills}
        self.segment_max_tokens = segment_max_tokens
        self.segment_generation_time = segment_generation_time
        self.words_per_minute = words_per_minute
        self.source = source
        self.prompt = prompt
        self.observation = observation or ObservationForm()
        self.system_prompt = build_system_prompt(prompt, skills, self.observation.form) if prompt else ""
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
    return tuple(a.strip().strip("'\"") for a in raw.split(",") if a.strip())


def load_skill_model(path: str | Path) -> SkillModel:
    """Load and validate one skill-model file; ConfigError names the file and field."""
    source = str(path)
    data = read_mapping(path)
    _no_unknown_keys(data, FILE_KEYS, source, "")
    robot = _require(data, "robot", str, source)
    language = _require(data, "language", str, source)
    if language not in SEGMENT_LANGUAGES:
        raise ConfigError(source, "language", f"must be one of {SEGMENT_LANGUAGES}, got {language!r}")
    segment = _require(data, "segment", dict, source)
    max_tokens = _require(segment, "max_tokens", int, source, "segment.")
    gen_time = float(_require(segment, "generation_time", (int, float), source, "segment."))
    if max_tokens <= 0 or gen_time <= 0:
        raise ConfigError(source, "segment", "max_tokens and generation_time must be > 0")
    wpm = data.get("words_per_minute")
    if wpm is not None and (not isinstance(wpm, (int, float)) or wpm <= 0):
        raise ConfigError(source, "words_per_minute", "must be a positive number")
    raw_skills = data.get("skills", [])
    if not isinstance(raw_skills, list) or (not raw_skills and wpm is None):
        raise ConfigError(source, "skills", "expected a non-empty list (or words_per_minute for reading)")
    skills = [_parse_skill(s, i, source) for i, s in enumerate(raw_skills)]
    _no_duplicates(skills, source)
    if "prompt" not in data and skills:
        raise ConfigError(source, "prompt", "missing: a robot with skills needs intro, guidance and examples")
    observation = _parse_observation(data.get("observation"), skills, language, source)
    prompt = parse_prompt(data["prompt"], skills, source) if "prompt" in data else None
    model = SkillModel(robot, language, skills, max_tokens, gen_time, wpm, source, prompt, observation)
    if prompt is not None:
        check_examples(prompt, model, source)
    return model


def _no_unknown_keys(data: dict, known: tuple[str, ...], source: str, prefix: str) -> None:
    for key in data:
        if key not in known:
            raise ConfigError(source, prefix + str(key), f"unknown field (known: {', '.join(known)})")


def _no_duplicates(skills: list[Skill], source: str) -> None:
    seen: set[str] = set()
    for i, skill in enumerate(skills):
        if skill.abbr in seen:
            raise ConfigError(source, f"skills[{i}].abbr", f"duplicate skill {skill.abbr!r}")
        seen.add(skill.abbr)


def _parse_skill(raw: Any, index: int, source: str) -> Skill:
    where = f"skills[{index}]."
    if not isinstance(raw, dict):
        raise ConfigError(source, f"skills[{index}]", "expected a mapping")
    _no_unknown_keys(raw, SKILL_KEYS, source, where)
    abbr = _require(raw, "abbr", str, source, where)
    name = _require(raw, "name", str, source, where)
    if not re.fullmatch(r"[A-Za-z_]\w*", abbr):
        raise ConfigError(source, where + "abbr", f"{abbr!r} is not an identifier a plan can call")
    description = raw.get("description", "")
    if not isinstance(description, str) or ("description" in raw and not description.strip()):
        raise ConfigError(source, where + "description", "must be non-empty text")
    args = raw.get("args", [])
    if not isinstance(args, list):
        raise ConfigError(source, where + "args", "expected a list")
    returns = raw.get("returns")
    if returns is not None and returns not in RETURN_TYPES:
        raise ConfigError(source, where + "returns", f"must be one of {RETURN_TYPES}, got {returns!r}")
    blocking = raw.get("blocking", False)
    if not isinstance(blocking, bool):
        raise ConfigError(source, where + "blocking", f"must be true or false, got {blocking!r}")
    if blocking and returns is None:
        raise ConfigError(source, where + "blocking", "a blocking skill needs returns: (the value the plan waits for)")
    specs = tuple(_parse_arg(a, f"{where}args[{i}]", source) for i, a in enumerate(args))
    time_model = _parse_time(_require(raw, "time", dict, source, where), source, where)
    return Skill(abbr, name, specs, time_model, returns, description.strip(), blocking)


def _parse_observation(raw: Any, skills: list[Skill], language: str, source: str) -> ObservationForm:
    """The ``observation`` section (defaults where absent); blocking skills only in statement languages."""
    blocking = [s.abbr for s in skills if s.blocking]
    if blocking and language not in BLOCKING_LANGUAGES:
        raise ConfigError(source, "skills", f"blocking skill {blocking[0]!r} in a {language} plan: only "
                                            f"{' and '.join(BLOCKING_LANGUAGES)} plans can wait for a value")
    if raw is None:
        return ObservationForm()
    if not isinstance(raw, dict):
        raise ConfigError(source, "observation", "expected a mapping with form and/or max_tokens")
    _no_unknown_keys(raw, OBSERVATION_KEYS, source, "observation.")
    form = raw.get("form", DEFAULT_OBSERVATION_FORM)
    if not isinstance(form, str) or form.count("{value}") != 1:
        raise ConfigError(source, "observation.form", f"must be text holding {{value}} exactly once, got {form!r}")
    if "\n" in form.rstrip("\n") or not form.split("{value}")[1]:
        raise ConfigError(source, "observation.form",
                          "must be one line (a trailing newline allowed) with text after {value}, where the value ends")
    limit = raw.get("max_tokens", DEFAULT_OBSERVATION_MAX_TOKENS)
    if not isinstance(limit, int) or isinstance(limit, bool) or limit <= 0:
        raise ConfigError(source, "observation.max_tokens", f"must be a positive integer, got {limit!r}")
    return ObservationForm(form, limit)


def _parse_arg(raw: Any, where: str, source: str) -> ArgSpec:
    if isinstance(raw, str):
        return ArgSpec(raw, "any")
    if not (isinstance(raw, dict) and len(raw) == 1 and isinstance(next(iter(raw.values())), str)):
        raise ConfigError(source, where, "expected NAME or {NAME: TYPE}")
    name, kind = next(iter(raw.items()))
    if m := _INT_TYPE.fullmatch(kind.strip()):
        low, high = int(m.group(1)), int(m.group(2))
        if low > high:
            raise ConfigError(source, where, f"empty range {low}..{high}")
        return ArgSpec(name, "int", low, high)
    if kind.strip() in ("name", "text"):
        return ArgSpec(name, kind.strip())
    raise ConfigError(source, where, f"type must be 'int LOW..HIGH', 'name' or 'text', got {kind!r}")


def _parse_time(raw: dict, source: str, where: str) -> TimeModel:
    field = where + "time"
    if len(raw) != 1:
        raise ConfigError(source, field, "expected exactly one of fixed, linear, samples")
    kind, value = next(iter(raw.items()))
    if kind == "fixed" and isinstance(value, (int, float)) and value >= 0:
        return TimeModel("fixed", (float(value),))
    if kind == "linear" and isinstance(value, dict) and {"slope", "intercept"} <= value.keys():
        if all(isinstance(value[k], (int, float)) for k in ("slope", "intercept")):
            return TimeModel("linear", (float(value["slope"]), float(value["intercept"])))
    if kind == "samples" and isinstance(value, list) and value:
        if all(isinstance(v, (int, float)) and v >= 0 for v in value):
            return TimeModel("samples", tuple(float(v) for v in value))
    raise ConfigError(source, f"{field}.{kind}", f"invalid time model {value!r}")


def _require(data: dict, key: str, kind: type | tuple[type, ...], source: str, prefix: str = "") -> Any:
    if key not in data:
        raise ConfigError(source, prefix + key, "missing")
    value = data[key]
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ConfigError(source, prefix + key, f"wrong type {type(value).__name__}")
    return value


def skill_model_dir() -> Path:
    """``skill_models/`` of the checkout or of the installed package (see :func:`timely_llm.share.share_dir`)."""
    return share_dir() / "skill_models"


def load_skill_models(paths: list[str | Path] | None = None) -> dict[str, SkillModel]:
    """Load skill models by robot name (default: every file in ``skill_models/``, which must hold one)."""
    if paths:
        files = [Path(p) for p in paths]
    else:
        files = sorted(skill_model_dir().glob("*.yaml"))
        if not files:
            raise ConfigError(str(skill_model_dir()), "*.yaml", "no skill models: no robot type would be known")
    models = {}
    for f in files:
        model = load_skill_model(f)
        models[model.robot] = model
    return models
