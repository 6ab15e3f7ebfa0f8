"""The simulator of the remote path (engines/sim_remote.py): request overhead, token delay, whole-context resumes,
on the engine's model clock. Expectations are computed by hand from a profile of round figures."""

from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from timely_llm.core.tuf import NORMAL_TUF
from timely_llm.engines.base import GenerationSpec
from timely_llm.engines.hardware import HardwareProfile, load_profile
from timely_llm.engines.registry import EngineSettings, engine_kind
from timely_llm.engines.sim import SimEngine
from timely_llm.engines.sim_remote import RemoteSimEngine, simulator
from timely_llm.engines.sim_tokenizer import SimTokenizer
from timely_llm.errors import ConfigError

STEP = {"base": 0.010, "per_prefill_token": 0.001, "per_prefill_attention": 0.0, "per_decode_seq": 0.002,
        "per_kv_token": 0.0, "prefill_stall": 0.0, "per_kv_reread": 0.0}
"""A step: 10 ms, 1 ms per prefilled token, 2 ms per decoding sequence."""
MEMORY = {"total_gib": 1.0, "weights_gib": 0.0, "reserved_gib": 0.0, "kv_bytes_per_token": 1024.0,
          "block_tokens": 4.0}
HTTP = {"request_overhead": 0.022, "token_delay": 0.005, "servers": 1.0}
PROFILE = HardwareProfile("remote-test", STEP, MEMORY, 512, http=HTTP)
PROMPT = list(range(100, 108))  # 8 tokens: two full blocks


def _engine() -> RemoteSimEngine:
    return RemoteSimEngine(PROFILE, SimTokenizer())


def _spec(gen_id: str, output: list[int] | None = None, prompt: list[int] = PROMPT) -> GenerationSpec:
    return GenerationSpec(gen_id, list(prompt), list(output or []), max_new_tokens=8, forced_ids=[1, 2, 3, 4, 5, 6])


def test_a_start_lands_after_the_request_overhead_and_its_tokens_come_after_the_token_delay():
    engine = _engine()
    engine.start(_spec("a"))
    first = engine.step()  # waits 22 ms for the request, prefills 8 tokens (18 ms), 5 ms to the node
    assert first.duration == pytest.approx(0.022 + 0.018 + 0.005)
    assert first.new_tokens == {"a": [1]}
    assert first.started["a"].cached_tokens == 0
    second = engine.step()  # a decode step: the delay is paid once, steps follow each other on the server
    assert second.duration == pytest.approx(0.012)
    assert second.new_tokens == {"a": [2]}


def test_a_resume_resubmits_the_context_and_prefills_what_the_prefix_cache_misses():
    engine = _engine()
    engine.start(_spec("a"))
    engine.step()
    engine.step()  # output [1, 2]: context 10 tokens
    engine.suspend("a")
    engine.start(_spec("a", output=[1, 2]))
    out = engine.step()
    # two full blocks of the 9 tokens before the last sampled one hit; 2 tokens prefill (12 ms)
    assert (out.started["a"].context_tokens, out.started["a"].cached_tokens) == (10, 8)
    assert out.duration == pytest.approx(0.022 + 0.012 + 0.005)
    assert out.new_tokens == {"a": [3]}


def test_a_request_in_flight_does_not_stall_the_running_generations():
    engine = _engine()
    engine.start(_spec("a"))
    engine.step()
    engine.start(_spec("b", prompt=list(range(200, 208))))  # lands 22 ms from now; the server's steps began 5 ms ago
    decodes = [engine.step() for _ in range(3)]  # steps beginning 5 ms before, 7 ms and 19 ms after the start
    assert [d.duration for d in decodes] == pytest.approx([0.012] * 3)
    assert all(set(d.new_tokens) == {"a"} for d in decodes)
    assert engine.running_ids() == ["a", "b"]  # in flight, the node counts it running
    joined = engine.step()  # begins 31 ms after the start: b prefills 8 tokens beside a's decode
    assert joined.duration == pytest.approx(0.010 + 0.008 + 0.002)
    assert set(joined.new_tokens) == {"a", "b"}


def test_nothing_in_flight_and_nothing_running_takes_no_time():
    engine = _engine()
    assert engine.step().duration == 0.0
    engine.start(_spec("a"))
    engine.suspend("a")  # before it landed: the server never hears of it
    assert engine.step().duration == 0.0
    engine.release("a")
    assert engine.running_ids() == []


