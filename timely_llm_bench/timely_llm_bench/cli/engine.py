"""``timely-llm`` benchmark commands on the real engine: peer-bench, fidelity."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from timely_llm.cli.common import (
    _add_vllm_arg,
    _in_file,
    _model_dir,
    _nonneg_int,
    _out_file,
    _positive_float,
    _positive_int,
    _quiet_vllm_logging,
    _vllm_engine,
)
from timely_llm.cli.engine import _stdout_to_stderr
from timely_llm.core.policies import ENGINE_FCFS, POLICIES, TIMELYLLM, VLLM_STREAM
from timely_llm.engines.registry import REMOTE_ENGINE, VLLM_ENGINE
from timely_llm.errors import ConfigError
from timely_llm.models import DEFAULT_MODEL
from timely_llm_bench.cli.common import (
    BURSTY_MAX_BATCH,
    _add_only,
    _load_inputs,
    _of_categories,
    _read_json,
    workloads_help,
)

if TYPE_CHECKING:
    from collections.abc import Iterator

    from timely_llm.engines.base import Engine
    from timely_llm.engines.hardware import HardwareProfile
    from timely_llm.plan.skills import SkillModel
    from timely_llm.traces import TraceCatalog
    from timely_llm_bench.evaluation.peer_bench import PeerBench, Run, ServeProcess
    from timely_llm_bench.workloads.generator import Workload


def _add_peer_bench(p: argparse.ArgumentParser) -> None:
    from timely_llm_bench.evaluation.peer_bench import NODE_ENGINES, SERVE_CONFIGS
    from timely_llm_bench.workloads.peer import PEER_WORKLOADS

    p.description = ("Start vllm serve from this venv (same model, dtype, KV size, batch cap, prefix caching as the "
                     "node's engine) and replay each workload with robots streaming completions over its OpenAI API "
                     "on loopback, cutting segments with the Segmenter; then the node's server loop on an embedded "
                     "engine under each policy. Every server first runs each task alone (its floor). Prints one "
                     "table of ratios to the floor; see README.md, 'Peer benchmark'.")
    p.add_argument("--model", default=DEFAULT_MODEL, type=_model_dir, help="smollm2 (default), tiny or a directory")
    p.add_argument("--workloads", nargs="+", default=["light", "contended"], choices=list(PEER_WORKLOADS),
                   help="built-in mixed workloads (default: light contended)")
    p.add_argument("--policies", nargs="+", default=[TIMELYLLM.name, VLLM_STREAM.name],
                   choices=list(POLICIES), help=f"the node's policies (default: {TIMELYLLM.name} {VLLM_STREAM.name})")
    p.add_argument("--serve-configs", nargs="*", default=["serve"], choices=SERVE_CONFIGS,
                   help="vllm serve runs: serve (FCFS, its default), serve-priority (default: serve)")
    p.add_argument("--node-engines", nargs="+", default=[VLLM_ENGINE.name], choices=NODE_ENGINES,
                   help="the node's engines: vllm (embedded, a fresh engine each round), remote (the remote engine "
                        "driving the first --serve-configs server, after its streaming robots) (default: vllm)")
    p.add_argument("--servers", type=_positive_int, default=1,
                   help="servers the remote engine drives: the first --serve-configs server and more started alike "
                        "on the next ports, for the node alone, each on its own slice of the cores (default 1)")
    p.add_argument("--rounds", type=_positive_int, default=2, help="rounds, each on fresh servers (default 2)")
    p.add_argument("--max-tokens", type=_positive_int, default=48, help="tokens per plan at most (default 48)")
    p.add_argument("--kv-gib", type=_positive_float, default=1.0, help="KV cache on both sides (default 1)")
    p.add_argument("--max-batch", type=_positive_int, default=64,
                   help="batch cap on both sides: vllm serve's --max-num-seqs, the node's max_batch (default 64)")
    p.add_argument("--block-size", type=_positive_int, default=None,
                   help="KV block size in tokens on both sides (default: the embedded engine's, 32 on a CPU)")
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
    from timely_llm_bench.evaluation.peer_bench import Run, RunRecord

    if args.inputs:
        runs = []
        for path in args.inputs:
            for raw in _read_json(path)["runs"]:
                records = [RunRecord(**r) for r in raw.pop("records")]
                runs.append(Run(**raw, records=records))
        _print_peer_runs(runs)
        return 0
    if args.out is None:
        raise ConfigError("--out", None, "is required unless --from is given")
    if REMOTE_ENGINE.name in args.node_engines and not args.serve_configs:
        raise ConfigError("--node-engines remote", None, "drives a vllm serve of --serve-configs: name one")
    if args.servers > 1 and REMOTE_ENGINE.name not in args.node_engines:
        raise ConfigError("--servers", None, "are for the remote engine: add --node-engines remote")
    _quiet_vllm_logging()
    bench = _peer_bench_of(args)

    def progress(line: str) -> None:
        print(line, flush=True)
        Path(args.out).write_text(json.dumps(bench.to_json(), indent=1))

    bench.run(progress)
    Path(args.out).write_text(json.dumps(bench.to_json(), indent=1))
    _print_peer_runs(bench.runs)
    print(f"prompt ids identical on both sides: {bench.prompt_ids_match}; runs -> {args.out}")
    return 0


def _peer_bench_of(args: argparse.Namespace) -> PeerBench:
    from timely_llm.engines.vllm_engine import default_block_size
    from timely_llm.models import resolve_model
    from timely_llm.plan.robot_file import load_skill_models
    from timely_llm.traces import load_catalog
    from timely_llm_bench.evaluation.peer_bench import EngineConfig, PeerBench
    from timely_llm_bench.workloads.peer import PEER_WORKLOADS, generate_peer

    catalog = load_catalog()
    path, dtype = resolve_model(args.model)
    engine = EngineConfig(str(args.model), str(path), dtype, kv_cache_gib=args.kv_gib,
                          max_batch=args.max_batch, max_tokens=args.max_tokens,
                          block_size=args.block_size or default_block_size())  # both sides alike
    workloads = [generate_peer(PEER_WORKLOADS[w], catalog, args.seed) for w in args.workloads]
    if args.first:
        workloads = [dataclasses.replace(w, requests=w.requests[:args.first]) for w in workloads]
    return PeerBench(engine, workloads, load_skill_models(None), catalog, tuple(args.serve_configs),
                     tuple(args.policies), args.rounds, args.port, args.reserved_cpus, Path(args.out).resolve().parent,
                     node_engines=tuple(args.node_engines), servers=args.servers)


def _print_peer_runs(runs: list[Run]) -> None:
    from timely_llm_bench.evaluation.peer_bench import failures, first_segments, kv_reuse, machine_loads, table

    print(table(runs))
    print("\nWhere urgent first segments waited (node, means in seconds):\n" + first_segments(runs))
    print("\nWhat the node's resumes reused:\n" + kv_reuse(runs))
    print("\nPlans the node ended without an action:\n" + failures(runs))
    print("\nThe machine during the runs:\n" + machine_loads(runs))


FIDELITY_POLICIES = (TIMELYLLM.name, VLLM_STREAM.name)


def _add_fidelity(p: argparse.ArgumentParser) -> None:
    p.description = ("Replay one workload's recorded LRTrace plans (forced token by token, as bench --engine vllm "
                     "does) on the simulator (suspending in place, as embedded vLLM does; with its own tokenizer and "
                     "with the stand-in one) and on embedded vLLM in real time, under each policy, and print them side "
                     "by side: per category mean and p95 response and waiting, utility, where the first segments' "
                     "time went; per run the step times by kind and batch, (re)starts, suspensions and the "
                     "machine's load. With --url or --serve: the remote engine on vllm serve instead, and the plans it "
                     "generated replayed on the simulator of the remote path, each mean response real against "
                     "simulated with the error.")
    p.add_argument("--workload", default="bursty",
                   help=f"{workloads_help()} (default bursty)")
    p.add_argument("--policies", nargs="+", default=list(FIDELITY_POLICIES), metavar="POLICY",
                   choices=[n for n, pol in POLICIES.items() if pol.engine_scheduling == ENGINE_FCFS],
                   help=f"policies, all on one FCFS engine (default {' '.join(FIDELITY_POLICIES)})")
    p.add_argument("--max-batch", type=_positive_int, default=BURSTY_MAX_BATCH,
                   help=f"batch cap of the scheduler and the vLLM engine (default {BURSTY_MAX_BATCH})")
    p.add_argument("--hw", default="cpu-2core-smollm2-135m",
                   help="the simulator's hardware profile (default cpu-2core-smollm2-135m)")
    p.add_argument("--model", default=DEFAULT_MODEL, type=_model_dir, help="smollm2 (default), tiny or a directory")
    p.add_argument("--rounds", type=_positive_int, default=1,
                   help="rounds on the real engine, every other one in reverse policy order (default 1)")
    p.add_argument("--first", type=_positive_int, default=None, metavar="N", help="only the first N requests")
    _add_only(p)
    p.add_argument("--seed", type=_nonneg_int, default=0, help="workload and robot seed (default 0)")
    p.add_argument("--out", type=_out_file, default=None, help="write every run (records, step logs) as JSON")
    p.add_argument("--url", default=None,
                   help="the remote engine on this running vllm serve instead of embedded vLLM: it generates each "
                        "plan under the grammar (greedy), and the simulator of the remote path replays those plans "
                        "(--hw with an http section; without one the server is profiled first)")
    p.add_argument("--serve", action="store_true",
                   help="as --url, on a vllm serve of --model started here, capped at --max-batch")
    p.add_argument("--api-key-env", default="", help="with --url: the environment variable holding its bearer token")
    _add_vllm_arg(p)
    p.set_defaults(run=_fidelity)


def _fidelity(args: argparse.Namespace) -> int:
    from timely_llm.engines.hardware import estimator_profile, load_profile
    from timely_llm.engines.sim_tokenizer import SimTokenizer
    from timely_llm_bench.evaluation import fidelity

    profile = load_profile(args.hw)
    skills, catalog, workload = _fidelity_inputs(args)
    policies = list(dict.fromkeys(args.policies))
    if args.url or args.serve:
        return _remote_fidelity(args, profile, (skills, catalog, workload), policies)
    print(f"{len(workload.requests)} requests of {workload.name}, batch cap {args.max_batch}; simulator {profile.name} "
          f"(in place), real engine {args.model}; {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} "
          "at the start", flush=True)
    _quiet_vllm_logging()
    with _stdout_to_stderr():
        engine = _vllm_engine(args.model, args.vllm_arg, max_batch=args.max_batch,
                              options={"seed": ("--seed", args.seed), "scheduling_policy": ("--policies", ENGINE_FCFS)})
    try:
        print("engine ready; warming up, then the real runs", flush=True)
        runs = fidelity.on_the_engine(engine, estimator_profile(None, False, args.model, ""), workload, policies,
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
    print("\n\n".join([fidelity.outcome_table(runs), fidelity.step_table(runs), "\n".join(fidelity.load_lines(runs)),
                        "\n".join(fidelity.kv_lines(runs))]))
    return 0


def _fidelity_inputs(args: argparse.Namespace) -> tuple[dict[str, SkillModel], TraceCatalog, Workload]:
    """The robots, the catalog and the workload, cut to ``--first`` and then to ``--only``'s categories."""
    skills, catalog, workload = _load_inputs(argparse.Namespace(**{**vars(args), "skill_models": None}))
    if args.first:
        workload = dataclasses.replace(workload, requests=workload.requests[:args.first])
    return skills, catalog, _of_categories(workload, catalog, args.only)


