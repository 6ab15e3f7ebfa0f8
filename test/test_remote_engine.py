"""The remote engine (engines/remote.py): against a tiny HTTP server written here that misbehaves on purpose
(down, garbage, silent, failing then back), and against real ``vllm serve`` processes (marker ``remote``):
plans in the grammar segment by segment, a wrong key, placement over two servers, sticky resumes, one killed.

The engine contract itself runs on a real server in test_engine_contract.py.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from guards import bounded, wait_until
from remote_servers import API_KEY, API_KEY_ENV, free_tcp_port, settings

from timely_llm.engines.base import EngineRejected, GenerationSpec, StepOutput, most_cached
from timely_llm.engines.remote import SILENT_SHARE, RemoteEngine
from timely_llm.engines.remote_servers import base_url
from timely_llm.engines.remote_settings import RemoteSettings
from timely_llm.plan.grammar import plan_grammar
from timely_llm.plan.robot_file import load_skill_models
from timely_llm.planning import generate_plan

STEP_BOUND_S = 2.0
"""A step returns within this even when no server sends anything (it waits STEP_WAIT_S): generous for a
loaded machine, far below the servers' silence in these tests."""
SERVER_PATIENCE_S = 300.0
"""How long a real server may take for what a test waits for (a loaded 2-core CPU may give 1 token/s)."""
MODELS = load_skill_models()


# ----- a tiny OpenAI-compatible server that misbehaves on demand -----

@dataclass
class Fake:
    mode: str = "ok"
    """ok (three tokens, then length), garbage, silent (headers, then nothing), error (HTTP 500)."""
    healthy: bool = True
    silence_s: float = 3.0
    """How long a silent completion holds its stream open."""
    authorizations: list[str] = field(default_factory=list)
    completions: int = 0


def _handler(fake: Fake) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def _send(self, code: int, body: bytes, kind: str = "application/json") -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            fake.authorizations.append(self.headers.get("Authorization", ""))
            if self.path == "/v1/models":
                self._send(200, json.dumps({"data": [{"id": "fake", "max_model_len": 512}]}).encode())
            elif self.path == "/version":
                self._send(200, b'{"version": "0.32.0"}')
            elif self.path == "/health":
                self._send(200 if fake.healthy else 503, b"")
            else:
                self._send(404, b"{}")

        def do_POST(self) -> None:  # noqa: N802
            fake.authorizations.append(self.headers.get("Authorization", ""))
            self.rfile.read(int(self.headers["Content-Length"]))
            fake.completions += 1
            if fake.mode == "error":
                self._send(500, b'{"error": {"message": "out of memory"}}')
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            if fake.mode == "garbage":
                self.wfile.write(b"data: {this is not json\n\n")
            elif fake.mode == "silent":
                self.wfile.flush()
                time.sleep(fake.silence_s)
            else:
                for i, finish in ((5, None), (6, None), (7, "length")):
                    chunk = {"choices": [{"index": 0, "text": "x", "token_ids": [i], "finish_reason": finish}]}
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                self.wfile.write(b"data: [DONE]\n\n")
            self.close_connection = True

    return Handler


@contextlib.contextmanager
def _serving(state: Fake) -> Iterator[str]:
    """The fake server answering as ``state`` says, at the URL yielded."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def fake() -> Iterator[tuple[Fake, str]]:
    state = Fake()
    with _serving(state) as url:
        yield state, url


@pytest.fixture
def key(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(API_KEY_ENV, API_KEY)
    return API_KEY


def steps_until(engine: RemoteEngine, gen_id: str, timeout_s: float = 30.0) -> StepOutput:
    """Step until ``gen_id`` ends (finished or failed); every step returns within STEP_BOUND_S."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        began = time.monotonic()
        out = engine.step()
        assert time.monotonic() - began < STEP_BOUND_S
        if gen_id in out.finished or gen_id in out.failed:
            return out
    raise AssertionError(f"{gen_id} did not end within {timeout_s} s")


