"""``timely-llm plan``: segments on stdout as they are cut, the plan as one JSON line last, logs elsewhere."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from timely_llm.plan.grammar import plan_grammar
from timely_llm.plan.robot_file import load_skill_models

pytestmark = pytest.mark.vllm


def test_plan_prints_segments_then_one_json_line() -> None:
    task = "Scene: [], Task: [A] Find the cat and go to it."
    proc = subprocess.run(
        [sys.executable, "-m", "timely_llm.cli", "plan", "--robot", "tello", "--task", task, "--model", "tiny",
         "--max-new-tokens", "24", "--json"],
        capture_output=True, text=True, timeout=600, env=os.environ | {"VLLM_LOGGING_LEVEL": "INFO"})
    lines = proc.stdout.splitlines()
    assert lines, proc.stderr[-2000:]
    plan = json.loads(lines[-1])
    assert set(plan) == {"robot", "task", "plan", "segments"}
    assert (plan["robot"], plan["task"]) == ("tello", task)
    assert plan["plan"] == "".join(s["text"] for s in plan["segments"])
    aborted = plan["plan"] == ""  # no statement within 24 tokens: the node aborts such a plan, saying why
    said = ["aborted: the plan's 24-token budget ran out before its first complete statement"] if aborted else []
    assert lines[:-1] == [f"segment {s['index']}: {s['text']}" for s in plan["segments"]] + said
    model = load_skill_models()["tello"]
    # Random weights write grammatical text, but 24 tokens may end it mid-statement: the plan then holds only the
    # complete statements (maybe none), and a block whose header went out already is closed empty.
    grammar, text = plan_grammar(model), plan["plan"]
    header_out = grammar.accepts_prefix(text.rstrip("}")) and text.rstrip("}").endswith("{")
    assert text == "" or grammar.accepts(text) or header_out, text
    for segment in plan["segments"]:
        assert all(set(skill) == {"name", "args"} and skill["name"] in model.skills for skill in segment["skills"])
    at_cap = "the plan stopped at its token cap" in proc.stderr  # random weights may well write 24 tokens
    assert proc.returncode == (1 if aborted else 3 if at_cap else 0), proc.stderr[-2000:]
    assert "INFO" not in proc.stdout and "INFO" in proc.stderr  # vLLM's logs stay off stdout


def test_plan_says_it_is_loading_the_engine_and_that_a_plan_without_a_statement_failed_exiting_1() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "timely_llm.cli", "plan", "--robot", "tello", "--task", "Take off.", "--model", "tiny",
         "--max-new-tokens", "2"],  # no statement of the grammar ends within 2 tokens
        capture_output=True, text=True, timeout=600)
    stderr = "\n" + proc.stderr
    loading = stderr.find("\nloading tiny on embedded vLLM (on a CPU it compiles")  # a line of its own
    assert 0 <= loading < stderr.find("Loading safetensors"), proc.stderr[-2000:]  # before the model loads
    assert "\ngenerating\n" in proc.stderr
    assert proc.stdout == "aborted: the plan's 2-token budget ran out before its first complete statement\n"
    assert "token cap" not in proc.stderr  # the plan failed; it was not cut short of its task
    assert proc.returncode == 1, proc.stderr[-2000:]


@pytest.mark.parametrize(("status", "reason", "sampled", "exit_status", "said"), [
    ("succeeded", "", 64, 3, "the plan stopped at its token cap (64 tokens; --max-new-tokens raises it)"),
    ("succeeded", "", 10, 0, ""),
    ("aborted", "the plan's 64-token budget ran out before its first complete statement", 64, 1, ""),
    ("aborted", "engine error: out of memory", 10, 1, ""),
])
def test_the_exit_status_says_how_the_plan_ended(status: str, reason: str, sampled: int, exit_status: int,
                                                said: str, capsys: pytest.CaptureFixture[str]) -> None:
    from timely_llm.cli.engine import _report
    from timely_llm.planning import GeneratedPlan

    plan = GeneratedPlan("tello", "t", status, reason, list(range(sampled)), [], max_new_tokens=64)
    assert _report(plan, False, sys.stdout) == exit_status
    out, err = capsys.readouterr()
    assert out == (f"{status}: {reason}\n" if reason else "")
    assert (said in err) and (bool(said) == bool(err)), err


def test_plan_help_documents_its_exit_statuses() -> None:
    proc = subprocess.run([sys.executable, "-m", "timely_llm.cli", "plan", "--help"], capture_output=True, text=True,
                          timeout=120, env=os.environ | {"COLUMNS": "200"})
    assert proc.returncode == 0
    assert "exit status: 0 the model ended the plan; 1 the plan failed" in " ".join(proc.stdout.split())
    assert "3 the plan was cut at its token cap (--max-new-tokens)" in " ".join(proc.stdout.split())


def test_a_plan_ended_by_the_model_is_not_at_its_cap() -> None:
    from timely_llm.planning import GeneratedPlan

    assert not GeneratedPlan("tello", "t", "succeeded", "", [1, 2, 3], [], max_new_tokens=64).stopped_at_token_cap
    assert GeneratedPlan("tello", "t", "succeeded", "", [1, 2, 3], [], max_new_tokens=3).stopped_at_token_cap


@pytest.mark.parametrize(("robot", "task", "reason"), [
    ("boat", "sail", f"--robot: unknown robot 'boat' (known: {', '.join(sorted(load_skill_models()))})"),
    ("tello", "  ", "--task: empty task"),
])
def test_plan_refuses_a_bad_robot_or_task_before_loading_a_model(robot: str, task: str, reason: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "timely_llm.cli", "plan", "--robot", robot, "--task", task],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == f"timely-llm plan: error: {reason}"
