"""The ``timely-llm`` command: benchmark, plot, serve and demo the scheduler."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from timely_llm.core.features import Features
from timely_llm.core.overload import OVERRUN_STRATEGIES
from timely_llm.errors import ConfigError, RunIncomplete
from timely_llm.models import DEFAULT_MODEL, MODEL_NAMES

if TYPE_CHECKING:
    from timely_llm.plan.skills import SkillModel
    from timely_llm.robots.robot_client import SegmentRunner
    from timely_llm.workloads.generator import Workload
    from timely_llm.workloads.traces import TraceCatalog

DEFAULT_MAX_DRONES = 25
GENERATED_SEGMENT_TIMEOUT_MARGIN = 120.0
"""A generated loop (up to 5 rounds of up to 4 statements) runs its later rounds at its ``}``, a segment
estimated at ~0 s."""
DEMO_GENERATED_SECONDS = 20.0
"""The demo on the real model replays the first 20 s of the workload: the CPU generates ~17 tokens/s."""
DEMO_PLAN_TOKENS = 48


DESCRIPTION = ("Serve many robots' plan requests from one LLM with segmented generation (TimelyLLM), and "
               "benchmark its scheduling policies on a calibrated simulator or on embedded vLLM.")
POLICY_HELP = {
    "vllm": "FCFS continuous batching; the whole plan is dispatched when it is complete",
    "vllm-stream": "FCFS; each statement is dispatched as soon as it is generated, never paused",
    "vllm-priority": "vLLM's priority scheduling (lower ERT first) with preemption; statements streamed",
    "fcfs": "segmented: suspended after each segment, queued by arrival",
    "edf": "segmented, queued by the first segment's deadline (arrival + ERT)",
    "timelyllm": "segmented + PUD priority (Eq. 4) + latency-guided adaptive batch: the paper's system",
    "isolated": "bench only: each request alone on an idle simulated server (the best it could get)",
}
DEFAULT_HW = "rtx4090-llama3-8b"
PROGRESS_PERIOD_S = 10.0


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


def _add_bench(p: argparse.ArgumentParser) -> None:
    from timely_llm.evaluation.harness import BENCH_POLICIES
    from timely_llm.server import DEFAULT_MAX_BATCH

    p.description = ("Replay a workload through the server loop under one policy and write one record per "
                     "request plus per-category means. On the simulator (the default) the run is on a virtual "
                     "clock and deterministic for a seed; on vLLM it takes real time.")
    p.add_argument("--engine", choices=("sim", "vllm", "remote"), default="sim",
                   help="sim: calibrated simulator on a virtual clock (default); vllm: embedded vLLM, wall clock; "
                        "remote: refused, bench force-decodes recorded plans (measure it with peer-bench "
                        "--node-engines remote)")
    p.add_argument("--hw", default=None,
                   help=f"sim: hardware profile name or YAML file (default {DEFAULT_HW}; see timely-llm --help)")
    p.add_argument("--model", default=None, type=_model_dir,
                   help="vllm: smollm2 (default: SmolLM2-135M-Instruct), tiny (random test model) or a directory")
    p.add_argument("--workload", required=True, help="WID1, WID1-high, WID2, WID3, or a workload JSON file")
    p.add_argument("--policy", required=True, choices=BENCH_POLICIES, metavar="POLICY",
                   help=f"one of {', '.join(BENCH_POLICIES)} (see timely-llm --help)")
    p.add_argument("--seed", type=_nonneg_int, default=0,
                   help="seed of the built-in workload's arrivals and of the robots' execution times (default 0)")
    p.add_argument("--max-batch", type=_positive_int, default=None,
                   help=f"most generations in one batch (default: {DEFAULT_MAX_BATCH}, or less if the engine "
                        "runs fewer at once: the vLLM engine's max_num_seqs)")
    p.add_argument("--skill-models", nargs="*", default=None, type=_in_file,
                   help="skill-model YAML files (default: the shipped ones)")
    p.add_argument("--features", default="default", type=_features, metavar="PARTS",
                   help=f"scheduler parts to switch on: a comma list of {', '.join(Features.names())}, "
                        "or all, none, default (default: default)")
    p.add_argument("--estimator-profile", default=None, metavar="PROFILE",
                   help="feature timebill: the engine's step-time profile (name or YAML file written by "
                        "timely-llm profile); default: the --hw profile on sim, the shipped fit of smollm2 on vllm")
    p.add_argument("--overrun-strategy", default=None, choices=OVERRUN_STRATEGIES,
                   help="every request's overrun strategy (TimeBill): what becomes of a segment that overran its "
                        "deadline; default: each request's own (workload files: field overrun; else none)")
    p.add_argument("--suspend-in-place", action="store_true", help=SUSPEND_IN_PLACE_HELP)
    p.add_argument("--out", required=True, type=_out_file, help="result JSON file to write")
    _add_vllm_arg(p)
    p.set_defaults(run=_bench)


SUSPEND_IN_PLACE_HELP = ("simulator: suspend as embedded vLLM does, keeping the KV in place until a newcomer "
                         "needs it (a resume then prefills nothing), instead of dropping it to the prefix cache "
                         "as the profiles were measured")


def _features(text: str) -> str:
    try:
        Features.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _load_inputs(args: argparse.Namespace):  # noqa: ANN202 - tuple of loaded inputs
    from timely_llm.plan.robot_file import load_skill_models
    from timely_llm.workloads.generator import BUILTIN, generate, load_workload
    from timely_llm.workloads.traces import load_catalog

    skills = load_skill_models(args.skill_models)
    catalog = load_catalog(robots=skills)  # prompts from the skill models this run uses
    for trace in catalog.traces.values():
        if trace.robot not in skills:
            raise ConfigError("lrtrace.yaml", f"trace {trace.id}.robot", f"no skill model for {trace.robot!r}")
    if args.workload in BUILTIN:
        workload = generate(BUILTIN[args.workload], catalog, skills, args.seed)
    elif Path(args.workload).is_file():
        workload = load_workload(args.workload, catalog)
    else:
        raise ConfigError("--workload", args.workload, f"neither a built-in workload ({', '.join(BUILTIN)}) nor a file")
    return skills, catalog, workload


def _bench(args: argparse.Namespace) -> int:
    from timely_llm.engines.hardware import estimator_profile, load_profile
    from timely_llm.evaluation.harness import EngineSetup, run_bench
    from timely_llm.serving import ServerConfig

    if args.engine == "remote":
        raise ConfigError("--engine remote", None, "bench force-decodes the recorded LRTrace plans, which an "
                          "OpenAI-compatible server cannot; measure one with peer-bench --node-engines remote")
    if args.engine == "vllm" and (args.policy == "isolated" or args.hw is not None):
        option = "--policy isolated" if args.policy == "isolated" else "--hw"
        raise ConfigError(option, None, "needs the simulator engine (--engine sim)")
    if args.engine == "sim" and (args.model is not None or args.vllm_arg):
        raise ConfigError("--model" if args.model is not None else "--vllm-arg", None, "applies to --engine vllm only")
    if args.engine == "vllm" and args.suspend_in_place:
        raise ConfigError("--suspend-in-place", None, "applies to --engine sim (vLLM always suspends in place)")
    profile = load_profile(args.hw or DEFAULT_HW)
    features = Features.parse(args.features)
    model = args.model or DEFAULT_MODEL
    step_model = estimator_profile(args.estimator_profile, args.engine, model, args.hw or DEFAULT_HW)
    skills, catalog, workload = _load_inputs(args)
    if args.overrun_strategy is not None:
        workload = workload.with_overrun(args.overrun_strategy)
    if args.engine == "vllm":
        source = f"the step-time profile of {model} (write one: timely-llm profile --model {model} --out F)"
        try:  # refused here if need be, before the engine starts (minutes)
            config = ServerConfig(args.policy, workload.network_latency, features, args.max_batch,
                                  step_profile=step_model, step_profile_source=source)
        except ValueError as exc:
            raise ConfigError("--estimator-profile", None, str(exc)) from None
        _quiet_vllm_logging()
        set_by_policy = {name: ("--policy", value) for name, value in config.vllm_args().items()}
        cap = {"max_num_seqs": ("--max-batch", args.max_batch)} if args.max_batch else {}
        engine = _vllm_engine(model, args.vllm_arg, seed=("--seed", args.seed), **set_by_policy, **cap)
        setup = EngineSetup.real(f"vllm:{model}", engine, step_model)
    else:
        setup = dataclasses.replace(EngineSetup.simulator(profile, args.suspend_in_place), profile=step_model)
    result = run_bench(workload, args.policy, setup, skills, catalog, args.seed, args.max_batch, features)
    Path(args.out).write_text(json.dumps(result, indent=1))
    _print_summary(result)
    return 0


def _print_summary(result: dict) -> None:
    from timely_llm.evaluation.metrics import fmt_metric as fmt

    print(f"{result['policy']} on {result['workload']} ({result['hw']}, seed {result['seed']}):")
    for category, s in result["summary"].items():
        killed = f" killed={s['killed']}" if s.get("killed") else ""
        shed = (f" shed={s['shed']}{killed} utility with shed={fmt(s['mean_utility_with_shed'])}"
                if s.get("shed") or killed else "")
        print(f"  {category:7s} n={s['count']:4d} ok={s['succeeded']:4d} utility={fmt(s['mean_utility'])} "
              f"response={fmt(s['mean_response_time'])}s waiting={fmt(s['mean_waiting_time'])}s{shed}")


def _add_workload(p: argparse.ArgumentParser) -> None:
    p.description = "Write a built-in workload (or a workload file, checked) as workload JSON; see README.md."
    p.add_argument("--workload", required=True, help="WID1, WID1-high, WID2, WID3, or a workload JSON file")
    p.add_argument("--seed", type=_nonneg_int, default=0, help="seed of the arrivals (default 0)")
    p.add_argument("--skill-models", nargs="*", default=None, type=_in_file,
                   help="skill-model YAML files (default: the shipped ones)")
    p.add_argument("--out", required=True, type=_out_file, help="workload JSON file to write")
    p.set_defaults(run=_workload)


def _workload(args: argparse.Namespace) -> int:
    _, _, workload = _load_inputs(args)
    Path(args.out).write_text(json.dumps(workload.to_json(), indent=1))
    print(f"{len(workload.requests)} requests -> {args.out}")
    return 0


def _add_plot(p: argparse.ArgumentParser) -> None:
    p.add_argument("results", nargs="+", type=_in_file, help="result JSON files of timely-llm bench or sweep")
    p.add_argument("--out", required=True, type=_out_dir, help="output directory (created if missing)")
    p.set_defaults(run=_plot)


def _plot(args: argparse.Namespace) -> int:
    from timely_llm.evaluation.ablation import is_ablation
    from timely_llm.evaluation.plots import plot_results, plot_sweep
    from timely_llm.evaluation.sweep import is_sweep

    results = _read_results(args.results)
    for path, result in zip(args.results, results, strict=True):
        if is_ablation(result):
            raise ConfigError(path, None, "an ablation result has no plot: timely-llm table shows it")
    sweeps = [r for r in results if is_sweep(r)]
    written = [f for sweep in sweeps for f in plot_sweep(sweep, Path(args.out))]
    benches = [r for r in results if not is_sweep(r)]
    if benches or not sweeps:
        written += plot_results(benches, Path(args.out))
    for f in written:
        print(f)
    return 0


def _add_sweep(p: argparse.ArgumentParser) -> None:
    from timely_llm.evaluation import sweep

    p.add_argument("--hw", nargs="+", default=["rtx4090-llama3-8b"], help="hardware profile names or YAML files")
    p.add_argument("--policies", nargs="+", default=list(sweep.POLICIES), choices=tuple(_policies()),
                   metavar="POLICY", help=f"policies to compare (default {' '.join(sweep.POLICIES)})")
    p.add_argument("--agents", nargs="+", type=_positive_int, default=list(sweep.AGENTS),
                   help="numbers of agents, the load axis (the event rate grows with them)")
    p.add_argument("--caps", nargs="+", default=[str(c or "none") for c in sweep.CAPS],
                   help="batch caps; 'none' for vLLM's default max_num_seqs (256)")
    p.add_argument("--duration", type=float, default=200.0, help="seconds of arrivals per workload")
    p.add_argument("--seed", type=int, default=3, help="workload seed")
    p.add_argument("--bench-seed", type=int, default=0, help="robot execution-time draws")
    p.add_argument("--kv-gib", type=float, default=None, help="KV-cache memory for every profile (GiB)")
    p.add_argument("--features", nargs="+", default=["default"], type=_features, metavar="PARTS",
                   help="sets of scheduler parts, each run under every policy but the baselines "
                        "(vllm, vllm-stream, vllm-priority: once, without parts; see bench --features)")
    p.add_argument("--jobs", type=int, default=sweep.default_jobs(), help="worker processes")
    p.add_argument("--suspend-in-place", action="store_true", help=SUSPEND_IN_PLACE_HELP)
    p.add_argument("--out", required=True, type=_out_file, help="sweep JSON file to write")
    p.set_defaults(run=_sweep)


def _add_ablation(p: argparse.ArgumentParser) -> None:
    from timely_llm.evaluation import ablation, sweep

    p.description = ("Run timelyllm on each point once per set of scheduler parts (default: none, each part alone, "
                     "the default set, all) on the virtual clock; write one JSON and print the table.")
    p.add_argument("--points", nargs="+", type=_ablation_point, default=[pt.name for pt in ablation.POINTS],
                   metavar="POINT", help="WORKLOAD@HW[/CAP][/kvGIB]: a built-in workload or map:N (the load map's "
                                         "workload of N agents), e.g. WID2@rtx4090-llama3-8b/8 "
                                         "(default: the load map's scarce points and WID1-3)")
    p.add_argument("--features", nargs="+", type=_features, default=list(ablation.feature_sets()), metavar="PARTS",
                   help="sets of parts to compare (see bench --features)")
    p.add_argument("--duration", type=_positive_float, default=100.0, help="seconds of arrivals of map:N workloads")
    p.add_argument("--seed", type=_nonneg_int, default=3, help="workload seed (default 3)")
    p.add_argument("--bench-seed", type=_nonneg_int, default=0, help="robot execution-time draws (default 0)")
    p.add_argument("--jobs", type=_positive_int, default=sweep.default_jobs(), help="worker processes")
    p.add_argument("--out", required=True, type=_out_file, help="ablation JSON file to write")
    p.set_defaults(run=_ablation)


def _ablation_point(text: str) -> str:
    from timely_llm.engines.hardware import load_profile
    from timely_llm.evaluation.ablation import Point

    try:
        point = Point.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    try:
        load_profile(point.hw)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(f"point {text!r}: {exc}") from None
    return text


def _ablation(args: argparse.Namespace) -> int:
    from timely_llm.evaluation.ablation import Point, markdown_table, run_ablation

    points = tuple(Point.parse(text) for text in args.points)
    result = run_ablation(points, tuple(args.features), args.duration, args.seed, args.bench_seed, args.jobs)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(markdown_table(result))
    print(f"{len(result['rows'])} runs in {result['wall_s']:.0f} s -> {args.out}")
    return 0


def _policies() -> list[str]:
    from timely_llm.server import POLICIES

    return list(POLICIES)


def _sweep(args: argparse.Namespace) -> int:
    from timely_llm.engines.hardware import load_profile
    from timely_llm.evaluation.sweep import Grid, markdown_table, run_grid

    caps = []
    for cap in args.caps:
        if cap != "none" and (not cap.isdigit() or int(cap) < 1):
            raise ConfigError("--caps", cap, "must be a positive integer or 'none'")
        caps.append(None if cap == "none" else int(cap))
    if any(a < 1 for a in args.agents) or args.duration <= 0 or args.jobs < 1:
        raise ConfigError("--agents/--duration/--jobs", None, "must be positive")
    if args.kv_gib is not None and args.kv_gib <= 0:
        raise ConfigError("--kv-gib", None, "must be > 0")
    for hw in args.hw:
        load_profile(hw)  # a bad name fails here, before any run
    grid = Grid(tuple(args.hw), tuple(args.policies), tuple(args.agents), tuple(caps), args.duration,
                args.seed, args.bench_seed, args.kv_gib, tuple(args.features), args.suspend_in_place)
    result = run_grid(grid, args.jobs)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(markdown_table(result))
    print(f"{len(result['points'])} points in {result['wall_s']:.0f} s -> {args.out}")
    return 0


def _add_profile(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=DEFAULT_MODEL, type=_model_dir,
                   help="smollm2 (default: SmolLM2-135M-Instruct), tiny (random test model) or a directory")
    p.add_argument("--memory-from", default=DEFAULT_HW,
                   help="profile whose memory section is kept, but for its block size: the engine's")
    p.add_argument("--max-model-len", type=_positive_int, default=None,
                   help=f"vLLM max_model_len, at least {MIN_PROFILE_MODEL_LEN} (default: vllm.max_model_len of "
                        "config/timely_llm.yaml)")
    p.add_argument("--out", required=True, type=_out_file, help="hardware profile YAML file to write")
    _add_vllm_arg(p)
    p.set_defaults(run=_profile)


def _profile(args: argparse.Namespace) -> int:
    from timely_llm.engines.hardware import load_profile, save_profile
    from timely_llm.engines.vllm_args import shipped_vllm_args

    given = dict(args.vllm_arg)
    max_model_len = args.max_model_len or given.get("max_model_len") or shipped_vllm_args().get("max_model_len")
    if not isinstance(max_model_len, int) or max_model_len < MIN_PROFILE_MODEL_LEN:
        raise ConfigError("--max-model-len", None, f"must be at least {MIN_PROFILE_MODEL_LEN}")
    memory = dict(load_profile(args.memory_from).memory)
    _quiet_vllm_logging()
    from timely_llm.evaluation.profile_fit import fit_profile, measure_steps

    length = {"max_model_len": ("--max-model-len", args.max_model_len)} if args.max_model_len else {}
    engine = _vllm_engine(args.model, args.vllm_arg, kv_cache_gib=PROFILE_KV_GIB, **length)
    lengths = [n for n in (64, 128, 256, 512, 1024, 1536) if n < max_model_len - 8]
    contexts = tuple(n for n in (256, 1024) if n < max_model_len - 80)
    samples = measure_steps(engine, lengths, [1, 2, 4, 8, 16, 32], contexts=contexts)
    memory["block_tokens"] = float(engine.block_size)  # the prefix cache hits whole blocks of the engine's size
    engine.close()
    profile = fit_profile(samples, Path(args.out).stem, memory, max_model_len)
    if args.model in MODEL_NAMES:  # simulated with the model's token counts
        profile = dataclasses.replace(profile, tokenizer=args.model)
    save_profile(profile, args.out)
    for term, value in profile.step.items():
        print(f"{term:24s} {value:.3e}")
    return 0


def _add_peer_bench(p: argparse.ArgumentParser) -> None:
    from timely_llm.evaluation.peer_bench import NODE_ENGINES, SERVE_CONFIGS
    from timely_llm.workloads.peer import PEER_WORKLOADS

    p.description = ("Start vllm serve from this venv (same model, dtype, KV size, batch cap, prefix caching as the "
                     "node's engine) and replay each workload with robots streaming completions over its OpenAI API "
                     "on loopback, cutting segments with the Segmenter; then the node's server loop on an embedded "
                     "engine under each policy. Every server first runs each task alone (its floor). Prints one "
                     "table of ratios to the floor; see README.md, 'Peer benchmark'.")
    p.add_argument("--model", default=DEFAULT_MODEL, type=_model_dir, help="smollm2 (default), tiny or a directory")
    p.add_argument("--workloads", nargs="+", default=["light", "contended"], choices=list(PEER_WORKLOADS),
                   help="built-in mixed workloads (default: light contended)")
    p.add_argument("--policies", nargs="+", default=["timelyllm", "vllm-stream"], choices=[
        n for n in POLICY_HELP if n != "isolated"], help="the node's policies (default: timelyllm vllm-stream)")
    p.add_argument("--serve-configs", nargs="*", default=["serve"], choices=SERVE_CONFIGS,
                   help="vllm serve runs: serve (FCFS, its default), serve-priority (default: serve)")
    p.add_argument("--node-engines", nargs="+", default=["vllm"], choices=NODE_ENGINES,
                   help="the node's engines: vllm (embedded, a fresh engine each round), remote (the remote engine "
                        "driving the first --serve-configs server, after its streaming robots) (default: vllm)")
    p.add_argument("--rounds", type=_positive_int, default=2, help="rounds, each on fresh servers (default 2)")
    p.add_argument("--max-tokens", type=_positive_int, default=48, help="tokens per plan at most (default 48)")
    p.add_argument("--kv-gib", type=_positive_float, default=1.0, help="KV cache on both sides (default 1)")
    p.add_argument("--max-num-seqs", type=_positive_int, default=64, help="batch cap on both sides (default 64)")
    p.add_argument("--block-size", type=_positive_int, default=None,
                   help="KV block size in tokens on both sides (default: vLLM's, 128 on the CPU)")
    p.add_argument("--reserved-cpus", type=_nonneg_int, default=None,
                   help="VLLM_CPU_NUM_OF_RESERVED_CPU for vllm serve (0: its worker gets every core, as ours does; "
                        "default: vLLM's own, which keeps one core for the API server)")
    p.add_argument("--port", type=_positive_int, default=8765, help="loopback port of vllm serve (default 8765)")
    p.add_argument("--seed", type=_nonneg_int, default=0, help="seed of the arrivals and robots (default 0)")
    p.add_argument("--first", type=_positive_int, default=None, metavar="N",
                   help="keep only each workload's first N requests (a quick check)")
    p.add_argument("--from", dest="inputs", nargs="+", type=_in_file, default=None, metavar="JSON",
                   help="print the table of earlier runs' JSON files (rounds merged) instead of running")
    p.add_argument("--out", type=_out_file, default=None, help="JSON of every run, written after each one")
    p.set_defaults(run=_peer_bench)


def _peer_bench(args: argparse.Namespace) -> int:
    from timely_llm.evaluation.peer_bench import (
        EngineConfig,
        PeerBench,
        Run,
        RunRecord,
        first_segments,
        machine_loads,
        table,
    )

    if args.inputs:
        runs = []
        for path in args.inputs:
            for raw in _read_json(path)["runs"]:
                records = [RunRecord(**r) for r in raw.pop("records")]
                runs.append(Run(**raw, records=records))
        print(table(runs))
        print("\nWhere urgent first segments waited (node, means in seconds):\n" + first_segments(runs))
        print("\nThe machine during the runs:\n" + machine_loads(runs))
        return 0
    if args.out is None:
        raise ConfigError("--out", None, "is required unless --from is given")
    if "remote" in args.node_engines and not args.serve_configs:
        raise ConfigError("--node-engines remote", None, "drives a vllm serve of --serve-configs: name one")
    from timely_llm.models import resolve_model
    from timely_llm.plan.robot_file import load_skill_models
    from timely_llm.workloads.peer import PEER_WORKLOADS, generate_peer
    from timely_llm.workloads.traces import load_catalog

    _quiet_vllm_logging()
    catalog = load_catalog()
    path, dtype = resolve_model(args.model)
    engine = EngineConfig(str(args.model), str(path), dtype, kv_cache_gib=args.kv_gib,
                          max_num_seqs=args.max_num_seqs, max_tokens=args.max_tokens, block_size=args.block_size)
    workloads = [generate_peer(PEER_WORKLOADS[w], catalog, args.seed) for w in args.workloads]
    if args.first:
        workloads = [dataclasses.replace(w, requests=w.requests[:args.first]) for w in workloads]
    bench = PeerBench(engine, workloads,
                      load_skill_models(None), catalog, tuple(args.serve_configs), tuple(args.policies),
                      args.rounds, args.port, args.reserved_cpus, Path(args.out).resolve().parent,
                      node_engines=tuple(args.node_engines))

    def progress(line: str) -> None:
        print(line, flush=True)
        Path(args.out).write_text(json.dumps(bench.to_json(), indent=1))

    bench.run(progress)
    Path(args.out).write_text(json.dumps(bench.to_json(), indent=1))
    print(table(bench.runs))
    print("\nWhere urgent first segments waited (node, means in seconds):\n" + first_segments(bench.runs))
    print("\nThe machine during the runs:\n" + machine_loads(bench.runs))
    print(f"prompt ids identical on both sides: {bench.prompt_ids_match}; runs -> {args.out}")
    return 0


FIDELITY_POLICIES = ("timelyllm", "vllm-stream")


def _add_fidelity(p: argparse.ArgumentParser) -> None:
    from timely_llm.server import POLICIES
    from timely_llm.workloads.peer import PEER_WORKLOADS

    p.description = ("Replay one workload's recorded LRTrace plans (forced token by token, as bench --engine vllm "
                     "does) on the simulator (suspending in place, as embedded vLLM does; with its own tokenizer and "
                     "with the stand-in one) and on embedded vLLM in real time, under each policy, and print them side "
                     "by side: per category mean and p95 response and waiting, utility, where the first segments' "
                     "time went; per run the step times by kind and batch, (re)starts, suspensions and the "
                     "machine's load.")
    p.add_argument("--workload", default="bursty",
                   help=f"a peer workload ({', '.join(PEER_WORKLOADS)}; default bursty), WID1, WID1-high, WID2, WID3 "
                        "or a workload JSON file")
    p.add_argument("--policies", nargs="+", default=list(FIDELITY_POLICIES), metavar="POLICY",
                   choices=[n for n in POLICIES if n != "vllm-priority"],
                   help=f"policies, all on one FCFS engine (default {' '.join(FIDELITY_POLICIES)})")
    p.add_argument("--max-batch", type=_positive_int, default=BURSTY_MAX_BATCH,
                   help=f"batch cap, and vLLM's max_num_seqs unless --vllm-arg gives it (default {BURSTY_MAX_BATCH})")
    p.add_argument("--hw", default="cpu-2core-smollm2-135m",
                   help="the simulator's hardware profile (default cpu-2core-smollm2-135m)")
    p.add_argument("--model", default=DEFAULT_MODEL, type=_model_dir, help="smollm2 (default), tiny or a directory")
    p.add_argument("--rounds", type=_positive_int, default=1,
                   help="rounds on the real engine, every other one in reverse policy order (default 1)")
    p.add_argument("--first", type=_positive_int, default=None, metavar="N", help="only the first N requests")
    p.add_argument("--seed", type=_nonneg_int, default=0, help="workload and robot seed (default 0)")
    p.add_argument("--out", type=_out_file, default=None, help="write every run (records, step logs) as JSON")
    _add_vllm_arg(p)
    p.set_defaults(run=_fidelity)


def _fidelity(args: argparse.Namespace) -> int:
    from timely_llm.engines.hardware import estimator_profile, load_profile
    from timely_llm.engines.sim_tokenizer import SimTokenizer
    from timely_llm.evaluation import fidelity
    from timely_llm.workloads.peer import PEER_WORKLOADS, generate_peer

    profile = load_profile(args.hw)
    if args.workload in PEER_WORKLOADS:
        skills, catalog, _ = _load_inputs(argparse.Namespace(workload="WID1", seed=args.seed, skill_models=None))
        workload = generate_peer(PEER_WORKLOADS[args.workload], catalog, args.seed)
    else:
        skills, catalog, workload = _load_inputs(argparse.Namespace(**{**vars(args), "skill_models": None}))
    if args.first:
        workload = dataclasses.replace(workload, requests=workload.requests[:args.first])
    policies = list(dict.fromkeys(args.policies))
    print(f"{len(workload.requests)} requests of {workload.name}, batch cap {args.max_batch}; simulator {profile.name} "
          f"(in place), real engine {args.model}; {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} "
          "at the start", flush=True)
    _quiet_vllm_logging()
    seqs = {} if "max_num_seqs" in dict(args.vllm_arg) else {"max_num_seqs": ("--max-batch", args.max_batch)}
    with _stdout_to_stderr():
        engine = _vllm_engine(args.model, args.vllm_arg, seed=("--seed", args.seed),
                              scheduling_policy=("--policies", "fcfs"), **seqs)
    try:
        print("engine ready; warming up, then the real runs", flush=True)
        runs = fidelity.on_the_engine(engine, estimator_profile(None, "vllm", args.model, ""), workload, policies,
                                      args.rounds, skills, catalog, args.seed, args.max_batch)
        runs += [run for tokenizer in (None, SimTokenizer())
                 for run in fidelity.simulated(profile, tokenizer, workload, policies, skills, catalog, args.seed,
                                               args.max_batch)]
    finally:
        engine.close()
    if args.out:
        Path(args.out).write_text(json.dumps({"workload": workload.to_json(), "hw": profile.name,
                                              "model": str(args.model), "max_batch": args.max_batch,
                                              "runs": [r.to_json() for r in runs]}))
    print(fidelity.outcome_table(runs))
    print()
    print(fidelity.step_table(runs))
    print()
    print("\n".join(fidelity.load_lines(runs)))
    return 0


def _read_json(path: str) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(path, None, f"cannot read JSON: {exc}") from exc


def _add_table(p: argparse.ArgumentParser) -> None:
    p.add_argument("results", nargs="+", type=_in_file, help="result JSON files of timely-llm bench or sweep")
    p.set_defaults(run=_table)


def _read_results(paths: list[str]) -> list[dict]:
    from timely_llm.evaluation.ablation import is_ablation
    from timely_llm.evaluation.sweep import is_sweep

    results = []
    for path in paths:
        try:
            result = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise ConfigError(path, None, f"cannot read result JSON: {exc}") from exc
        if not is_sweep(result) and not is_ablation(result) and not _is_bench_result(result):
            raise ConfigError(path, None, "not a timely-llm bench, sweep or ablation result "
                                          "(needs policy, workload, requests and summary)")
        results.append(result)
    return results


def _is_bench_result(data: object) -> bool:
    return (isinstance(data, dict) and isinstance(data.get("policy"), str) and isinstance(data.get("workload"), str)
            and isinstance(data.get("requests"), list) and isinstance(data.get("summary"), dict)
            and all(isinstance(s, dict) and "count" in s for s in data["summary"].values()))


def _table(args: argparse.Namespace) -> int:
    from timely_llm.evaluation import ablation, sweep
    from timely_llm.evaluation.metrics import markdown_table

    results = _read_results(args.results)
    for result in filter(sweep.is_sweep, results):
        print(sweep.markdown_table(result))
    for result in filter(ablation.is_ablation, results):
        print(ablation.markdown_table(result))
    benches = [r for r in results if not sweep.is_sweep(r) and not ablation.is_ablation(r)]
    if benches:
        print(markdown_table(benches))
    return 0


def _add_closed_loop(p: argparse.ArgumentParser) -> None:
    from timely_llm.evaluation import closed_loop

    p.description = closed_loop.__doc__.split("\n\n", 1)[1]
    from timely_llm.evaluation.closed_loop import MODES

    p.add_argument("--engine", choices=("sim", "vllm"), default="sim",
                   help="sim: the simulator on a virtual clock (default); vllm: embedded vLLM on the wall clock, "
                        "robots executing in real time (run one mode per command: modes share the engine's "
                        "prefix cache)")
    p.add_argument("--model", default=None, type=_model_dir, help="vllm: the model (default smollm2)")
    p.add_argument("--hw", nargs="+", default=["rtx4090-llama3-8b", "cpu-2core-smollm2-135m"],
                   help="sim: hardware profiles, names or YAML files (default rtx4090-llama3-8b "
                        "cpu-2core-smollm2-135m)")
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES), help=f"default: {' '.join(MODES)}")
    p.add_argument("--seed", type=_nonneg_int, default=0, help="seed of the arrivals, times and values (default 0)")
    p.add_argument("--events-per-second", type=_positive_float, default=0.5,
                   help="Poisson events (1..8 tasks each) per second (default 0.5)")
    p.add_argument("--duration", type=_positive_float, default=240.0, help="seconds of arrivals (default 240)")
    p.add_argument("--robots", type=_positive_int, default=40, help="robots, each running one task at a time "
                                                                     "(default 40)")
    p.add_argument("--suspend-in-place", action="store_true", help=SUSPEND_IN_PLACE_HELP)
    p.add_argument("--out", default=None, type=_out_file, help="also write every task's figures as JSON")
    p.set_defaults(run=_closed_loop)


def _closed_loop(args: argparse.Namespace) -> int:
    from timely_llm.evaluation.closed_loop import run_mode, summarize_tasks
    from timely_llm.evaluation.metrics import fmt_metric as fmt
    from timely_llm.workloads.closed_loop import load_closed_loop

    tasks = load_closed_loop()
    workload = tasks.workload(args.seed, args.events_per_second, agents=args.robots, duration=args.duration)
    results = []
    print("hw                                   mode           category  tasks   ok  utility  step_util  response  "
          "step_resp  step_p95  prefill/resume  completion")
    for setup in _closed_loop_setups(args):
        for mode in args.modes:
            records = run_mode(mode, tasks, workload, setup, args.seed)
            summary = summarize_tasks(records)
            results.append({"hw": setup.name, "mode": mode, "summary": summary,
                            "tasks": [dataclasses.asdict(r) | {"tuf": r.tuf.to_dict()} for r in records]})
            for category, s in summary.items():
                print(f"{setup.name:36s} {mode:14s} {category:8s} {s['tasks']:6d} {s['succeeded']:4d} "
                      f"{fmt(s['utility']):>8s} {fmt(s['step_utility']):>10s} {fmt(s['response']):>9s} "
                      f"{fmt(s['step_response']):>10s} {fmt(s['step_response_p95']):>9s} "
                      f"{fmt(s['prefill_per_resume']):>15s} {fmt(s['completion']):>11s}")
    if args.out:
        Path(args.out).write_text(json.dumps({"seed": args.seed, "workload": workload.name, "results": results},
                                             indent=1))
    return 0


def _closed_loop_setups(args: argparse.Namespace) -> list:
    """The simulator on each --hw profile, or one embedded vLLM engine."""
    from timely_llm.engines.hardware import estimator_profile, load_profile
    from timely_llm.evaluation.harness import EngineSetup

    if args.engine == "sim":
        if args.model is not None:
            raise ConfigError("--model", None, "applies to --engine vllm only")
        return [EngineSetup.simulator(load_profile(hw), args.suspend_in_place) for hw in args.hw]
    if args.suspend_in_place:
        raise ConfigError("--suspend-in-place", None, "applies to --engine sim (vLLM always suspends in place)")
    model = args.model or DEFAULT_MODEL
    _quiet_vllm_logging()
    engine = _vllm_engine(model, [], seed=("--seed", args.seed), scheduling_policy=("--engine vllm", "fcfs"))
    return [EngineSetup.real(f"vllm:{model}", engine, estimator_profile(None, "vllm", model, DEFAULT_HW))]


def _add_sched(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sizes", type=_positive_int, nargs="+", default=[1, 2, 4, 6, 8, 100, 1000, 10000],
                   help="queue lengths to time (default 1 2 4 6 8 100 1000 10000)")
    p.add_argument("--repeat", type=_positive_int, default=200, help="decisions timed per queue length (default 200)")
    p.add_argument("--features", default="none", type=_features, metavar="PARTS",
                   help="scheduler parts whose per-decision work is timed too: timebill recomputes every row's "
                        "G(s) (default: none)")
    p.set_defaults(run=_sched)


def _sched(args: argparse.Namespace) -> int:
    from timely_llm.evaluation.sched_overhead import measure

    print("queue_length  us_per_decision")
    for size, seconds in measure(args.sizes, args.repeat, timebill=Features.parse(args.features).timebill):
        print(f"{size:12d}  {seconds * 1e6:15.1f}")
    return 0


def _add_loop_cost(p: argparse.ArgumentParser) -> None:
    from timely_llm.evaluation import loop_cost

    p.description = loop_cost.__doc__.split("\n\n", 1)[1]
    p.add_argument("--batches", type=_positive_int, nargs="+", default=list(loop_cost.BATCHES),
                   help="generations kept running, one row each with the grammar off and on "
                        f"(default {' '.join(map(str, loop_cost.BATCHES))})")
    p.add_argument("--steps", type=_positive_int, default=loop_cost.DEFAULT_STEPS,
                   help=f"engine steps timed per row (default {loop_cost.DEFAULT_STEPS})")
    p.set_defaults(run=_loop_cost)


def _loop_cost(args: argparse.Namespace) -> int:
    from timely_llm.evaluation.loop_cost import run

    run(args.steps, tuple(args.batches))
    return 0


def _add_estimate_error(p: argparse.ArgumentParser) -> None:
    from timely_llm.server import POLICIES

    p.description = ("Run a workload on the simulator with the profiled constant G(s) and with TimeBill's estimate "
                     "(feature timebill), and print the median absolute relative error of each segment's predicted "
                     "generation time against the time it took.")
    p.add_argument("--workload", default="WID2", help="WID1, WID1-high, WID2 (default), WID3, or a workload JSON file")
    p.add_argument("--hw", default=DEFAULT_HW, help=f"hardware profile name or YAML file (default {DEFAULT_HW})")
    p.add_argument("--policy", choices=tuple(POLICIES), default="timelyllm", metavar="POLICY",
                   help=f"one of {', '.join(POLICIES)} (default timelyllm)")
    p.add_argument("--max-batch", type=_positive_int, default=None, help="batch cap (default: as bench)")
    p.add_argument("--seed", type=_nonneg_int, default=0, help="workload and robot seed (default 0)")
    p.add_argument("--skill-models", nargs="*", default=None, type=_in_file,
                   help="skill-model YAML files (default: the shipped ones)")
    p.add_argument("--results", nargs="+", default=None, type=_in_file, metavar="FILE",
                   help="instead: the error in these bench result files (e.g. a bench --engine vllm run)")
    p.set_defaults(run=_estimate_error)


def _estimate_error(args: argparse.Namespace) -> int:
    from timely_llm.engines.hardware import load_profile
    from timely_llm.evaluation.estimate_error import ErrorSummary, measure, segment_errors, summarize_errors

    if args.results:
        print(ErrorSummary.HEADER)
        for path, result in zip(args.results, _read_results(args.results), strict=True):
            if "requests" not in result:
                raise ConfigError(path, None, "a sweep holds no segment records: give bench results")
            label = f"{result['policy']} [{result.get('features', 'none')}] {result['hw']}"
            print(summarize_errors(label, segment_errors(result)).row())
        return 0
    profile = load_profile(args.hw)
    skills, catalog, workload = _load_inputs(args)
    print(f"G(s) vs the simulator's segment generation time: {args.policy} on {workload.name} ({profile.name}, "
          f"max batch {args.max_batch or 'default'}, seed {args.seed})")
    print(ErrorSummary.HEADER)
    for summary in measure(workload, profile, skills, catalog, args.policy, args.seed, args.max_batch):
        print(summary.row())
    return 0


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


def _add_replay_args(p: argparse.ArgumentParser, duration_default: str = "60") -> None:
    p.add_argument("--workload", default="WID1",
                   help="WID1 (default), WID1-high, WID2, WID3, or a workload JSON file")
    p.add_argument("--seed", type=_nonneg_int, default=0,
                   help="seed of the built-in workload's arrivals and of the robots' execution times (default 0)")
    p.add_argument("--duration", type=_positive_float, default=60.0,
                   help=f"replay the requests arriving in the first S seconds (default {duration_default})")
    p.add_argument("--skill-models", nargs="*", default=None, type=_in_file,
                   help="skill-model YAML files (default: the shipped ones)")
    p.add_argument("--domain-id", type=_domain_id, default=os.environ.get("ROS_DOMAIN_ID", "0"),
                   help="ROS 2 domain id, 0-232 (default: $ROS_DOMAIN_ID or 0)")


def _add_robot_args(p: argparse.ArgumentParser, tello_sim: bool) -> None:
    p.add_argument("--tello-sim", action=argparse.BooleanOptionalAction, default=tello_sim,
                   help="fly drones on Tello simulators through djitellopy, arms on simulated arms "
                        "(else every robot sleeps its skill-model times)")
    p.add_argument("--max-drones", type=_nonneg_int, default=DEFAULT_MAX_DRONES,
                   help="with --tello-sim: at most this many drones on simulators, the rest sleep their times")
    p.add_argument("--interface", choices=("action", "topic"), default="action",
                   help="robots ask over the request_plan action (default) or publish on the task_requests topic "
                        "and hear only their own <agent>/segments and <agent>/plan_result")


def _robots(args: argparse.Namespace, workload: Workload, catalog: TraceCatalog, skills: dict[str, SkillModel],
            ) -> AbstractContextManager[dict[str, SegmentRunner] | None]:
    """The demo's or fleet's robot runners (None: SimulatedSkills for all), reporting what flies."""
    from timely_llm.robots.fleet import fleet_agents
    from timely_llm.robots.sim_robots import simulated_robots

    agents = fleet_agents(workload, catalog)
    if not args.tello_sim:
        return contextlib.nullcontext(None)
    drones = sum(robot == "tello" for robot in agents.values())
    flown = min(drones, args.max_drones)
    print(f"{flown} of {drones} drones fly Tello simulators through djitellopy"
          f"{f' ({drones - flown} sleep their skill-model times)' if flown < drones else ''}; "
          f"{sum(robot == 'arm' for robot in agents.values())} simulated arms")
    return simulated_robots(agents, skills, catalog, args.seed, args.max_drones)


def _add_fleet(p: argparse.ArgumentParser) -> None:
    _add_replay_args(p)
    _add_robot_args(p, tello_sim=False)
    p.add_argument("--out", type=_out_file, help="write the records and summary as JSON")
    p.set_defaults(run=_fleet)


def _fleet(args: argparse.Namespace) -> int:
    from timely_llm.robots.fleet import cut, fleet_result, ros_session, run_fleet

    skills, catalog, workload = _load_inputs(args)
    workload = cut(workload, args.duration)
    print(f"{len(workload.requests)} requests of {workload.name} to the running node on ROS domain {args.domain_id}")
    with ros_session(args.domain_id) as (context, executor), _robots(args, workload, catalog, skills) as runners, \
            _progress("fleet", len(workload.requests)) as progress:
        records = run_fleet(workload, catalog, skills, executor, context, args.seed, runners, progress,
                            interface=args.interface)
    result = fleet_result(workload, records, FLEET_POLICY, args.seed)
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    _print_summary(result)
    _print_failures(result["requests"])
    return 0


DEMO_POLICIES = ("timelyllm", "vllm-stream", "vllm")
DEMO_POINTS = {
    "light": "WID1 (or --workload), the batch cap the policy's: the engine keeps up and the streaming policies "
             "are level",
    "bursty": "106 drone tasks in 60 s in bursts of up to 16, the batch capped at 8 (--max-batch): slots are "
              "scarce and the scheduler decides who gets them",
}
BURSTY_MAX_BATCH = 8


def _add_demo(p: argparse.ArgumentParser) -> None:
    import importlib.util

    from timely_llm.server import POLICIES

    p.description = ("Start the node in this process and replay a fleet's requests to it over ROS 2 in real time, "
                     "once per policy, one policy after the other; print each policy's results, how busy the "
                     "machine was during each run (the CPU other processes took) and, where the runs saw "
                     "comparable machines, how the first policy fared against each other one.")
    _add_replay_args(p, duration_default=f"{DEMO_GENERATED_SECONDS:.0f} with --engine vllm generating plans, "
                                         "else 60; --point bursty: all its 60 s")
    p.set_defaults(duration=None, workload=None)
    _add_robot_args(p, tello_sim=True)
    p.add_argument("--point", choices=tuple(DEMO_POINTS), default="light",
                   help="; ".join(f"{name}: {text}" for name, text in DEMO_POINTS.items()) + " (default light)")
    p.add_argument("--engine", choices=("sim", "vllm"), default="vllm" if importlib.util.find_spec("vllm") else "sim",
                   help="vllm: embedded vLLM generating plans from the task texts (default where vLLM is "
                        "installed); sim: calibrated simulator replaying LRTrace plans on the wall clock")
    p.add_argument("--model", default=DEFAULT_MODEL, type=_model_dir,
                   help="vllm: smollm2 (default: SmolLM2-135M-Instruct), tiny (random test model) or a directory")
    p.add_argument("--replay", action="store_true",
                   help="vllm: force-decode the recorded LRTrace plans instead of generating from the task texts")
    p.add_argument("--max-new-tokens", type=_positive_int, default=DEMO_PLAN_TOKENS,
                   help=f"vllm: cap on a generated plan's tokens (default {DEMO_PLAN_TOKENS})")
    p.add_argument("--max-batch", type=_positive_int, default=None,
                   help=f"batch cap of the node (and vLLM's max_num_seqs); default: the policy's, "
                        f"{BURSTY_MAX_BATCH} at --point bursty")
    p.add_argument("--policies", nargs="+", choices=tuple(POLICIES), default=list(DEMO_POLICIES), metavar="POLICY",
                   help=f"policies run, the first compared with each other one: of {', '.join(POLICIES)} "
                        f"(default {' '.join(DEMO_POLICIES)})")
    p.add_argument("--rounds", type=_positive_int, default=1,
                   help="rounds of all the policies, every other round in reverse order (ABC, CBA, ...), so that "
                        "each policy sees the same machine on average; results merged over rounds (default 1)")
    _add_vllm_arg(p)
    p.set_defaults(run=_demo)


def _demo_inputs(args: argparse.Namespace) -> tuple[dict, TraceCatalog, Workload, int | None]:
    """The demo's skill models, catalog, workload (its point's, cut to the duration) and batch cap."""
    from timely_llm.robots.fleet import cut
    from timely_llm.workloads.peer import PEER_WORKLOADS, generate_peer

    if args.point == "bursty":
        if args.workload is not None:
            raise ConfigError("--workload", None, "the bursty point has its own workload: give one or the other")
        skills, catalog, _ = _load_inputs(argparse.Namespace(**{**vars(args), "workload": "WID1"}))
        workload = cut(generate_peer(PEER_WORKLOADS["bursty"], catalog, args.seed), args.duration)
        return skills, catalog, workload, args.max_batch or BURSTY_MAX_BATCH
    args.workload = args.workload or "WID1"
    skills, catalog, workload = _load_inputs(args)
    generate = args.engine == "vllm" and not args.replay
    return skills, catalog, cut(workload, args.duration or (DEMO_GENERATED_SECONDS if generate else 60.0)), \
        args.max_batch


def _demo(args: argparse.Namespace) -> int:
    from timely_llm.evaluation.machine_load import combined, measured, verdict_lines
    from timely_llm.robots.fleet import fleet_result, ros_session, run_fleet, server_node

    if len(set(args.policies)) < len(args.policies):
        raise ConfigError("--policies", None, "a policy given twice")
    skills, catalog, workload, max_batch = _demo_inputs(args)
    if not workload.requests:
        raise ConfigError("--duration", None, f"no request of {workload.name} arrives in the first {args.duration} s")
    generate = args.engine == "vllm" and not args.replay
    node_params: dict[str, object] = {"max_batch": max_batch} if max_batch else {}
    if args.engine == "vllm":
        _quiet_vllm_logging()
        vllm_args = _checked_vllm_args(args.vllm_arg)
        if max_batch:
            vllm_args.setdefault("max_num_seqs", max_batch)
        node_params |= {"model": args.model, **{f"vllm.{k}": v for k, v in vllm_args.items()}}
    elif args.vllm_arg:
        raise ConfigError("--vllm-arg", None, "applies to --engine vllm only")
    if generate:
        node_params["segment_timeout_margin"] = GENERATED_SEGMENT_TIMEOUT_MARGIN
    source = f"plans generated by {args.model} from the task texts" if generate else "recorded LRTrace plans"
    arrivals = max((r.arrival for r in workload.requests), default=0.0)
    print(f"{len(workload.requests)} requests of {workload.name} over ROS 2, {args.engine} engine, {source}, "
          f"batch cap {max_batch or 'none'}; each policy replays them in real time ({arrivals:.0f} s of "
          f"arrivals); {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the start", flush=True)
    records: dict[str, list[dict]] = {policy: [] for policy in args.policies}
    loads: dict[str, list] = {policy: [] for policy in args.policies}
    for round_ in range(args.rounds):
        for policy in args.policies if round_ % 2 == 0 else args.policies[::-1]:
            label = f"{policy}" + (f" (round {round_ + 1})" if args.rounds > 1 else "")
            print(f"{label}: starting the node ({args.engine} engine)", flush=True)
            with ros_session(args.domain_id) as (context, executor), \
                    server_node(executor, context, engine=args.engine, policy=policy, **node_params,
                                network_latency=workload.network_latency), \
                    _robots(args, workload, catalog, skills) as runners, \
                    _progress(policy, len(workload.requests)) as progress, measured() as meter:
                got = run_fleet(workload, catalog, skills, executor, context, args.seed, runners, progress,
                                generate=generate, max_new_tokens=args.max_new_tokens if generate else 0,
                                interface=args.interface)
            records[policy] += got
            loads[policy] += [meter.load] if meter.load else []
            print(f"{label}: {sum(r['status'] == 'succeeded' for r in got)} of {len(got)} requests succeeded; "
                  + (meter.load.describe() if meter.load else "machine load not measured (no /proc)"), flush=True)
    results = {policy: fleet_result(workload, records[policy], policy, args.seed) for policy in args.policies}
    machine = {policy: combined(found) for policy, found in loads.items() if found}
    print(f"\nresults ({'merged over ' + str(args.rounds) + ' rounds; ' if args.rounds > 1 else ''}"
          "wall clock: they vary with the machine's load):")
    for policy, result in results.items():  # last, after every engine's start-up output
        _print_summary(result)
        if policy in machine:
            print(f"  machine during {policy}: {machine[policy].describe()}")
        _print_failures(result["requests"])
    print()
    for line in verdict_lines({p: r["summary"] for p, r in results.items()}, machine):
        print(line)
    return 0


def _add_load_bench(p: argparse.ArgumentParser) -> None:
    p.add_argument("--agents", nargs="+", type=_positive_int, default=[100, 500, 1000],
                   help="robots, each always with a goal in flight, against a fresh node per count "
                        "(default 100 500 1000)")
    p.add_argument("--duration", type=_positive_float, default=20.0, help="seconds measured per count (default 20)")
    p.add_argument("--time-scale", type=_positive_float, default=0.05,
                   help="robots execute segments in this fraction of their skill-model time (default 0.05)")
    p.add_argument("--memory-goals", nargs="*", type=_positive_int, default=[1000, 10000],
                   help="the node's RSS once this many goals ended (default 1000 10000;"
                        " the option alone, with no counts, skips the run)")
    p.add_argument("--memory-agents", type=_positive_int, default=200, help="robots for the RSS run (default 200)")
    p.add_argument("--domain-id", type=_domain_id, default=os.environ.get("ROS_DOMAIN_ID", "0"),
                   help="ROS 2 domain id, 0-232 (default: $ROS_DOMAIN_ID or 0)")
    p.set_defaults(run=_load_bench)


def _load_bench(args: argparse.Namespace) -> int:
    from timely_llm.plan.robot_file import load_skill_models
    from timely_llm.robots.load_bench import LoadResult, rss_after_goals, run_load
    from timely_llm.workloads.traces import load_catalog

    skills, catalog = load_skill_models(), load_catalog()
    print(f"node on the sim engine, its own process; {os.cpu_count()} cores, load average "
          f"{os.getloadavg()[0]:.1f} at the start", flush=True)
    print(LoadResult.HEADER, flush=True)
    for agents in args.agents:
        print(run_load(agents, args.duration, skills, catalog, args.domain_id, args.time_scale).row(), flush=True)
    if args.memory_goals:
        marks = sorted(args.memory_goals)
        found = rss_after_goals(marks, args.memory_agents, skills, catalog, args.domain_id)
        print(f"node RSS with {args.memory_agents} robots: " + ", ".join(
            f"{rss:.0f} MiB after {goals:,} goals" for goals, rss in found) +
            f" ({100 * (found[-1][1] / found[0][1] - 1):+.1f}% from first to last)")
    return 0


def _add_traffic_bench(p: argparse.ArgumentParser) -> None:
    p.add_argument("--robots", nargs="+", type=_positive_int, default=[2, 8, 32],
                   help="robot processes, all at once against a fresh node per count (default 2 8 32)")
    p.add_argument("--goals", type=_positive_int, default=3, help="tasks each robot sends in turn (default 3)")
    p.add_argument("--interfaces", nargs="+", choices=("action", "topic"), default=["action", "topic"],
                   help="the interfaces measured, in this order, by the same robot processes (default action topic)")
    p.add_argument("--time-scale", type=_positive_float, default=0.02,
                   help="robots execute segments in this fraction of their skill-model time (default 0.02)")
    p.add_argument("--domain-id", type=_domain_id, default=os.environ.get("ROS_DOMAIN_ID", "0"),
                   help="ROS 2 domain id, 0-232 (default: $ROS_DOMAIN_ID or 0)")
    p.set_defaults(run=_traffic_bench)


def _traffic_bench(args: argparse.Namespace) -> int:
    from timely_llm.robots.traffic_bench import InterfaceTraffic, run_traffic

    print(f"node on the sim engine and every robot in a process of its own; {os.cpu_count()} cores, load average "
          f"{os.getloadavg()[0]:.1f} at the start; {args.goals} tasks per robot, one after another", flush=True)
    print(InterfaceTraffic.HEADER, flush=True)
    for robots in args.robots:
        for point in run_traffic(robots, args.goals, args.domain_id, args.time_scale, tuple(args.interfaces)):
            print(point.row(), flush=True)
    return 0


def _add_security_policy(p: argparse.ArgumentParser) -> None:
    p.add_argument("--agents", nargs="+", required=True, help="the robots' agent ids (ROS name tokens)")
    p.add_argument("--out", type=Path, default=Path("sros2_policies"),
                   help="directory for <agent>.policy.xml and timely_llm_server.policy.xml (default sros2_policies)")
    p.add_argument("--namespace", default="/", help="the node's namespace (default /)")
    p.add_argument("--robot-node", default="{agent}",
                   help="each robot's node name, {agent} standing for its agent id (default {agent})")
    p.set_defaults(run=_security_policy)


def _security_policy(args: argparse.Namespace) -> int:
    from timely_llm.ros.security_policy import write_policies

    try:
        written = write_policies(args.agents, args.out, args.namespace, args.robot_node)
    except ValueError as exc:
        raise SystemExit(f"timely-llm security-policy: {exc}") from None
    for path in written:
        print(path)
    return 0


def _print_failures(records: list[dict]) -> None:
    for record in records:
        if record["status"] != "succeeded":
            print(f"    {record['id']} ({record['agent']}): {record['status']}: {record['reason']}")


FLEET_POLICY = "running node"
"""The policy named in fleet results: whatever the running node serves with (its ``policy`` parameter)."""


@contextlib.contextmanager
def _progress(label: str, total: int, period_s: float = PROGRESS_PERIOD_S) -> Iterator[Callable[[int], None]]:
    """A callback taking the number of requests done; a thread prints 'done / total' every ``period_s``."""
    done = [0]
    stop = threading.Event()
    began = time.monotonic()

    def report() -> None:
        while not stop.wait(period_s):
            print(f"  {label}: {done[0]}/{total} requests done ({time.monotonic() - began:.0f} s)", flush=True)

    def update(count: int) -> None:
        done[0] = count

    printer = threading.Thread(target=report, daemon=True)
    printer.start()
    try:
        yield update
    finally:
        stop.set()
        printer.join()


def _quiet_vllm_logging() -> None:
    """vLLM logs to stdout at INFO; send only its errors, to stderr, so results stay readable.

    Must run before vLLM is imported; variables already set in the environment win.
    """
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")


# ----- argument types: a bad value is a one-line error before any work -----

MIN_PROFILE_MODEL_LEN = 128
PROFILE_KV_GIB = 2.0
"""KV cache of the profiling engine: room for 32 generations of 1,024 tokens of SmolLM2."""
MAX_ROS_DOMAIN_ID = 232


def _positive_int(text: str) -> int:
    value = _int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive integer")
    return value


def _nonneg_int(text: str) -> int:
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be an integer >= 0")
    return value


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive number")
    return value


def _domain_id(text: str) -> int:
    value = _nonneg_int(text)
    if value > MAX_ROS_DOMAIN_ID:
        raise argparse.ArgumentTypeError(f"{text!r} is not a ROS 2 domain id (0-{MAX_ROS_DOMAIN_ID})")
    return value


def _in_file(text: str) -> str:
    if not Path(text).is_file():
        raise argparse.ArgumentTypeError(f"{text!r}: no such file")
    return text


def _model_dir(text: str) -> str:
    from timely_llm.models.hub import is_hub_id

    if text in MODEL_NAMES or is_hub_id(text) and not Path(text).exists():
        return text
    if not Path(text).is_dir():
        raise argparse.ArgumentTypeError(f"{text!r}: no such model directory (nor a Hugging Face id org/name)")
    return text


def _add_vllm_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--vllm-arg", action="append", default=[], type=_vllm_arg, metavar="KEY=VALUE",
                   help="a vLLM engine argument (any EngineArgs field, e.g. max_num_seqs=8, dtype=float16, "
                        "tensor_parallel_size=2), repeatable; VALUE read as YAML; the others as in the vllm section "
                        "of config/timely_llm.yaml")


def _vllm_arg(text: str) -> tuple[str, object]:
    from timely_llm.engines.vllm_args import EngineArgsError, parse_assignment

    try:
        return parse_assignment(text)
    except EngineArgsError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _checked_vllm_args(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """The --vllm-arg options as a dict, each a field the user may set (vLLM checks the values)."""
    from timely_llm.engines.vllm_args import EngineArgsError, check_fields

    given: dict[str, object] = {}
    for key, value in pairs:
        if key in given:
            raise ConfigError("--vllm-arg", None, f"{key} given twice")
        given[key] = value
    try:
        check_fields(given, "")
    except EngineArgsError as exc:
        raise ConfigError("--vllm-arg", None, str(exc)) from None
    return given


def _vllm_engine(model: str | None, pairs: list[tuple[str, object]], kv_cache_gib: float | None = None,
                 announce: str = "", **options: tuple[str, object]):  # noqa: ANN202
    """The embedded vLLM engine with the shipped engine arguments (config/timely_llm.yaml), the command's own
    ``options`` (field: (its option, value)) and the --vllm-arg ones; vLLM's refusal is a ConfigError.
    ``kv_cache_gib``: the shipped one unless given. ``announce`` goes to stderr once the model and the arguments
    passed the checks made before vLLM loads (so a refusal there stays one line)."""
    from timely_llm.engines.vllm_args import EngineArgsError, engine_args, shipped_parameters
    from timely_llm.models.hub import ModelNotReachable, check_if_hub_id

    try:
        check_if_hub_id(model or "")  # before vLLM's import: an unreachable Hub fails in seconds
    except ModelNotReachable as exc:
        raise ConfigError("--model", None, str(exc)) from None
    try:
        arguments = engine_args(_checked_vllm_args(pairs), options, source="")
    except EngineArgsError as exc:
        raise ConfigError("--vllm-arg", None, str(exc)) from None
    if announce:
        print(announce, file=sys.stderr, flush=True)
    try:
        from timely_llm.engines.vllm_engine import VllmEngine

        return VllmEngine(model, kv_cache_gib=kv_cache_gib or shipped_parameters()["kv_cache_gib"], **arguments)
    except (EngineArgsError, ModelNotReachable) as exc:
        raise ConfigError("--vllm-arg" if isinstance(exc, EngineArgsError) else "--model", None, str(exc)) from None


def _out_file(text: str) -> str:
    """A file we can write: checked before the run, so a long run is not lost at the end."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a directory")
    parent = path.parent
    if not parent.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r}: directory {str(parent)!r} does not exist")
    if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise argparse.ArgumentTypeError(f"{text!r}: not writable")
    return text


