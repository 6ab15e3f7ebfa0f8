"""The scheduler alone, without a server or a loop: what ``schedule`` and ``update_from_output`` decide and what
they hand back for the loop to carry out."""

from __future__ import annotations

import pytest

from timely_llm.core.estimator import SegmentTimes
from timely_llm.core.features import Features
from timely_llm.core.overload import INFEASIBLE_REASON
from timely_llm.core.places import Call
from timely_llm.core.request import Request, Status
from timely_llm.core.tuf import NORMAL_TUF, TUF, URGENT_TUF
from timely_llm.engines.base import Engine, GenerationSpec, StepOutput
from timely_llm.engines.hardware import load_profile
from timely_llm.engines.sim import SimEngine
from timely_llm.engines.sim_remote import simulator
from timely_llm.plan.robot_file import load_skill_models
from timely_llm.scheduler import Dispatched, Ended, Generated, Infeasible, Scheduler
from timely_llm.server import PlanRequest
from timely_llm.serving import ServerConfig, build_scheduler

SKILLS = load_skill_models()
LATENCY = 0.008
NO_PARTS = Features()
REMOTE_PROFILE = "h100-llama3-8b-remote"


def scheduler(policy: str = "timelyllm", features: Features = NO_PARTS,
              in_place: bool = False) -> tuple[Scheduler, SimEngine]:
    engine = SimEngine(load_profile("rtx4090-llama3-8b"), suspends_in_place=in_place)
    return build_scheduler(ServerConfig(policy, LATENCY, features, max_batch=4), engine, SKILLS), engine


def request(engine: Engine, rid: str, tuf: TUF = NORMAL_TUF, **options: object) -> Request:
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


@pytest.mark.parametrize(("text", "budget_spent", "reason"), [
    ("", False, "the model ended the plan without a statement for the robot to execute"),
    (" ", False, "the model ended the plan without a statement for the robot to execute"),
    ("mf(5", True, "the plan's {}-token budget ran out before its first complete statement"),
])
def test_a_generation_that_ends_without_a_statement_aborts_its_goal_and_dispatches_nothing(
        text: str, budget_spent: bool, reason: str) -> None:
    sched, engine = scheduler()
    tokens = engine.tokenizer.encode_continuation(text)
    budget = len(tokens) if budget_spent else 64
    r = started(sched, engine, "a", max_new_tokens=budget)
    notices = sched.update_from_output(StepOutput(0.02, new_tokens={"a": tokens}, finished={"a": "length"}), 0.02)
    assert [type(n) for n in notices] == [Generated, Ended] and not r.segments
    assert r.status is Status.ABORTED and r.reason == reason.format(budget)
    assert not sched.running and "a" not in sched.queue


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


def full_batch(sched: Scheduler, engine: SimEngine, moves: dict[str, str]) -> dict[str, Request]:
    """A batch at the cap (4), each generation running on after its first segment ``moves[rid]`` was dispatched:
    its deadline is its robot's end of that move."""
    batch = {rid: request(engine, rid, forced_ids=engine.tokenizer.encode_continuation(f"{move}tc(90);"))
             for rid, move in moves.items()}
    for r in batch.values():
        sched.add(r)
    out = sched.schedule(0.0)
    for _, r in out.calls:  # the engine holds them, as the server would start them
        engine.start(GenerationSpec(r.id, r.prompt_ids, [], r.max_new_tokens, r.forced_ids))
    sched.applied(out)
    tokens = {rid: engine.tokenizer.encode_continuation(move) for rid, move in moves.items()}
    sched.update_from_output(StepOutput(0.02, new_tokens=tokens), 0.02)
    out = sched.schedule(0.02)  # nobody else waits: every parked generation goes on
    assert not out.calls and all(r.status is Status.RUNNING and r.seg_index == 1 for r in batch.values())
    sched.applied(out)
    return batch


