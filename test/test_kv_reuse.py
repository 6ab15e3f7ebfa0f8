"""What resumes reuse (core/kv_reuse.py) as the scheduler counts it from engine reports, and the remote engine's
record of what its servers hold (engines/remote_prefixes.py): the arithmetic by hand, then whole simulated runs."""

from __future__ import annotations

from collections import Counter

from timely_llm.core.kv_reuse import RESUMED, RESUMED_FROM_KV, RESUMES, KvReuse, count_resume
from timely_llm.engines.base import most_cached
from timely_llm.engines.hardware import load_profile
from timely_llm.engines.remote_prefixes import (
    BALANCE_SLACK,
    Candidate,
    PrefixCacheCounts,
    PrefixIndex,
    choose_server,
    prefix_cache_metrics,
)
from timely_llm.plan.robot_file import load_skill_models
from timely_llm.traces import load_catalog
from timely_llm_bench.evaluation.harness import EngineSetup, run_bench
from timely_llm_bench.workloads.generator import WorkloadSpec, generate

PROFILE = load_profile("cpu-2core-smollm2-135m")
SKILLS = load_skill_models()
CATALOG = load_catalog()


def test_a_resume_could_reuse_all_but_its_last_token_and_what_was_appended_after_it() -> None:
    counters: Counter[str] = Counter()
    count_resume(counters, context_tokens=100, cached_tokens=100, appended=10)  # kept in place: capped at 89
    count_resume(counters, context_tokens=100, cached_tokens=64, appended=0)  # two 32-token blocks found
    count_resume(counters, context_tokens=1, cached_tokens=0, appended=0)  # nothing it could reuse: not counted
    assert (counters[RESUMED], counters[RESUMED_FROM_KV], counters[RESUMES]) == (89 + 99, 89 + 64, 2)
    reuse = KvReuse.of(counters)
    assert reuse.recomputed == 35 and reuse.share == (89 + 64) / (89 + 99)
    assert "81.4% of resumed context" in reuse.describe() and "35 recomputed" in reuse.describe()
    assert KvReuse.of({}).describe() == "KV reuse: no resume"


def test_the_prefix_index_matches_leading_full_blocks_only_and_forgets_the_least_recent() -> None:
    index = PrefixIndex(block_size=4, capacity_blocks=5)
    index.add(list(range(10)))  # blocks [0-3], [4-7]; the last two tokens fill no block
    assert index.cached_blocks(list(range(12))) == 2
    assert index.cached_blocks([0, 1, 2, 3, 9, 9, 9, 9]) == 1
    assert index.cached_blocks([9, 1, 2, 3, 4, 5, 6, 7]) == 0  # the same second block after another first: no hit
    index.add([7] * 16)  # four blocks more: the oldest of the first context goes
    assert index.cached_blocks(list(range(8))) == 0
    assert index.cached_blocks([7] * 16) == 4
    index.clear()
    assert index.cached_blocks([7] * 16) == 0


def test_prefix_cache_metrics_are_read_from_vllm_prometheus_text_summed_over_engines() -> None:
    text = """# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="smollm2"} 1200.0
vllm:prefix_cache_queries_total{engine="1",model_name="smollm2"} 300.0
vllm:prefix_cache_queries_created{engine="0",model_name="smollm2"} 1.7e9
vllm:prefix_cache_hits_total{engine="0",model_name="smollm2"} 960.0
vllm:prefix_cache_hits_total{engine="1",model_name="smollm2"} 0.0
"""
    assert prefix_cache_metrics(text) == (1500, 960)
    assert prefix_cache_metrics("up 1\n") is None


def test_resumed_hits_from_server_counts_are_a_lower_bound_never_above_what_resumes_could_reuse() -> None:
    before = PrefixCacheCounts(1000, 800, 600, 0, 0)
    after = PrefixCacheCounts(3000, 2600, 900, 1500, 3)
    run = after - before
    assert run == PrefixCacheCounts(2000, 1800, 300, 1500, 3)
    assert run.resumed_hits_at_least == 1500  # 1800 hits less 300 first-start tokens, capped at 1500
    assert PrefixCacheCounts(2000, 200, 300, 1500, 3).resumed_hits_at_least == 0


def test_a_first_start_is_charged_only_what_a_vllm_prefix_cache_could_serve_it() -> None:
    # Whole blocks, short of the last token: a 65-token prompt finds at most 64 cached, a 64-token one 32.
    assert [most_cached(n, 32) for n in (0, 1, 32, 33, 64, 65, 96)] == [0, 0, 0, 32, 32, 64, 64]
    assert most_cached(100, 16) == 96


def _resumed_run(suspends_in_place: bool) -> KvReuse:
    workload = generate(WorkloadSpec("kv", 0.5, 8, tuple(range(1, 12)), 20, 40.0), CATALOG, SKILLS, 3)
    setup = EngineSetup.simulator(PROFILE, suspends_in_place=suspends_in_place)
    result = run_bench(workload, "timelyllm", setup, SKILLS, CATALOG, max_batch=2)
    return KvReuse.of(result["counters"])


def test_resumes_in_place_reuse_everything_and_through_the_prefix_cache_lose_at_most_a_partial_block() -> None:
    in_place, cached = _resumed_run(True), _resumed_run(False)
    assert in_place.resumes > 5 and in_place.recomputed == 0 and in_place.share == 1.0
    assert cached.resumes > 5 and 0 < cached.recomputed < cached.resumes * PROFILE.block_tokens


def test_a_new_generation_follows_its_cached_prompt_while_that_server_has_room_and_is_not_far_busier() -> None:
    cold, warm = Candidate(0, 0, 100), Candidate(28, BALANCE_SLACK, 50)
    assert choose_server([cold, warm], max_open=8) == 1  # the prefix wins within the slack
    busier = Candidate(28, BALANCE_SLACK + 1, 50)
    assert choose_server([cold, busier], max_open=8) == 0  # past the slack, load wins
    assert choose_server([Candidate(0, 4, 100), Candidate(28, 5, 50)], max_open=4) == 0  # all full: the least busy
    assert choose_server([Candidate(0, 4, 100), Candidate(28, 4, 50)], max_open=4) == 1  # ... then the cache
    assert choose_server([Candidate(3, 1, 10), Candidate(3, 1, 90)], max_open=8) == 1  # ties: the most free KV


def test_a_server_gone_silent_gets_a_new_generation_only_when_no_other_has_room() -> None:
    silent_warm, cold = Candidate(28, 1, 100, silent=True), Candidate(0, 2, 50)
    assert choose_server([silent_warm, cold], max_open=8) == 1
    assert choose_server([cold, silent_warm, Candidate(28, 0, 50, silent=True)], max_open=8) == 0
    assert choose_server([silent_warm, Candidate(0, 8, 50)], max_open=8) == 0  # the other is full
    assert choose_server([silent_warm, Candidate(0, 2, 50, silent=True)], max_open=8) == 0  # all silent: as usual
