"""The Nav2 bridge (timely_llm_robot.executors.nav2) over ROS, against the node on the sim engine and a fake Nav2
(test/fake_nav2.py: action servers of the real nav2_msgs types, in a ROS context of their own).

A mobile_base robot driven by the bridge runs a replayed plan: its go_to calls reach Nav2 as NavigateToPose goals
to the places file's poses, in order (frame, x, y, yaw as a quaternion), dock as DockRobot, say through the
fallback; a Nav2 abort ends the goal aborted with Nav2's error code and message in the node's reason; canceling
the timely_llm goal cancels the Nav2 goal in flight; a call over its per-call timeout fails saying so, its Nav2
goal canceled; a malformed places file is refused in one line. Without nav2_msgs installed every test fails in
one line saying so.
"""

from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml
from fake_nav2 import NAV2_MISSING, Answer, fake_nav2
from guards import wait_until

from timely_llm.traces import Trace, TraceCatalog, load_catalog
from timely_llm_bench.robots.fleet import server_node
from timely_llm_robot.client import RobotClient, TaskOutcome
from timely_llm_robot.executors.mobile_base import SimulatedMobileBase
from timely_llm_robot.executors.places import PlacesError, load_places

pytestmark = pytest.mark.ros

TRACE = Trace(901, "normal", "mobile_base", "Nav2 round",
              "Scene: [kitchen, living_room, front_door, dock], Task: Check the kitchen, the living room and the "
              "front door, then go charge.",
              "go_to('kitchen');say('In the kitchen.');go_to('living_room');go_to('front_door');dock;")
"""A mobile_base plan for the sim engine to replay (the shipped catalog has none): three go_to, a say, a dock."""
PLACES = {"kitchen": {"frame": "map", "x": 3.0, "y": -1.5, "yaw": math.pi / 2},
          "living_room": {"frame": "map", "x": -2.0, "y": 4.25, "yaw": math.pi},
          "front_door": {"frame": "odom", "x": 6.5, "y": 0.0, "yaw": -math.pi / 4}}
IN_ORDER = ("kitchen", "living_room", "front_door")
RESULT_TIMEOUT_S = 90.0


@pytest.fixture
def nav2_types() -> None:
    """nav2_msgs importable, or the test fails in one line saying where it comes from."""
    if importlib.util.find_spec("nav2_msgs") is None:
        pytest.fail(NAV2_MISSING, pytrace=False)


@pytest.fixture
def mobile_trace(monkeypatch: pytest.MonkeyPatch) -> Trace:
    """The node's catalog with TRACE added (the node loads its catalog when it configures)."""
    shipped = load_catalog()
    catalog = TraceCatalog({**shipped.traces, TRACE.id: TRACE}, shipped.robots)
    monkeypatch.setattr("timely_llm.ros.engine_loader.load_catalog", lambda: catalog)
    return TRACE


@pytest.fixture
def places_file(tmp_path: Path) -> Path:
    path = tmp_path / "places.yaml"
    path.write_text(yaml.safe_dump(PLACES))
    return path


@contextmanager
def nav2_round(session: tuple, ros_domain: int, link: object, places: Path, answer: Callable[[str, object], Answer],
               **bridge: object) -> Iterator[tuple[RobotClient, object, SimulatedMobileBase]]:
    """The node on the sim engine, the fake Nav2, and a robot whose executor is the bridge (say and look_for go
    to a simulated base): (robot, fake, fallback base)."""
    from timely_llm_robot.executors.nav2 import Nav2Bridge

    base = SimulatedMobileBase()
    with fake_nav2(ros_domain, answer) as fake, server_node(session[1], session[0]):
        bridge_ = Nav2Bridge(link.node, places, fallback=base.dispatch, dock_id="home_dock", **bridge)
        robot = RobotClient(link, "nav2_base", "mobile_base", bridge_, on_end=bridge_.task_ended)
        try:
            assert link.wait_for_server()
            yield robot, fake, base
        finally:
            robot.close()
            bridge_.close()


def request(robot: RobotClient) -> TaskOutcome:
    return robot.request(TRACE.prompt, None, TRACE.id)


def reason(outcome: TaskOutcome) -> str:
    return outcome.result.reason if outcome.result else "rejected"


