"""``timely-llm`` commands on the simulator and on saved results: bench, workload, plot, sweep, ablation, table,
closed-loop-bench, sched-overhead, loop-cost, estimate-error."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING

from timely_llm.cli.common import (
    DEFAULT_HW,
    _add_vllm_arg,
    _in_file,
    _model_dir,
    _nonneg_int,
    _out_dir,
    _out_file,
    _positive_float,
    _positive_int,
    _quiet_vllm_logging,
    _vllm_engine,
)
from timely_llm.core.features import Features
from timely_llm.core.overload import OVERRUN_STRATEGIES
from timely_llm.core.policies import ENGINE_FCFS
from timely_llm.engines.registry import ENGINES, REMOTE_ENGINE, SIM_ENGINE, VLLM_ENGINE
from timely_llm.errors import ConfigError
from timely_llm.models import DEFAULT_MODEL
from timely_llm_bench.cli.common import (
    _add_only,
    _features,
    _load_inputs,
    _of_categories,
    _print_summary,
    workloads_help,
)

if TYPE_CHECKING:
    from timely_llm.plan.skills import SkillModel
    from timely_llm.traces import TraceCatalog
    from timely_llm_bench.workloads.generator import Workload


def _add_bench(p: argparse.ArgumentParser) -> None:
    from timely_llm.serving import DEFAULT_MAX_BATCH
    from timely_llm_bench.evaluation.harness import BENCH_POLICIES

    p.description = ("Replay a workload through the server loop under one policy and write one record per "
                     "request plus per-category means. On the simulator (the default) the run is on a virtual "
                     "clock and deterministic for a seed; on vLLM it takes real time.")
    p.add_argument("--engine", choices=tuple(ENGINES), default=SIM_ENGINE.name,
                   help="sim: calibrated simulator on a virtual clock (default); vllm: embedded vLLM, wall clock; "
                        "remote: refused, bench force-decodes recorded plans (measure it with peer-bench "
                        "--node-engines remote)")
    p.add_argument("--hw", default=None,
                   help=f"sim: hardware profile name or YAML file (default {DEFAULT_HW}; see timely-llm --help)")
    p.add_argument("--model", default=None, type=_model_dir,
                   help="vllm: smollm2 (default: SmolLM2-135M-Instruct), tiny (random test model) or a directory")
    p.add_argument("--workload", required=True, help=workloads_help())
    p.add_argument("--policy", required=True, choices=BENCH_POLICIES, metavar="POLICY",
                   help=f"one of {', '.join(BENCH_POLICIES)} (see timely-llm --help)")
    p.add_argument("--seed", type=_nonneg_int, default=0,
                   help="seed of the built-in workload's arrivals and of the robots' execution times (default 0)")
    p.add_argument("--max-batch", type=_positive_int, default=None,
                   help=f"batch cap: most generations at once, for the scheduler and the vLLM engine (default: "
                        f"{DEFAULT_MAX_BATCH} on sim; on vllm config/timely_llm.yaml's max_batch)")
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
    _add_only(p)
    p.add_argument("--out", required=True, type=_out_file, help="result JSON file to write")
    _add_vllm_arg(p)
    p.set_defaults(run=_bench)


SUSPEND_IN_PLACE_HELP = ("simulator: suspend as embedded vLLM does, keeping the KV in place until a newcomer "
                         "needs it (a resume then prefills nothing), instead of dropping it to the prefix cache "
                         "as the profiles were measured")


def _bench(args: argparse.Namespace) -> int:
    from timely_llm.engines.hardware import estimator_profile, load_profile
    from timely_llm.serving import ServerConfig
    from timely_llm_bench.evaluation.harness import ISOLATED, EngineSetup, run_bench

    if args.engine == REMOTE_ENGINE.name:
        raise ConfigError("--engine remote", None, "bench force-decodes the recorded LRTrace plans, which an "
                          "OpenAI-compatible server cannot; measure one with peer-bench --node-engines remote")
    if args.engine == VLLM_ENGINE.name and (args.policy == ISOLATED or args.hw is not None):
        option = "--policy isolated" if args.policy == ISOLATED else "--hw"
        raise ConfigError(option, None, "needs the simulator engine (--engine sim)")
    if args.engine == SIM_ENGINE.name and (args.model is not None or args.vllm_arg):
        raise ConfigError("--model" if args.model is not None else "--vllm-arg", None, "applies to --engine vllm only")
    if args.engine == VLLM_ENGINE.name and args.suspend_in_place:
        raise ConfigError("--suspend-in-place", None, "applies to --engine sim (vLLM always suspends in place)")
    profile = load_profile(args.hw or DEFAULT_HW)
    features = Features.parse(args.features)
    model = args.model or DEFAULT_MODEL
    step_model = estimator_profile(args.estimator_profile, args.engine == SIM_ENGINE.name, model, args.hw or DEFAULT_HW)
    skills, catalog, workload = _bench_inputs(args)
    if args.engine == VLLM_ENGINE.name:
        source = f"the step-time profile of {model} (write one: timely-llm profile --model {model} --out F)"
        try:  # refused here if need be, before the engine starts (minutes)
            config = ServerConfig(args.policy, workload.network_latency, features, args.max_batch,
                                  step_profile=step_model, step_profile_source=source)
        except ValueError as exc:
            raise ConfigError("--estimator-profile", None, str(exc)) from None
        _quiet_vllm_logging()
        set_by_policy = {name: ("--policy", value) for name, value in config.vllm_args().items()}
        engine = _vllm_engine(model, args.vllm_arg, max_batch=args.max_batch,
                              options={"seed": ("--seed", args.seed), **set_by_policy})
        setup = EngineSetup.real(f"vllm:{model}", engine, step_model)
    else:
        setup = dataclasses.replace(EngineSetup.simulator(profile, args.suspend_in_place), profile=step_model)
    result = run_bench(workload, args.policy, setup, skills, catalog, args.seed, args.max_batch, features)
    Path(args.out).write_text(json.dumps(result, indent=1))
    _print_summary(result)
    return 0


def _bench_inputs(args: argparse.Namespace) -> tuple[dict[str, SkillModel], TraceCatalog, Workload]:
    """The robots, the catalog and the workload, cut to ``--only``'s categories, with ``--overrun-strategy``."""
    skills, catalog, workload = _load_inputs(args)
    workload = _of_categories(workload, catalog, args.only)
    if args.overrun_strategy is not None:
        workload = workload.with_overrun(args.overrun_strategy)
    return skills, catalog, workload


