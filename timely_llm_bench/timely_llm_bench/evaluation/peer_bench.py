"""Side by side on the real engine: ``vllm serve`` with streaming robots, then the node's server loop (on an
embedded engine, and/or on the remote engine driving that same ``vllm serve``).

Both serve the same model from the same venv with the same engine settings (dtype, KV cache,
batch cap, prefix caching), the same prompt ids, the same plan grammar (EBNF, structured outputs)
and the same arrivals. Against ``vllm serve`` each robot streams one completion over the OpenAI API
on loopback and cuts segments with the project's ``Segmenter`` as they arrive (TypeFly's way); the
node is the in-process ``Server`` on an embedded ``VllmEngine`` (what the ROS node runs, without
the ROS transport). Robots are simulated alike on both sides (``SimulatedRobots``' execution-time
draws, keyed by seed, request and segment), and each side's floor is every task run alone on that
same server, so the ratios compare scheduling, not machines.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
import zlib
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from timely_llm.clock import WallClock
from timely_llm.core.features import DEFAULT as DEFAULT_FEATURES
from timely_llm.core.kv_reuse import KvReuse
from timely_llm.core.policies import TIMELYLLM, VLLM_STREAM
from timely_llm.core.priority import request_priority
from timely_llm.core.request import Outcome
from timely_llm.engines.hardware import HardwareProfile
from timely_llm.engines.registry import REMOTE_ENGINE, VLLM_ENGINE
from timely_llm.engines.remote_prefixes import PrefixCacheCounts
from timely_llm.plan.grammar import PlanGrammar, plan_grammar
from timely_llm.plan.segmenter import Segmenter
from timely_llm.plan.skills import SkillModel
from timely_llm.server import PlanRequest
from timely_llm.serving import Driver, ServerConfig, build_server
from timely_llm.traces import TraceCatalog
from timely_llm_bench.evaluation.harness import SimulatedRobots
from timely_llm_bench.evaluation.machine_load import MachineLoad, combined, load_verdict, measured
from timely_llm_bench.workloads.generator import Workload, WorkloadRequest

CATEGORIES = ("urgent", "normal", "arm")
SERVE_CONFIGS = ("serve", "serve-priority")
"""``vllm serve`` as shipped (FCFS), and with ``--scheduling-policy priority`` (each request's ERT as priority)."""
FLOOR = "floor"
NODE_REMOTE = "node-remote"
"""The side of the node on the remote engine, driving the ``vllm serve`` the streaming robots used."""
NODE_ENGINES = (VLLM_ENGINE.name, REMOTE_ENGINE.name)


@dataclass(frozen=True)
class EngineConfig:
    """The engine settings both sides share."""

    model: str
    model_dir: str
    dtype: str | None
    max_model_len: int = 2048
    kv_cache_gib: float = 1.0
    max_batch: int = 64
    """The batch cap on both sides: vllm serve's --max-num-seqs, the node's engine and scheduler's max_batch."""
    max_tokens: int = 48
    seed: int = 0
    block_size: int | None = None
    """KV block size in tokens; None: each side's own default (``vllm serve``: vLLM's, 128 on a CPU; the embedded
    engine: ``vllm_engine.default_block_size``, 32 on a CPU). ``peer-bench`` gives both the embedded engine's."""


@dataclass
class RunRecord:
    id: str
    category: str
    trace: int
    succeeded: bool
    grammatical: bool
    response: float | None
    completion: float | None
    plan: str
    reason: str = ""
    """Why the node ended a plan that gave its robot no action (empty where it did, and on the streaming side)."""


@dataclass
class Run:
    side: str
    """``serve``, ``serve-priority``, ``node`` (embedded engine) or ``node-remote``."""
    config: str
    """``floor`` or the workload's policy on that side."""
    workload: str
    round: int
    records: list[RunRecord] = field(default_factory=list)
    log: dict | None = None
    """The node's step log (``StepLog``), where recorded."""
    load: dict | None = None
    """The machine's load during the run (``MachineLoad.to_json``), where measured."""

    def to_json(self) -> dict:
        return {"side": self.side, "config": self.config, "workload": self.workload, "round": self.round,
                "records": [vars(r) for r in self.records], "log": self.log, "load": self.load}


def robot_times(seed: int, request_id: str, robot: SkillModel, arrival: float, gen_ends: list[tuple[str, float]],
                network_latency: float) -> tuple[float, float]:
    """(response, completion) of a plan whose segments were cut at ``gen_ends`` (text, time), executed by a
    simulated robot exactly as ``SimulatedRobots`` does on the node's side."""
    lane = -math.inf
    first = None
    for index, (text, gen_end) in enumerate(gen_ends):
        rng = random.Random(zlib.crc32(f"{seed}/{request_id}/{index}".encode()))
        start = max(gen_end + network_latency, lane)
        lane = start + robot.sample_exec_time(text, rng)
        first = start if first is None else first
    if first is None:
        raise ValueError(f"request {request_id}: a plan of no segments has no robot times")
    return first - arrival, lane - arrival


# ----- vllm serve -----


THREADS_BIND = "VLLM_CPU_OMP_THREADS_BIND"


def core_slices(servers: int, cpus: list[int]) -> list[str | None]:
    """Each of ``servers`` CPU servers' cores (``VLLM_CPU_OMP_THREADS_BIND``) on a machine with ``cpus``: several
    get disjoint slices, since vLLM's own binding pins every server's threads to the same cores (there one server
    starved beside the other, and the node failed its plans after 60 s of silence). One server, fewer cores than
    servers, or a binding set by the user: vLLM's (None)."""
    if servers <= 1 or len(cpus) < servers or THREADS_BIND in os.environ:
        return [None] * servers
    size = len(cpus) // servers
    return [",".join(str(c) for c in sorted(cpus)[i * size:(i + 1) * size]) for i in range(servers)]


class ServeProcess:
    """``vllm serve`` started from this venv (or the ``python`` given) on loopback, stopped (its process group) on
    exit; with ``api_key`` its OpenAI endpoints want that bearer token (in its environment, not its command line)."""

    def __init__(self, engine: EngineConfig, port: int, priority: bool, reserved_cpus: int | None,
                 log: Path, start_timeout: float, api_key: str | None = None, python: str = sys.executable,
                 cores: str | None = None) -> None:
        """``cores``: the CPUs its OpenMP threads run on (``core_slices``); None: vLLM's own choice."""
        args = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", engine.model_dir,
                "--served-model-name", engine.model, "--host", "127.0.0.1", "--port", str(port),
                "--max-model-len", str(engine.max_model_len),
                "--kv-cache-memory-bytes", str(int(engine.kv_cache_gib * (1 << 30))),
                "--max-num-seqs", str(engine.max_batch), "--enable-prefix-caching", "--seed", str(engine.seed),
                "--disable-uvicorn-access-log"]
        if engine.dtype:
            args += ["--dtype", engine.dtype]
        if engine.block_size:
            args += ["--block-size", str(engine.block_size)]
        if priority:
            args += ["--scheduling-policy", "priority"]
        env = dict(os.environ, HF_HUB_OFFLINE="1")
        if reserved_cpus is not None:
            env["VLLM_CPU_NUM_OF_RESERVED_CPU"] = str(reserved_cpus)
        if cores is not None:
            env[THREADS_BIND] = cores
        if api_key is not None:
            env["VLLM_API_KEY"] = api_key
        self.url = f"http://127.0.0.1:{port}"
        self.log = log
        self._log_file = log.open("w")
        self._proc = subprocess.Popen(args, stdout=self._log_file, stderr=subprocess.STDOUT, env=env,
                                      start_new_session=True)
        try:
            self._wait_ready(start_timeout)
        except BaseException:  # interrupted too: a server in a session of its own would outlive us
            self.close()
            raise

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {self._proc.returncode} (log: {self.log})")
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as answer:
                    if answer.status == 200:
                        return
            time.sleep(2)
        raise RuntimeError(f"vllm serve not ready within {timeout:.0f} s (log: {self.log})")

    def kill(self) -> None:
        """Kill the server at once (its process group), as a crash would."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._proc.pid, signal.SIGKILL)
        self._proc.wait()

    def close(self) -> None:
        if self._proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._proc.pid, signal.SIGTERM)
            try:
                self._proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self._proc.pid, signal.SIGKILL)
                self._proc.wait()
        self._log_file.close()


@dataclass
class StreamingRobots:
    """Robots that each stream one completion from ``vllm serve`` and cut segments as text arrives."""

    url: str
    engine: EngineConfig
    skills: dict[str, SkillModel]
    catalog: TraceCatalog
    encode: Callable[[str], list[int]]
    priority: bool
    request_timeout: float = 300.0

    def replay(self, workload: Workload, requests: Iterable[WorkloadRequest] | None = None,
               alone: bool = False) -> list[RunRecord]:
        """The workload's arrivals in real time (``alone``: one request after another, each on an idle server)."""
        requests = list(workload.requests if requests is None else requests)
        return asyncio.run(self._replay(workload, requests, alone))

    async def _replay(self, workload: Workload, requests: list[WorkloadRequest], alone: bool) -> list[RunRecord]:
        import aiohttp

        timeout = aiohttp.ClientTimeout(total=self.request_timeout)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            if alone:
                return [await self._robot(session, workload, r, None) for r in requests]
            origin = time.monotonic()
            return list(await asyncio.gather(*(self._robot(session, workload, r, origin) for r in requests)))

    async def _robot(self, session, workload: Workload, request: WorkloadRequest,  # noqa: ANN001 - aiohttp session
                     origin: float | None) -> RunRecord:
        trace = self.catalog[request.trace]
        robot = self.skills[trace.robot]
        if origin is not None:
            await asyncio.sleep(max(origin + request.arrival - time.monotonic(), 0.0))
        arrival = time.monotonic()
        grammar = _grammar(robot)
        body = {"model": self.engine.model, "prompt": self.encode(self.catalog.prompt_text(trace.robot, trace.prompt)),
                "max_tokens": self.engine.max_tokens, "temperature": 0.0, "stream": True,
                "structured_outputs": {"grammar": grammar.continuation("")}}
        if self.priority:
            body["priority"] = request_priority(request.tuf.ert)
        segmenter = Segmenter(robot)
        cuts: list[tuple[str, float]] = []
        finished = False
        try:
            async with session.post(f"{self.url}/v1/completions", json=body) as answer:
                answer.raise_for_status()
                async for line in answer.content:
                    text, finished = _chunk(line, finished)
                    now = time.monotonic()
                    cuts += [(piece, now) for piece in segmenter.feed(text)]
        except Exception as exc:  # noqa: BLE001 - a failed request counts as failed, the run goes on
            print(f"peer-bench: {request.id}: {exc!r}", file=sys.stderr)
            finished = False
        if finished:
            rest = grammar.close("".join(t for t, _ in cuts), segmenter.flush())
            if rest.strip() or not cuts:
                cuts.append((rest, time.monotonic()))
        plan = "".join(t for t, _ in cuts)
        ok = finished and bool(plan.strip())
        response = completion = None
        if ok:
            response, completion = robot_times(self.engine.seed, request.id, robot, arrival, cuts,
                                                workload.network_latency)
        return RunRecord(request.id, trace.category, trace.id, ok, ok and grammar.accepts(plan), response,
                         completion, plan)


