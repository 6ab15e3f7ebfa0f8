"""Loading a robot file (``skill_models/*.yaml``): its skills, time models, observation form and prompt parts,
each field checked with a one-line error naming the file and the field; its system prompt built
(:mod:`timely_llm.plan.robot_prompt`) and every worked example checked against its plan grammar
(:mod:`timely_llm.plan.grammar`)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from timely_llm.errors import ConfigError, read_mapping
from timely_llm.plan.grammar import plan_grammar
from timely_llm.plan.robot_prompt import build_system_prompt, parse_prompt
from timely_llm.plan.skills import (
    BLOCKING_LANGUAGES,
    DEFAULT_OBSERVATION_FORM,
    DEFAULT_OBSERVATION_MAX_TOKENS,
    RETURN_TYPES,
    SEGMENT_LANGUAGES,
    ArgSpec,
    ObservationForm,
    PromptParts,
    Skill,
    SkillModel,
    TimeModel,
)
from timely_llm.share import share_dir

FILE_KEYS = ("robot", "language", "segment", "words_per_minute", "skills", "prompt", "observation")
SKILL_KEYS = ("abbr", "name", "args", "returns", "blocking", "time", "description")
OBSERVATION_KEYS = ("form", "max_tokens")
_INT_TYPE = re.compile(r"int\s+(\d+)\s*\.\.\s*(\d+)")
_QUOTED_TYPE = re.compile(r"(name|text)(?:\s+\.\.\s*(\d+))?")


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
    system_prompt = build_system_prompt(prompt, skills, observation.form) if prompt else ""
    model = SkillModel(robot, language, skills, max_tokens, gen_time, wpm, source, prompt, observation, system_prompt)
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
    if m := _QUOTED_TYPE.fullmatch(kind.strip()):
        longest = int(m.group(2) or 0)
        if m.group(2) and longest < 1:
            raise ConfigError(source, where, f"a {m.group(1)} holds at least 1 character, got ..{longest}")
        return ArgSpec(name, m.group(1), max_chars=longest)
    raise ConfigError(source, where, f"type must be 'int LOW..HIGH', 'name [..MAX]' or 'text [..MAX]', got {kind!r}")


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


def check_examples(parts: PromptParts, model: SkillModel, source: str) -> None:
    """Every worked example parses in the robot's grammar, unless it says why not (and then truly does not)."""
    grammar = plan_grammar(model)
    if grammar is None:
        return
    for i, example in enumerate(parts.examples):
        try:
            parses = grammar.accepts(model.without_observations(example.plan))
        except ValueError as exc:
            raise ConfigError(source, f"prompt.examples[{i}].plan", str(exc)) from None
        if not parses and example.off_grammar is None:
            raise ConfigError(source, f"prompt.examples[{i}].plan",
                              f"{example.plan!r} does not parse in the {model.language} grammar of "
                              f"{model.robot}'s skills")
        if parses and example.off_grammar is not None:
            raise ConfigError(source, f"prompt.examples[{i}].off_grammar", "the plan parses: drop off_grammar")
