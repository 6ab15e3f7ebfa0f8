"""Memory-safe admission (Amin) and deferred prefill (K*): the pure rules, and their effect on the simulator."""

from dataclasses import replace

import pytest
from record_checks import check_record

from timely_llm.clock import VirtualClock
from timely_llm.core.admission import AminAdmission, DeferredPrefill, departure_threshold
from timely_llm.core.estimator import ExecutionTimeEstimator
from timely_llm.core.features import Features
from timely_llm.core.request import Request, Status
from timely_llm.core.tuf import NORMAL_TUF, TUF, URGENT_TUF
from timely_llm.engines.base import GenerationSpec
from timely_llm.engines.hardware import load_profile
from timely_llm.engines.sim import SimEngine
from timely_llm.plan.robot_file import load_skill_models
from timely_llm.server import PlanRequest, Server
from timely_llm.serving import Driver, ServerConfig, build_server
from timely_llm.traces import load_catalog
from timely_llm_bench.evaluation.harness import SimulatedRobots, run_bench
from timely_llm_bench.evaluation.sweep import with_kv_memory, workload_for
from timely_llm_bench.workloads.generator import BUILTIN, generate

SKILLS = load_skill_models()


def tiny_card(num_blocks: int):
    profile = load_profile("rtx4090-llama3-8b")
    memory = {**profile.memory, "total_gib": 16 + 1.5 + num_blocks * 16 * 131072 / 2**30}
    object.__setattr__(profile, "memory", memory)
    assert profile.num_kv_blocks == num_blocks
    return profile


def test_simulator_reports_its_preemptions_and_the_tokens_it_recomputes():
    engine = SimEngine(tiny_card(12))
    for i in range(3):  # 3 x 64 tokens = 12 full blocks: the next token needs a 13th
        engine.start(GenerationSpec(f"g{i}", [500 + i] + list(range(63)), max_new_tokens=20,
                                    forced_ids=list(range(7000, 7020))))
    first = engine.step()
    assert first.preempted == [] and first.recomputed_tokens == 0
    second = engine.step()
    assert second.preempted == ["g2"]  # the latest started, as vLLM
    engine.release("g1")  # room again: g2 is prefilled anew
    third = engine.step()
    assert "g2" in third.started
    info = third.started["g2"]
    assert third.recomputed_tokens == info.context_tokens - info.cached_tokens > 0


# ----- Amin: bounds, block arithmetic, eviction order -----

def drone_request(rid: str = "r", prompt: int = 40, output: int = 0, seg_tokens: int = 0,
                  arrival: float = 0.0) -> Request:
    request = Request(rid, "agent", SKILLS["tello"], NORMAL_TUF, arrival, list(range(prompt)), 256)
    request.output_ids.extend(range(1000, 1000 + output))
    request.seg_tokens = seg_tokens
    return request


