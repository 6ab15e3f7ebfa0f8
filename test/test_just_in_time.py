"""Just-in-time later segments: held back while a first segment decodes, never lost."""

from __future__ import annotations

from record_checks import check_record

from timely_llm.core.features import Features
from timely_llm.core.skills import load_skill_models
from timely_llm.core.tuf import NORMAL_TUF, URGENT_TUF
from timely_llm.engines.hardware import load_profile
from timely_llm.evaluation.harness import run_bench
from timely_llm.workloads.generator import Workload, WorkloadRequest
from timely_llm.workloads.traces import load_catalog

SKILLS = load_skill_models()
CATALOG = load_catalog()
CPU = load_profile("cpu-2core-smollm2-135m")


def _run(policy: str, requests: list[WorkloadRequest]) -> dict:
    return run_bench(Workload("jit", 0.008, tuple(requests)), policy, CPU, SKILLS, CATALOG, 0, None, Features())


def _resumed(result: dict, request_id: str) -> int:
    """Later segments of ``request_id`` that began with a resume (a held-back generation is suspended)."""
    record = next(r for r in result["requests"] if r["id"] == request_id)
    return sum(s["cached_tokens"] is not None for s in record["segments"][1:])


def test_a_later_segment_waits_while_a_first_segment_decodes_and_every_plan_completes() -> None:
    # a drone plan of long moves is generating later segments when an urgent request arrives
    busy = WorkloadRequest("busy", 0.0, "drone-1", 3, NORMAL_TUF)
    urgent = WorkloadRequest("urgent", 0.2, "drone-2", 6, URGENT_TUF)
    held = _run("timelyllm", [busy, urgent])
    assert _resumed(held, "busy") > 0
    for rec in held["requests"]:
        check_record(rec, 0.008)
    streamed = _run("vllm-stream", [busy, urgent])
    plans = {r["id"]: r["plan"] for r in streamed["requests"]}
    assert {r["id"]: r["plan"] for r in held["requests"]} == plans  # held back, not cut short
    first = {r["id"]: r["response_time"] for r in held["requests"]}
    assert first["urgent"] <= {r["id"]: r["response_time"] for r in streamed["requests"]}["urgent"]


def test_nothing_is_held_without_a_first_segment_to_make_room_for() -> None:
    alone = _run("timelyllm", [WorkloadRequest("busy", 0.0, "drone-1", 3, NORMAL_TUF)])
    assert _resumed(alone, "busy") == 0
    # the unsegmented baselines never hold anything back
    both = [WorkloadRequest("busy", 0.0, "drone-1", 3, NORMAL_TUF), WorkloadRequest("u", 0.2, "drone-2", 6, URGENT_TUF)]
    assert _resumed(_run("vllm-stream", both), "busy") == 0


def test_engine_steps_that_decode_nothing_do_not_teach_the_batch_controller() -> None:
    # vLLM returns at once, with no tokens, while a request waits for its grammar to compile; such a
    # step timed as a decode step of the whole batch made the throughput curve's knee 1 on the CPU
    from timely_llm.clock import VirtualClock
    from timely_llm.engines.base import StepOutput
    from timely_llm.engines.sim import SimEngine
    from timely_llm.server import POLICIES, PlanRequest, Server

    class CompilingFirst(SimEngine):
        waits = 3

        def step(self) -> StepOutput:
            if self.waits:
                self.waits -= 1
                return StepOutput(duration=0.0005)
            return super().step()

    engine = CompilingFirst(CPU)
    server = Server(engine, SKILLS, POLICIES["timelyllm"], VirtualClock(), features=Features(ala=True))
    trace = CATALOG[1]
    server.submit(PlanRequest("r", "a", trace.robot, engine.tokenizer.encode(trace.prompt), NORMAL_TUF,
                              forced_ids=engine.tokenizer.encode(trace.plan)))
    for _ in range(8):
        server.step()
    assert engine.waits == 0
    assert min(d for _, d in server.batch.steps._samples) > 0.001
