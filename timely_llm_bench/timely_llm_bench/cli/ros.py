"""``timely-llm`` commands around the ROS 2 node: serve, fleet, demo, load-bench, traffic-bench, security-policy."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from timely_llm.cli.common import (
    _add_vllm_arg,
    _checked_vllm_args,
    _in_file,
    _model_dir,
    _nonneg_int,
    _out_file,
    _positive_float,
    _positive_int,
    _quiet_vllm_logging,
)
from timely_llm.core.policies import TIMELYLLM, VLLM, VLLM_STREAM
from timely_llm.engines.registry import SIM_ENGINE, VLLM_ENGINE
from timely_llm.errors import ConfigError
from timely_llm.models import DEFAULT_MODEL
from timely_llm_bench.cli.common import (
    BURSTY_MAX_BATCH,
    _load_inputs,
    _print_failures,
    _print_summary,
    _progress,
    workloads_help,
)
from timely_llm_bench.cli.demo_log import terminal_and_log

if TYPE_CHECKING:
    from timely_llm.engines.keeper import EngineKeeper
    from timely_llm.plan.skills import SkillModel
    from timely_llm.traces import TraceCatalog
    from timely_llm_bench.evaluation.machine_load import MachineLoad
    from timely_llm_bench.workloads.generator import Workload
    from timely_llm_robot.client import SegmentRunner


DEFAULT_MAX_DRONES = 25


GENERATED_SEGMENT_TIMEOUT_MARGIN = 120.0
"""A generated loop (up to 5 rounds of up to 4 statements) runs its later rounds at its ``}``, a segment
estimated at ~0 s."""


DEMO_GENERATED_SECONDS = 20.0
"""The light demo on the real model replays the first 20 s of the workload: the CPU generates ~17 tokens/s."""


DEMO_BURST_SECONDS = 1.0
"""The bursty demo with plans generated: the requests of the first burst only (14 drone tasks, 4 of them urgent,
with seed 0), more than the batch cap of 8 admits at once; a 2-core CPU serves one burst in about a minute."""


DEMO_LEAD_S = 1.0
DEMO_GRACE_S = 60.0
"""How long a demo run waits for its open requests after the last arrival: a baseline that keeps the burst
waiting longer has shown what it does by then, and its open requests are listed as not ended."""
"""At the bursty point the first request arrives this long after the robots are up (not the workload's 8 s)."""


DEMO_PLAN_TOKENS = 48


def _add_replay_args(p: argparse.ArgumentParser, duration_default: str = "60") -> None:
    p.add_argument("--workload", default="WID1", help=f"{workloads_help()} (default WID1)")
    p.add_argument("--seed", type=_nonneg_int, default=0,
                   help="seed of the built-in workload's arrivals and of the robots' execution times (default 0)")
    p.add_argument("--duration", type=_positive_float, default=60.0,
                   help=f"replay the requests arriving in the first S seconds (default {duration_default})")
    p.add_argument("--skill-models", nargs="*", default=None, type=_in_file,
                   help="skill-model YAML files (default: the shipped ones)")
    _add_domain_id_arg(p)


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
    from timely_llm_bench.robots.fleet import fleet_agents
    from timely_llm_bench.robots.sim_robots import simulated_robots

    agents = fleet_agents(workload, catalog)
    if not args.tello_sim:
        return contextlib.nullcontext(None)
    drones = sum(robot == "tello" for robot in agents.values())
    flown = min(drones, args.max_drones)
    print(f"{flown} of {drones} drones fly Tello simulators through djitellopy"
          f"{f' ({drones - flown} sleep their skill-model times)' if flown < drones else ''}; "
          f"{sum(robot == 'arm' for robot in agents.values())} simulated arms")
    return simulated_robots(agents, skills, catalog, args.seed, args.max_drones, domain=args.domain_id)


def _add_fleet(p: argparse.ArgumentParser) -> None:
    _add_replay_args(p)
    _add_robot_args(p, tello_sim=False)
    p.add_argument("--out", type=_out_file, help="write the records and summary as JSON")
    p.set_defaults(run=_fleet)


def _fleet(args: argparse.Namespace) -> int:
    from timely_llm_bench.robots.fleet import cut, fleet_result, ros_session, run_fleet

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


DEMO_POLICIES = (TIMELYLLM.name, VLLM_STREAM.name, VLLM.name)


DEMO_POINTS = {
    "bursty": "drone tasks in bursts of up to 16 (106 in 60 s; with --engine vllm generating plans, the first burst "
              "only: 14, 4 urgent), the batch capped at 8 (--max-batch): slots are scarce and the scheduler decides "
              "who gets them",
    "light": "WID1 (or --workload), the shipped batch cap (max_batch): the engine keeps up and the streaming policies "
             "are level",
}


DEMO_LEVEL = {
    "light": "at the light point the engine keeps up with the arrivals, so no request waits for a batch slot and the "
             "order a scheduler picks changes little; --point bursty is where slots are scarce",
    "bursty": "not what this point is for (slots are scarce here): a machine busy with other work slows every policy "
              "alike, see the machine load above",
}
"""Why two policies come out level at each point."""


def _add_demo_engine_args(p: argparse.ArgumentParser) -> None:
    import importlib.util

    p.add_argument("--engine", choices=(SIM_ENGINE.name, VLLM_ENGINE.name),
                   default=VLLM_ENGINE.name if importlib.util.find_spec("vllm") else SIM_ENGINE.name,
                   help="vllm: embedded vLLM generating plans from the task texts (default where vLLM is "
                        "installed); sim: calibrated simulator replaying LRTrace plans on the wall clock")
    p.add_argument("--model", default=DEFAULT_MODEL, type=_model_dir,
                   help="vllm: smollm2 (default: SmolLM2-135M-Instruct), tiny (random test model) or a directory")
    p.add_argument("--replay", action="store_true",
                   help="vllm: force-decode the recorded LRTrace plans instead of generating from the task texts")


def _add_demo(p: argparse.ArgumentParser) -> None:
    from timely_llm.core.policies import POLICIES

    p.description = ("Start the node in this process and replay a fleet's requests to it over ROS 2 in real time, "
                     "once per policy, one policy after the other; print each policy's results, how busy the "
                     "machine was during each run (the CPU other processes took) and, where the runs saw "
                     "comparable machines, how the first policy fared against each other one.")
    _add_replay_args(p, duration_default=f"--point light: {DEMO_GENERATED_SECONDS:.0f} with --engine vllm "
                                         "generating plans, else 60; --point bursty: from its first arrival, "
                                         f"{DEMO_BURST_SECONDS:.0f} (its first burst) with --engine vllm generating "
                                         "plans, else all")
    p.set_defaults(duration=None, workload=None)
    _add_robot_args(p, tello_sim=True)
    p.add_argument("--point", choices=tuple(DEMO_POINTS), default=None,
                   help="; ".join(f"{name}: {text}" for name, text in DEMO_POINTS.items())
                        + " (default bursty; light where --workload is given)")
    _add_demo_engine_args(p)
    p.add_argument("--max-new-tokens", type=_positive_int, default=DEMO_PLAN_TOKENS,
                   help=f"vllm: cap on a generated plan's tokens (default {DEMO_PLAN_TOKENS})")
    p.add_argument("--max-batch", type=_positive_int, default=None,
                   help=f"batch cap of the node (its parameter max_batch); default: config/timely_llm.yaml's, "
                        f"{BURSTY_MAX_BATCH} at --point bursty")
    p.add_argument("--policies", nargs="+", choices=tuple(POLICIES), default=list(DEMO_POLICIES), metavar="POLICY",
                   help=f"policies run, the first compared with each other one: of {', '.join(POLICIES)} "
                        f"(default {' '.join(DEMO_POLICIES)})")
    p.add_argument("--rounds", type=_positive_int, default=1,
                   help="rounds of all the policies, every other round in reverse order (ABC, CBA, ...), so that "
                        "each policy sees the same machine on average; results merged over rounds (default 1)")
    p.add_argument("--log", default="build/demo.log",
                   help="file for everything but the demo's own lines: vLLM's output, warnings, progress bars, the "
                        "node's ROS log (default build/demo.log)")
    _add_vllm_arg(p)
    p.set_defaults(run=_demo)


def _demo_inputs(args: argparse.Namespace) -> tuple[dict, TraceCatalog, Workload, int]:
    """The demo's skill models, catalog, workload (its point's, cut to the duration) and batch cap."""
    from timely_llm.engines.vllm_args import shipped_parameters
    from timely_llm_bench.robots.fleet import cut
    from timely_llm_bench.workloads.peer import PEER_WORKLOADS, generate_peer

    generate = args.engine == VLLM_ENGINE.name and not args.replay
    args.point = args.point or ("light" if args.workload is not None else "bursty")
    if args.point == "bursty":
        if args.workload is not None:
            raise ConfigError("--workload", None, "the bursty point has its own workload: give one or the other")
        skills, catalog, _ = _load_inputs(argparse.Namespace(**{**vars(args), "workload": "WID1"}))
        workload = generate_peer(PEER_WORKLOADS["bursty"], catalog, args.seed)
        duration = args.duration or (DEMO_BURST_SECONDS if generate else None)
        return skills, catalog, _from_first_arrival(workload, duration), args.max_batch or BURSTY_MAX_BATCH
    args.workload = args.workload or "WID1"
    skills, catalog, workload = _load_inputs(args)
    return skills, catalog, cut(workload, args.duration or (DEMO_GENERATED_SECONDS if generate else 60.0)), \
        args.max_batch or shipped_parameters()["max_batch"]


def _from_first_arrival(workload: Workload, duration: float | None) -> Workload:
    """The requests arriving within ``duration`` s of the first (all if None), the first at ``DEMO_LEAD_S``."""
    import dataclasses

    first = min((r.arrival for r in workload.requests), default=0.0)
    kept = [r for r in workload.requests if duration is None or r.arrival < first + duration]
    return dataclasses.replace(workload, requests=tuple(
        dataclasses.replace(r, arrival=round(r.arrival - first + DEMO_LEAD_S, 6)) for r in kept))


def _demo(args: argparse.Namespace) -> int:
    if len(set(args.policies)) < len(args.policies):
        raise ConfigError("--policies", None, "a policy given twice")
    skills, catalog, workload, max_batch = _demo_inputs(args)
    if not workload.requests:
        raise ConfigError("--duration", None, f"no request of {workload.name} arrives in the first {args.duration} s")
    generate = args.engine == VLLM_ENGINE.name and not args.replay
    node_params = _demo_node_params(args, max_batch, generate)
    source = f"plans generated by {args.model} from the task texts" if generate else "recorded LRTrace plans"
    arrivals = max((r.arrival for r in workload.requests), default=0.0)
    urgent = sum(catalog[r.trace].category == "urgent" for r in workload.requests)
    print(f"{len(workload.requests)} requests ({urgent} urgent) of {workload.name} over ROS 2, {args.engine} engine, "
          f"{source}, batch cap {max_batch}; each policy replays them in real time (the last arrives at "
          f"{arrivals:.1f} s); {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the start", flush=True)
    from timely_llm.engines.vllm_version import MODULE as VLLM_MODULE

    with terminal_and_log(Path(args.log), (VLLM_MODULE,) if args.engine == VLLM_ENGINE.name else ()):
        print(f"third-party output (vLLM, progress bars, the node's ROS log) goes to {args.log}", flush=True)
        records, loads = _demo_runs(args, workload, catalog, skills, node_params, generate)
        _print_demo_results(args, workload, records, loads)
    return 0


def _demo_node_params(args: argparse.Namespace, max_batch: int, generate: bool) -> dict[str, Any]:
    """The node's parameters for every policy's run."""
    params: dict[str, object] = {"max_batch": max_batch}
    if args.engine == VLLM_ENGINE.name:
        _quiet_vllm_logging()
        vllm_args = _checked_vllm_args(args.vllm_arg)
        params |= {"model": args.model, **{f"vllm.{k}": v for k, v in vllm_args.items()}}
    elif args.vllm_arg:
        raise ConfigError("--vllm-arg", None, "applies to --engine vllm only")
    if generate:
        params["segment_timeout_margin"] = GENERATED_SEGMENT_TIMEOUT_MARGIN
    return params


def _demo_runs(args: argparse.Namespace, workload: Workload, catalog: TraceCatalog, skills: dict[str, SkillModel],
               node_params: dict[str, Any], generate: bool) -> tuple[dict[str, list[dict]], dict[str, list]]:
    """Each policy's run, a fresh node each on one engine (loaded once, kept between runs), in turns that alternate
    their order by round: (records, loads) by policy."""
    from timely_llm.engines.keeper import EngineKeeper

    keeper = EngineKeeper()
    records: dict[str, list[dict]] = {policy: [] for policy in args.policies}
    loads: dict[str, list] = {policy: [] for policy in args.policies}
    what = f"{args.model} on the vllm engine" if args.engine == VLLM_ENGINE.name else "the sim engine"
    print(f"loading {what} once for all {len(args.policies)} policies", flush=True)
    try:
        for round_ in range(args.rounds):
            for policy in args.policies if round_ % 2 == 0 else args.policies[::-1]:
                label = f"{policy}" + (f" (round {round_ + 1})" if args.rounds > 1 else "")
                got, load = _demo_run(args, workload, catalog, skills, node_params, generate, policy, label, keeper)
                records[policy] += got
                loads[policy] += [load] if load else []
    finally:
        keeper.close()
    print(f"engine loads in all: {len(keeper.loads)} ("
          + ", ".join(f"{seconds:.0f} s" for seconds in keeper.loads) + ")", flush=True)
    return records, loads


def _demo_run(args: argparse.Namespace, workload: Workload, catalog: TraceCatalog, skills: dict[str, SkillModel],
              node_params: dict[str, Any], generate: bool, policy: str, label: str,
              keeper: EngineKeeper) -> tuple[list[dict], MachineLoad | None]:
    """One policy's run on a fresh node taking the engine from ``keeper``: its records and the machine's load."""
    from timely_llm_bench.evaluation.machine_load import measured
    from timely_llm_bench.robots.fleet import ros_session, run_fleet, server_node, waiting_for

    loaded = len(keeper.loads)
    print(f"{label}: starting the node ({args.engine} engine)", flush=True)
    sent: list = []
    with ros_session(args.domain_id) as (context, executor), \
            server_node(executor, context, engine=args.engine, engines=keeper, policy=policy, **node_params,
                        network_latency=workload.network_latency), \
            _robots(args, workload, catalog, skills) as runners, \
            _progress(policy, len(workload.requests), waiting=lambda: waiting_for(sent)) as progress, \
            measured() as meter:
        if len(keeper.loads) > loaded:
            print(f"{label}: engine loaded in {keeper.loads[-1]:.0f} s (kept for the other runs)", flush=True)
        got = run_fleet(workload, catalog, skills, executor, context, args.seed, runners, progress,
                        generate=generate, max_new_tokens=args.max_new_tokens if generate else 0,
                        interface=args.interface, sent=sent, partial=True, grace_s=DEMO_GRACE_S)
    print(f"{label}: {sum(r['status'] == 'succeeded' for r in got)} of {len(got)} requests succeeded; "
          + (meter.load.describe() if meter.load else "machine load not measured (no /proc)"), flush=True)
    return got, meter.load


def _print_demo_results(args: argparse.Namespace, workload: Workload, records: dict[str, list[dict]],
                        loads: dict[str, list]) -> None:
    """Each policy's summary, machine load and missed deadlines, then one verdict sentence per baseline (after a
    caution where the runs' machines differed too much to compare them fairly)."""
    from timely_llm_bench.evaluation.machine_load import combined, load_verdict, verdict_lines
    from timely_llm_bench.evaluation.verdict import (
        deadline_lines,
        first_actions,
        missed_deadlines,
        verdict_sentences,
    )
    from timely_llm_bench.robots.fleet import fleet_result

    results = {policy: fleet_result(workload, records[policy], policy, args.seed) for policy in args.policies}
    machine = {policy: combined(found) for policy, found in loads.items() if found}
    print(f"\nresults ({'merged over ' + str(args.rounds) + ' rounds; ' if args.rounds > 1 else ''}"
          "wall clock: they vary with the machine's load; response: the robot's first action after its request):")
    for policy, result in results.items():
        _print_summary(result)
        if policy in machine:
            print(f"  machine during {policy}: {machine[policy].describe()}")
        _print_failures(result["requests"])
        for line in deadline_lines(result["requests"]):
            print(line)
    print()
    refusal = load_verdict(machine)
    if refusal:  # the sentences still come, after the warning that the machine may have decided them
        print(refusal.replace("no verdict: ", "caution, the runs saw unequal machines: ", 1))
    else:
        for line in verdict_lines({p: r["summary"] for p, r in results.items()}, machine):
            print(line)
    met = {p: f"{len(r['requests']) - len(missed_deadlines(r['requests']))} of {len(r['requests'])}"
           for p, r in results.items()}
    print()
    firsts = {p: first_actions(r["requests"]) for p, r in results.items()}
    for line in verdict_sentences(firsts, met, DEMO_LEVEL[args.point]):
        print(line)


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
    _add_domain_id_arg(p)
    p.set_defaults(run=_load_bench)


def _load_bench(args: argparse.Namespace) -> int:
    from timely_llm.plan.robot_file import load_skill_models
    from timely_llm.traces import load_catalog
    from timely_llm_bench.robots.load_bench import LoadResult, rss_after_goals, run_load

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


def _add_abuse_bench(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scenarios", nargs="+", choices=("defaults", "fleet"), default=["defaults", "fleet"],
                   help="defaults: no fleet file, one agent flooding urgent claims; fleet: 20 declared robots, "
                        "2,000 made-up ids and a declared robot claiming beyond its class (default both)")
    p.add_argument("--duration", type=_positive_float, default=30.0, help="seconds per run (default 30)")
    _add_domain_id_arg(p)
    p.set_defaults(run=_abuse_bench)


def _abuse_bench(args: argparse.Namespace) -> int:
    from timely_llm.plan.robot_file import load_skill_models
    from timely_llm.traces import load_catalog
    from timely_llm_bench.robots.abuse_bench import AbuseResult, run_abuse

    skills, catalog = load_skill_models(), load_catalog()
    print(f"node in-process on the sim engine, batch cap 8; {os.cpu_count()} cores, load average "
          f"{os.getloadavg()[0]:.1f} at the start", flush=True)
    print(AbuseResult.HEADER, flush=True)
    for scenario in args.scenarios:
        quiet = run_abuse(scenario, False, args.duration, skills, catalog, args.domain_id)
        print(quiet.row(), flush=True)
        attacked = run_abuse(scenario, True, args.duration, skills, catalog, args.domain_id)
        print(attacked.row(), flush=True)
        print(f"{scenario}: urgent mean response with attackers {attacked.urgent_mean_s / quiet.urgent_mean_s:.2f}x "
              f"the run without; honest goals lost: {attacked.honest_goals - attacked.honest_succeeded}", flush=True)
    print(f"load average {os.getloadavg()[0]:.1f} at the end", flush=True)
    return 0


def _add_traffic_bench(p: argparse.ArgumentParser) -> None:
    p.add_argument("--robots", nargs="+", type=_positive_int, default=[2, 8, 32],
                   help="robot processes, all at once against a fresh node per count (default 2 8 32)")
    p.add_argument("--goals", type=_positive_int, default=3, help="tasks each robot sends in turn (default 3)")
    p.add_argument("--interfaces", nargs="+", choices=("action", "topic"), default=["action", "topic"],
                   help="the interfaces measured, in this order, by the same robot processes (default action topic)")
    p.add_argument("--time-scale", type=_positive_float, default=0.02,
                   help="robots execute segments in this fraction of their skill-model time (default 0.02)")
    _add_domain_id_arg(p)
    p.set_defaults(run=_traffic_bench)


def _traffic_bench(args: argparse.Namespace) -> int:
    from timely_llm_bench.robots.traffic_bench import InterfaceTraffic, run_traffic

    print(f"node on the sim engine and every robot in a process of its own; {os.cpu_count()} cores, load average "
          f"{os.getloadavg()[0]:.1f} at the start; {args.goals} tasks per robot, one after another", flush=True)
    print(InterfaceTraffic.HEADER, flush=True)
    for robots in args.robots:
        for point in run_traffic(robots, args.goals, args.domain_id, args.time_scale, tuple(args.interfaces)):
            print(point.row(), flush=True)
    return 0


FLEET_POLICY = "running node"
"""The policy named in fleet results: whatever the running node serves with (its ``policy`` parameter)."""


MAX_ROS_DOMAIN_ID = 232


def _add_domain_id_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--domain-id", type=_domain_id, default=os.environ.get("ROS_DOMAIN_ID", "0"),
                   help="ROS 2 domain id, 0-232 (default: $ROS_DOMAIN_ID or 0)")


def _domain_id(text: str) -> int:
    value = _nonneg_int(text)
    if value > MAX_ROS_DOMAIN_ID:
        raise argparse.ArgumentTypeError(f"{text!r} is not a ROS 2 domain id (0-{MAX_ROS_DOMAIN_ID})")
    return value