def blocks_for(tokens: int) -> int:
    return -(-tokens // 16)


def test_segment_lower_bound_is_the_shortest_seen_and_rises_as_tokens_arrive():
    amin = AminAdmission(blocks_for)
    assert amin.lower_bound(drone_request()) == 1  # nothing seen: one token is certain
    amin.segments.observe("tello", 0)  # an empty piece says nothing
    amin.segments.observe("tello", 6)
    amin.segments.observe("tello", 9)
    assert amin.segments.lower("tello") == 6 and amin.segments.lower("arm") == 1
    assert amin.lower_bound(drone_request()) == 6
    assert amin.lower_bound(drone_request(output=4, seg_tokens=4)) == 2
    assert amin.lower_bound(drone_request(output=8, seg_tokens=8)) == 1  # past the bound: one more token


def test_block_counts_follow_the_kv_written_next():
    amin = AminAdmission(blocks_for)
    amin.segments.observe("tello", 4)
    # context 33: 32 tokens' KV written (2 full blocks); the next step writes the 33rd: a new block
    assert amin.demand([drone_request(prompt=33)])[0] == 1
    assert amin.demand([drone_request(prompt=34)])[0] == 0
    # 4 more tokens from context 30 write KV up to 33 tokens: one block beyond the 2 held
    assert amin.reserve(drone_request(prompt=30)) == 1
    running = [drone_request(prompt=p) for p in (30, 33, 34, 47)]
    assert amin.demand(running) == (1, sum(amin.reserve(r) for r in running))
    # a newcomer: its context less the shared blocks, plus its segment's lower bound
    two_shared = lambda ids: blocks_for(len(ids)) - 2  # noqa: E731 - two blocks shared with others
    assert amin.needed(drone_request(prompt=40), two_shared) == blocks_for(40) - 2 + blocks_for(44) - blocks_for(40)


def test_eviction_takes_fewest_generated_tokens_then_the_least_urgent():
    fresh_early = drone_request("fresh-early", output=2, arrival=0.0)
    fresh_late = drone_request("fresh-late", output=2, arrival=5.0)  # later deadline: less urgent
    advanced = drone_request("advanced", output=30)
    order = AminAdmission.eviction_order([advanced, fresh_early, fresh_late], network_latency=0.008)
    assert [r.id for r in order] == ["fresh-late", "fresh-early", "advanced"]


# ----- Amin on the simulator -----

CATALOG = load_catalog()
PROFILE = load_profile("rtx4090-llama3-8b")
STALLED = replace(PROFILE, name="stalled", step={**PROFILE.step, "prefill_stall": PROFILE.step["base"]})
"""The 4090 as an engine that pays a step's intercept again to switch to prefill (paper 004's c_p)."""


def scarce_point(features: Features, kv_gib: float | None = 0.15, agents: int = 200, cap: int = 64) -> tuple:
    workload = workload_for(agents, 40.0, 3, CATALOG, SKILLS)
    result = run_bench(workload, "timelyllm", with_kv_memory(PROFILE, kv_gib), SKILLS, CATALOG, 0, cap, features)
    return workload, result


def test_amin_replaces_engine_recompute_with_fewer_evictions_and_every_request_ends():
    workload, off = scarce_point(Features())
    _, on = scarce_point(Features(amin=True))
    assert off["counters"]["preemptions"] > 0  # the point is KV-scarce: the engine preempts
    assert on["counters"].get("preemptions", 0) == 0
    assert 0 < on["counters"]["amin_evictions"] < off["counters"]["preemptions"]
    assert on["counters"]["recomputed_tokens"] < off["counters"]["recomputed_tokens"]
    assert len(on["requests"]) == len(workload.requests)
    for rec in on["requests"]:
        check_record(rec, workload.network_latency)


def test_amin_changes_nothing_where_memory_is_plentiful():
    _, off = scarce_point(Features(), kv_gib=None)
    _, on = scarce_point(Features(amin=True), kv_gib=None)
    assert on["counters"] == off["counters"] == {}
    assert on["requests"] == off["requests"]


# ----- Deferred prefill (K*) -----

def test_k_star_minimises_the_approximate_inverse_throughput():
    # C = 8, a generation leaves after a token with probability 0.1, c_p = c_d: by hand,
    # (1 + ln(1 - K/8)/ln 0.9)/K is 2.27, 1.87, 1.82, 1.90 for K = 1..4 (in units of c_d).
    assert departure_threshold(0.021, 0.021, 8, 0.1) == 3
    assert departure_threshold(0.0, 0.021, 8, 0.1) == 1  # no fixed stall: nothing gained by waiting
    assert departure_threshold(0.021, 0.021, 1, 0.1) == 1
    growing = [departure_threshold(stall, 0.021, 64, 0.1) for stall in (0.001, 0.01, 0.021, 0.1)]
    assert growing == sorted(growing) and growing[0] < growing[-1] < 64  # a dearer stall: wait for more


def test_deferral_waits_for_k_departures_under_backlog_only():
    deferral = DeferredPrefill(3)
    assert not deferral.defers(in_batch=0, waiting=10)  # nothing decoding to protect
    deferral.prefilled(8)
    assert deferral.defers(in_batch=8, waiting=10)
    assert deferral.defers(in_batch=6, waiting=10)  # two departures
    assert not deferral.defers(in_batch=5, waiting=10)  # the third: prefill
    assert not deferral.defers(in_batch=8, waiting=2)  # no backlog to batch
    deferral.prefilled(2)
    assert not deferral.defers(in_batch=2, waiting=10)  # K* departures cannot come


def deferral_server(max_batch: int = 8) -> tuple[Server, Driver, SimEngine]:
    """A server on a profile with a prefill stall; its arm served open-loop, so that an arm plan decodes on
    through its scans."""
    engine = SimEngine(STALLED)
    clock = VirtualClock()
    driver = Driver(clock)
    skills = {**SKILLS, "arm": SKILLS["arm"].served_open_loop()}
    robots = SimulatedRobots(skills, 0.008, 0, driver.at)
    config = ServerConfig("timelyllm", 0.008, Features(deferred_prefill=True), max_batch, step_profile=STALLED)
    server = build_server(config, engine, skills, clock, on_segment=robots.on_segment)
    return server, driver, engine


def submit_at(driver: Driver, engine: SimEngine, rid: str, trace_id: int, t: float,
              tuf: TUF = NORMAL_TUF) -> None:
    trace = CATALOG[trace_id]
    tok = engine.tokenizer
    plan = PlanRequest(rid, rid, trace.robot, tok.encode(CATALOG.prompt_text(trace.robot, trace.prompt)), tuf,
                       "urgent" if tuf is URGENT_TUF else "normal", forced_ids=tok.encode(trace.plan),
                       trace=trace_id, arrival=t)
    driver.arrive(plan)


def test_deferred_newcomers_wait_but_an_urgent_first_segment_starts_at_once_and_takes_them_along():
    server, driver, engine = deferral_server()
    k = server.scheduler.filling.deferral.threshold
    assert 1 < k < 8  # a stall of one step intercept is worth batching
    arm_traces = [t for t in sorted(CATALOG.traces) if CATALOG[t].robot == "arm"]
    for i in range(5):  # long arm plans keep the batch decoding (served open-loop, see deferral_server)
        submit_at(driver, engine, f"busy{i}", arm_traces[i % len(arm_traces)], 0.0)
    for i in range(k):
        submit_at(driver, engine, f"late{i}", 1, 0.3)
    submit_at(driver, engine, "urgent", 7, 0.5, URGENT_TUF)
    seen = {}
    driver.at(0.45, lambda server: seen.update(before={r: server.requests[r].status for r in server.requests}))
    driver.at(0.56, lambda server: seen.update(after={r: server.requests[r].status for r in server.requests}))
    ended = []
    server.on_finish = ended.append
    driver.run(server)
    assert all(seen["before"][f"late{i}"] is Status.WAITING for i in range(k))  # deferred, the batch has room
    assert server.counters["deferred_prefills"] > 0
    assert seen["after"]["urgent"] is not Status.WAITING  # its slack would not wait: started at once
    assert all(seen["after"][f"late{i}"] is not Status.WAITING for i in range(k))  # in the same stall
    assert sorted(r.id for r in ended) == sorted([*(f"busy{i}" for i in range(5)), *(f"late{i}" for i in range(k)),
                                                  "urgent"])
    assert all(r.status is Status.SUCCEEDED for r in ended)


def test_deferred_prefill_on_wid2_ends_every_request():
    workload = generate(BUILTIN["WID2"], CATALOG, SKILLS, 0)
    result = run_bench(workload, "timelyllm", STALLED, SKILLS, CATALOG, 0, 8, Features(deferred_prefill=True))
    assert result["counters"]["deferred_prefills"] > 0
    assert len(result["requests"]) == len(workload.requests)
    for rec in result["requests"]:
        check_record(rec, workload.network_latency)


@pytest.mark.parametrize("hw", ["rtx4090-llama3-8b", "jetson-orin-nx-16gb-llama32-3b-q4"])
def test_without_a_prefill_stall_deferral_is_off_and_changes_nothing(hw):
    # Chunked prefill (every shipped GPU profile) pays no c_p: K* = 1, so the part must not move a record.
    profile = load_profile(hw)
    assert profile.step["prefill_stall"] == 0
    workload = generate(BUILTIN["WID2"], CATALOG, SKILLS, 0)
    off, on = (run_bench(workload, "timelyllm", profile, SKILLS, CATALOG, 0, 8, Features(deferred_prefill=flag))
               for flag in (False, True))
    assert on["requests"] == off["requests"] and "deferred_prefills" not in on["counters"]


def test_a_prefill_stall_is_charged_once_per_prefilling_step_and_raises_k_star():
    engine = SimEngine(STALLED)
    engine.start(GenerationSpec("a", list(range(10, 110)), max_new_tokens=4, forced_ids=[5] * 4))
    engine.start(GenerationSpec("b", list(range(200, 300)), max_new_tokens=4, forced_ids=[5] * 4))
    both = engine.step().duration
    assert both == pytest.approx(PROFILE.step_time([(100, 100)] * 2, []) + STALLED.step["prefill_stall"])
    assert engine.step().duration == pytest.approx(PROFILE.step_time([], [101, 101]))  # decoding: no stall
    estimator = ExecutionTimeEstimator.from_profile(STALLED)
    assert estimator.prefill_time(100) == pytest.approx(STALLED.step_time([(100, 100)], []))
