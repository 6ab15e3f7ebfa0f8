"""The py_trees leaf (``timely_llm_robot.bt.AskTimelyLlm``) in trees ticked in a loop, against the node over ROS.

On the sim engine, the shipped arm replaying its stacking plan (trace 9: ``scan('red_box')`` blocks, two more
scans later): a tree with the leaf executes the whole plan through a simulated arm, answers each scan with its
value and ends SUCCESS with the plan on the blackboard; a higher-priority "battery low -> dock" branch that turns
SUCCESS while the plan waits for its first scan halts the leaf, which cancels the goal (the node's result says
canceled and the arm runs nothing more of the plan); a goal for a robot type the node does not know ends FAILURE,
the reason on the blackboard.
"""

from __future__ import annotations

import operator
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import py_trees
import pytest
from py_trees.common import ComparisonExpression, Status

from timely_llm.traces import load_catalog
from timely_llm_bench.robots.fleet import server_node
from timely_llm_robot.bt import AskTimelyLlm
from timely_llm_robot.executors.arm import SimulatedArm
from timely_llm_robot.executors.base import CallList, SegmentResult, calls_runner

pytestmark = pytest.mark.ros

ARM_TRACE = 9
"""The arm's stacking plan: scan('red_box') first (blocking: the plan waits for its value), two more scans later."""
SCENE = {"red_box": "table", "blue_box": "table", "green_box": "shelf", "stack_base": "table"}
TICK_S = 0.02
TREE_TIMEOUT_S = 120.0
NS = "/patrol"
DOCS = Path(__file__).resolve().parents[1] / "docs" / "robot-side.md"


@pytest.fixture(autouse=True)
def fresh_blackboard() -> Iterator[None]:
    yield
    py_trees.blackboard.Blackboard.clear()


class RecordingArm(SimulatedArm):
    """The simulated arm (fast), recording each segment's calls; ``on_segment(calls)`` runs before each."""

    def __init__(self, on_segment: Callable[[CallList], None] = lambda calls: None) -> None:
        super().__init__(dict(SCENE), time_scale=0.01)
        self.segments: list[list[str]] = []
        self.values: list[object] = []
        self.on_segment = on_segment

    def execute_calls(self, calls: CallList) -> SegmentResult:
        self.segments.append([f"{name}('{args[0]}')" for name, args in calls])
        self.on_segment(calls)
        result = super().execute_calls(calls)
        self.values.append(result.last_value)
        return result


def flag(name: str, key: str) -> py_trees.behaviour.Behaviour:
    """A condition: SUCCESS while the blackboard's ``key`` (under NS) is True."""
    return py_trees.behaviours.CheckBlackboardVariableValue(
        name, ComparisonExpression(f"{NS}/{key}", True, operator.eq))


class Dock(py_trees.behaviour.Behaviour):
    """Docks at once; ``docked`` says it ran."""

    def __init__(self) -> None:
        super().__init__("dock")
        self.docked = threading.Event()

    def update(self) -> Status:
        self.docked.set()
        return Status.SUCCESS


def tick_until_done(root: py_trees.behaviour.Behaviour, done: Callable[[], bool] | None = None) -> Status:
    """Tick the tree every TICK_S until its root ends (SUCCESS or FAILURE), or until ``done()`` if given."""
    tree = py_trees.trees.BehaviourTree(root)
    tree.setup(timeout=5.0)
    deadline = time.monotonic() + TREE_TIMEOUT_S
    while time.monotonic() < deadline:
        tree.tick()
        status = root.status
        if done() if done else status in (Status.SUCCESS, Status.FAILURE):
            if status == Status.RUNNING:
                tree.interrupt()  # halts what still runs (the patrol route)
            return status
        time.sleep(TICK_S)
    tree.interrupt()
    raise AssertionError(f"the tree still running after {TREE_TIMEOUT_S} s:\n{py_trees.display.unicode_tree(root)}")


