"""``timely-llm`` commands of the node itself: serve, security-policy."""

from __future__ import annotations

import argparse
from pathlib import Path

from timely_llm.errors import ConfigError


def _without_ros_args(argv: list[str]) -> list[str]:
    """``argv`` less its ROS arguments (``--ros-args ...`` up to ``--`` or the end, anywhere), as rclpy reads them,
    and less a ``--`` just before them (``serve -- --ros-args ...``)."""
    if "--ros-args" not in argv:
        return argv
    argv = [a for i, a in enumerate(argv) if not (a == "--" and argv[i + 1:i + 2] == ["--ros-args"])]
    from rclpy.utilities import remove_ros_args

    try:
        return remove_ros_args(["timely-llm", *argv])[1:]
    except RuntimeError as exc:
        raise _ros_args_error(exc) from exc


def _ros_args_error(exc: RuntimeError) -> ConfigError:
    """rcl's refusal of the ROS arguments, one line. rclpy raises its RCLError or UnknownROSArgsError (both
    RuntimeErrors), which it exports only from its private implementation module: they are told apart by name."""
    reason = str(exc).split(", at ")[0]  # rcl appends its source locations
    if type(exc).__name__ == "UnknownROSArgsError":
        reason = f"unknown ROS arguments {reason}"
    return ConfigError("--ros-args", None, reason)


def _add_serve(p: argparse.ArgumentParser) -> None:
    p.description = ("Run the node until SIGINT or SIGTERM. ROS arguments go anywhere after --ros-args (up to --), "
                     "as for any ROS 2 executable: e.g. --ros-args -p policy:=fcfs --params-file F "
                     "-r __node:=NAME; parameters set with -p win over --params.")
    p.add_argument("--params", help="ROS 2 parameters YAML file, over the node's defaults: the shipped "
                                    "config/timely_llm.yaml's values (embedded vLLM with SmolLM2)")
    p.set_defaults(run=_serve)


def _serve(args: argparse.Namespace) -> int:
    from timely_llm.ros.node import main as serve

    # rcl applies parameter files and -p overrides in command-line order, so --params goes first.
    params = ["--ros-args", "--params-file", args.params, "--"] if args.params else []
    ros_argv = ["timely-llm", *params, *args.ros_argv]
    _check_ros_args(ros_argv)
    return serve(ros_argv)


def _check_ros_args(argv: list[str]) -> None:
    """ConfigError unless rcl accepts the ROS arguments in ``argv`` (it parses them on init)."""
    import rclpy
    from rclpy.context import Context

    context = Context()
    try:
        rclpy.init(args=argv, context=context)
    except RuntimeError as exc:
        raise _ros_args_error(exc) from exc
    context.try_shutdown()


def _add_security_policy(p: argparse.ArgumentParser) -> None:
    p.add_argument("--agents", nargs="+", default=[],
                   help="the robots' agent ids (ROS name tokens); with --fleet, ids its patterns match")
    p.add_argument("--fleet", type=Path, help="fleet file: a policy for every robot it names by id (and --agents); "
                                              "robots may use their own request topic only, unless --shared")
    p.add_argument("--shared", action="store_true",
                   help="with --fleet: robots may also publish on the shared task_requests and call the action, "
                        "where they can name any agent id")
    p.add_argument("--out", type=Path, default=Path("sros2_policies"),
                   help="directory for <agent>.policy.xml and timely_llm_server.policy.xml (default sros2_policies)")
    p.add_argument("--namespace", default="/", help="the node's namespace (default /)")
    p.add_argument("--robot-node", default="{agent}",
                   help="each robot's node name, {agent} standing for its agent id (default {agent})")
    p.set_defaults(run=_security_policy)


def _security_policy(args: argparse.Namespace) -> int:
    from timely_llm.ros.security_policy import write_policies

    try:
        agents, shared = args.agents, True
        if args.fleet is not None:
            from timely_llm.ros.fleet_file import load_fleet
            from timely_llm.ros.security_policy import fleet_agents

            agents, shared = fleet_agents(load_fleet(str(args.fleet)), args.agents), args.shared
        if not agents:
            raise ValueError("no robots: give --agents or a --fleet file")
        written = write_policies(agents, args.out, args.namespace, args.robot_node, shared)
    except ValueError as exc:  # ConfigError included
        raise SystemExit(f"timely-llm security-policy: {exc}") from None
    for path in written:
        print(path)
    return 0