def _chunk(line: bytes, finished: bool) -> tuple[str, bool]:
    """The text of one server-sent event line, and whether the completion has ended."""
    line = line.strip()
    if not line.startswith(b"data:"):
        return "", finished
    data = line[5:].strip()
    if data == b"[DONE]":
        return "", finished
    choice = json.loads(data)["choices"][0]
    return choice.get("text") or "", finished or choice.get("finish_reason") is not None


# ----- the node's server loop -----


class StepLog:
    """The engine behind the server, recording every step (when, generations that got a token, generations
    (re)started, seconds, of those (re)started the first starts) and the time each (re)start took in the loop
    (building the continuation grammar and submitting the request). A first start prefills its task's prompt; a
    resume in place prefills nothing: the two kinds of steps cost the engine differently (``fidelity.step_table``)."""

    def __init__(self, engine, clock) -> None:  # noqa: ANN001 - an Engine and the server's clock
        self._engine = engine
        self._clock = clock
        self.steps: list[tuple[float, int, int, float, int]] = []
        self.starts: list[tuple[str, int, float]] = []
        """(generation, tokens generated before this start, seconds start() took)."""
        self._first_starts: set[str] = set()
        """Generations started with no token generated, until the step that runs them."""

    def __getattr__(self, name: str):  # noqa: ANN204 - everything else as the engine has it
        return getattr(self._engine, name)

    def start(self, spec) -> None:  # noqa: ANN001
        began = time.perf_counter()
        self._engine.start(spec)
        self.starts.append((spec.gen_id, len(spec.output_ids), time.perf_counter() - began))
        if not spec.output_ids:
            self._first_starts.add(spec.gen_id)

    def step(self):  # noqa: ANN201
        at = self._clock.now()
        out = self._engine.step()
        firsts = self._first_starts.intersection(out.started)
        self._first_starts -= firsts
        self.steps.append((round(at, 4), len(out.new_tokens), len(out.started), round(out.duration, 4), len(firsts)))
        return out


