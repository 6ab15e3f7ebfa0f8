"""A robot type is one YAML file: skills, time models, descriptions, guidance and worked examples.

The prompt, the grammar, the stop-checker and the time estimates all come from it; the shipped
Tello's prompt is the one the paper's LRTrace figures were measured with, and the arm's is too but for its
blocking scan.
"""

from __future__ import annotations

import hashlib
import random
import subprocess
import sys
from pathlib import Path

import pytest

from timely_llm.errors import ConfigError
from timely_llm.plan.grammar import plan_grammar
from timely_llm.plan.robot_file import load_skill_model, load_skill_models, skill_model_dir
from timely_llm.plan.skills import SkillModel
from timely_llm.traces import load_catalog
from timely_llm_robot.executors.minispec import SkillFailed
from timely_llm_robot.executors.mobile_base import SimulatedMobileBase

MEASURED_SYSTEM_PROMPTS = {  # sha256 and length of lrtrace.yaml's system_prompts at 12c3262, which the figures used
    "tello": ("cb57e1fb08e1cae841dd2ddbc37d07dc046f31f99019ebabaea609fb23f2b631", 3221),
    "arm": ("4dca3a5a288376a55715bc23a67f55dba1ac464c8eb342f77a622954530d468b", 791),
}
MEASURED_TRACE_PROMPTS = "b315e0b3742ba3389a24aec0a75fe2e64648dbf1af43abca5c9823b21224965c"
"""sha256 over every LRTrace task's full prompt, in catalog order, at 12c3262."""
ARM_BLOCKING_SCAN = ("blocking: true,", r" # true\n",
                     "    If a scan answers false, the object is not there: leave it and go on with the rest of the"
                     " task.\n")
"""What arm.yaml added to the measured arm for its blocking scan: the flag (whose prompt line says how a value
appears), the value in each worked example, one line of guidance."""

USER_ROBOT = """\
robot: lawn_mower
language: calls
segment: {max_tokens: 16, generation_time: 0.1}
skills:
  - {abbr: mow_zone, name: mow_zone, args: [{zone: name}, {height_mm: int 20..80}],
     description: cut the grass of a zone to a height, time: {linear: {slope: 2.0, intercept: 30.0}}}
  - {abbr: edge_trim, name: edge_trim, args: [{border: name}], description: trim along a border,
     time: {samples: [40.0, 55.0]}}
  - {abbr: empty_bin, name: empty_bin, args: [], description: drive to the compost heap and empty the grass bin,
     time: {fixed: 90.0}}
  - {abbr: rain_ahead, name: rain_ahead, args: [], returns: bool, description: whether rain is forecast this hour,
     time: {fixed: 0.2}}
prompt:
  intro: You drive a robotic lawn mower. Answer with skill calls, each ending with ';'.
  guidance: Mow before trimming. Empty the bin after two zones.
  examples:
    - {task: "Mow the front lawn short.", plan: "mow_zone('front_lawn',30);empty_bin;"}
    - {task: "Tidy the hedge border.", plan: "edge_trim('hedge');"}
"""


def user_robot(tmp_path: Path, text: str = USER_ROBOT) -> Path:
    path = tmp_path / "lawn_mower.yaml"
    path.write_text(text)
    return path


def measured_robots(tmp_path: Path) -> dict[str, SkillModel]:
    """The shipped robots, the arm as measured: arm.yaml without what its blocking scan added."""
    text = (skill_model_dir() / "arm.yaml").read_text()
    for added in ARM_BLOCKING_SCAN:
        assert added in text
        text = text.replace(added, "")
    path = tmp_path / "arm.yaml"
    path.write_text(text)
    return {**load_skill_models(), "arm": load_skill_model(path)}


@pytest.mark.parametrize("robot", sorted(MEASURED_SYSTEM_PROMPTS))
def test_shipped_prompt_is_the_measured_lrtrace_prompt_byte_for_byte(robot: str, tmp_path: Path) -> None:
    prompt = measured_robots(tmp_path)[robot].system_prompt
    assert (hashlib.sha256(prompt.encode()).hexdigest(), len(prompt)) == MEASURED_SYSTEM_PROMPTS[robot]


def test_the_shipped_arm_waits_for_its_scan_and_its_prompt_says_how_the_answer_appears() -> None:
    arm = load_skill_models()["arm"]
    assert arm.blocking_call("scan('cup');") is not None and arm.blocking_call("goto('cup');") is None
    assert 'the robot\'s answer is written right after the call, as in "scan(...); # VALUE"' in arm.system_prompt
    assert "Response: scan('cup'); # true\ngoto('cup');" in arm.system_prompt


def test_every_lrtrace_request_prompt_is_unchanged_and_the_chatbot_keeps_its_empty_one(tmp_path: Path) -> None:
    catalog = load_catalog(robots=measured_robots(tmp_path))
    digest = hashlib.sha256()
    for trace in catalog.traces.values():
        digest.update(catalog.prompt_text(trace.robot, trace.prompt).encode())
    assert digest.hexdigest() == MEASURED_TRACE_PROMPTS
    assert load_skill_models()["chatbot"].system_prompt == ""