def investigate(leaf: AskTimelyLlm) -> py_trees.composites.Sequence:
    return py_trees.composites.Sequence("investigate", memory=False, children=[flag("saw something?", "saw"), leaf])


def board(*keys: str) -> dict[str, object]:
    return {key: py_trees.blackboard.Blackboard.get(f"{NS}/{key}") for key in keys}


def test_the_leaf_executes_a_plan_answers_its_blocking_scans_and_succeeds(session: tuple, link: object,
                                                                           robots: Callable) -> None:
    trace = load_catalog()[ARM_TRACE]
    arm = RecordingArm()
    leaf = AskTimelyLlm("ask timely_llm", robots("bt_arm", "arm", calls_runner(arm.execute_calls)), namespace=NS)
    py_trees.blackboard.Blackboard.set(f"{NS}/saw", True)
    py_trees.blackboard.Blackboard.set(f"{NS}/task", trace.prompt)  # the task and trace come from the blackboard
    py_trees.blackboard.Blackboard.set(f"{NS}/trace_id", trace.id)
    with server_node(session[1], session[0]):
        assert link.wait_for_server()
        assert tick_until_done(investigate(leaf)) == Status.SUCCESS, board("plan_status", "plan_reason")
    ended = board("plan", "plan_status", "plan_reason")
    assert ended["plan_status"] == "succeeded" and ended["plan_reason"] == "", ended
    assert ended["plan"] == leaf.outcome.result.plan and ended["plan"].count("# true\n") == 3, ended["plan"]
    executed = [call for segment in arm.segments for call in segment]
    assert ";".join(executed) + ";" == trace.plan, executed
    assert len(arm.segments) == len(leaf.outcome.segments) and arm.objects["green_box"] == "blue_box"
    waited = [s.index for s in leaf.outcome.segments if s.waits_for]
    assert len(waited) == 3 and all(arm.values[i] is True for i in waited), (waited, arm.values)


def test_a_preempting_branch_halts_the_leaf_and_the_goal_ends_canceled(session: tuple, link: object,
                                                                      robots: Callable) -> None:
    trace = load_catalog()[ARM_TRACE]
    dock = Dock()

    def battery_drains_during_the_first_scan(calls: CallList) -> None:
        py_trees.blackboard.Blackboard.set(f"{NS}/battery_low", True)
        assert dock.docked.wait(30.0), "the dock branch never ran"  # the plan waits for this scan's value

    arm = RecordingArm(battery_drains_during_the_first_scan)
    leaf = AskTimelyLlm("ask timely_llm", robots("bt_arm", "arm", calls_runner(arm.execute_calls)), trace.prompt,
                        namespace=NS, trace_id=trace.id)
    py_trees.blackboard.Blackboard.set(f"{NS}/saw", True)
    py_trees.blackboard.Blackboard.set(f"{NS}/battery_low", False)
    root = py_trees.composites.Selector("patrol", memory=False, children=[
        py_trees.composites.Sequence("battery", memory=True, children=[flag("battery low?", "battery_low"), dock]),
        investigate(leaf)])
    with server_node(session[1], session[0]):
        assert link.wait_for_server()
        assert tick_until_done(root) == Status.SUCCESS
        assert leaf.outcome.wait(TREE_TIMEOUT_S).status == "canceled", leaf.outcome.result.reason
    assert leaf.status == Status.INVALID and dock.status == Status.SUCCESS
    assert board("plan_status")["plan_status"] == "preempted", board("plan_status", "plan_reason")
    assert "goal canceled" in board("plan_reason")["plan_reason"]
    assert arm.segments == [["scan('red_box')"]]  # nothing of the plan ran after the halt
    assert trace.plan.startswith(leaf.outcome.result.plan.replace("# true\n", "")), leaf.outcome.result.plan


