"""Does the simulator predict the real engine? One workload replayed on both, side by side.

The same requests (recorded LRTrace plans, forced token by token) go through the same server loop and
simulated robots: on the simulator (a hardware profile, suspension in place as embedded vLLM does,
virtual clock) and on the embedded vLLM engine (wall clock), under each policy. Per policy and category:
mean and p95 response and waiting, mean utility, and where the first segments' time went (queued, prefill
steps, decode steps, empty steps, outside the engine: ``peer_bench.first_segment_times``); per run, the
step times by kind and batch, the (re)starts and what they cost the loop, and the suspensions. The
simulator runs twice: as its profile says (the CPU profile tokenizes as the model does) and with the
stand-in ``SimTokenizer``, to show what token counts change.

On the remote engine (``vllm serve``), which cannot force recorded plans, each plan is generated under its grammar
(greedy); the simulator of the remote path (a profile with an http section) then replays the plans that run
generated (``replayed_remote``), and ``error_lines`` sets each mean response beside the real one.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import cast

from timely_llm.clock import VirtualClock, WallClock
from timely_llm.core.policies import VLLM_STREAM
from timely_llm.engines.base import Engine, GenerationSpec, StepOutput, Tokenizer
from timely_llm.engines.hardware import HardwareProfile
from timely_llm.engines.registry import SIM_ENGINE
from timely_llm.engines.remote import RemoteEngine
from timely_llm.engines.sim import SimEngine
from timely_llm.engines.sim_remote import simulator
from timely_llm.plan.skills import SkillModel
from timely_llm.traces import TraceCatalog
from timely_llm_bench.evaluation.harness import EngineSetup, run_bench
from timely_llm_bench.evaluation.machine_load import MachineLoad, combined, load_verdict, measured
from timely_llm_bench.evaluation.peer_bench import (
    StepLog,
    first_segment_times,
    floor_requests,
    prefix_cache_delta,
    run_kv_reuse,
)
from timely_llm_bench.workloads.generator import Workload

SIM = SIM_ENGINE.name
SIM_STAND_IN = "sim, stand-in tokenizer"
REAL = "vLLM"
REMOTE = "vllm serve"
SIM_REMOTE = "sim, remote path"
REAL_ENGINES = (REAL, REMOTE)
CATEGORIES = ("urgent", "normal", "arm")
DECODE_BATCHES = ((1, 2), (3, 4), (5, 8), (9, 16), (17, 64))


class RecordingEngine(StepLog):
    """``StepLog`` that also counts suspensions, and the resumes that prefilled again (their KV no longer in
    place: the engine had given it up) with the tokens they recomputed."""

    def __init__(self, engine: Engine, clock: VirtualClock | WallClock) -> None:
        super().__init__(engine, clock)
        self.suspends = 0
        self.reprefilled = 0
        self.reprefilled_tokens = 0
        self.sampled: dict[str, list[int]] = {}
        """Each generation's sampled token ids, in order: what a remote run generated, for the simulator to replay."""
        self._resuming: set[str] = set()

    def suspend(self, gen_id: str) -> None:
        self.suspends += 1
        self._engine.suspend(gen_id)

    def start(self, spec: GenerationSpec) -> None:
        super().start(spec)
        if spec.output_ids:
            self._resuming.add(spec.gen_id)

    def step(self) -> StepOutput:
        out = super().step()
        for gen_id, ids in out.new_tokens.items():
            self.sampled.setdefault(gen_id, []).extend(ids)
        for gen_id, info in out.started.items():
            if gen_id in self._resuming and info.cached_tokens < info.context_tokens:
                self.reprefilled += 1
                self.reprefilled_tokens += info.context_tokens - info.cached_tokens
            self._resuming.discard(gen_id)
        return out


@dataclass
class FidelityRun:
    engine: str
    """``SIM``, ``SIM_STAND_IN``, ``SIM_REMOTE``, ``REAL`` or ``REMOTE``."""
    policy: str
    round: int
    result: dict
    """The bench result (records, summary, counters)."""
    log: dict
    """Steps, (re)starts, suspensions, each request's segment times and arrival (``first_segment_times``)."""
    load: MachineLoad | None = None

    def to_json(self) -> dict:
        return {"engine": self.engine, "policy": self.policy, "round": self.round, "result": self.result,
                "log": self.log, "load": self.load.to_json() if self.load else None}