def test_the_catalog_holds_no_prompt_of_its_own(tmp_path: Path) -> None:
    old = tmp_path / "old.yaml"
    old.write_text("system_prompts: {tello: hi}\ntasks: []\n")
    with pytest.raises(ConfigError, match=r"old\.yaml: system_prompts: a robot's prompt lives in its skill-model"):
        load_catalog(old)


def test_every_worked_example_of_every_shipped_robot_parses_in_its_grammar() -> None:
    models = load_skill_models()
    assert {"tello", "arm", "mobile_base", "chatbot"} <= set(models)
    off_grammar = []
    for model in models.values():
        for n, example in enumerate(model.prompt.examples if model.prompt else (), 1):
            if example.off_grammar:
                off_grammar.append((model.robot, n))
            assert plan_grammar(model).accepts(example.plan) is not example.off_grammar, (model.robot, n)
            assert f"{example.task}" in model.system_prompt and example.plan in model.system_prompt
    assert off_grammar == [("tello", 1)]  # TypeFly's published example, kept verbatim for the measured prompt


def test_a_user_robot_file_gives_prompt_grammar_stop_checker_and_times(tmp_path: Path) -> None:
    model = load_skill_model(user_robot(tmp_path))
    prompt = model.prompt_text("Mow the back lawn.")
    assert prompt.startswith("You drive a robotic lawn mower.") and prompt.endswith("\nTask: Mow the back lawn.\n"
                                                                                   "Response: ")
    for line in ("- mow_zone(zone: quoted name, height_mm: integer 20..80): cut the grass of a zone to a height",
                 "- edge_trim(border: quoted name): trim along a border",
                 "- empty_bin(): drive to the compost heap and empty the grass bin",
                 "- rain_ahead() -> bool: whether rain is forecast this hour",
                 "Example 1:\nTask: Mow the front lawn short.\nResponse: mow_zone('front_lawn',30);empty_bin;"):
        assert line in prompt
    grammar = plan_grammar(model)
    assert grammar.accepts("mow_zone('back_lawn',45);edge_trim('fence');empty_bin;")
    for foreign in ("goto('lawn');", "mow_zone('back_lawn',10);", "mf(50);", "scan('grass');"):
        assert not grammar.accepts(foreign), foreign
    calls = model.find_calls("mow_zone('a',40);empty_bin;")
    assert [(c.name, c.args) for c in calls] == [("mow_zone", ("a", "40")), ("empty_bin", ())]
    assert model.min_exec_time("mow_zone('a',40);edge_trim('b');empty_bin;") == 2.0 * 40 + 30.0 + 40.0 + 90.0
    assert model.sample_exec_time("edge_trim('b');", random.Random(1)) in (40.0, 55.0)


@pytest.mark.parametrize(("edit", "field", "reason"), [
    (lambda t: t.replace("description: trim along a border,", ""), "skills[1].description", "missing"),
    (lambda t: t.replace("'hedge'", "'Hedge Row'"), "prompt.examples[1].plan", "does not parse"),
    (lambda t: t.replace("int 20..80", "float 20..80"), "skills[0].args[1]", "type must be"),
    (lambda t: t.replace("{zone: name}", "{zone: name ..0}"), "skills[0].args[0]", "at least 1 character"),
    (lambda t: t.replace("{zone: name}", "{zone: name 0..40}"), "skills[0].args[0]", "'name [..MAX]'"),
    (lambda t: t.replace("  guidance: Mow", "  advice: Mow"), "prompt.advice", "unknown field"),
    (lambda t: t.replace("  guidance: Mow before trimming. Empty the bin after two zones.\n", ""),
     "prompt.guidance", "missing"),
    (lambda t: t.replace("prompt:", "prompt:\n  layout: '{intro} {skills} {examples}'"), "prompt.layout",
     "{guidance} exactly once"),
    (lambda t: t.replace("prompt:", "prompt:\n  skills_text: mow_zone and edge_trim do it all")
     .replace("description: drive to the compost heap and empty the grass bin,", ""),
     "skills[2].description", "prompt.skills_text does not name it"),
    (lambda t: t.replace("  - {abbr: rain_ahead", "  - {abbr: edge_trim"), "skills[3].abbr", "duplicate skill"),
    (lambda t: t.split("prompt:")[0], "prompt", "missing"),
    (lambda t: t.replace("    - {task: \"Tidy", "    - {plan: \"x;\", tsk: \"Tidy"), "prompt.examples[1]",
     "expected {task, plan}"),
])
def test_a_malformed_robot_file_is_refused_naming_file_and_field(tmp_path: Path, edit, field: str,  # noqa: ANN001
                                                                  reason: str) -> None:
    path = user_robot(tmp_path, edit(USER_ROBOT))
    with pytest.raises(ConfigError) as refused:
        load_skill_model(path)
    message = str(refused.value)
    assert message.startswith(f"{path}: {field}: ") and reason in message and "\n" not in message, message


