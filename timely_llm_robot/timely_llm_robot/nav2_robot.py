"""A Nav2 mobile base as a timely_llm robot, in one process: ``python -m timely_llm_robot.nav2_robot``.

It asks the node (``timely-llm serve``, same ROS domain and namespace) for a plan for one task and runs it as it
arrives through the Nav2 bridge: ``go_to(place)`` as NavigateToPose to the place's pose in ``--places``, ``dock``
and ``undock`` as DockRobot and UndockRobot; ``say``, ``look_for``, ``follow`` and ``turn`` go to a simulated
base here (:class:`SimulatedMobileBase`: replace ``fallback`` with your robot's own). Ctrl-C cancels the goal
(and with it the Nav2 goal in flight). Exit status: 0 succeeded, 1 aborted, canceled or rejected, 2 bad input.

    python -m timely_llm_robot.nav2_robot --places places.yaml \\
        --task "Scene: [kitchen, dock], Task: Check the kitchen, then go charge." [--dock-id home_dock] \\
        [--timeout go_to=120] [--nav2-namespace /robot1] [--agent-id base_1] [--trace-id N (the sim engine)] \
        [--ros-args ...]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import rclpy
from rclpy.node import Node
from rclpy.utilities import remove_ros_args
from timely_llm_interfaces.rclpy_compat import spinning

from timely_llm_robot.client import PlanLink, RobotClient, TaskOutcome
from timely_llm_robot.executors.mobile_base import SimulatedMobileBase
from timely_llm_robot.executors.places import PlacesError


def timeout_arg(text: str) -> tuple[str, float]:
    """``go_to=120`` -> ("go_to", 120.0)."""
    skill, _, seconds = text.partition("=")
    try:
        value = float(seconds)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected SKILL=SECONDS, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{skill}'s timeout must be positive, got {seconds}")
    return skill, value


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m timely_llm_robot.nav2_robot",
                                     description="Run one task's plan on a Nav2 mobile base.")
    parser.add_argument("--places", required=True, help="places file: name -> {frame, x, y, yaw}")
    parser.add_argument("--task", required=True, help="the task, as the robot's prompts write it")
    parser.add_argument("--agent-id", default="nav2_base", help="this robot's id (a ROS name token)")
    parser.add_argument("--robot-type", default="mobile_base", help="its skill model on the node")
    parser.add_argument("--dock-id", default="", help="the dock `dock` docks at (else the place named dock)")
    parser.add_argument("--dock-type", default="", help="Nav2's dock plugin type, where there are several")
    parser.add_argument("--timeout", type=timeout_arg, action="append", default=[], metavar="SKILL=SECONDS",
                        help="per-call timeout of a Nav2 skill (go_to, dock, undock); repeatable")
    parser.add_argument("--nav2-namespace", default="", help="Nav2's namespace, if not this node's (/robot1)")
    parser.add_argument("--trace-id", type=int, default=0, help="an LRTrace plan to replay (the sim engine)")
    parser.add_argument("--result-timeout", type=float, default=3600.0, help="seconds to wait for the result")
    return parser.parse_args(argv)


def run(node: Node, args: argparse.Namespace) -> TaskOutcome | None:
    """Request the plan and execute it; the outcome, or None if the node did not answer in time."""
    from timely_llm_robot.executors.nav2 import ACTIONS, Nav2Bridge

    names = {skill: f"{args.nav2_namespace.rstrip('/')}/{name}" for skill, (name, _) in ACTIONS.items()} \
        if args.nav2_namespace else None
    bridge = Nav2Bridge(node, args.places, fallback=SimulatedMobileBase().dispatch, timeouts=dict(args.timeout),
                        dock_id=args.dock_id, dock_type=args.dock_type, action_names=names)
    link = PlanLink(node)
    robot = RobotClient(link, args.agent_id, args.robot_type, bridge, on_end=bridge.task_ended)
    try:
        if not link.wait_for_server():
            print("no timely_llm node answers request_plan here (same ROS domain and namespace?)", file=sys.stderr)
            return None
        outcome = robot.request(args.task, trace_id=args.trace_id)
        try:
            return outcome.wait(args.result_timeout)
        except KeyboardInterrupt:
            if outcome.goal_handle is not None:
                robot.cancel(outcome)
            return outcome.wait(30.0)
    finally:
        robot.close()
        bridge.close()


def main(argv: Sequence[str] | None = None) -> int:
    command_line = list(sys.argv) if argv is None else ["nav2_robot", *argv]
    args = parse_args(remove_ros_args(command_line)[1:])
    rclpy.init(args=command_line)
    try:
        with spinning() as executor:
            node = Node(f"{args.agent_id}_robot")
            executor.add_node(node)
            try:
                outcome = run(node, args)
            except PlacesError as error:
                print(error, file=sys.stderr)
                return 2
            finally:
                executor.remove_node(node)
                node.destroy_node()
    finally:
        rclpy.try_shutdown()
    if outcome is None:
        return 1
    reason = outcome.result.reason if outcome.result else ""
    print(f"{outcome.status}{': ' + reason if reason else ''}")
    if outcome.result is not None and outcome.result.plan:
        print(outcome.result.plan)
    return 0 if outcome.status == "succeeded" else 1


if __name__ == "__main__":
    sys.exit(main())