def _remote_fidelity(args: argparse.Namespace, profile: HardwareProfile,
                     inputs: tuple[dict[str, SkillModel], TraceCatalog, Workload], policies: list[str]) -> int:
    """``fidelity --url/--serve``: the remote engine in real time, then its generated plans on the simulator of the
    remote path; the capped-burst means real against simulated."""
    from timely_llm_bench.evaluation import fidelity

    skills, catalog, workload = inputs
    with contextlib.ExitStack() as stack:
        url = args.url or stack.enter_context(_serve(args)).url
        profile = _with_http_section(profile, url, args)
        print(f"{len(workload.requests)} requests of {workload.name}, batch cap {args.max_batch}; simulator "
              f"{profile.name} (remote path), real: the remote engine on {url}; {os.cpu_count()} cores, load "
              f"average {os.getloadavg()[0]:.1f} at the start", flush=True)
        engine = _remote_engine(url, args)
        stack.callback(engine.close)
        runs = fidelity.on_the_engine(engine, profile, workload, policies, args.rounds, skills, catalog, args.seed,
                                      args.max_batch, remote=True)
    runs += fidelity.replayed_remote(profile, runs, workload, skills, catalog, args.seed, args.max_batch)
    if args.out:
        Path(args.out).write_text(json.dumps({"workload": workload.to_json(), "hw": profile.to_dict(), "url": url,
                                              "max_batch": args.max_batch, "runs": [r.to_json() for r in runs]}))
    print("\n\n".join([fidelity.outcome_table(runs), fidelity.step_table(runs), "\n".join(fidelity.load_lines(runs)),
                        "\n".join(fidelity.error_lines(runs, fidelity.REMOTE, fidelity.SIM_REMOTE)),
                        "\n".join(fidelity.kv_lines(runs))]))
    return 0


