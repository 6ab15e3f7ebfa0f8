"""``timely-llm loop-cost``: what the serving loop itself costs, the engine left out.

The loop runs on the simulator with steps of zero time (``engines.sim.zero_time``), its robots
reporting every segment executed at once, so what the process spends is the loop's own work:
scheduling points, the output pipeline (detokenize, segment, dispatch), request bookkeeping.
The simulator's own calls (start, step, suspend, release) are timed apart and subtracted.
Each row keeps ``batch`` generations running (a finished plan is replaced at once by the next
one), under ``timelyllm``. With the grammar on, every (re)start derives and renders the
continuation grammar, as the vLLM adapter does before handing it to the engine (the engine's
compile is not the loop's). The last row over-subscribes the batch (twice as many generations
as it holds, under ``edf``) so parked generations are suspended and resumed: resumes per CPU second.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from timely_llm.clock import VirtualClock
from timely_llm.core.policies import EDF_POLICY, TIMELYLLM
from timely_llm.core.request import Request, Segment
from timely_llm.core.tuf import TUF
from timely_llm.engines.base import Engine, GenerationSpec, StepOutput
from timely_llm.engines.hardware import load_profile
from timely_llm.engines.sim import SimEngine, zero_time
from timely_llm.plan.grammar import plan_grammar
from timely_llm.plan.robot_file import load_skill_models
from timely_llm.plan.skills import SkillModel
from timely_llm.server import PlanRequest, Server
from timely_llm.serving import ServerConfig, build_server
from timely_llm.traces import TraceCatalog, load_catalog

BATCHES = (1, 8, 64, 256)
DEFAULT_STEPS = 400
MEMORY_PROFILE = "rtx4090-llama3-8b"
"""The hardware profile whose KV memory the zero-time simulator keeps (room for 512 generations)."""
TARGET_STEP_MS_AT_64 = 0.5
RESUME_POLICY = EDF_POLICY.name
"""The over-subscribed row's policy: segmented like timelyllm, whose utility order here keeps every
parked generation running rather than resume another."""
NORMAL, URGENT = TUF(5.0, -0.5, 1.0), TUF(0.05, -2.0, 2.0)


class TimedSim(SimEngine):
    """The zero-time simulator, its CPU time counted apart; with ``grammar``, each (re)start also
    renders the continuation grammar, as a constraining engine adapter must."""

    def __init__(self, hw: str, grammar: bool) -> None:
        super().__init__(zero_time(load_profile(hw)))
        self.grammar = grammar
        self.cpu = 0.0
        self.resumes = 0

    def _timed(self, call: Callable[[], Any]) -> Any:
        began = time.process_time()
        try:
            return call()
        finally:
            self.cpu += time.process_time() - began

    def start(self, spec: GenerationSpec) -> None:
        if spec.output_ids:
            self.resumes += 1
        if self.grammar and spec.grammar is not None:  # the adapter's work: part of the loop's cost
            spec.grammar.continuation(self.tokenizer.decode(spec.output_ids))
        self._timed(lambda: super(TimedSim, self).start(spec))

    def step(self) -> StepOutput:
        return self._timed(super().step)

    def suspend(self, gen_id: str) -> None:
        self._timed(lambda: super(TimedSim, self).suspend(gen_id))

    def release(self, gen_id: str) -> None:
        self._timed(lambda: super(TimedSim, self).release(gen_id))


@dataclass
class LoopCost:
    policy: str
    batch: int
    grammar: bool
    generations: int
    steps: int
    tokens: int
    resumes: int
    loop_cpu_s: float
    engine_cpu_s: float

    @property
    def step_ms(self) -> float:
        return 1e3 * self.loop_cpu_s / self.steps

    @property
    def token_us(self) -> float:
        return 1e6 * self.loop_cpu_s / max(self.tokens, 1)

    @property
    def resumes_per_s(self) -> float:
        return self.resumes / self.loop_cpu_s if self.loop_cpu_s else 0.0

    HEADER = ("policy     batch  gens  grammar  steps  tokens  resumes  loop ms/step  loop us/token  resumes/CPU-s"
              "  sim ms/step")

    def row(self) -> str:
        grammar = "on " if self.grammar else "off"
        return (f"{self.policy:10s} {self.batch:5d} {self.generations:5d}  {grammar}    {self.steps:5d}"
                f" {self.tokens:7d} {self.resumes:8d} {self.step_ms:13.3f} {self.token_us:14.1f}"
                f" {self.resumes_per_s:14.0f} {1e3 * self.engine_cpu_s / self.steps:12.3f}")


class _Fleet:
    """A server of ``config`` on ``engine`` and robots keeping plans in flight on it: they execute every
    segment at once, and a finished plan is followed by the next trace's."""

    def __init__(self, config: ServerConfig, engine: Engine, catalog: TraceCatalog, robots: dict[str, SkillModel],
                 grammar: bool) -> None:
        self.server = build_server(config, engine, robots, VirtualClock(), on_segment=self._dispatched,
                                   on_finish=self._finished)
        self.grammar = grammar
        tokenizer = engine.tokenizer
        self.plans = itertools.cycle([
            (t.robot, tokenizer.encode(catalog.prompt_text(t.robot, t.prompt)), tokenizer.encode(t.plan))
            for t in catalog.traces.values() if t.robot in robots])
        self.ids = itertools.count()
        self.reports: list[tuple[str, int]] = []
        self.ended = 0
        self.tokens = 0

    def submit(self) -> None:
        robot, prompt_ids, plan_ids = next(self.plans)
        number = next(self.ids)
        tuf = URGENT if number % 2 else NORMAL  # urgent arrivals make parked generations yield and resume later
        request = self.server.submit(PlanRequest(f"g{number}", "bench", robot, prompt_ids, tuf, forced_ids=plan_ids))
        if self.grammar:  # a replayed plan needs no grammar; here it stands for a generated one
            request.grammar = plan_grammar(request.robot)

    def report(self) -> None:
        now = self.server.clock.now()
        for request_id, index in self.reports:
            self.server.segment_done(request_id, index, now, now)
        self.reports.clear()

    def _dispatched(self, request: Request, segment: Segment) -> None:
        self.reports.append((request.id, segment.index))

    def _finished(self, request: Request) -> None:
        self.ended += 1
        self.tokens += len(request.output_ids)
        self.submit()