def _out_dir(text: str) -> str:
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} exists and is not a directory")
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not os.access(existing, os.W_OK):
        raise argparse.ArgumentTypeError(f"{text!r}: {str(existing)!r} is not writable")
    return text


def _add_plan(p: argparse.ArgumentParser) -> None:
    from timely_llm.planning import DEFAULT_PLAN_TOKENS

    p.add_argument("--robot", required=True,
                   help="robot type: the robot of a skill model (a shipped one, or one in --skill-models)")
    p.add_argument("--task", help="the task, optionally after a scene: 'Scene: [cat], Task: ...' "
                                  "(required unless --show-prompt)")
    p.add_argument("--model", default=DEFAULT_MODEL, type=_model_dir,
                   help="smollm2 (default: SmolLM2-135M-Instruct), tiny (random test model) or a directory")
    p.add_argument("--max-new-tokens", type=_positive_int, default=DEFAULT_PLAN_TOKENS,
                   help=f"cap on the plan's tokens (default {DEFAULT_PLAN_TOKENS})")
    p.add_argument("--no-grammar", action="store_true", help="decode freely instead of in the robot's grammar")
    p.add_argument("--skill-models", nargs="*", default=None, type=_in_file,
                   help="skill-model YAML files (default: the shipped ones)")
    p.add_argument("--json", action="store_true", help="end with the plan as one line of JSON")
    p.add_argument("--show-prompt", action="store_true",
                   help="print the exact prompt the model gets (for --task, or the robot's fixed part alone) "
                        "and exit without loading a model")
    _add_vllm_arg(p)
    p.set_defaults(run=_plan)