def test_a_leaf_halted_before_its_goal_is_accepted_cancels_it_once_accepted(session: tuple, link: object,
                                                                              robots: Callable) -> None:
    trace = load_catalog()[ARM_TRACE]
    arm = RecordingArm()
    leaf = AskTimelyLlm("ask timely_llm", robots("bt_arm", "arm", calls_runner(arm.execute_calls)), trace.prompt,
                        namespace=NS, trace_id=trace.id)
    with server_node(session[1], session[0]):
        assert link.wait_for_server()
        leaf.tick_once()  # sends the goal
        leaf.stop(Status.INVALID)  # halted at once: the node has not answered yet
        assert leaf.outcome.wait(TREE_TIMEOUT_S).status == "canceled", leaf.outcome.result.reason
    assert board("plan_status")["plan_status"] == "preempted"
    assert not arm.segments  # no segment of the canceled plan was executed


def test_a_rejected_goal_ends_the_leaf_failed_with_the_reason(session: tuple, link: object,
                                                             robots: Callable) -> None:
    arm = RecordingArm()
    leaf = AskTimelyLlm("ask timely_llm", robots("bt_sub", "submarine", calls_runner(arm.execute_calls)),
                        "Dive to the wreck.", namespace=NS, trace_id=1)
    py_trees.blackboard.Blackboard.set(f"{NS}/saw", True)
    with server_node(session[1], session[0]):
        assert link.wait_for_server()
        assert tick_until_done(investigate(leaf)) == Status.FAILURE
    ended = board("plan", "plan_status", "plan_reason")
    assert ended["plan_status"] == "rejected" and ended["plan"] == "", ended
    assert "'submarine'" in ended["plan_reason"] and "rejected" in ended["plan_reason"], ended
    assert not arm.segments


def test_the_leaf_fails_without_a_task(robots: Callable) -> None:
    leaf = AskTimelyLlm("ask timely_llm", robots("bt_idle", "arm", calls_runner(RecordingArm().execute_calls)),
                        namespace=NS)
    assert tick_until_done(leaf) == Status.FAILURE
    assert board("plan_status")["plan_status"] == "not sent"
    assert board("plan_reason")["plan_reason"] == f"no task: {NS}/task is not set and the leaf was given none"


def docs_patrol_tree() -> Callable[..., py_trees.behaviour.Behaviour]:
    """``patrol_tree`` of docs/robot-side.md's example: its first code block, run as a user would paste it."""
    example = DOCS.read_text().split("\n## Example", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    scope: dict[str, object] = {}
    exec(compile(example, str(DOCS), "exec"), scope)  # noqa: S102 - the docs' own example
    return scope["patrol_tree"]


def test_the_docs_patrol_tree_investigates_a_sighting_and_resumes_patrolling(session: tuple, link: object,
                                                                             robots: Callable) -> None:
    trace = load_catalog()[ARM_TRACE]
    arm = RecordingArm()
    root = docs_patrol_tree()(robots("bt_patrol", "arm", calls_runner(arm.execute_calls)))
    for key, value in {"battery_low": False, "saw": True, "task": trace.prompt, "trace_id": trace.id}.items():
        py_trees.blackboard.Blackboard.set(f"{NS}/{key}", value)
    with server_node(session[1], session[0]):
        assert link.wait_for_server()
        tick_until_done(root, lambda: py_trees.blackboard.Blackboard.get(f"{NS}/saw") is False)
    assert board("plan_status", "plan_reason") == {"plan_status": "succeeded", "plan_reason": ""}
    assert ";".join(call for segment in arm.segments for call in segment) + ";" == trace.plan


def test_every_code_block_of_the_robot_side_docs_compiles() -> None:
    blocks = [block.split("```", 1)[0] for block in DOCS.read_text().split("```python\n")[1:]]
    assert len(blocks) == 3  # the leaf's patrol tree, its robot, the Nav2 bridge's robot
    for block in blocks:
        compile(block, str(DOCS), "exec")