def _add_workload(p: argparse.ArgumentParser) -> None:
    p.description = "Write a built-in workload (or a workload file, checked) as workload JSON; see README.md."
    p.add_argument("--workload", required=True, help=workloads_help())
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
    from timely_llm_bench.evaluation.ablation import is_ablation
    from timely_llm_bench.evaluation.plots import plot_results, plot_sweep
    from timely_llm_bench.evaluation.sweep import is_sweep

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
    from timely_llm.serving import DEFAULT_MAX_BATCH
    from timely_llm_bench.evaluation import sweep

    p.add_argument("--hw", nargs="+", default=["rtx4090-llama3-8b"], help="hardware profile names or YAML files")
    p.add_argument("--policies", nargs="+", default=list(sweep.POLICIES), choices=tuple(_policies()),
                   metavar="POLICY", help=f"policies to compare (default {' '.join(sweep.POLICIES)})")
    p.add_argument("--agents", nargs="+", type=_positive_int, default=list(sweep.AGENTS),
                   help="numbers of agents, the load axis (the event rate grows with them)")
    p.add_argument("--caps", nargs="+", default=[str(c or "none") for c in sweep.CAPS],
                   help=f"batch caps; 'none' for the default, {DEFAULT_MAX_BATCH}")
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
    from timely_llm_bench.evaluation import ablation, sweep

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
    from timely_llm_bench.evaluation.ablation import Point

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
    from timely_llm_bench.evaluation.ablation import Point, markdown_table, run_ablation

    points = tuple(Point.parse(text) for text in args.points)
    result = run_ablation(points, tuple(args.features), args.duration, args.seed, args.bench_seed, args.jobs)
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(markdown_table(result))
    print(f"{len(result['rows'])} runs in {result['wall_s']:.0f} s -> {args.out}")
    return 0


def _policies() -> list[str]:
    from timely_llm.core.policies import POLICIES

    return list(POLICIES)


def _sweep(args: argparse.Namespace) -> int:
    from timely_llm.engines.hardware import load_profile
    from timely_llm_bench.evaluation.sweep import Grid, markdown_table, run_grid

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


def _add_table(p: argparse.ArgumentParser) -> None:
    p.add_argument("results", nargs="+", type=_in_file, help="result JSON files of timely-llm bench or sweep")
    p.set_defaults(run=_table)