def replay(engine_name: str, engine: Engine, clock: VirtualClock | WallClock, profile: HardwareProfile | None,
           workload: Workload, policy: str, skills: dict[str, SkillModel], catalog: TraceCatalog, seed: int,
           max_batch: int | None, round_: int = 1,
           forced_plans: Mapping[str, list[int] | None] | None = None) -> FidelityRun:
    """``workload`` under ``policy`` on ``engine`` through the bench harness, every step recorded;
    ``forced_plans``: run_bench's."""
    recording = RecordingEngine(engine, clock)
    # a proxy of the engine (StepLog: what it does not record, it hands to the engine), so an Engine to the server
    setup = EngineSetup(engine_name, lambda: cast(Engine, recording), lambda: clock, profile)
    servers = engine.prefix_cache_counts() if isinstance(engine, RemoteEngine) else None
    with measured() as meter:
        result = run_bench(workload, policy, setup, skills, catalog, seed, max_batch, forced_plans=forced_plans)
    log = {"steps": recording.steps, "starts": recording.starts, "suspends": recording.suspends,
           "reprefilled": recording.reprefilled, "reprefilled_tokens": recording.reprefilled_tokens,
           "arrivals": {r["id"]: r["arrival"] for r in result["requests"]},
           "segments": {r["id"]: [(s["gen_start"], s["gen_end"], s["tokens"], s["cached_tokens"])
                                  for s in r["segments"]] for r in result["requests"] if r["segments"]},
           "sampled": {r["id"]: recording.sampled.get(r["id"], []) for r in result["requests"]}}
    if isinstance(engine, RemoteEngine) and servers is not None:
        log["prefix_cache"] = prefix_cache_delta(servers, engine.prefix_cache_counts())
    return FidelityRun(engine_name, policy, round_, result, log, meter.load if engine_name in REAL_ENGINES else None)


def simulated(profile: HardwareProfile, tokenizer: Tokenizer | None, workload: Workload, policies: list[str],
              skills: dict[str, SkillModel], catalog: TraceCatalog, seed: int,
              max_batch: int | None) -> list[FidelityRun]:
    """Each policy on a fresh simulator that suspends in place; ``tokenizer`` None: the profile's own."""
    name = SIM if tokenizer is None else SIM_STAND_IN
    return [replay(name, SimEngine(profile, tokenizer, suspends_in_place=True), VirtualClock(), profile, workload,
                   policy, skills, catalog, seed, max_batch) for policy in policies]


def on_the_engine(engine: Engine, step_profile: HardwareProfile | None, workload: Workload, policies: list[str],
                  rounds: int, skills: dict[str, SkillModel], catalog: TraceCatalog, seed: int,
                  max_batch: int | None, progress: Callable[[str], None] = print,
                  remote: bool = False) -> list[FidelityRun]:
    """A warm-up (each task once, all at once: grammars compiled, the prompts cached), then ``rounds`` of every
    policy on ``engine`` in real time, every other round in reverse order. ``remote``: the engine is the remote
    one, which generates each plan under its grammar (greedy) instead of forcing the recorded one."""
    warm = Workload("warm", workload.network_latency, tuple(replace(r, arrival=0.0) for r in floor_requests(workload)))
    name = REMOTE if remote else REAL
    generated = {r.id: None for r in (*workload.requests, *warm.requests)} if remote else None
    run_bench(warm, VLLM_STREAM.name, EngineSetup.real(name, engine), skills, catalog, seed, max_batch,
              forced_plans=generated)
    runs = []
    for round_ in range(1, rounds + 1):
        for policy in policies if round_ % 2 else policies[::-1]:
            run = replay(name, engine, WallClock(), step_profile, workload, policy, skills, catalog, seed, max_batch,
                         round_, generated)
            progress(f"  {name} {policy} round {round_}: {run.result['summary']['all']['succeeded']}/"
                     f"{len(run.result['requests'])} succeeded; {run.load.describe() if run.load else ''}")
            runs.append(run)
    return runs


def replayed_remote(profile: HardwareProfile, remote_runs: list[FidelityRun], workload: Workload,
                    skills: dict[str, SkillModel], catalog: TraceCatalog, seed: int,
                    max_batch: int | None) -> list[FidelityRun]:
    """Each remote run again on the simulator of the remote path (``profile`` has an http section), every request
    forced to the plan the server generated for it in that run (its sampled ids, less a final end-of-sequence,
    which the simulator's end of plan stands for)."""
    runs = []
    for real in remote_runs:
        engine = simulator(profile)
        eos = engine.tokenizer.eos_token_id
        plans = {gen: ids[:-1] if ids and ids[-1] == eos else ids for gen, ids in real.log["sampled"].items()}
        runs.append(replay(SIM_REMOTE, engine, VirtualClock(), profile, workload, real.policy, skills, catalog, seed,
                           max_batch, real.round, plans))
    return runs


def error_lines(runs: list[FidelityRun], real: str, simulated: str) -> list[str]:
    """Per policy and category, the mean response of the ``real`` runs against the ``simulated`` ones (rounds
    pooled) and the simulator's error."""
    lines = []
    for policy in dict.fromkeys(r.policy for r in runs):
        for category in CATEGORIES:
            means = [_mean_response([r for r in runs if r.engine == engine and r.policy == policy], category)
                     for engine in (real, simulated)]
            if None not in means:
                measured, predicted = cast(list[float], means)
                lines.append(f"{policy} {category}: {real} {measured:.3f} s, {simulated} {predicted:.3f} s, "
                             f"error {100 * (predicted - measured) / measured:+.1f}%")
    return lines


