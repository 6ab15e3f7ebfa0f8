"""The scheduler alone, without a server or a loop: what ``schedule`` and ``update_from_output`` decide and what
they hand back for the loop to carry out."""

from __future__ import annotations

from timely_llm.core.features import Features
from timely_llm.core.overload import INFEASIBLE_REASON
from timely_llm.core.places import Call
from timely_llm.core.request import Request, Status
from timely_llm.core.tuf import NORMAL_TUF, TUF
from timely_llm.engines.base import StepOutput
from timely_llm.engines.hardware import load_profile
from timely_llm.engines.sim import SimEngine
from timely_llm.plan.robot_file import load_skill_models
from timely_llm.scheduler import Dispatched, Ended, Generated, Infeasible, Scheduler
from timely_llm.server import PlanRequest
from timely_llm.serving import ServerConfig, build_scheduler

SKILLS = load_skill_models()
LATENCY = 0.008
NO_PARTS = Features()


def scheduler(policy: str = "timelyllm", features: Features = NO_PARTS) -> tuple[Scheduler, SimEngine]:
    engine = SimEngine(load_profile("rtx4090-llama3-8b"))
    return build_scheduler(ServerConfig(policy, LATENCY, features, max_batch=4), engine, SKILLS), engine


def request(engine: SimEngine, rid: str, tuf: TUF = NORMAL_TUF, **options: object) -> Request:
    plan = PlanRequest(rid, f"agent-{rid}", "tello", engine.tokenizer.encode("find the cat"), tuf, **options)
    return plan.request(SKILLS["tello"], 0.0, 64, engine.tokenizer.decode, streaming=True)


def started(sched: Scheduler, engine: SimEngine, rid: str, **options: object) -> Request:
    r = request(engine, rid, **options)
    sched.add(r)
    out = sched.schedule(0.0)
    assert out.calls == [(Call.START, r)] and not out.notices
    sched.applied(out)
    return r


def test_a_step_that_completes_two_segments_dispatches_both_in_order_then_parks() -> None:
    sched, engine = scheduler()
    r = started(sched, engine, "a")
    tokens = engine.tokenizer.encode_continuation("mf(50);tc(90);")
    notices = sched.update_from_output(StepOutput(0.02, new_tokens={"a": tokens}), 0.02)
    assert [type(n) for n in notices] == [Dispatched, Dispatched]
    first, second = (n.segment for n in notices if isinstance(n, Dispatched))
    assert (first.index, first.text, second.index, second.text) == (0, "mf(50);", 1, "tc(90);")
    # each segment carries the end estimated when it was cut: the second starts where the first ends
    assert first.est_end == 0.02 + LATENCY + first.est_exec_time
    assert second.est_end == first.est_end + second.est_exec_time == r.prev_end_est
    assert r.status is Status.PARKED and "a" in sched.parked and "a" in sched.queue


def test_a_finished_generation_is_released_before_its_last_segment_goes_out_and_ends_once_reported() -> None:
    sched, engine = scheduler()
    r = started(sched, engine, "a")
    tokens = engine.tokenizer.encode_continuation("mf(50);")
    notices = sched.update_from_output(StepOutput(0.02, new_tokens={"a": tokens}, finished={"a": "eos"}), 0.02)
    assert [type(n) for n in notices] == [Generated, Dispatched] and r.status is Status.GENERATED
    assert notices[1].segment.final  # type: ignore[union-attr]
    (ended,) = sched.reported(r, 0, 0.03, 0.5, True, "", None)
    assert isinstance(ended, Ended) and ended.request is r and not ended.in_engine
    assert r.status is Status.SUCCEEDED and not sched.running and "a" not in sched.queue


def test_an_engine_failure_ends_the_generation_and_the_loop_releases_it() -> None:
    sched, engine = scheduler()
    r = started(sched, engine, "a")
    (ended,) = sched.update_from_output(StepOutput(0.02, failed={"a": "out of memory"}), 0.02)
    assert isinstance(ended, Ended) and ended.in_engine and r.status is Status.ABORTED
    assert r.reason == "engine error: out of memory"


def test_overload_control_runs_at_the_scheduling_point_and_never_inside_a_submit() -> None:
    sched, engine = scheduler(features=Features(shed=True))
    impossible = TUF(ert=0.0, alpha=-100.0, beta=1.0)  # cut-off 10 ms: below network latency + G
    gone, kept = request(engine, "gone", impossible), request(engine, "kept", impossible, keep_if_infeasible=True)
    sched.add(gone)
    sched.add(kept)
    assert gone.status is Status.WAITING and kept.status is Status.WAITING
    out = sched.schedule(0.001)
    assert [(type(n), n.request.id) for n in out.notices] == [(Ended, "gone"), (Infeasible, "kept")]
    assert gone.status is Status.ABORTED and gone.reason == INFEASIBLE_REASON
    assert out.calls == [(Call.START, kept)]  # the one that keeps waiting is still served


def test_the_unsegmented_baseline_never_parks() -> None:
    sched, engine = scheduler("vllm-stream")
    r = started(sched, engine, "a")
    tokens = engine.tokenizer.encode_continuation("mf(50);")
    notices = sched.update_from_output(StepOutput(0.02, new_tokens={"a": tokens}), 0.02)
    assert [type(n) for n in notices] == [Dispatched] and r.status is Status.RUNNING and not sched.parked