def test_a_skill_added_beside_prose_skill_text_gets_its_own_line(tmp_path: Path) -> None:
    extended = tmp_path / "tello.yaml"
    extended.write_text((skill_model_dir() / "tello.yaml").read_text()
                        + "  - {abbr: fl, name: flip, args: [{direction: name}], time: {fixed: 1.0},"
                          " description: flip towards a direction}\n")
    prompt = load_skill_model(extended).system_prompt
    shipped = load_skill_models()["tello"].system_prompt
    line = "- fl(direction: quoted name) [flip]: flip towards a direction\n"
    assert prompt == shipped.replace("goto (g, object name).\n", "goto (g, object name).\n" + line)


def test_a_marked_off_grammar_example_that_parses_is_refused(tmp_path: Path) -> None:
    path = user_robot(tmp_path, USER_ROBOT.replace('plan: "edge_trim(\'hedge\');"',
                                                   'plan: "edge_trim(\'hedge\');", off_grammar: "why not"'))
    with pytest.raises(ConfigError, match=r"prompt\.examples\[1\]\.off_grammar: the plan parses"):
        load_skill_model(path)


def _plan_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "timely_llm.cli", "plan", *args], capture_output=True, text=True,
                          timeout=120)


def test_plan_show_prompt_prints_the_exact_prompt_of_a_robot_in_the_given_file(tmp_path: Path) -> None:
    path = user_robot(tmp_path)
    model = load_skill_model(path)
    alone = _plan_cli("--robot", "lawn_mower", "--skill-models", str(path), "--show-prompt")
    assert alone.returncode == 0 and alone.stdout == model.system_prompt, alone.stderr
    task = "Mow the back lawn."
    full = _plan_cli("--robot", "lawn_mower", "--skill-models", str(path), "--show-prompt", "--task", task)
    assert full.returncode == 0 and full.stdout == model.prompt_text(task), full.stderr
    shipped = _plan_cli("--robot", "tello", "--show-prompt")
    assert shipped.stdout == load_skill_models()["tello"].system_prompt


def test_plan_refuses_a_malformed_robot_file_in_one_line(tmp_path: Path) -> None:
    path = user_robot(tmp_path, USER_ROBOT.replace("description: trim along a border,", ""))
    proc = _plan_cli("--robot", "lawn_mower", "--skill-models", str(path), "--show-prompt")
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"timely-llm plan: error: {path}: skills[1].description: missing")
    assert proc.stderr.count("\n") == 1


# ----- the shipped mobile base and its simulated executor -----

WORLD = {"kitchen": {"open_fridge_door"}, "front_door": {"alice"}, "office": set()}


def test_the_simulated_mobile_base_runs_every_worked_example_of_its_file() -> None:
    model = load_skill_models()["mobile_base"]
    for example in model.prompt.examples:
        base = SimulatedMobileBase(WORLD)
        calls = [(c.name, list(c.args)) for c in model.find_calls(example.plan)]
        result = base.execute_calls(calls)
        assert result.success, (example.plan, result.reason)
    assert base.state.position == "dock" and base.state.docked  # the last example docks


def test_the_simulated_mobile_base_looks_follows_and_refuses_like_a_base_on_a_map() -> None:
    base = SimulatedMobileBase(WORLD)
    base.dispatch("go_to", ["kitchen"])
    assert base.dispatch("look_for", ["open_fridge_door"]) == "here, at kitchen"
    assert base.dispatch("look_for", ["alice"]) == "not here"
    assert base.execute_calls([("look_for", ["open_fridge_door"])]).last_value == "here, at kitchen"
    with pytest.raises(SkillFailed, match="alice is not at kitchen"):
        base.dispatch("follow", ["alice", 10])
    with pytest.raises(SkillFailed, match="no place 'garage' on the map"):
        base.dispatch("go_to", ["garage"])
    result = base.execute_calls([("say", ["Hi"]), ("go_to", ["attic"]), ("say", ["never said"])])
    assert not result.success and "attic" in result.reason and base.state.said == ["Hi"]
    open_map = SimulatedMobileBase()
    assert open_map.execute_calls([("go_to", ["anywhere"]), ("follow", ["bob", 5])]).success


def test_a_fleet_mobile_base_executes_segments_in_the_times_simulated_skills_draws() -> None:
    from timely_llm.ros.interfaces import Segment as SegmentMsg
    from timely_llm.ros.interfaces import SkillCall as SkillCallMsg
    from timely_llm_bench.robots.sim_robots import simulated_robots
    from timely_llm_bench.robots.simulated import segment_rng

    skills = load_skill_models()
    model = skills["mobile_base"]
    text = "go_to('garage');look_for('bike');follow('bob',5);say('Done.');"
    segment = SegmentMsg(text=text, index=1, skills=[SkillCallMsg(name=c.name, args=list(c.args))
                                                     for c in model.find_calls(text)])
    scale = 0.02
    with simulated_robots({"base-1": "mobile_base"}, skills, load_catalog(), seed=4, time_scale=scale) as runners:
        result = runners["base-1"](segment, "task-9")
    assert result.success, result.reason
    expected = model.sample_exec_time(text, segment_rng(4, "task-9", 1)) * scale
    assert expected <= result.duration < expected + 1.0
