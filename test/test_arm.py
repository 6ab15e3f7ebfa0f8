"""SimulatedArm: pick-and-place state, failures with reasons, and timing."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from timely_llm_robot.executors.arm import ArmState, SimulatedArm, arm_skill_duration
from timely_llm_robot.executors.minispec import Value

TIME_SCALE = 0.01


@pytest.fixture
def arm() -> SimulatedArm:
    return SimulatedArm(time_scale=TIME_SCALE)


def test_pick_and_drop_moves_an_object(arm: SimulatedArm) -> None:
    result = arm.execute_calls([("goto", ["table"]), ("pick", ["cyan_box"]), ("drop", ["shelf"])])

    assert result.success, result.reason
    assert arm.state == ArmState(position="shelf", held=None)
    assert arm.objects["cyan_box"] == "shelf"


def test_pick_holds_the_object_and_moves_to_it(arm: SimulatedArm) -> None:
    assert arm.execute_calls([("pick", ["yellow_box"])]).success
    assert arm.state == ArmState(position="shelf", held="yellow_box")
    assert "yellow_box" not in arm.objects


def test_pick_while_holding_fails_with_reason(arm: SimulatedArm) -> None:
    result = arm.execute_calls([("pick", ["cyan_box"]), ("pick", ["red_box"]), ("drop", ["shelf"])])

    assert not result.success
    assert result.reason == "pick(red_box): already holding cyan_box"
    assert arm.state.held == "cyan_box"


def test_drop_with_empty_gripper_fails_with_reason(arm: SimulatedArm) -> None:
    result = arm.execute_calls([("drop", ["shelf"])])
    assert not result.success
    assert "gripper is empty" in result.reason


def test_pick_of_a_missing_object_fails(arm: SimulatedArm) -> None:
    result = arm.execute_calls([("pick", ["green_box"])])
    assert not result.success and "no green_box" in result.reason


def test_unknown_skill_and_wrong_arguments_fail(arm: SimulatedArm) -> None:
    unknown = arm.execute_calls([("wave", ["hand"])])
    no_args = arm.execute_calls([("pick", [])])
    assert not unknown.success and "unknown skill" in unknown.reason
    assert not no_args.success and "expects one argument" in no_args.reason


def test_scan_reports_whether_the_object_is_there(arm: SimulatedArm) -> None:
    assert arm.dispatch("scan", ["red_box"]) is True
    assert arm.dispatch("scan", ["green_box"]) is False


def test_default_durations_and_time_scale() -> None:
    assert [arm_skill_duration(s, []) for s in ("goto", "pick", "drop", "scan")] == [0.8, 3.0, 3.0, 1.0]
    result = SimulatedArm(time_scale=0.02).execute_calls([("pick", ["cyan_box"]), ("drop", ["table"])])
    assert 6.0 * 0.02 <= result.duration < 6.0 * 0.02 + 0.1


def test_custom_duration_function_is_used() -> None:
    asked: list[tuple[str, list[Value]]] = []

    def half_second(skill: str, args: Sequence[Value]) -> float:
        asked.append((skill, list(args)))
        return 0.5

    arm = SimulatedArm(duration=half_second, time_scale=0.0)
    assert arm.execute_calls([("goto", ["shelf"]), ("scan", ["red_box"])]).success
    assert asked == [("goto", ["shelf"]), ("scan", ["red_box"])]


def test_failed_skill_takes_no_time() -> None:
    result = SimulatedArm(time_scale=1.0).execute_calls([("drop", ["table"])])
    assert not result.success and result.duration < 0.5