def test_go_to_calls_reach_nav2_as_the_places_poses_in_order(
        nav2_types: None, mobile_trace: Trace, session: tuple, ros_domain: int, link: object,
        places_file: Path) -> None:
    with nav2_round(session, ros_domain, link, places_file, lambda action, goal: Answer(seconds=0.3)) as (
            robot, fake, base):
        outcome = request(robot).wait(RESULT_TIMEOUT_S)
    assert outcome.status == "succeeded", reason(outcome)
    poses = [g.goal.pose for g in fake.goals("navigate_to_pose")]
    assert [p.header.frame_id for p in poses] == [PLACES[name]["frame"] for name in IN_ORDER]
    for pose, name in zip(poses, IN_ORDER, strict=True):
        place, q = PLACES[name], pose.pose.orientation
        assert (pose.pose.position.x, pose.pose.position.y, pose.pose.position.z) == (place["x"], place["y"], 0.0)
        assert (q.x, q.y) == (0.0, 0.0), name
        assert (q.z, q.w) == pytest.approx((math.sin(place["yaw"] / 2), math.cos(place["yaw"] / 2))), name
        assert math.atan2(2 * q.w * q.z, 1 - 2 * q.z * q.z) == pytest.approx(place["yaw"]), name
    docks = fake.goals("dock_robot")
    assert [(d.goal.use_dock_id, d.goal.dock_id) for d in docks] == [(True, "home_dock")]
    assert base.state.said == ["In the kitchen."]
    assert outcome.exec_time >= 4 * 0.3, outcome.exec_time  # each Nav2 goal's real duration reported


def test_a_nav2_abort_ends_the_goal_aborted_with_nav2s_error(
        nav2_types: None, mobile_trace: Trace, session: tuple, ros_domain: int, link: object,
        places_file: Path) -> None:
    def answer(action: str, goal: object) -> Answer:
        if action == "navigate_to_pose" and goal.pose.header.frame_id == "odom":  # the front door
            return Answer(seconds=0.1, error_code=9002, error_msg="no transform from odom to base_link")
        return Answer(seconds=0.1)

    with nav2_round(session, ros_domain, link, places_file, answer) as (robot, fake, base):
        outcome = request(robot).wait(RESULT_TIMEOUT_S)
    assert outcome.status == "aborted", reason(outcome)
    assert reason(outcome).startswith("robot failed segment "), reason(outcome)
    assert reason(outcome).endswith(": go_to('front_door'): Nav2 NavigateToPose aborted: error 9002 TF_ERROR, "
                                    "no transform from odom to base_link"), reason(outcome)
    assert [g.ended for g in fake.goals("navigate_to_pose")] == ["succeeded", "succeeded", "aborted"]
    assert fake.goals("dock_robot") == []  # the plan stopped at Nav2's failure


def test_canceling_the_goal_cancels_the_nav2_goal_in_flight(
        nav2_types: None, mobile_trace: Trace, session: tuple, ros_domain: int, link: object,
        places_file: Path) -> None:
    with nav2_round(session, ros_domain, link, places_file, lambda action, goal: Answer(hang=True)) as (
            robot, fake, base):
        outcome = request(robot)
        wait_until(lambda: fake.goals("navigate_to_pose"), 60.0, "the first NavigateToPose goal")
        robot.cancel(outcome)
        outcome.wait(RESULT_TIMEOUT_S)
        wait_until(lambda: fake.goals("navigate_to_pose")[0].ended, 15.0, "Nav2's goal to end")
        first = fake.goals("navigate_to_pose")[0]
        time.sleep(1.0)  # long enough for the segments queued behind the canceled one to run, had they moved it
    assert outcome.status == "canceled", reason(outcome)
    assert first.cancel_requested and first.ended == "canceled"
    assert len(fake.goals("navigate_to_pose")) == 1 and base.state.said == []  # nothing of the plan ran after


def test_a_call_over_its_timeout_fails_saying_so_and_cancels_its_nav2_goal(
        nav2_types: None, mobile_trace: Trace, session: tuple, ros_domain: int, link: object,
        places_file: Path) -> None:
    with nav2_round(session, ros_domain, link, places_file, lambda action, goal: Answer(hang=True),
                    timeouts={"go_to": 0.5}) as (robot, fake, base):
        outcome = request(robot).wait(RESULT_TIMEOUT_S)
        wait_until(lambda: fake.goals("navigate_to_pose")[0].ended, 15.0, "Nav2's goal to end")
    assert outcome.status == "aborted", reason(outcome)
    assert reason(outcome) == ("robot failed segment 0: go_to('kitchen'): timed out after 0.5 s (go_to's per-call "
                               "timeout); Nav2 goal canceled")
    assert fake.goals("navigate_to_pose")[0].cancel_requested