def measure(batch: int, grammar: bool, steps: int = DEFAULT_STEPS, generations: int | None = None,
            policy: str = TIMELYLLM.name, hw: str = MEMORY_PROFILE, warmup: int = 50) -> LoopCost:
    """The loop's CPU over ``steps`` engine steps with ``generations`` (default ``batch``) plans in flight."""
    robots, catalog = load_skill_models(), load_catalog()
    engine = TimedSim(hw, grammar)
    fleet = _Fleet(ServerConfig(policy, network_latency=0.0, max_batch=batch), engine, catalog, robots, grammar)
    server = fleet.server
    for _ in range(generations or batch):
        fleet.submit()
    for _ in range(warmup):
        _one_step(server, fleet)
    tokens0 = _tokens_so_far(server, fleet)
    resumes0, engine0, began = engine.resumes, engine.cpu, time.process_time()
    for _ in range(steps):
        _one_step(server, fleet)
    total = time.process_time() - began
    engine_cpu = engine.cpu - engine0
    return LoopCost(policy, batch, grammar, generations or batch, steps, _tokens_so_far(server, fleet) - tokens0,
                    engine.resumes - resumes0, total - engine_cpu, engine_cpu)


def _one_step(server: Server, fleet: _Fleet) -> None:
    server.step()
    fleet.report()


def _tokens_so_far(server: Server, fleet: _Fleet) -> int:
    return fleet.tokens + sum(len(r.output_ids) for r in server.requests.values())


def run(steps: int = DEFAULT_STEPS, batches: tuple[int, ...] = BATCHES, hw: str = MEMORY_PROFILE) -> list[LoopCost]:
    """Every batch with the grammar off and on, then the over-subscribed run of the largest batch but one."""
    print(f"server loop on the zero-time simulator ({hw}'s KV memory); {steps} steps per row", flush=True)
    print(LoopCost.HEADER, flush=True)
    rows = []
    for batch, grammar in itertools.product(batches, (False, True)):
        rows.append(measure(batch, grammar, steps, hw=hw))
        print(rows[-1].row(), flush=True)
    contended = batches[-2] if len(batches) > 1 else batches[0]
    rows.append(measure(contended, True, steps, generations=2 * contended, policy=RESUME_POLICY, hw=hw))
    print(rows[-1].row(), flush=True)
    at_64 = [r.step_ms for r in rows if r.batch == 64 and r.generations == 64]
    if at_64:
        print(f"target: at most {TARGET_STEP_MS_AT_64} ms of loop time per step at batch 64; measured "
              f"{max(at_64):.3f} ms (grammar on or off, the larger)", flush=True)
    return rows