def test_at_the_cap_the_generation_with_the_most_slack_yields_its_slot_to_an_urgent_newcomer() -> None:
    sched, engine = scheduler(in_place=True)
    batch = full_batch(sched, engine, {"a": "mf(100);", "b": "mf(500);", "c": "mf(200);", "d": "tc(90);"})
    latest = max(batch.values(), key=lambda r: r.dispatch_deadline(LATENCY))
    urgent = request(engine, "urgent", URGENT_TUF)
    sched.add(urgent)
    out = sched.schedule(0.03)
    assert out.calls == [(Call.SUSPEND, latest), (Call.START, urgent)]
    assert latest.status is Status.SUSPENDED and latest.id in sched.queue and len(sched.running) == 4
    assert sched.counters["slot_yields"] == 1


def test_no_generation_yields_when_none_could_wait_for_the_newcomer_and_still_end_on_time() -> None:
    sched, engine = scheduler(in_place=True)
    batch = full_batch(sched, engine, {"a": "tc(1);", "b": "tc(2);", "c": "tc(3);", "d": "tc(5);"})
    newcomer = request(engine, "newcomer", URGENT_TUF)
    sched.add(newcomer)
    now = 0.65  # each turn ends by 0.9 s: too soon for the newcomer's G (90 ms) and a worst case of 10 tokens
    assert all(now + newcomer.robot.segment_generation_time + sched.batch.wcet(r, 4) > r.dispatch_deadline(LATENCY)
               > newcomer.dispatch_deadline(LATENCY) for r in batch.values())
    assert not sched.schedule(now).calls and newcomer.status is Status.WAITING
    assert not sched.counters["slot_yields"]


def test_no_generation_yields_in_the_vllm_baselines_nor_on_an_engine_that_would_prefill_its_resume() -> None:
    for policy, in_place in (("vllm-stream", True), ("timelyllm", False)):
        sched, engine = scheduler(policy, in_place=in_place)
        full_batch(sched, engine, {"a": "mf(100);", "b": "mf(500);", "c": "mf(200);", "d": "tc(90);"})
        urgent = request(engine, "urgent", URGENT_TUF)
        sched.add(urgent)
        assert not sched.schedule(0.03).calls and urgent.status is Status.WAITING, policy


def _plans_in_flight_and_resumes(engine: Engine) -> tuple[Scheduler, dict[str, Request], list[Request]]:
    """Four plans at the cap (4), each parked after its first segment; a newcomer's first segment takes the slot of
    one (suspended), then every generation in the engine dispatches one more segment and parks."""
    sched = build_scheduler(ServerConfig("timelyllm", LATENCY, NO_PARTS, max_batch=4), engine, SKILLS)
    plan = engine.tokenizer.encode_continuation("tc(90);tc(90);tc(90);tc(90);")
    move = engine.tokenizer.encode_continuation("tc(90);")
    batch = {rid: request(engine, rid, forced_ids=plan) for rid in "abcd"}
    for r in batch.values():
        sched.add(r)
    sched.applied(sched.schedule(0.0))
    sched.update_from_output(StepOutput(0.02, new_tokens=dict.fromkeys(batch, move)), 0.02)
    newcomer = request(engine, "e", forced_ids=plan)
    sched.add(newcomer)
    out = sched.schedule(0.02)
    suspended = [r for call, r in out.calls if call is Call.SUSPEND]
    assert (Call.START, newcomer) in out.calls and suspended
    sched.applied(out)
    in_engine = [r for r in [*batch.values(), newcomer] if r not in suspended]
    sched.update_from_output(StepOutput(0.04, new_tokens={r.id: move for r in in_engine}), 0.04)
    assert len(sched.parked) == len(in_engine) and all(r.seg_index == 1 for r in suspended)
    return sched, {r.id: r for r in in_engine}, suspended


def test_a_resume_waits_for_a_slot_rather_than_take_a_plan_in_flights_on_an_engine_that_resubmits() -> None:
    sched, in_flight, waiting = _plans_in_flight_and_resumes(simulator(load_profile(REMOTE_PROFILE)))
    assert sched.queue.best(0.05) in waiting  # it ranks above the parked ones, yet they keep their slots
    out = sched.schedule(0.05)
    assert not out.calls and all(r.status is Status.SUSPENDED for r in waiting)
    assert all(r.status is Status.RUNNING for r in in_flight.values())