def test_the_example_robot_runs_a_plan_on_nav2(
        nav2_types: None, mobile_trace: Trace, session: tuple, ros_domain: int, link: object,
        places_file: Path) -> None:
    """python -m timely_llm_robot.nav2_robot, as docs/robot-side.md runs it, in a process of its own."""
    env = {**os.environ, "ROS_DOMAIN_ID": str(ros_domain)}
    with fake_nav2(ros_domain, lambda action, goal: Answer(seconds=0.1)) as fake, \
            server_node(session[1], session[0]):
        done = subprocess.run([sys.executable, "-m", "timely_llm_robot.nav2_robot", "--places", str(places_file),
                               "--task", TRACE.prompt, "--trace-id", str(TRACE.id), "--dock-id", "home_dock",
                               "--timeout", "go_to=60", "--result-timeout", "120"],
                              env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("succeeded\n"), done.stdout
    assert [g.goal.pose.pose.position.x for g in fake.goals("navigate_to_pose")] == [PLACES[p]["x"] for p in IN_ORDER]
    assert len(fake.goals("dock_robot")) == 1


MALFORMED = {
    "kitchen: [1, 2]\n": "places file {}: kitchen: expected a mapping {{frame, x, y, yaw}}, got [1, 2]",
    "kitchen: {frame: map, x: 1, yaw: 0}\n": "places file {}: kitchen: missing 'y' (fields: frame, x, y, yaw)",
    "kitchen: {frame: map, x: 1, y: two, yaw: 0}\n": "places file {}: kitchen.y: expected a finite number, got 'two'",
    "kitchen: {frame: '', x: 1, y: 2, yaw: 0}\n": "places file {}: kitchen.frame: expected a frame name (e.g. map), "
                                                  "got ''",
    "kitchen: {frame: map, x: 1, y: 2, yaw: 0, z: 3}\n": "places file {}: kitchen: unknown field 'z' (fields: frame, "
                                                         "x, y, yaw)",
    "kitchen: {frame: map, x: 1\n": "places file {}: not YAML at line 2: expected ',' or '}}', but got '<stream end>'",
    "- kitchen\n": "places file {}: expected a mapping of place names to {{frame, x, y, yaw}}, got list",
    "the kitchen: {frame: map, x: 1, y: 2, yaw: 0}\n": "places file {}: place name 'the kitchen' is not a word of "
                                                       "letters, digits and '_'",
}


@pytest.mark.parametrize("text", MALFORMED)
def test_a_malformed_places_file_is_refused_in_one_line(text: str, tmp_path: Path) -> None:
    path = tmp_path / "places.yaml"
    path.write_text(text)
    with pytest.raises(PlacesError) as refused:
        load_places(path)
    assert str(refused.value) == MALFORMED[text].format(path)


def test_the_bridge_refuses_a_malformed_places_file_before_it_talks_to_nav2(
        nav2_types: None, link: object, tmp_path: Path) -> None:
    from timely_llm_robot.executors.nav2 import Nav2Bridge

    path = tmp_path / "places.yaml"
    path.write_text("kitchen: {frame: map, x: 1, y: 2}\n")
    with pytest.raises(PlacesError, match=r"^places file .*: kitchen: missing 'yaw' \(fields: frame, x, y, yaw\)$"):
        Nav2Bridge(link.node, path)
    with pytest.raises(PlacesError, match=r"^places file .*missing\.yaml: cannot read it: No such file or directory$"):
        load_places(tmp_path / "missing.yaml")


def test_nav2s_reasons_read_its_result_and_status(nav2_types: None) -> None:
    from action_msgs.msg import GoalStatus
    from nav2_msgs.action import DockRobot, NavigateToPose, UndockRobot

    from timely_llm_robot.executors.nav2 import nav2_failure

    assert nav2_failure("go_to('a')", NavigateToPose, GoalStatus.STATUS_SUCCEEDED, NavigateToPose.Result()) == ""
    assert nav2_failure("dock", DockRobot, GoalStatus.STATUS_SUCCEEDED, DockRobot.Result(
        success=False, error_code=905)) == "dock: Nav2 DockRobot reported failure: error 905 FAILED_TO_CONTROL"
    assert nav2_failure("go_to('a')", NavigateToPose, GoalStatus.STATUS_CANCELED, NavigateToPose.Result()) == \
        "go_to('a'): Nav2 NavigateToPose canceled by Nav2"
    assert nav2_failure("undock", UndockRobot, GoalStatus.STATUS_ABORTED, UndockRobot.Result(
        success=False, error_code=1234)) == "undock: Nav2 UndockRobot aborted: error 1234"
    humble = object()  # Humble's NavigateToPose result: std_msgs/Empty, no error fields
    assert nav2_failure("go_to('a')", NavigateToPose, GoalStatus.STATUS_ABORTED, humble) == \
        "go_to('a'): Nav2 NavigateToPose aborted"