def patience(seconds: float) -> Iterator[None]:
    """Loop guard by time: the engine's steps return within STEP_BOUND_S whether or not a token came."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        yield
    raise AssertionError(f"still waiting after {seconds} s")


# ----- settings -----

def test_settings_take_one_url_or_several_and_name_an_unknown_one() -> None:
    one = RemoteSettings.parse({"remote.url": "http://a:1/v1"})
    assert one.url == ("http://a:1/v1",) and one.max_num_seqs == 256 and one.api == "auto"
    assert RemoteSettings.parse({"url": "http://a:1/v1, http://b:2/v1"}).url == ("http://a:1/v1", "http://b:2/v1")
    assert RemoteSettings.parse({"url": ["http://a:1", "http://b:2"], "timeout": "5"}).timeout == 5.0
    with pytest.raises(ValueError, match=r"^remote.no_such: no such setting"):
        RemoteSettings.parse({"url": "http://a:1", "remote.no_such": 1})
    with pytest.raises(ValueError, match="remote.url: give the base URL"):
        RemoteSettings.parse({"url": ""})
    with pytest.raises(ValueError, match="remote.api must be one of"):
        RemoteSettings.parse({"url": "http://a:1", "api": "v2"})


# ----- a server that is down, misbehaves or comes back -----

def test_an_unreachable_url_fails_the_start_naming_it() -> None:
    url = f"http://127.0.0.1:{free_tcp_port()}/v1"
    with pytest.raises(RuntimeError, match=r"no remote server answers \(http://127.0.0.1:\d+: ConnectError"):
        RemoteEngine(RemoteSettings.parse({"url": url}))


def test_a_key_variable_that_is_not_set_is_named() -> None:
    with pytest.raises(ValueError, match="^remote.api_key_env: environment variable TIMELY_LLM_NO_SUCH_KEY is not set"):
        RemoteEngine(RemoteSettings.parse({"url": "http://127.0.0.1:9", "api_key_env": "TIMELY_LLM_NO_SUCH_KEY"}))


def test_the_key_is_sent_as_bearer_and_never_logged_nor_in_a_reason(fake: tuple[Fake, str], key: str,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    state, url = fake
    caplog.set_level(logging.DEBUG)
    engine = RemoteEngine(settings(url))
    try:
        engine.start(GenerationSpec("g", [1, 2, 3], max_new_tokens=3))
        assert steps_until(engine, "g").finished == {"g": "length"}
        state.mode = "error"
        engine.start(GenerationSpec("h", [1, 2, 3], max_new_tokens=3))
        reason = steps_until(engine, "h").failed["h"]
    finally:
        engine.close()
    assert state.authorizations and set(state.authorizations) == {f"Bearer {key}"}
    assert key not in reason and key not in caplog.text and key not in repr(engine._settings)


def test_garbage_and_silence_fail_only_their_generation_with_the_cause(fake: tuple[Fake, str], key: str) -> None:
    state, url = fake
    engine = RemoteEngine(settings(url, timeout=1.0))
    try:
        state.mode = "garbage"
        engine.start(GenerationSpec("garbled", [1, 2], max_new_tokens=3))
        assert "answered garbage: not JSON" in steps_until(engine, "garbled").failed["garbled"]
        state.mode = "silent"
        engine.start(GenerationSpec("silent", [1, 2], max_new_tokens=3))
        assert steps_until(engine, "silent").failed["silent"].endswith("sent nothing for 1 s")
        state.mode = "ok"  # the server was never taken out: garbage and silence are the generation's
        engine.start(GenerationSpec("fine", [1, 2], max_new_tokens=3))
        tokens = []
        for _ in bounded(2000):
            out = engine.step()
            tokens += out.new_tokens.get("fine", [])
            if "fine" in out.finished:
                break
        assert tokens == [5, 6, 7]
    finally:
        engine.close()


def test_plans_waiting_on_a_server_gone_silent_start_again_on_one_that_answers(key: str) -> None:
    quiet, answering = Fake(mode="silent", silence_s=60.0), Fake()
    with _serving(quiet) as quiet_url, _serving(answering) as answering_url:
        engine = RemoteEngine(settings(quiet_url, answering_url, timeout=8.0))  # stalled after 8 s x SILENT_SHARE
        prompt = list(range(1, 41))  # two full KV blocks, which a second plan of the same task finds cached
        try:
            for gen_id in ("first", "second"):
                engine.start(GenerationSpec(gen_id, prompt, max_new_tokens=3))
                assert engine.server_of(gen_id) == base_url(quiet_url)  # the cache wins: not stalled yet
            tokens: dict[str, list[int]] = {"first": [], "second": []}
            finished: dict[str, str] = {}
            for _ in patience(30.0):
                out = engine.step()
                assert not out.failed
                for gen_id, new in out.new_tokens.items():
                    tokens[gen_id] += new
                finished |= out.finished
                if len(finished) == 2:
                    break
            assert finished == {"first": "length", "second": "length"} and tokens["first"] == [5, 6, 7]
            assert {engine.server_of(g) for g in finished} == {base_url(answering_url)}
            assert quiet.completions == 2 and answering.completions == 2
            stalled = engine.servers()[0].silent_s
            assert stalled is not None and stalled >= 8.0 * SILENT_SHARE and engine.servers()[1].silent_s is None
            engine.start(GenerationSpec("third", prompt, max_new_tokens=3))  # its prompt is cached on the stalled one
            assert engine.server_of("third") == base_url(answering_url)
            assert steps_until(engine, "third").finished == {"third": "length"}
        finally:
            engine.close()


def test_a_failing_server_is_taken_out_and_back_when_it_answers_again(fake: tuple[Fake, str], key: str) -> None:
    state, url = fake
    engine = RemoteEngine(settings(url))
    try:
        state.mode, state.healthy = "error", False
        engine.start(GenerationSpec("a", [1, 2], max_new_tokens=3))
        assert "HTTP 500 out of memory" in steps_until(engine, "a").failed["a"]
        with pytest.raises(EngineRejected, match=r"no remote server answers \(http://127.0.0.1:\d+: HTTP 500\)"):
            engine.start(GenerationSpec("b", [1, 2], max_new_tokens=3))
        assert engine.free_kv_blocks() == 0  # a server taken out has no room
        state.mode, state.healthy = "ok", True
        wait_until(lambda: engine.free_kv_blocks() > 0, 10.0, "the server taken back")
        engine.start(GenerationSpec("b", [1, 2], max_new_tokens=3))
        assert steps_until(engine, "b").finished == {"b": "length"}
    finally:
        engine.close()


def test_a_recorded_plan_cannot_be_forced_over_http(fake: tuple[Fake, str], key: str) -> None:
    engine = RemoteEngine(settings(fake[1]))
    try:
        with pytest.raises(EngineRejected, match="cannot force-decode a recorded plan"):
            engine.start(GenerationSpec("forced", [1, 2], forced_ids=[3, 4]))
        assert engine.free_kv_blocks() == engine.kv_after([], []).free_blocks  # nothing held
    finally:
        engine.close()


# ----- real vllm serve -----

TASKS = [
    ("tello", "Scene: [chair_1], Task: [A] Turn around, then fly up 50 cm and take a picture."),
    ("arm", "Scene: [cup, sink], Task: Put the cup in the sink."),
]


@pytest.fixture(scope="module")
def remote(vllm_serve: object) -> Iterator[RemoteEngine]:
    os.environ.setdefault(API_KEY_ENV, API_KEY)
    engine = RemoteEngine(settings(vllm_serve.url))
    yield engine
    engine.close()


@pytest.mark.remote
@pytest.mark.parametrize("robot,task", TASKS)
def test_segmented_plans_over_http_equal_straight_ones_in_the_grammar(remote: RemoteEngine, robot: str,
                                                                      task: str) -> None:
    """Each segment's stream closed and the rest re-submitted (prompt + ids so far, the grammar continued)
    gives the very tokens of one straight stream."""
    straight = generate_plan(remote, MODELS[robot], task, segmented=False, max_new_tokens=40)
    segmented = generate_plan(remote, MODELS[robot], task, segmented=True, max_new_tokens=40)
    assert segmented.status == "succeeded", segmented.reason
    assert len(segmented.segments) >= 2
    assert segmented.output_ids == straight.output_ids
    assert plan_grammar(MODELS[robot]).accepts(segmented.text), segmented.text


@pytest.mark.remote
def test_a_wrong_key_fails_the_start_without_showing_it(vllm_serve: object, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(API_KEY_ENV, "not-the-key")
    with pytest.raises(RuntimeError, match="HTTP 401, the API key is missing or wrong") as raised:
        RemoteEngine(settings(vllm_serve.url))
    assert "not-the-key" not in str(raised.value)


@pytest.fixture(scope="module")
def second_serve(tmp_path_factory: pytest.TempPathFactory, vllm_serve: object) -> Iterator[object]:
    """A second vllm serve, for the two-server test alone (it kills it)."""
    from remote_servers import start_serve

    server = start_serve(tmp_path_factory.mktemp("second-serve"), "second")
    yield server
    server.close()


@pytest.mark.remote
def test_two_servers_place_by_prompt_prefix_resume_where_the_kv_is_and_one_killed_fails_only_its_own(
        vllm_serve: object, second_serve: object, key: str) -> None:
    engine = RemoteEngine(settings(vllm_serve.url, second_serve.url))
    tokenizer = engine.tokenizer
    tasks = {"tello": "Scene: [], Task: [A] Fly a square of 50 cm sides.",
             "arm": "Scene: [cup, sink], Task: Put the cup in the sink."}
    prompts = {robot: tokenizer.encode(MODELS[robot].prompt_text(task)) for robot, task in tasks.items()}
    robots = {"g0": "tello", "g1": "tello", "g2": "arm", "g3": "arm"}
    specs = {g: GenerationSpec(g, prompts[r], max_new_tokens=40, grammar=plan_grammar(MODELS[r]))
             for g, r in robots.items()}
    try:
        assert engine.max_batch == 16
        for spec in specs.values():
            engine.start(spec)
        placed = {gen_id: engine.server_of(gen_id) for gen_id in specs}
        # A robot type's second plan follows its prompt's cached blocks; the other type, cached nowhere, goes to the
        # least busy server, and its second plan follows it there.
        assert placed["g0"] == placed["g1"] != placed["g2"] == placed["g3"], placed
        killed = second_serve.url
        on_killed = sorted(g for g, url in placed.items() if url == killed)
        kept = sorted(g for g, url in placed.items() if url != killed)
        outputs: dict[str, list[int]] = {g: [] for g in specs}
        finished: dict[str, str] = {}
        # Each of these is suspended at its first token, wherever its server is (one server may stream a whole
        # plan while the other starts): its KV is then on its server.
        to_suspend, suspended = {kept[0], *on_killed}, set()
        for _ in patience(SERVER_PATIENCE_S):
            out = engine.step()
            for gen_id, tokens in out.new_tokens.items():
                outputs[gen_id] += tokens
            finished |= out.finished
            for gen_id in sorted(to_suspend - suspended - set(finished)):
                if outputs[gen_id]:
                    engine.suspend(gen_id)
                    suspended.add(gen_id)
            if suspended == to_suspend:
                break
        assert suspended == to_suspend, (suspended, finished)
        engine.start(replace(specs[kept[0]], output_ids=outputs[kept[0]]))
        assert engine.server_of(kept[0]) == placed[kept[0]]  # resumed where its KV is
        # A stream open on the server about to die: resumed just before the kill, it cannot end first.
        engine.start(replace(specs[on_killed[1]], output_ids=outputs[on_killed[1]]))

        second_serve.kill()
        failed: dict[str, str] = {}
        for _ in patience(SERVER_PATIENCE_S):
            out = engine.step()
            failed |= out.failed
            finished |= out.finished
            if len(failed) + len(set(finished) & set(kept)) == 3:
                break
        assert set(failed) == {on_killed[1]} and killed in failed[on_killed[1]], failed
        assert set(finished) == set(kept), finished  # the other server served on
        with pytest.raises(EngineRejected, match=f"its server {killed} .* is down"):
            engine.start(replace(specs[on_killed[0]], output_ids=outputs[on_killed[0]]))
        engine.start(replace(specs["g0"], gen_id="new", max_new_tokens=4))
        assert engine.server_of("new") == vllm_serve.url  # new ones go where a server answers
        assert "new" in steps_until(engine, "new", SERVER_PATIENCE_S).finished
    finally:
        engine.close()


@pytest.mark.remote
def test_an_observation_is_tokenized_as_a_continuation_alike_by_the_server_and_the_model_files(
        remote: RemoteEngine) -> None:
    """What a blocking skill's value becomes in the context (no special tokens), whichever tokenizer the remote
    engine has: the server's endpoints (the default) or ``remote.tokenizer``'s files."""
    from remote_servers import serving_python, smollm2

    from timely_llm.engines.remote_tokenizer import LocalTokenizer

    observation = " # here, at kitchen_2\n"
    ids = remote.tokenizer.encode_continuation(observation)
    assert ids == LocalTokenizer(smollm2(serving_python())[0]).encode_continuation(observation)
    assert remote.tokenizer.decode(ids) == observation


@pytest.mark.remote
def test_a_resume_finds_its_context_in_the_servers_prefix_cache_as_its_metrics_count(remote: RemoteEngine) -> None:
    """A suspension closes the stream; the resume re-submits prompt + output, and the server's own prefix-cache
    metrics count it served every full block of the context before the last token from its cache."""
    robot = MODELS["tello"]
    prompt = remote.tokenizer.encode(robot.prompt_text(f"Scene: [], Task: [A] Land after {time.time_ns()} turns."))
    spec = GenerationSpec("kv", prompt, max_new_tokens=40, grammar=plan_grammar(robot))
    before = remote.prefix_cache_counts()
    remote.start(spec)
    url = remote.server_of("kv")
    output: list[int] = []
    for _ in patience(SERVER_PATIENCE_S):
        output += remote.step().new_tokens.get("kv", [])
        if len(output) >= 3:
            break
    remote.suspend("kv")
    first = remote.prefix_cache_counts()[url] - before[url]
    assert (first.first_start_tokens, first.resumes, first.queries) == (
        most_cached(len(prompt), remote.block_size), 0, len(prompt))
    assert first.hits <= first.first_start_tokens  # no more than a vLLM prefix cache can serve a first start
    remote.start(replace(spec, output_ids=output))
    context = len(prompt) + len(output)
    wait_until(lambda: remote.prefix_cache_counts()[url].queries - before[url].queries >= 2 * len(prompt),
               SERVER_PATIENCE_S, "the resume's lookup in the server's metrics")
    resume = remote.prefix_cache_counts()[url] - before[url] - first
    assert (resume.resumes, resume.resumed_tokens, resume.queries) == (1, context - 1, context)
    assert resume.hits >= (context - 1) // remote.block_size * remote.block_size > 0
    assert resume.resumed_hits_at_least == min(resume.hits, context - 1)
    remote.release("kv")