def kv_lines(runs: list[FidelityRun]) -> list[str]:
    """Per run, the share of resumed context served from kept or cached KV and the tokens recomputed (the
    engine's reports, or the remote engine's servers' metrics)."""
    return [f"{run.engine} {run.policy} round {run.round}: "
            f"{run_kv_reuse(run.log | {'counters': run.result['counters']}).describe()}" for run in runs]


def _mean_response(runs: list[FidelityRun], category: str) -> float | None:
    times = [r["response_time"] for run in runs for r in run.result["requests"]
             if r["category"] == category and r["status"] == "succeeded"]
    return statistics.fmean(times) if times else None


# ----- tables -----


def _p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, -(-95 * len(ordered) // 100) - 1)]


def _cell(values: list[float], p95: bool = False) -> str:
    if not values:
        return "-"
    return f"{statistics.fmean(values):.3f}" + (f" / {_p95(values):.3f}" if p95 else "")


def outcome_table(runs: list[FidelityRun]) -> str:
    """Per policy and category, each engine's run: n, response and waiting mean / p95, utility, and the first
    segment's time split (means over the succeeded requests)."""
    head = ["policy", "category", "engine", "round", "n", "response mean / p95", "waiting mean / p95", "utility",
            "queued", "prefill steps", "decode steps", "decode steps (n)", "ms / decode step", "decode batch",
            "empty steps", "outside the engine"]
    lines = ["| " + " | ".join(head) + " |", "|---|---|---|" + "---:|" * (len(head) - 3)]
    policies = list(dict.fromkeys(r.policy for r in runs))
    for policy in policies:
        for category in CATEGORIES:
            for run in (r for r in runs if r.policy == policy):
                done = [r for r in run.result["requests"] if r["category"] == category and r["status"] == "succeeded"]
                if not done:
                    continue
                split = [first_segment_times(run.log, r["id"]) for r in done if r["id"] in run.log["segments"]]
                means = [statistics.fmean(column) for column in zip(*split, strict=True)] if split else [0.0] * 9
                cells = [policy, category, run.engine, str(run.round), str(len(done)),
                         _cell([r["response_time"] for r in done], p95=True),
                         _cell([r["waiting_time"] for r in done], p95=True), _cell([r["utility"] for r in done]),
                         *(f"{v:.3f}" for v in means[1:4]), f"{means[4]:.1f}", f"{means[5]:.1f}", f"{means[6]:.1f}",
                         *(f"{v:.3f}" for v in means[7:])]
                lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def step_table(runs: list[FidelityRun]) -> str:
    """Per run: steps that (re)started generations, those with a first start (which prefills a task's prompt) apart
    from those that only resumed (count, mean ms), decode-only steps by batch (mean ms), (re)starts (first, resumes,
    resumes that prefilled again and their tokens, seconds they took in the loop), suspensions, and the machine's
    load on the real engine."""
    head = ["policy", "engine", "round", "steps with first starts (n, ms)", "steps with resumes only (n, ms)",
            *(f"decode ms at batch {lo}-{hi}" for lo, hi in DECODE_BATCHES),
            "first starts", "resumes", "resumes prefilled again (tokens)", "loop s in (re)starts", "suspends",
            "other processes (cores)"]
    lines = ["| " + " | ".join(head) + " |", "|---|---|---|" + "---:|" * (len(head) - 3)]
    for run in sorted(runs, key=lambda r: (r.policy, r.engine not in REAL_ENGINES, r.engine, r.round)):
        origin = min(run.log["arrivals"].values(), default=0.0)
        steps = [s for s in run.log["steps"] if s[0] >= origin]
        first = [s[3] for s in steps if s[4]]
        resumed = [s[3] for s in steps if s[2] and not s[4]]
        cells = [run.policy, run.engine, str(run.round), f"{len(first)}, {_ms(first)}",
                 f"{len(resumed)}, {_ms(resumed)}"]
        for lo, hi in DECODE_BATCHES:
            cells.append(_ms([s[3] for s in steps if not s[2] and lo <= s[1] <= hi]))
        starts = run.log["starts"]
        resumes = sum(1 for _, tokens, _ in starts if tokens)
        cells += [str(len(starts) - resumes), str(resumes),
                  f"{run.log['reprefilled']} ({run.log['reprefilled_tokens']})", f"{sum(s for _, _, s in starts):.3f}",
                  str(run.log["suspends"]), f"{run.load.others_cores:.2f}" if run.load else "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _ms(durations: list[float]) -> str:
    return f"{1e3 * statistics.fmean(durations):.1f}" if durations else "-"


def load_lines(runs: list[FidelityRun]) -> list[str]:
    """The machine during each policy's real runs (rounds combined), and whether the loads allow comparing."""
    loads: dict[str, list[MachineLoad]] = {}
    for run in runs:
        if run.load:
            loads.setdefault(f"{run.engine} {run.policy}", []).append(run.load)
    merged = {label: combined(found) for label, found in loads.items()}
    lines = [f"{label}: {load.describe()}" for label, load in merged.items()]
    return lines + ([load_verdict(merged) or "the real runs saw comparable loads"] if merged else [])
