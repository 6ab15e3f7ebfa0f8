"""A blocking call on the embedded vLLM engine (SmolLM2: the tiny random model cannot write a plan in a
grammar of skill names): the robot's value is forced into the context
exactly, the grammar-constrained plan goes on after it, and the resume, its KV kept in place, prefills only
the observation and the call's last token."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from looker_robot import LOOKER

from timely_llm.clock import VirtualClock
from timely_llm.core.request import Outcome, Request, Segment, Status
from timely_llm.core.tuf import NORMAL_TUF
from timely_llm.engines.base import GenerationSpec, ResumeInfo
from timely_llm.engines.vllm_engine import VllmEngine
from timely_llm.plan.grammar import plan_grammar
from timely_llm.plan.robot_file import load_skill_model
from timely_llm.server import PlanRequest, Server
from timely_llm.serving import Driver, ServerConfig, build_server

pytestmark = pytest.mark.vllm

VALUE = "on the shelf by the window"


@pytest.fixture(scope="module")
def engine() -> Iterator[VllmEngine]:
    eng = VllmEngine("smollm2", max_model_len=2048, kv_cache_gib=0.25, max_batch=4)
    yield eng
    eng.close()


def test_the_value_is_forced_into_the_context_and_the_plan_grammar_goes_on_after_it(
        engine: VllmEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    starts: list[GenerationSpec] = []
    start = engine.start
    monkeypatch.setattr(engine, "start", lambda spec: (starts.append(spec), start(spec))[1])
    path = tmp_path / "looker.yaml"
    path.write_text(yaml.safe_dump(LOOKER))
    robot = load_skill_model(path)
    clock = VirtualClock()
    driver = Driver(clock)
    seen: dict[str, object] = {}
    ended: list[Outcome] = []

    def on_segment(request: Request, segment: Segment) -> None:
        if segment.waits_for is None:
            driver.at(clock.now() + 0.01, lambda s: s.segment_done(request.id, segment.index, clock.now(), clock.now()))
            return

        def report(server: Server) -> None:
            seen.setdefault("ids_at_report", engine.output_ids(request.id))
            seen.setdefault("reported_at", clock.now())
            server.segment_done(request.id, segment.index, clock.now(), clock.now(), result=VALUE)
        driver.at(clock.now() + 1.0, report)

    server = build_server(ServerConfig("timelyllm", 0.0), engine, {"looker": robot}, clock, on_segment=on_segment,
                          on_finish=lambda r: ended.append(Outcome.of(r)))
    prompt = engine.tokenizer.encode(robot.prompt_text("Find the keys, then the wallet."))
    driver.arrive(PlanRequest("r", "a", "looker", prompt, NORMAL_TUF, max_new_tokens=24, arrival=0.0))
    driver.run(server)

    outcome = ended[0]
    assert outcome.status is Status.SUCCEEDED, outcome.reason
    first, observation = outcome.segments[0], f" # {VALUE}\n"
    assert first.waits_for is not None and first.observation == observation
    # nothing was generated past the blocking call before the report
    assert engine.tokenizer.decode(seen["ids_at_report"]).endswith(first.text)
    assert all(s.gen_start >= seen["reported_at"] for s in outcome.segments[1:])
    # the resume's context holds the observation's exact ids right after the call, marked as not sampled
    obs_ids = engine.tokenizer.encode_continuation(observation)
    resume = next(spec for spec in starts if spec.observed)  # the first start after the report
    at = len(seen["ids_at_report"])
    assert resume.output_ids == [*seen["ids_at_report"], *obs_ids] and resume.observed == ((at, at + len(obs_ids)),)
    assert outcome.plan.startswith(first.text + observation)
    # the plan the model wrote around it is one of the robot's grammar
    assert plan_grammar(robot).accepts("".join(s.text for s in outcome.segments))
    # the paused request went on in place: it prefilled the observation and the call's last token only
    assert first.resume_prefill == len(obs_ids) + 1


def _decode(engine: VllmEngine, gen_id: str, n: int) -> tuple[list[int], ResumeInfo | None]:
    """Step until ``gen_id`` has ``n`` more tokens (or ends); its tokens and how its start found its context."""
    tokens: list[int] = []
    info = None
    for _ in range(4 * n):
        out = engine.step()
        info = info or out.started.get(gen_id)
        tokens += out.new_tokens.get(gen_id, [])
        if len(tokens) >= n or gen_id in out.finished:
            break
    return tokens[:n], info


def _observe_in_place(engine: VllmEngine, spec: GenerationSpec, observation: str) -> tuple[list[int], list[int]]:
    """Decode ``spec`` 8 tokens, pause it, resume it with ``observation`` after them; return those 8 and the
    observation's ids, the resumed spec being started."""
    engine.start(spec)
    before, _ = _decode(engine, spec.gen_id, 8)
    engine.suspend(spec.gen_id)
    engine.step()
    obs = engine.tokenizer.encode_continuation(observation)
    engine.start(GenerationSpec(spec.gen_id, spec.prompt_ids, before + obs, spec.max_new_tokens, spec.forced_ids,
                                observed=((len(before), len(before) + len(obs)),)))
    return before, obs


def test_an_observation_appended_in_place_decodes_as_a_fresh_start_of_the_same_context(engine: VllmEngine) -> None:
    prompt = engine.tokenizer.encode("A kitchen robot's skills, one per line:\n1.")
    before, obs = _observe_in_place(engine, GenerationSpec("held", prompt, max_new_tokens=40), " # a red cup\n")
    after, info = _decode(engine, "held", 10)
    engine.release("held")
    assert info is not None and info.context_tokens - info.cached_tokens == len(obs) + 1
    engine.start(GenerationSpec("fresh", prompt + before + obs, max_new_tokens=10))
    fresh, _ = _decode(engine, "fresh", 10)
    engine.release("fresh")
    assert len(after) == 10 and after == fresh  # greedy: the kept KV and ids are the context's own


def test_a_forced_plan_goes_on_with_its_tail_after_an_observation_appended_in_place(engine: VllmEngine) -> None:
    prompt = engine.tokenizer.encode("Plan:")
    plan = engine.tokenizer.encode_continuation(" look_for('cup'); pick('cup'); place('cup', 'tray'); done();")
    before, obs = _observe_in_place(engine, GenerationSpec("forced", prompt, max_new_tokens=40, forced_ids=plan),
                                    " # here\n")
    after, info = _decode(engine, "forced", len(plan))
    engine.release("forced")
    assert before == plan[:8] and after[: len(plan) - 8] == plan[8:]
    assert info is not None and info.context_tokens - info.cached_tokens == len(obs) + 1