@contextlib.contextmanager
def _serve(args: argparse.Namespace) -> Iterator[ServeProcess]:
    """``vllm serve`` of ``--model`` on a free loopback port, capped at ``--max-batch``, stopped on exit."""
    import socket
    import tempfile

    from timely_llm.engines.vllm_engine import default_block_size
    from timely_llm.models import resolve_model
    from timely_llm_bench.evaluation.peer_bench import EngineConfig, ServeProcess

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    model_dir, dtype = resolve_model(args.model)
    log = Path(tempfile.mkdtemp(prefix="fidelity-serve-")) / "serve.log"
    print(f"starting vllm serve of {args.model} (log {log}; 1-2 minutes on a CPU)", flush=True)
    config = EngineConfig(str(args.model), model_dir, dtype, max_batch=args.max_batch,
                          block_size=default_block_size())  # the embedded engine's, as peer-bench gives it
    server = ServeProcess(config, port,
                          priority=False, reserved_cpus=0, log=log, start_timeout=900.0)
    try:
        yield server
    finally:
        server.close()


def _with_http_section(profile: HardwareProfile, url: str, args: argparse.Namespace) -> HardwareProfile:
    """``profile`` where it has an http section, else the server's, profiled now (its memory kept)."""
    if profile.http is not None:
        return profile
    from timely_llm.engines.profile_http import HttpProbe, fit_server_profile, measure_server

    print(f"{profile.name} has no http section: profiling {url} first (about a minute)", flush=True)
    probe = HttpProbe(url, "", args.api_key_env)
    return fit_server_profile(measure_server(probe), f"{profile.name}-http", dict(profile.memory))


def _remote_engine(url: str, args: argparse.Namespace) -> Engine:
    """The remote engine on ``url``, capped at ``--max-batch``, with the served model's tokenizer read here where
    it is a shipped one (each step's text then decodes without a call to the server)."""
    from timely_llm.engines.remote import RemoteEngine
    from timely_llm.engines.remote_settings import RemoteSettings
    from timely_llm.models import MODEL_NAMES, resolve_model

    tokenizer = resolve_model(args.model)[0] if args.model in MODEL_NAMES else ""
    try:
        return RemoteEngine(RemoteSettings.parse({"url": [url], "api_key_env": args.api_key_env,
                                                  "max_num_seqs": args.max_batch, "tokenizer": tokenizer}))
    except (RuntimeError, ValueError) as exc:  # no server answers, or a key variable that is not set
        raise ConfigError("--url", None, str(exc)) from None