def test_a_first_segment_ranked_below_the_waiting_resume_still_takes_a_parked_slot() -> None:
    engine = simulator(load_profile(REMOTE_PROFILE))
    sched, in_flight, waiting = _plans_in_flight_and_resumes(engine)
    relaxed = TUF(ert=30.0, alpha=NORMAL_TUF.alpha, beta=NORMAL_TUF.beta)  # it ranks below the robot left idle
    newcomer = request(engine, "f", relaxed)
    sched.add(newcomer)
    assert sched.queue.best(0.05) in waiting
    out = sched.schedule(0.05)
    suspended = [r for call, r in out.calls if call is Call.SUSPEND]
    assert (Call.START, newcomer) in out.calls and suspended and all(r.id in in_flight for r in suspended)
    assert all(r.status is Status.SUSPENDED for r in waiting)


@pytest.mark.parametrize("in_place", [True, False], ids=["in-place", "kv-to-prefix-cache"])
def test_where_a_resume_is_no_server_request_the_resume_ranked_first_takes_a_parked_slot(in_place: bool) -> None:
    engine = SimEngine(load_profile(REMOTE_PROFILE.removesuffix("-remote")), suspends_in_place=in_place)
    sched, in_flight, waiting = _plans_in_flight_and_resumes(engine)
    first = sched.queue.best(0.05)
    out = sched.schedule(0.05)
    suspended = [r for call, r in out.calls if call is Call.SUSPEND]
    assert first in waiting and (Call.RESUME, first) in out.calls
    assert suspended and all(r.id in in_flight for r in suspended)


def _after_one_slow_decode_step(steps_are_iterations: bool) -> Scheduler:
    engine = SimEngine(load_profile("rtx4090-llama3-8b"))
    engine.steps_are_iterations = steps_are_iterations
    config = ServerConfig("timelyllm", LATENCY, Features(timebill=True, ala=True), max_batch=4,
                          step_profile=engine.profile)
    sched = build_scheduler(config, engine, SKILLS)
    started(sched, engine, "a")
    sched.update_from_output(StepOutput(0.9, new_tokens={"a": engine.tokenizer.encode_continuation("m")}), 0.9)
    return sched


def test_the_step_time_models_learn_only_from_steps_that_are_engine_iterations() -> None:
    """A remote engine's step collects what its servers streamed while the node waited: a curve fitted to such
    steps once held the batch at 3 of a server's 8 sequences (ALA's knee), so there the models keep the profile."""
    learned = _after_one_slow_decode_step(steps_are_iterations=True)
    assert learned.batch.steps.predict(1) == 0.9
    assert isinstance(learned.times, SegmentTimes) and learned.times.step_factor > 1.0
    kept = _after_one_slow_decode_step(steps_are_iterations=False)
    assert kept.batch.steps.predict(1) is None
    assert isinstance(kept.times, SegmentTimes) and kept.times.step_factor == 1.0


def _scheduler_over(servers: int, max_batch: int) -> Scheduler:
    engine = SimEngine(load_profile("rtx4090-llama3-8b"))
    engine.server_count = servers
    config = ServerConfig("timelyllm", LATENCY, Features(timebill=True, ala=True), max_batch=max_batch,
                          step_profile=engine.profile)
    return build_scheduler(config, engine, SKILLS)


def test_the_step_time_models_read_a_batch_spread_over_servers_as_each_servers_share() -> None:
    """Two servers each step half the batch at once: read as one server's batch, the pair's batch of 128 passed
    one server's knee and ALA refused admissions two servers had room for."""
    one, two = _scheduler_over(1, 64), _scheduler_over(2, 128)
    for batch in (1, 8, 64):
        assert two.batch.step_time(2 * batch) == pytest.approx(one.batch.step_time(batch), rel=1e-4)
    assert two.batch.step_time(64) < 0.9 * two.batch.step_time(128)
    one_knee = one.batch.throughput.knee(64)
    two_knee = two.batch.throughput.knee(128)
    assert one_knee is not None and two_knee is not None and 1.8 * one_knee <= two_knee <= 2.2 * one_knee
    assert isinstance(one.times, SegmentTimes) and isinstance(two.times, SegmentTimes)
    assert two.times.token_time(16, 900) == one.times.token_time(8, 900)
    assert two.times.token_time(15, 900) == one.times.token_time(8, 900)
