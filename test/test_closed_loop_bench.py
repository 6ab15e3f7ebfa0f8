"""The closed-loop workload and benchmark on the simulator: robots report values drawn per seed, the node's
waiting queue against a new request per step (re-send) and open-loop."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from timely_llm.engines.hardware import load_profile
from timely_llm.errors import ConfigError
from timely_llm.plan.grammar import plan_grammar
from timely_llm_bench.evaluation.closed_loop import plan_steps, run_mode, summarize_tasks
from timely_llm_bench.evaluation.harness import EngineSetup, run_bench
from timely_llm_bench.workloads.closed_loop import TASKS_PATH, load_closed_loop

TASKS = load_closed_loop()
SETUP = EngineSetup.simulator(load_profile("rtx4090-llama3-8b"))


def small_workload(seed: int = 0):  # noqa: ANN201 - a Workload
    return TASKS.workload(seed, events_per_second=0.3, agents=6, duration=40.0)


def test_every_task_plans_in_its_robots_grammar_with_a_blocking_look_and_both_kinds_are_there() -> None:
    kinds = set()
    for trace in TASKS.catalog.traces.values():
        robot = TASKS.robots[trace.robot]
        assert plan_grammar(robot).accepts(trace.plan), trace.plan
        assert len(plan_steps(trace.plan, robot)) >= 2  # it waits at least once
        kinds.add((trace.robot, trace.category))
    assert kinds == {(r, c) for r in ("drone", "mobile_base") for c in ("urgent", "normal")}


def test_values_must_name_blocking_skills_of_the_tasks_robot(tmp_path: Path) -> None:
    data = yaml.safe_load(TASKS_PATH.read_text())
    data["tasks"][0]["values"] = {"go_to": ["here"]}
    path = tmp_path / "tasks.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=r"tasks\[0\]\.values\.go_to: not a blocking skill of mobile_base$"):
        load_closed_loop(path)


def test_a_plan_is_cut_into_steps_after_each_blocking_call() -> None:
    robot = TASKS.robots["mobile_base"]
    assert plan_steps("go_to('a');look_for('x');say('Hi.');look_for('y');", robot) == [
        "go_to('a');look_for('x');", "say('Hi.');look_for('y');"]
    assert plan_steps("go_to('a');look_for('x');dock;", robot) == ["go_to('a');look_for('x');", "dock;"]


def test_robots_report_values_drawn_per_seed_and_the_plans_show_them() -> None:
    def plans(seed: int) -> list[str]:
        result = run_bench(small_workload(), "timelyllm", SETUP, dict(TASKS.robots), TASKS.catalog, seed,
                           values=TASKS.values)
        assert all(r["status"] == "succeeded" for r in result["requests"])
        return [r["plan"] for r in result["requests"]]

    first = plans(0)
    assert first == plans(0)  # the same seed, the same values
    assert first != plans(1)
    seen = {v for values in TASKS.values.values() for listed in values.values() for v in listed}
    assert all(any(f" # {v}\n" in plan for v in seen) for plan in first)


def test_waiting_queue_resend_and_open_loop_serve_every_task() -> None:
    workload = small_workload()
    summaries = {mode: summarize_tasks(run_mode(mode, TASKS, workload, SETUP, 0))["all"]
                 for mode in ("waiting-queue", "resend", "open-loop")}
    for mode, summary in summaries.items():
        assert summary["succeeded"] == summary["tasks"] == len(workload.requests), mode
    assert summaries["open-loop"]["prefill_per_resume"] is None  # it never resumes after a value
    for mode in ("waiting-queue", "resend"):
        assert summaries[mode]["step_response"] > 0
        # a resume after a value prefills the observation and at most the partial block: the prefix cache keeps
        # the rest, for the node's suspended generation as for the re-sent context
        assert 0 < summaries[mode]["prefill_per_resume"] <= TASKS.robots["mobile_base"].observation.max_tokens + 16