def _read_results(paths: list[str]) -> list[dict]:
    from timely_llm_bench.evaluation.ablation import is_ablation
    from timely_llm_bench.evaluation.sweep import is_sweep

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
    from timely_llm_bench.evaluation import ablation, sweep
    from timely_llm_bench.evaluation.metrics import markdown_table

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
    from timely_llm_bench.evaluation import closed_loop

    p.description = closed_loop.__doc__.split("\n\n", 1)[1]
    from timely_llm_bench.evaluation.closed_loop import MODES

    p.add_argument("--engine", choices=(SIM_ENGINE.name, VLLM_ENGINE.name), default=SIM_ENGINE.name,
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
    from timely_llm_bench.evaluation.closed_loop import run_mode, summarize_tasks
    from timely_llm_bench.evaluation.metrics import fmt_metric as fmt
    from timely_llm_bench.workloads.closed_loop import load_closed_loop

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
    from timely_llm_bench.evaluation.harness import EngineSetup

    if args.engine == SIM_ENGINE.name:
        if args.model is not None:
            raise ConfigError("--model", None, "applies to --engine vllm only")
        return [EngineSetup.simulator(load_profile(hw), args.suspend_in_place) for hw in args.hw]
    if args.suspend_in_place:
        raise ConfigError("--suspend-in-place", None, "applies to --engine sim (vLLM always suspends in place)")
    model = args.model or DEFAULT_MODEL
    _quiet_vllm_logging()
    engine = _vllm_engine(model, [], options={"seed": ("--seed", args.seed),
                                              "scheduling_policy": ("--engine vllm", ENGINE_FCFS)})
    return [EngineSetup.real(f"vllm:{model}", engine, estimator_profile(None, False, model, DEFAULT_HW))]


def _add_sched(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sizes", type=_positive_int, nargs="+", default=[1, 2, 4, 6, 8, 100, 1000, 10000],
                   help="queue lengths to time (default 1 2 4 6 8 100 1000 10000)")
    p.add_argument("--repeat", type=_positive_int, default=200, help="decisions timed per queue length (default 200)")
    p.add_argument("--features", default="none", type=_features, metavar="PARTS",
                   help="scheduler parts whose per-decision work is timed too: timebill recomputes every row's "
                        "G(s) (default: none)")
    p.set_defaults(run=_sched)


def _sched(args: argparse.Namespace) -> int:
    from timely_llm_bench.evaluation.sched_overhead import measure

    print("queue_length  us_per_decision")
    for size, seconds in measure(args.sizes, args.repeat, timebill=Features.parse(args.features).timebill):
        print(f"{size:12d}  {seconds * 1e6:15.1f}")
    return 0


def _add_loop_cost(p: argparse.ArgumentParser) -> None:
    from timely_llm_bench.evaluation import loop_cost

    p.description = loop_cost.__doc__.split("\n\n", 1)[1]
    p.add_argument("--batches", type=_positive_int, nargs="+", default=list(loop_cost.BATCHES),
                   help="generations kept running, one row each with the grammar off and on "
                        f"(default {' '.join(map(str, loop_cost.BATCHES))})")
    p.add_argument("--steps", type=_positive_int, default=loop_cost.DEFAULT_STEPS,
                   help=f"engine steps timed per row (default {loop_cost.DEFAULT_STEPS})")
    p.set_defaults(run=_loop_cost)


def _loop_cost(args: argparse.Namespace) -> int:
    from timely_llm_bench.evaluation.loop_cost import run

    run(args.steps, tuple(args.batches))
    return 0


def _add_estimate_error(p: argparse.ArgumentParser) -> None:
    from timely_llm.core.policies import POLICIES, TIMELYLLM

    p.description = ("Run a workload on the simulator with the profiled constant G(s) and with TimeBill's estimate "
                     "(feature timebill), and print the median absolute relative error of each segment's predicted "
                     "generation time against the time it took.")
    p.add_argument("--workload", default="WID2", help="WID1, WID1-high, WID2 (default), WID3, or a workload JSON file")
    p.add_argument("--hw", default=DEFAULT_HW, help=f"hardware profile name or YAML file (default {DEFAULT_HW})")
    p.add_argument("--policy", choices=tuple(POLICIES), default=TIMELYLLM.name, metavar="POLICY",
                   help=f"one of {', '.join(POLICIES)} (default {TIMELYLLM.name})")
    p.add_argument("--max-batch", type=_positive_int, default=None, help="batch cap (default: as bench)")
    p.add_argument("--seed", type=_nonneg_int, default=0, help="workload and robot seed (default 0)")
    p.add_argument("--skill-models", nargs="*", default=None, type=_in_file,
                   help="skill-model YAML files (default: the shipped ones)")
    p.add_argument("--results", nargs="+", default=None, type=_in_file, metavar="FILE",
                   help="instead: the error in these bench result files (e.g. a bench --engine vllm run)")
    p.set_defaults(run=_estimate_error)


def _estimate_error(args: argparse.Namespace) -> int:
    from timely_llm.engines.hardware import load_profile
    from timely_llm_bench.evaluation.estimate_error import ErrorSummary, measure, segment_errors, summarize_errors

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
