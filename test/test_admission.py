"""Memory-safe admission (Amin) and deferred prefill (K*): the pure rules, and their effect on the simulator."""

from record_checks import check_record

from timely_llm.core.admission import AminAdmission, LengthBounds
from timely_llm.core.features import Features
from timely_llm.core.request import Request
from timely_llm.core.skills import load_skill_models
from timely_llm.core.tuf import NORMAL_TUF
from timely_llm.engines.base import GenerationSpec
from timely_llm.engines.hardware import load_profile
from timely_llm.engines.sim import SimEngine
from timely_llm.evaluation.harness import run_bench
from timely_llm.evaluation.sweep import with_kv_memory, workload_for
from timely_llm.workloads.traces import load_catalog

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
    amin = AminAdmission(blocks_for, lambda ids: blocks_for(len(ids)))
    seg_max = SKILLS["tello"].segment_max_tokens
    assert amin.bounds(drone_request()) == LengthBounds(1, seg_max)  # nothing seen: one token is certain
    amin.segments.observe("tello", 0)  # an empty piece says nothing
    amin.segments.observe("tello", 6)
    amin.segments.observe("tello", 9)
    assert amin.segments.lower("tello") == 6 and amin.segments.lower("arm") == 1
    assert amin.bounds(drone_request()) == LengthBounds(6, seg_max)
    assert amin.bounds(drone_request(output=4, seg_tokens=4)) == LengthBounds(2, seg_max - 4)
    assert amin.bounds(drone_request(output=8, seg_tokens=8)).lower == 1  # past the bound: one more token


def test_block_counts_follow_the_kv_written_next():
    amin = AminAdmission(blocks_for, lambda ids: blocks_for(len(ids)) - 2)  # two blocks shared with others
    amin.segments.observe("tello", 4)
    # context 33: 32 tokens' KV written (2 full blocks); the next step writes the 33rd: a new block
    assert amin.growth(drone_request(prompt=33)) == 1
    assert amin.growth(drone_request(prompt=34)) == 0
    # 4 more tokens from context 30 write KV up to 33 tokens: one block beyond the 2 held
    assert amin.reserve(drone_request(prompt=30)) == 1
    # a newcomer: its context less the shared blocks, plus its segment's lower bound
    assert amin.needed(drone_request(prompt=40)) == blocks_for(40) - 2 + blocks_for(44) - blocks_for(40)


def test_eviction_takes_fewest_generated_tokens_then_the_least_urgent():
    fresh_early = drone_request("fresh-early", output=2, arrival=0.0)
    fresh_late = drone_request("fresh-late", output=2, arrival=5.0)  # later deadline: less urgent
    advanced = drone_request("advanced", output=30)
    order = AminAdmission.eviction_order([advanced, fresh_early, fresh_late], network_latency=0.008)
    assert [r.id for r in order] == ["fresh-late", "fresh-early", "advanced"]


# ----- Amin on the simulator -----

CATALOG = load_catalog()
PROFILE = load_profile("rtx4090-llama3-8b")


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