def node_replay(engine, workload: Workload, requests: list[WorkloadRequest], policy: str,  # noqa: ANN001
                skills: dict[str, SkillModel], catalog: TraceCatalog, config: EngineConfig,
                step_profile: HardwareProfile | None = None, log: dict | None = None) -> list[RunRecord]:
    """``requests`` through a fresh server on ``engine`` in real time, robots simulated; ``log``, when
    given, receives the step log, the starts and every request's segment times (for ``peer-bench`` JSON)."""
    clock = WallClock()
    outcomes: list[Outcome] = []
    engine = StepLog(engine, clock) if log is not None else engine
    driver = Driver(clock)
    robots = SimulatedRobots(skills, workload.network_latency, config.seed, driver.at)
    server_config = ServerConfig(policy, workload.network_latency, DEFAULT_FEATURES, config.max_batch,
                                 config.max_tokens, step_profile=step_profile)
    server = build_server(server_config, engine, skills, clock, on_segment=robots.on_segment,
                          on_finish=lambda r: outcomes.append(Outcome.of(r)))
    origin = clock.now()
    for r in requests:
        trace = catalog[r.trace]
        ids = engine.tokenizer.encode(catalog.prompt_text(trace.robot, trace.prompt))
        driver.arrive(PlanRequest(r.id, r.agent, trace.robot, ids, r.tuf, trace.category,
                                  max_new_tokens=config.max_tokens, trace=trace.id, arrival=origin + r.arrival))
    driver.run(server)
    if log is not None:
        log.update(origin=origin, steps=engine.steps, starts=engine.starts, counters=dict(server.counters),
                   segments={o.id: [(s.gen_start, s.gen_end, s.tokens, s.cached_tokens) for s in o.segments]
                             for o in outcomes},
                   arrivals={o.id: o.arrival for o in outcomes})
    return [_node_record(o, skills) for o in sorted(outcomes, key=lambda o: o.id)]


