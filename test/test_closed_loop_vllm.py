"""A blocking call on the embedded vLLM engine (SmolLM2: the tiny random model cannot write a plan in a
grammar of skill names): the robot's value is forced into the context
exactly, the grammar-constrained plan goes on after it, and the resume prefills only the observation and
the partial block."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from looker_robot import LOOKER

from timely_llm.clock import VirtualClock
from timely_llm.core.grammar import plan_grammar
from timely_llm.core.request import Outcome, Request, Segment, Status
from timely_llm.core.skills import load_skill_model
from timely_llm.core.tuf import NORMAL_TUF
from timely_llm.engines.base import GenerationSpec
from timely_llm.engines.vllm_engine import VllmEngine
from timely_llm.server import POLICIES, PlanRequest, Server
from timely_llm.serving import Driver

pytestmark = pytest.mark.vllm

VALUE = "on the shelf by the window"


@pytest.fixture(scope="module")
def engine() -> Iterator[VllmEngine]:
    eng = VllmEngine("smollm2", max_model_len=2048, kv_cache_gib=0.25, max_num_seqs=4)
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

    server = Server(engine, {"looker": robot}, POLICIES["timelyllm"], clock, 0.0, None, on_segment=on_segment,
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
    # vLLM's cache report: the resume prefilled the observation and at most the partial block before it
    assert len(obs_ids) <= first.resume_prefill <= len(obs_ids) + engine.block_size
