"""A robot's system prompt, built from the ``prompt:`` section of its skill-model file.

The section holds the prompt's parts; the prompt is the ``layout`` with each placeholder
replaced by its part:

  ``{intro}``     ``prompt.intro``: who the model is and what it writes;
  ``{skills}``    one line per skill from its signature and ``description``
                  (``- go_to(place: quoted name) -> bool: ...``); a file may describe its skills in
                  prose instead (``prompt.skills_text``), and then only the skills the prose does not
                  name get a line, after it; where skills are blocking, a last line says that their
                  values come back written after the call, and in what form;
  ``{guidance}``  ``prompt.guidance``: rules, syntax, hints;
  ``{examples}``  ``prompt.examples``, each ``{task, plan}`` written by ``example_format``.

Every worked example's plan must parse in the robot's own plan grammar, so the model is
never shown a plan it could not write (an example kept verbatim from a published prompt
may say why it does not parse in ``off_grammar``). A request's prompt is the system
prompt, then the task (:func:`timely_llm.plan.skills.request_prompt`).
"""

from __future__ import annotations

import re
from typing import Any

from timely_llm.errors import ConfigError
from timely_llm.plan.skills import DEFAULT_EXAMPLE_FORMAT, DEFAULT_LAYOUT, ArgSpec, PromptParts, Skill, WorkedExample

PLACEHOLDERS = ("intro", "skills", "guidance", "examples")
PROMPT_KEYS = ("intro", "guidance", "examples", "skills_text", "layout", "example_format")
_PLACEHOLDER = re.compile(r"\{(" + "|".join(PLACEHOLDERS) + r")\}")


def build_system_prompt(parts: PromptParts, skills: list[Skill], observation_form: str) -> str:
    """The robot's system prompt: ``parts.layout`` with every placeholder filled."""
    examples = "\n".join(parts.example_format.format(n=n, task=e.task, plan=e.plan)
                         for n, e in enumerate(parts.examples, 1))
    fill = {"intro": parts.intro, "skills": _skills_part(parts, skills) + _observations_line(skills, observation_form),
            "guidance": parts.guidance, "examples": examples}
    return _PLACEHOLDER.sub(lambda m: fill[m.group(1)], parts.layout)


def _skills_part(parts: PromptParts, skills: list[Skill]) -> str:
    """The prose description, if any, then one line per skill it does not name."""
    lines = [_skill_line(s) for s in skills if not _named_in(parts.skills_text, s)]
    return "\n".join(([parts.skills_text] if parts.skills_text else []) + lines)


def _observations_line(skills: list[Skill], form: str) -> str:
    """How the values of blocking skills appear in a plan ("" for a robot without any)."""
    blocking = [s for s in skills if s.blocking]
    if not blocking:
        return ""
    shown = form.replace("{skill}", blocking[0].abbr).replace("{value}", "VALUE").rstrip("\n")
    names = ", ".join(s.abbr for s in blocking)
    return (f"\nThe plan waits after a call to {names}: the robot's answer is written right after the call, "
            f'as in "{blocking[0].abbr}(...);{shown}", and the plan goes on using it.')


def _named_in(text: str | None, skill: Skill) -> bool:
    return text is not None and re.search(rf"(?<!\w){re.escape(skill.abbr)}(?!\w)", text) is not None


def _skill_line(skill: Skill) -> str:
    returns = f" -> {skill.returns}" if skill.returns else ""
    named = "" if skill.name == skill.abbr else f" [{skill.name}]"
    args = ", ".join(_arg_text(a) for a in skill.args)
    return f"- {skill.abbr}({args}){returns}{named}: {skill.description}"


def _arg_text(arg: ArgSpec) -> str:
    if arg.type == "int":
        return f"{arg.name}: integer {arg.low}..{arg.high}"
    if arg.type in ("name", "text"):
        return f"{arg.name}: quoted {arg.type}"
    return arg.name


def parse_prompt(raw: Any, skills: list[Skill], source: str) -> PromptParts:
    """The ``prompt:`` section; ConfigError names the file and the field at fault."""
    if not isinstance(raw, dict):
        raise ConfigError(source, "prompt", "expected a mapping with intro, guidance and examples")
    unknown = sorted(str(k) for k in raw if k not in PROMPT_KEYS)
    if unknown:
        raise ConfigError(source, f"prompt.{unknown[0]}", f"unknown field (known: {', '.join(PROMPT_KEYS)})")
    parts = PromptParts(
        intro=_text(raw, "intro", source), guidance=_text(raw, "guidance", source),
        examples=_examples(raw.get("examples"), source),
        skills_text=_text(raw, "skills_text", source) if "skills_text" in raw else None,
        layout=_optional_text(raw, "layout", DEFAULT_LAYOUT, source),
        example_format=_optional_text(raw, "example_format", DEFAULT_EXAMPLE_FORMAT, source))
    _check_layout(parts.layout, source)
    _check_example_format(parts.example_format, source)
    _check_described(parts, skills, source)
    return parts


def _text(raw: dict, key: str, source: str) -> str:
    value = raw.get(key)
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(source, f"prompt.{key}", "missing" if value is None else "must be non-empty text")
    return value.rstrip("\n")


def _optional_text(raw: dict, key: str, default: str, source: str) -> str:
    if key not in raw:
        return default
    if not isinstance(raw[key], str):
        raise ConfigError(source, f"prompt.{key}", f"must be text, got {type(raw[key]).__name__}")
    return raw[key]


def _examples(raw: Any, source: str) -> tuple[WorkedExample, ...]:
    if not isinstance(raw, list) or not raw:
        raise ConfigError(source, "prompt.examples", "expected a non-empty list of {task, plan}")
    examples = []
    for i, item in enumerate(raw):
        where = f"prompt.examples[{i}]"
        if not isinstance(item, dict) or not {"task", "plan"} <= item.keys() or set(item) - {"task", "plan",
                                                                                              "off_grammar"}:
            raise ConfigError(source, where, "expected {task, plan} (and optionally off_grammar)")
        for key in item:
            if not isinstance(item[key], str) or not item[key].strip():
                raise ConfigError(source, f"{where}.{key}", "must be non-empty text")
        examples.append(WorkedExample(item["task"], item["plan"], item.get("off_grammar")))
    return tuple(examples)


def _check_layout(layout: str, source: str) -> None:
    for name in PLACEHOLDERS:
        count = layout.count("{" + name + "}")
        if count != 1:
            raise ConfigError(source, "prompt.layout", f"must hold {{{name}}} exactly once, holds it {count} times")


def _check_example_format(example_format: str, source: str) -> None:
    try:
        example_format.format(n=1, task="t", plan="p")
    except (KeyError, IndexError, ValueError) as exc:
        raise ConfigError(source, "prompt.example_format",
                          f"only {{n}}, {{task}} and {{plan}} may be filled in ({exc!r})") from exc
    if "{task}" not in example_format or "{plan}" not in example_format:
        raise ConfigError(source, "prompt.example_format", "must hold {task} and {plan}")


def _check_described(parts: PromptParts, skills: list[Skill], source: str) -> None:
    """Each skill is described: by its own ``description``, or named in the prose of ``skills_text``."""
    for i, skill in enumerate(skills):
        if not skill.description and not _named_in(parts.skills_text, skill):
            raise ConfigError(source, f"skills[{i}].description", "missing: every skill is described in the prompt"
                              + (" (prompt.skills_text does not name it)" if parts.skills_text else ""))
