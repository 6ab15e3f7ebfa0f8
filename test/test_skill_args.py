"""A skill call's arguments as the robot receives them (``SkillCall.args``): split at the commas outside quoted
literals, each literal without its quotes, for every argument type a robot file declares."""

from __future__ import annotations

from pathlib import Path

import pytest

from timely_llm.plan.grammar import plan_grammar
from timely_llm.plan.robot_file import load_skill_model, load_skill_models

ROBOT_FILE = """
robot: every_arg
language: calls
segment:
  max_tokens: 20
  generation_time: 0.16
prompt:
  intro: You move things.
  guidance: Use the skills below.
  examples:
    - task: "Put three in bay one."
      plan: "put(3,'bay_1','three, please',1);"
skills:
  - abbr: put
    name: put
    args: [{count: int 0..99}, {place: name}, {note: text}, anything]
    description: one argument of each type
    time: {fixed: 1.0}
"""


@pytest.fixture
def every_arg(tmp_path: Path):  # noqa: ANN201 - SkillModel
    path = tmp_path / "every_arg.yaml"
    path.write_text(ROBOT_FILE)
    return load_skill_model(path)


def test_a_comma_inside_a_quoted_literal_stays_in_its_argument() -> None:
    base = load_skill_models()["mobile_base"]
    plan = "say('Hi, there');"
    assert plan_grammar(base).accepts(plan)
    [call] = base.find_calls(plan)
    assert (call.name, call.args) == ("say", ("Hi, there",))


@pytest.mark.parametrize(("text", "args"), [
    ("put(3,'bay_b1','Hi, there, friend',7);", ("3", "bay_b1", "Hi, there, friend", "7")),
    ("put(12,'dock','no comma','a, b');", ("12", "dock", "no comma", "a, b")),
    ("put(0,'x1',',',\"double, quoted\");", ("0", "x1", ",", "double, quoted")),
    ("put(5,'a',' spaced ','');", ("5", "a", " spaced ", "")),
])
def test_each_argument_type_is_split_outside_quotes(every_arg, text: str, args: tuple[str, ...]) -> None:  # noqa: ANN001
    [call] = every_arg.find_calls(text)
    assert call.args == args


def test_the_grammar_accepts_what_the_splitter_reads(every_arg) -> None:  # noqa: ANN001
    plan = "put(3,'bay_b1','Hi, there',7);"
    assert plan_grammar(every_arg).accepts(plan)
    assert every_arg.find_calls(plan)[0].args == ("3", "bay_b1", "Hi, there", "7")


def test_an_apostrophe_in_a_double_quoted_literal_does_not_open_a_quote(every_arg) -> None:  # noqa: ANN001
    [call] = every_arg.find_calls("put(1,'a',\"it's, fine\",2);")
    assert call.args == ("1", "a", "it's, fine", "2")