def test_requests_in_flight_hold_their_blocks_in_the_free_count():
    engine = _engine()
    free = engine.free_kv_blocks()
    engine.start(_spec("a"))
    assert engine.free_kv_blocks() == free - 2
    assert engine.kv_after(["a"], []).free_blocks == free


def test_the_sim_engine_of_a_profile_with_an_http_section_is_the_remote_path(tmp_path: Path):
    path = tmp_path / "box.yaml"
    path.write_text(yaml.safe_dump(PROFILE.to_dict()))
    assert load_profile(str(path)).http == HTTP
    built = engine_kind("sim").factory(EngineSettings(param={"hw_profile": str(path)}.__getitem__))
    assert isinstance(built, RemoteSimEngine)
    assert type(simulator(load_profile("rtx4090-llama3-8b"))) is SimEngine
    with pytest.raises(ConfigError, match="cannot suspend in place"):
        simulator(PROFILE, suspends_in_place=True)


@pytest.mark.parametrize("http, said", [({"request_overhead": 0.01}, r"http\.token_delay: must be a number"),
                                          ({"request_overhead": -1, "token_delay": 0}, "request_overhead"),
                                          ({"request_overhead": 0, "token_delay": 0, "servers": 1.5},
                                           r"http\.servers: must be a whole number >= 1, got 1\.5"),
                                          ("fast", "http: missing or not a mapping")])
def test_a_bad_http_section_is_refused_in_one_line(tmp_path: Path, http, said):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump({**PROFILE.to_dict(), "http": http}))
    with pytest.raises(ConfigError, match=said) as refused:
        load_profile(str(path))
    assert "\n" not in str(refused.value) and str(path) in str(refused.value)


def test_two_servers_step_side_by_side_and_a_resume_goes_back_where_its_kv_is():
    engine = RemoteSimEngine(replace(PROFILE, http={**HTTP, "servers": 2.0}), SimTokenizer())
    engine.start(_spec("a"))
    engine.start(_spec("b", prompt=list(range(200, 208))))  # the other server: it has fewer generations
    steps = [engine.step() for _ in range(4)]
    # each server prefills its own at 22 ms (18 ms), then decodes it alone every 12 ms: the second server's step
    # ends with the first's, so its tokens come with them (0 s more)
    assert [s.duration for s in steps] == pytest.approx([0.045, 0.0, 0.012, 0.0])
    assert [list(s.new_tokens) for s in steps] == [["a"], ["b"], ["a"], ["b"]]
    engine.suspend("b")
    engine.start(_spec("c", prompt=list(range(300, 308))))  # b's server is the emptier one now
    engine.start(_spec("b", output=[1, 2], prompt=list(range(200, 208))))
    resumed = [engine.step() for _ in range(4)]  # both land 22 ms on, after a's server's third step has begun
    assert [sorted(s.started) for s in resumed] == [[], [], [], ["b", "c"]]
    info = resumed[3].started["b"]
    assert (info.context_tokens, info.cached_tokens) == (10, 8)  # its server kept its blocks in the prefix cache


def test_a_lone_request_through_the_server_loop_responds_later_by_the_overhead_and_the_delay():
    """One robot, nothing else running: every step is the embedded simulator's, the first token comes
    request_overhead + token_delay later, and so does the robot's first action (its warm-up goes through the same
    path, so the prompt is cached in both)."""
    from timely_llm.plan.robot_file import load_skill_models
    from timely_llm.traces import load_catalog
    from timely_llm_bench.evaluation.harness import EngineSetup, run_bench
    from timely_llm_bench.workloads.generator import Workload, WorkloadRequest

    skills, catalog = load_skill_models(), load_catalog()
    embedded = load_profile("cpu-2core-smollm2-135m")
    remote = replace(embedded, name="cpu-remote", http=HTTP)
    request = WorkloadRequest("r0", 1.0, "agent-01", 6, NORMAL_TUF)
    workload = Workload("one", 0.008, (request,))
    responses = [run_bench(workload, "timelyllm", EngineSetup.simulator(p), skills, catalog)["requests"][0]
                 for p in (embedded, remote)]
    assert [r["status"] for r in responses] == ["succeeded", "succeeded"]
    delta = responses[1]["response_time"] - responses[0]["response_time"]
    assert delta == pytest.approx(HTTP["request_overhead"] + HTTP["token_delay"], abs=1e-9)
