"""The ``timely-llm`` command: benchmark, plot, serve and demo the scheduler. Its commands live by what they
serve: the simulator's (``simulator``), the real engine's (``engine``), the ROS node's (``ros``)."""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import entry_points
from pathlib import Path
from typing import NoReturn

from timely_llm.cli.engine import _add_plan, _add_profile
from timely_llm.cli.node import _add_security_policy, _add_serve, _without_ros_args
from timely_llm.core.policies import policy_help
from timely_llm.errors import ConfigError, RunIncomplete

COMMANDS_GROUP = "timely_llm.commands"
"""Where other packages add commands: an entry point there is a function taking the subparsers (timely_llm_bench
adds its benchmarks and the demo); it may return the policies of its own it adds (name: help line), which the
top-level help lists after the node's (``core/policies.py``)."""

DESCRIPTION = ("Serve many robots' plan requests from one LLM with segmented generation (TimelyLLM), and "
               "benchmark its scheduling policies on a calibrated simulator or on embedded vLLM.")


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error: the reason and where the usage is."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _epilog(extra_policies: dict[str, str]) -> str:
    from timely_llm.engines.hardware import PROFILE_DIR

    policies = "\n".join(f"  {name:14s}{text}" for name, text in {**policy_help(), **extra_policies}.items())
    profiles = "\n".join(f"  {p.stem:36s}{_first_comment(p)}" for p in sorted(PROFILE_DIR.glob("*.yaml")))
    return (f"policies (--policy):\n{policies}\n\nhardware profiles of the simulator (--hw NAME, or a YAML file):\n"
            f"{profiles}\n\nEach command has its own help: timely-llm COMMAND --help.")


def _first_comment(path: Path) -> str:
    """A profile's description: its YAML file's first comment line, up to the first ': ' or '. ' (what the
    profile is; the lines after it say how it was measured)."""
    for line in path.read_text().splitlines():
        if line.startswith("#"):
            text = line.lstrip("# ").strip()
            ends = [i for i in (text.find(": "), text.find(". ")) if i >= 0]
            return text[:min(ends)] if ends else text.rstrip(":.")
    return ""


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="timely-llm", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    _add_serve(sub.add_parser("serve", help="run the timely_llm_server ROS 2 node"))
    _add_plan(sub.add_parser("plan", help="generate one plan for a task on embedded vLLM, segment by segment"))
    _add_profile(sub.add_parser("profile", help="fit a simulator hardware profile to measured vLLM steps"))
    _add_security_policy(sub.add_parser("security-policy", help="SROS2 permission policies: one per robot (its own "
                                        "topics, task_requests, the action) and one for the node"))
    extra_policies: dict[str, str] = {}
    for entry in entry_points(group=COMMANDS_GROUP):
        extra_policies |= entry.load()(sub) or {}
    parser.epilog = _epilog(extra_policies)
    for command_parser in sub.choices.values():
        command_parser.set_defaults(command_parser=command_parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        cli_argv = _without_ros_args(argv)
    except ConfigError as exc:
        parser.error(str(exc))
    command = next((a for a in cli_argv if not a.startswith("-")), None)
    if "--ros-args" in argv and command != "serve":  # before the command's own arguments are checked
        parser.error(f"{command} takes no ROS arguments (--ros-args): only serve does")
    args, unknown = parser.parse_known_args(cli_argv)
    if unknown:  # the command's parser says it, so the hint points at that command's --help
        args.command_parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if command == "serve":
        args.ros_argv = argv
    try:
        return args.run(args)
    except ConfigError as exc:  # found once the command runs: named like the command's parser errors
        print(f"{args.command_parser.prog}: error: {exc}", file=sys.stderr)
        return 2
    except RunIncomplete as exc:
        print(f"{args.command_parser.prog}: {exc}", file=sys.stderr)
        return 1