def _node_record(outcome: Outcome, skills: dict[str, SkillModel]) -> RunRecord:
    """As a streaming robot's record: a plan that gave its robot no action (the node aborts one without a
    statement, saying why) did not succeed and has no response."""
    ok = outcome.response_time is not None and bool(outcome.plan.strip())
    if outcome.trace is None:
        raise ValueError(f"request {outcome.id} replayed no trace")  # node_replay sends each with its trace
    grammatical = ok and _grammar(skills[outcome.robot]).accepts(outcome.plan)
    return RunRecord(outcome.id, outcome.category, outcome.trace, ok, grammatical,
                     outcome.response_time if ok else None, outcome.completion_time if ok else None, outcome.plan,
                     "" if ok else outcome.reason or outcome.status.value)


def _grammar(robot: SkillModel) -> PlanGrammar:
    """The robot's plan grammar, which both sides constrain and check its plans with."""
    grammar = plan_grammar(robot)
    if grammar is None:
        raise ValueError(f"robot {robot.robot}: its plan language has no grammar to compare servers in")
    return grammar


def _quicker(record: RunRecord, than: RunRecord) -> bool:
    return record.response is not None and than.response is not None and record.response < than.response


def quickest(passes: list[list[RunRecord]]) -> list[RunRecord]:
    """Each task's fastest run alone over several passes (before and after the workloads): on a shared
    machine the quietest moment is the closest to the server's own floor."""
    best: dict[int, RunRecord] = {}
    for record in (r for records in passes for r in records):
        known = best.get(record.trace)
        if record.succeeded and (known is None or not known.succeeded or _quicker(record, known)):
            best[record.trace] = record
        elif known is None:
            best[record.trace] = record
    return sorted(best.values(), key=lambda r: r.trace)


def floor_requests(workload: Workload) -> list[WorkloadRequest]:
    """One request per task of ``workload`` (the floor is per task: the same task gives the same plan)."""
    seen: dict[int, WorkloadRequest] = {}
    for r in workload.requests:
        seen.setdefault(r.trace, r)
    return list(seen.values())


# ----- the table -----


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]


