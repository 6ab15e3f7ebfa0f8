"""The real default model (SmolLM2-135M-Instruct on vLLM CPU) generating plans in the robots' grammars.

Greedy decoding, short plans. Segmented generation (suspend after every segment, resume
from the token ids) must produce the very tokens of a straight generation, and a
generation resumed at any statement boundary, inside open blocks too, must continue in
the grammar where it stopped.
"""

from __future__ import annotations

import pytest
from guards import bounded

from timely_llm.engines.base import GenerationSpec
from timely_llm.plan.grammar import plan_grammar
from timely_llm.plan.robot_file import load_skill_models
from timely_llm.planning import generate_plan, task_prompt
from timely_llm.traces import load_catalog

pytestmark = pytest.mark.vllm

MAX_TOKENS = 40
MODELS = load_skill_models()
CATALOG = load_catalog()
TASKS = [
    ("tello", "Scene: [], Task: [A] Could you find the cat? If so, go to it."),
    ("tello", "Scene: [chair_1], Task: [A] Turn around, then fly up 50 cm and take a picture."),
    ("arm", "Scene: [cup, sink], Task: Put the cup in the sink."),
]


@pytest.fixture(scope="module")
def engine():
    from timely_llm.engines.vllm_engine import VllmEngine

    eng = VllmEngine("smollm2", max_model_len=2048, kv_cache_gib=0.25)
    yield eng
    eng.close()


def run_to_end(engine, spec: GenerationSpec) -> tuple[list[int], str]:
    """All output ids (``spec.output_ids`` included) and why generation ended."""
    engine.start(spec)
    for _ in bounded():
        out = engine.step()
        assert spec.gen_id not in out.failed, out.failed
        if spec.gen_id in out.finished:
            break
    ids = engine.output_ids(spec.gen_id)
    engine.release(spec.gen_id)
    return ids, out.finished[spec.gen_id]


@pytest.mark.parametrize("robot,task", TASKS)
def test_segmented_plan_equals_straight_plan_and_every_segment_is_executable(engine, robot: str, task: str) -> None:
    model = MODELS[robot]
    grammar = plan_grammar(model)
    straight = generate_plan(engine, model, task, segmented=False, max_new_tokens=MAX_TOKENS)
    segmented = generate_plan(engine, model, task, segmented=True, max_new_tokens=MAX_TOKENS)
    assert segmented.output_ids == straight.output_ids
    assert segmented.text == straight.text
    assert segmented.status == "succeeded", segmented.reason
    assert grammar.accepts(segmented.text), segmented.text
    assert len(segmented.segments) > 1, segmented.text
    done = ""
    for segment in segmented.segments:
        done += segment.text
        assert grammar.accepts_prefix(done), done
        assert {c.name for c in segment.calls} <= set(model.skills)
    assert all(s.calls for s in segmented.segments[:-1])


def test_resumed_at_every_statement_boundary_the_model_continues_with_the_same_tokens(engine) -> None:
    robot, task = TASKS[0]
    grammar = plan_grammar(MODELS[robot])
    prompt = engine.tokenizer.encode(task_prompt(CATALOG, robot, task))
    straight, _ = run_to_end(engine, GenerationSpec("straight", prompt, max_new_tokens=MAX_TOKENS, grammar=grammar))
    cuts = [k for k in range(1, len(straight)) if engine.tokenizer.decode(straight[:k])[-1:] in (";", "{", "}")]
    assert cuts, engine.tokenizer.decode(straight)
    for k in cuts:
        resumed, _ = run_to_end(engine, GenerationSpec(f"resume-{k}", prompt, list(straight[:k]),
                                                    max_new_tokens=MAX_TOKENS, grammar=grammar))
        assert resumed == straight, (engine.tokenizer.decode(straight[:k]), engine.tokenizer.decode(resumed))


@pytest.mark.parametrize("opened", ["?iv('cat')==True{", "3{?s('cup')==True{g('cup');"])
def test_a_generation_resumed_inside_open_blocks_closes_them(engine, opened: str) -> None:
    """Resumed from text that leaves blocks open, the model must finish them (it could not,
    were the resumed request constrained from the start symbol: no top-level '}')."""
    grammar = plan_grammar(MODELS["tello"])
    prompt = engine.tokenizer.encode(task_prompt(CATALOG, *TASKS[0]))
    prefix = engine.tokenizer.encode(opened)  # no BOS: SmolLM2's tokenizer adds none
    assert engine.tokenizer.decode(prefix) == opened
    ids, reason = run_to_end(engine, GenerationSpec("open", prompt, prefix, max_new_tokens=2 * MAX_TOKENS,
                                                    grammar=grammar))
    text = engine.tokenizer.decode(ids)
    assert text.startswith(opened)
    assert grammar.accepts_prefix(text), text
    closed = closing_position(text)
    assert closed is not None, text  # block lengths are bounded: the model had to close them in its budget
    assert grammar.complete_after(text[:closed]), text
    assert reason == "length" or grammar.accepts(text), text


def closing_position(text: str) -> int | None:
    """Where the blocks open at the start of ``text`` are all closed (quotes skipped)."""
    depth, quoted = 0, False
    for i, ch in enumerate(text):
        quoted = quoted != (ch == "'")
        if not quoted and ch in "{}":
            depth += 1 if ch == "{" else -1
            if depth == 0:
                return i + 1
    return None


def test_without_the_grammar_the_model_is_not_held_to_skills(engine) -> None:
    """The constraint is what makes the plans executable: decoding freely, this model
    writes text outside the drone's grammar for the same prompt (it continues the examples)."""
    robot, task = TASKS[0]
    free = generate_plan(engine, MODELS[robot], task, constrained=False, max_new_tokens=MAX_TOKENS)
    constrained = generate_plan(engine, MODELS[robot], task, max_new_tokens=MAX_TOKENS)
    assert not plan_grammar(MODELS[robot]).accepts(free.text), free.text
    assert plan_grammar(MODELS[robot]).accepts(constrained.text)
