"""The ``timely-llm`` command: benchmark, plot, serve and demo the scheduler. Its commands live by what they
serve: the simulator's (``simulator``), the real engine's (``engine``), the ROS node's (``ros``)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import NoReturn

from timely_llm.cli.common import POLICY_HELP
from timely_llm.cli.engine import _add_fidelity, _add_peer_bench, _add_plan, _add_profile
from timely_llm.cli.ros import (
    _add_demo,
    _add_fleet,
    _add_load_bench,
    _add_security_policy,
    _add_serve,
    _add_traffic_bench,
    _without_ros_args,
)
from timely_llm.cli.simulator import (
    _add_ablation,
    _add_bench,
    _add_closed_loop,
    _add_estimate_error,
    _add_loop_cost,
    _add_plot,
    _add_sched,
    _add_sweep,
    _add_table,
    _add_workload,
)
from timely_llm.errors import ConfigError, RunIncomplete

DESCRIPTION = ("Serve many robots' plan requests from one LLM with segmented generation (TimelyLLM), and "
               "benchmark its scheduling policies on a calibrated simulator or on embedded vLLM.")


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error: the reason and where the usage is."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _epilog() -> str:
    from timely_llm.engines.hardware import PROFILE_DIR

    policies = "\n".join(f"  {name:14s}{text}" for name, text in POLICY_HELP.items())
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
    parser = _Parser(prog="timely-llm", description=DESCRIPTION, epilog=_epilog(),
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    _add_bench(sub.add_parser("bench", help="run a workload under one policy and write the records"))
    _add_plot(sub.add_parser("plot", help="Figure 5/6-style plots from bench results; load-map plots from sweeps"))
    _add_sweep(sub.add_parser("sweep", help="load map: policies x hardware x batch caps x agents, one JSON"))
    _add_ablation(sub.add_parser("ablation", help="scheduler parts each alone, all and none, on chosen points"))
    _add_workload(sub.add_parser("workload", help="write a generated workload to JSON"))
    _add_closed_loop(sub.add_parser("closed-loop-bench", help="closed-loop plans (blocking skills): the waiting "
                                    "queue vs a new request per step (ReAct re-send) vs open-loop, on the simulator"))
    _add_sched(sub.add_parser("sched-overhead", help="time per scheduling decision vs queue length"))
    _add_loop_cost(sub.add_parser("loop-cost", help="the server loop's own CPU per step, per token and per resume, "
                                                     "the engine left out"))
    _add_estimate_error(sub.add_parser("estimate-error", help="error of predicted segment generation times G(s) "
                                                              "on the simulator: TimeBill vs the constant"))
    _add_serve(sub.add_parser("serve", help="run the timely_llm_server ROS 2 node"))
    _add_fleet(sub.add_parser("fleet", help="replay a workload through ROS 2 robot clients against a running node"))
    _add_demo(sub.add_parser("demo", help="node + fleet in-process, timelyllm against vllm-stream and vllm, "
                                           "with the machine's load during each"))
    _add_load_bench(sub.add_parser("load-bench", help="the node under 100s of robots: goals in flight, accept "
                                                       "latency, CPU, RSS; RSS after 1,000 vs 10,000 goals"))
    _add_traffic_bench(sub.add_parser("traffic-bench", help="what each robot process receives on the action vs "
                                                             "the topic interface, for N robot processes"))
    _add_security_policy(sub.add_parser("security-policy", help="SROS2 permission policies: one per robot (its own "
                                        "topics, task_requests, the action) and one for the node"))
    _add_table(sub.add_parser("table", help="markdown table of bench or sweep results"))
    _add_profile(sub.add_parser("profile", help="fit a simulator hardware profile to measured vLLM steps"))
    _add_plan(sub.add_parser("plan", help="generate one plan for a task on embedded vLLM, segment by segment"))
    _add_peer_bench(sub.add_parser("peer-bench", help="vllm serve with streaming robots vs the node's policies, "
                                                      "same model, prompts, grammar and arrivals: one table"))
    _add_fidelity(sub.add_parser("fidelity", help="one workload on the simulator and on embedded vLLM, side by "
                                                  "side per policy: does the simulator predict the engine?"))
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