def _stats(run: Run, floor: dict[int, RunRecord], category: str, metric: str) -> tuple[float, float] | None:
    """(mean, p95) of ``metric`` over the category's succeeded requests, each as a ratio to the floor's
    (mean and p95 of the floor over the same requests' tasks)."""
    done = [r for r in run.records if r.category == category and r.succeeded and floor.get(r.trace)
            and floor[r.trace].succeeded]
    if not done:
        return None
    values = [getattr(r, metric) for r in done]
    alone = [getattr(floor[r.trace], metric) for r in done]
    return statistics.fmean(values) / statistics.fmean(alone), _p95(values) / _p95(alone)


def _absolute(run: Run, category: str, metric: str) -> float | None:
    values = [getattr(r, metric) for r in run.records if r.category == category and r.succeeded]
    return statistics.fmean(values) if values else None


def table(runs: list[Run]) -> str:
    """One row per (workload, side, config): per category mean and p95 of response and completion as
    ratios to that side's floor (median over rounds, [min-max] with several), absolute means in seconds,
    and plans succeeded / grammatical."""
    floors = {(r.side, r.round): {rec.trace: rec for rec in r.records} for r in runs if r.config == FLOOR}
    head = ["workload", "server", "policy"]
    for c in CATEGORIES:
        head += [f"{c} resp mean", f"{c} resp p95", f"{c} compl mean", f"{c} compl p95"]
    head += ["urgent / normal / arm resp (s)", "ok", "grammatical"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * 3 + "---:|" * (len(head) - 3)]
    keys = sorted({(r.workload, r.side, r.config) for r in runs if r.config != FLOOR}, key=_row_order)
    for workload, side, config in keys:
        group = [r for r in runs if (r.workload, r.side, r.config) == (workload, side, config)]
        cells = [workload, {"node": "node", NODE_REMOTE: "node on vllm serve"}.get(side, "vllm serve"), config]
        for c in CATEGORIES:
            for metric in ("response", "completion"):
                got = [g for g in (_stats(r, floors.get((r.side, r.round), {}), c, metric) for r in group)
                       if g is not None]
                cells += [_spread([g[0] for g in got]), _spread([g[1] for g in got])]
        absolute = []
        for c in CATEGORIES:
            values = [v for v in (_absolute(r, c, "response") for r in group) if v is not None]
            absolute.append(f"{statistics.median(values):.2f}" if values else "-")
        cells.append(" / ".join(absolute))
        total = sum(len(r.records) for r in group)
        cells.append(f"{sum(rec.succeeded for r in group for rec in r.records)}/{total}")
        cells.append(f"{sum(rec.grammatical for r in group for rec in r.records)}/{total}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def first_segments(runs: list[Run], category: str = "urgent") -> str:
    """Where ``category``'s first segments spent their time on the node (from the step logs), means per
    request: queued until (re)started, in engine steps that also prefilled, in decode steps (how many, ms
    each, generations in each), in steps that ran nothing (vLLM compiling a grammar) and outside the engine
    (the loop's own work, GIL), up to the first segment's dispatch; over the requests the table counts (plans
    that gave their robot an action). Runs without a step log are left out."""
    head = ["workload", "policy", "round", "n", "response (s)", "queued", "prefill steps", "decode steps",
            "decode steps (n)", "ms / decode step", "decode batch", "empty steps", "outside the engine"]
    lines = ["| " + " | ".join(head) + " |", "|---|---|" + "---:|" * (len(head) - 2)]
    for run in sorted((r for r in runs if r.log and r.side in ("node", NODE_REMOTE)), key=_run_order):
        assert run.log is not None  # the runs with a step log only
        rows = [first_segment_times(run.log, rec.id) for rec in run.records
                if rec.category == category and rec.succeeded and rec.id in run.log["segments"]]
        if rows:
            means = [statistics.fmean(column) for column in zip(*rows, strict=True)]
            cells = [f"{v:.3f}" for v in means[:4]] + [f"{means[4]:.1f}", f"{means[5]:.1f}", f"{means[6]:.1f}"]
            cells += [f"{v:.3f}" for v in means[7:]]
            lines.append("| " + " | ".join([run.workload, run.config, str(run.round), str(len(rows)), *cells]) + " |")
    return "\n".join(lines)


def first_segment_times(log: dict, request_id: str) -> tuple[float, ...]:
    """One request's row of ``first_segments``, from a step log holding ``steps``, ``segments`` and ``arrivals``."""
    arrival = log["arrivals"][request_id]
    started, dispatched = log["segments"][request_id][0][:2]
    steps = [s for s in log["steps"] if arrival <= s[0] < dispatched]
    prefill = sum(s[3] for s in steps if s[2])
    decodes = [s for s in steps if s[1] and not s[2]]
    decode = sum(s[3] for s in decodes)
    empty = sum(s[3] for s in steps if not s[1] and not s[2])
    per_step = 1e3 * decode / len(decodes) if decodes else 0.0
    batch = statistics.fmean(s[1] for s in decodes) if decodes else 0.0
    return (dispatched - arrival, started - arrival, prefill, decode, len(decodes), per_step, batch, empty,
            dispatched - arrival - sum(s[3] for s in steps))


def prefix_cache_delta(before: dict[str, PrefixCacheCounts], after: dict[str, PrefixCacheCounts]) -> dict[str, list]:
    """Per server, what its prefix cache counted over a run (``PrefixCacheCounts`` fields), from its counts before
    and after."""
    return {url: list((counts - before[url]).fields()) for url, counts in after.items() if url in before}


def run_kv_reuse(log: dict) -> KvReuse:
    """What a node run's resumes reused: the engine's reports (embedded, simulator), else its servers' metrics."""
    servers = log.get("prefix_cache")
    if not servers:
        return KvReuse.of(log.get("counters", {}))
    total = sum((PrefixCacheCounts(*fields) for fields in servers.values()), PrefixCacheCounts())
    return KvReuse(total.resumes, total.resumed_tokens, total.resumed_hits_at_least, at_least=True)


def kv_reuse(runs: list[Run]) -> str:
    """One line per node run: the share of resumed context served from kept or cached KV, and the tokens
    recomputed; on the remote engine with each server's prefix-cache hit rate over the run."""
    lines = []
    for run in sorted((r for r in runs if r.log), key=_run_order):
        assert run.log is not None  # the runs with a step log only
        servers = run.log.get("prefix_cache") or {}
        rates = [f"{url} {100 * c.hits / c.queries:.1f}% of {c.queries} tokens looked up"
                 for url, c in ((u, PrefixCacheCounts(*f)) for u, f in servers.items()) if c.queries]
        where = f"; server prefix cache hits: {', '.join(rates)}" if rates else ""
        lines.append(f"{run.workload} {run.side} {run.config} round {run.round}: "
                     f"{run_kv_reuse(run.log).describe()}{where}")
    return "\n".join(lines)


def failures(runs: list[Run]) -> str:
    """One line per node run with plans that gave their robot no action: how many ended so, and why."""
    lines = []
    for run in sorted(runs, key=_run_order):
        reasons = Counter(r.reason for r in run.records if r.reason)
        if reasons:
            why = "; ".join(f"{n} x {reason}" for reason, n in reasons.most_common())
            lines.append(f"{run.workload} {run.side} {run.config} round {run.round}: {why}")
    return "\n".join(lines) or "none"


def _run_order(run: Run) -> tuple[str, str, str, int]:
    """The order the per-run lines are printed in."""
    return run.workload, run.side, run.config, run.round


def _row_order(key: tuple[str, str, str]) -> tuple:
    workload, side, config = key
    return workload, side not in ("node", NODE_REMOTE), side, config


def _spread(values: list[float]) -> str:
    if not values:
        return "-"
    text = f"{statistics.median(values):.2f}x"
    return text + (f" [{min(values):.2f}-{max(values):.2f}]" if len(values) > 1 else "")


# ----- a whole benchmark -----


@dataclass
class PeerBench:
    """Rounds of: each ``vllm serve`` configuration (fresh server), then the node (fresh engine) under each
    policy; on each server its floor first, then every workload. With ``remote`` in ``node_engines`` the node
    also runs on the remote engine against the first ``vllm serve`` configuration's server, after the streaming
    robots (its floor: theirs, each task streamed alone from that server)."""

    engine: EngineConfig
    workloads: list[Workload]
    skills: dict[str, SkillModel]
    catalog: TraceCatalog
    serve_configs: tuple[str, ...] = ("serve",)
    policies: tuple[str, ...] = (TIMELYLLM.name, VLLM_STREAM.name)
    rounds: int = 2
    port: int = 8765
    reserved_cpus: int | None = None
    log_dir: Path = Path(".")
    start_timeout: float = 900.0
    node_engines: tuple[str, ...] = (VLLM_ENGINE.name,)
    servers: int = 1
    """Servers the remote engine drives: the streaming robots' one, and more started alike for the node alone."""
    runs: list[Run] = field(default_factory=list)
    prompt_ids_match: bool | None = None
    """Whether the node's tokenizer gave every prompt the ids the robots sent ``vllm serve``."""

    def __post_init__(self) -> None:
        # A streamed completion cannot wait for a value: both sides serve blocking skills (the arm's scan) as any
        # other, so that they compare by scheduling alone.
        self.skills = {name: model.served_open_loop() for name, model in self.skills.items()}
        self._cores = core_slices(self.servers, sorted(os.sched_getaffinity(0)))

    def run(self, progress=print) -> list[Run]:  # noqa: ANN001 - a print-like callable
        for round_ in range(1, self.rounds + 1):
            for config in self.serve_configs:
                self._serve_round(config, round_, progress)
            if VLLM_ENGINE.name in self.node_engines:
                self._node_round(round_, progress)
        return self.runs

    def _floor(self) -> list[WorkloadRequest]:
        seen: dict[int, WorkloadRequest] = {}
        for workload in self.workloads:
            for r in floor_requests(workload):
                seen.setdefault(r.trace, r)
        return sorted(seen.values(), key=lambda r: r.trace)

    def _record(self, run: Run, progress) -> None:  # noqa: ANN001
        self.runs.append(run)
        ok = sum(r.succeeded for r in run.records)
        progress(f"  {run.side} {run.config} {run.workload} round {run.round}: {ok}/{len(run.records)} plans")

    def _serve_round(self, config: str, round_: int, progress) -> None:  # noqa: ANN001
        from transformers import AutoTokenizer

        progress(f"round {round_}: starting vllm serve ({config})")
        tokenizer = AutoTokenizer.from_pretrained(self.engine.model_dir)
        server = ServeProcess(self.engine, self.port, config == "serve-priority", self.reserved_cpus,
                              self.log_dir / f"vllm-serve-{config}-{round_}.log", self.start_timeout,
                              cores=self._cores[0])
        try:
            robots = StreamingRobots(server.url, self.engine, self.skills, self.catalog,
                                     lambda text: list(tokenizer.encode(text)), config == "serve-priority")
            self._serve_ids = {t: robots.encode(self.catalog.prompt_text(self.catalog[t].robot,
                                                                        self.catalog[t].prompt))
                               for t in self.catalog.traces}
            warm = Workload("warm", 0.0, tuple(self._floor()))
            passes = [robots.replay(warm, alone=True) for _ in range(2)]  # the first compiles, fills the cache
            runs = []
            for workload in self.workloads:
                with measured() as meter:
                    records = robots.replay(workload)
                runs.append(Run(config, config, workload.name, round_, records, load=_load(meter.load)))
            passes.append(robots.replay(warm, alone=True))
            floor = quickest(passes)
            self._record(Run(config, FLOOR, "tasks", round_, floor), progress)
            for run in runs:
                self._record(run, progress)
            if REMOTE_ENGINE.name in self.node_engines and config == self.serve_configs[0]:
                self._remote_round(server, floor, round_, progress)
        finally:
            server.close()

    def _remote_round(self, server: ServeProcess, floor: list[RunRecord], round_: int, progress) -> None:  # noqa: ANN001
        """The node on the remote engine against ``server``, under each policy, on every workload."""
        from timely_llm.engines.hardware import estimator_profile
        from timely_llm.engines.remote import RemoteEngine
        from timely_llm.engines.remote_settings import RemoteSettings

        more = [ServeProcess(self.engine, self.port + i, False, self.reserved_cpus,
                             self.log_dir / f"vllm-serve-more-{i}-{round_}.log", self.start_timeout,
                             cores=self._cores[i])
                for i in range(1, self.servers)]
        urls = (server.url, *(s.url for s in more))
        progress(f"round {round_}: the node on the remote engine at {', '.join(urls)}")
        engine = RemoteEngine(RemoteSettings(urls, tokenizer=self.engine.model_dir,
                                             max_num_seqs=self.engine.max_batch))
        try:
            for extra in more:
                self._warm(extra)
            step_profile = estimator_profile(None, False, self.engine.model, "")
            runs = []
            for workload in self.workloads:
                for policy in self.policies:
                    log: dict = {}
                    before = engine.prefix_cache_counts()
                    records = node_replay(engine, workload, list(workload.requests), policy, self.skills,
                                          self.catalog, self.engine, step_profile, log)
                    log["prefix_cache"] = prefix_cache_delta(before, engine.prefix_cache_counts())
                    runs.append(Run(NODE_REMOTE, policy, workload.name, round_, records, log))
            self._record(Run(NODE_REMOTE, FLOOR, "tasks", round_, floor), progress)
            for run in runs:
                self._record(run, progress)
        finally:
            engine.close()
            for extra in more:
                extra.close()

    def _warm(self, server: ServeProcess) -> None:
        """A server started for the node alone gets the warm-up pass the streaming robots' server had (every task
        streamed alone: its robots' prompts cached), so that the runs compare warm servers and a robot type's
        first prompt there does not count as a resume's miss in the KV reuse bound."""
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(self.engine.model_dir)
        robots = StreamingRobots(server.url, self.engine, self.skills, self.catalog,
                                 lambda text: list(tokenizer.encode(text)), priority=False)
        robots.replay(Workload("warm", 0.0, tuple(self._floor())), alone=True)

    def _node_round(self, round_: int, progress) -> None:  # noqa: ANN001
        from timely_llm.engines.hardware import estimator_profile
        from timely_llm.engines.vllm_engine import VllmEngine

        progress(f"round {round_}: starting the node's engine")
        engine = VllmEngine(self.engine.model, max_model_len=self.engine.max_model_len,
                            kv_cache_gib=self.engine.kv_cache_gib, seed=self.engine.seed,
                            max_batch=self.engine.max_batch,
                            **({"block_size": self.engine.block_size} if self.engine.block_size else {}))
        try:
            ids = {t: engine.tokenizer.encode(self.catalog.prompt_text(self.catalog[t].robot, self.catalog[t].prompt))
                   for t in self.catalog.traces}
            serve_ids = getattr(self, "_serve_ids", None)
            if serve_ids is not None:
                self.prompt_ids_match = ids == serve_ids
            step_profile = estimator_profile(None, False, self.engine.model, "")
            floor = self._floor()
            warm = Workload("warm", 0.008, tuple(floor))

            def alone() -> list[RunRecord]:
                return [rec for r in floor for rec in node_replay(engine, warm, [_at_zero(r)], VLLM_STREAM.name,
                                                                  self.skills, self.catalog, self.engine)]

            passes = [alone(), alone()]  # the first compiles, fills the cache
            runs = []
            for workload in self.workloads:
                for policy in self.policies:
                    log: dict = {}
                    with measured() as meter:
                        records = node_replay(engine, workload, list(workload.requests), policy, self.skills,
                                              self.catalog, self.engine, step_profile, log)
                    runs.append(Run("node", policy, workload.name, round_, records, log, _load(meter.load)))
            passes.append(alone())
            self._record(Run("node", FLOOR, "tasks", round_, quickest(passes)), progress)
            for run in runs:
                self._record(run, progress)
        finally:
            engine.close()

    def to_json(self) -> dict:
        return {"engine": vars(self.engine), "rounds": self.rounds, "serve_configs": list(self.serve_configs),
                "policies": list(self.policies), "node_engines": list(self.node_engines), "servers": self.servers,
                "reserved_cpus": self.reserved_cpus,
                "prompt_ids_match": self.prompt_ids_match,
                "workloads": [w.to_json() for w in self.workloads], "runs": [r.to_json() for r in self.runs]}


def _load(load: MachineLoad | None) -> dict | None:
    return load.to_json() if load else None


def machine_loads(runs: list[Run]) -> str:
    """Per workload, the machine's load during each server's and policy's runs (rounds combined), and whether
    it allows comparing them (``load_verdict``)."""
    lines = []
    for workload in sorted({r.workload for r in runs if r.load}):
        loads: dict[str, list[MachineLoad]] = {}
        for run in runs:
            if run.workload == workload and run.load:
                label = f"{'node ' if run.side == 'node' else 'vllm '}{run.config}"
                loads.setdefault(label, []).append(MachineLoad.from_json(run.load))
        merged = {label: combined(found) for label, found in loads.items()}
        lines += [f"{workload}, {label}: {load.describe()}" for label, load in merged.items()]
        lines.append(f"{workload}: " + (load_verdict(merged) or "comparable loads"))
    return "\n".join(lines)


def _at_zero(request: WorkloadRequest) -> WorkloadRequest:
    from dataclasses import replace

    return replace(request, arrival=0.0)