def _plan(args: argparse.Namespace) -> int:
    from timely_llm.plan.robot_file import load_skill_models
    from timely_llm.planning import generate_plan

    skills = load_skill_models(args.skill_models)
    if args.robot not in skills:
        raise ConfigError("--robot", None, f"unknown robot {args.robot!r} (known: {', '.join(sorted(skills))})")
    if args.show_prompt:
        print(skills[args.robot].prompt_text(args.task) if args.task else skills[args.robot].system_prompt, end="")
        return 0
    if args.task is None:
        raise ConfigError("--task", None, "required (unless --show-prompt)")
    if not args.task.strip():
        raise ConfigError("--task", None, "empty task")
    _quiet_vllm_logging()
    out = os.fdopen(os.dup(sys.stdout.fileno()), "w", buffering=1)
    with _stdout_to_stderr():  # anything else vLLM and its libraries print
        engine = _vllm_engine(args.model, args.vllm_arg, announce=f"loading {args.model} on embedded vLLM (on a "
                                                                  "CPU it compiles for about half a minute first)")
        try:
            print("generating", file=sys.stderr, flush=True)
            plan = generate_plan(engine, skills[args.robot], args.task,
                                 constrained=not args.no_grammar, max_new_tokens=args.max_new_tokens,
                                 on_segment=lambda s: s.text and print(f"segment {s.index}: {s.text}", file=out))
        finally:
            engine.close()
    if plan.stopped_at_token_cap:
        print(f"the plan stopped at its token cap ({args.max_new_tokens} tokens; --max-new-tokens raises it): "
              "the model had not ended it, so it may stop short of the task", file=sys.stderr)
    if plan.reason:
        print(f"{plan.status}: {plan.reason}", file=out)
    if args.json:
        print(json.dumps(plan.to_json()), file=out)
    out.close()
    return 0 if plan.status == "succeeded" else 1


@contextlib.contextmanager
def _stdout_to_stderr():  # noqa: ANN202 - context manager
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)

if __name__ == "__main__":
    sys.exit(main())
