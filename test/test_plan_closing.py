"""A plan cut short by its token budget dispatches only what the model wrote (issue 24, item 5).

Every truncation point of every LRTrace plan and of plans drawn at random from the robots'
grammars goes through the server's own dispatch path: the simulator (steps of zero time)
replays the plan with a token budget that ends it there, the segmenter cuts what streams out
and ``PlanGrammar.close`` ends it. The skill calls dispatched must be a prefix of the plan's,
and the dispatched plan must parse in the grammar, except where only braces could close a
block whose header was dispatched already (the robot has run that header: no more).
"""

from __future__ import annotations

import random

import pytest

from timely_llm.clock import VirtualClock
from timely_llm.core.tuf import TUF
from timely_llm.engines.hardware import load_profile
from timely_llm.engines.sim import SimEngine, zero_time
from timely_llm.engines.sim_tokenizer import SimTokenizer
from timely_llm.plan.grammar import plan_grammar
from timely_llm.plan.regex import EPS, INF, Alt, Cat, Chars, Regex, Repeat, derive_text, forced_text, render
from timely_llm.plan.robot_file import load_skill_models
from timely_llm.plan.segmenter import AHEAD_LIMIT
from timely_llm.plan.skills import SkillCall, SkillModel
from timely_llm.server import PlanRequest
from timely_llm.serving import ServerConfig, build_server
from timely_llm.traces import load_catalog
from timely_llm_robot.executors.minispec import parse

MODELS = load_skill_models()
CATALOG = load_catalog()
GENERATED_PER_ROBOT = 100


def sample(r: Regex, rng: random.Random) -> str:
    """A random string of ``r``'s language (repetitions kept short)."""
    if r is EPS:
        return ""
    if isinstance(r, Chars):
        assert not r.negated
        return rng.choice(sorted(r.chars))
    if isinstance(r, Cat):
        return "".join(sample(p, rng) for p in r.parts)
    if isinstance(r, Alt):
        return sample(rng.choice(sorted(r.options, key=render)), rng)  # sorted: the same draw in every run
    assert isinstance(r, Repeat)
    high = r.low + 2 if r.high == INF else min(r.high, r.low + 2)
    return "".join(sample(r.inner, rng) for _ in range(rng.randint(r.low, high)))


def generated_plans(robot: str, count: int) -> list[str]:
    """``count`` random plans, each calling a skill where the robot has skills."""
    model = MODELS[robot]
    rng = random.Random(f"closing-{robot}")
    drawn: list[str] = []
    while len(drawn) < count:
        plan = sample(plan_grammar(model).root, rng)
        if model.find_calls(plan) or not model.skills:
            drawn.append(plan)
    return drawn


def plans(robot: str) -> list[str]:
    return [t.plan for t in CATALOG.traces.values() if t.robot == robot] + generated_plans(robot, GENERATED_PER_ROBOT)


def replay_every_prefix(model: SkillModel, plan_ids: list[int], tokenizer: SimTokenizer,
                        policy: str) -> dict[int, list[str]]:
    """The segments dispatched when the plan is generated with each budget 1..len(plan_ids) (all at once)."""
    engine = SimEngine(zero_time(load_profile("rtx4090-llama3-8b")), tokenizer)
    segments: dict[str, list[str]] = {}
    reports: list[tuple[str, int, SkillCall | None]] = []
    finished: list[str] = []

    def dispatched(request, segment) -> None:
        segments[request.id].append(segment.text)
        reports.append((request.id, segment.index, segment.waits_for))

    server = build_server(ServerConfig(policy, 0.0), engine, {model.robot: model}, VirtualClock(),
                          on_segment=dispatched, on_finish=lambda r: finished.append(r.id))
    prompt = tokenizer.encode("Plan: ")
    for budget in range(1, len(plan_ids) + 1):
        segments[str(budget)] = []
        server.submit(PlanRequest(str(budget), "test", model.robot, prompt, TUF(1.0, -2.0, 1.0),
                                  max_new_tokens=budget, forced_ids=plan_ids))
    while len(finished) < len(plan_ids):
        assert server.step() or reports, "the server stalled"
        while reports:  # robots execute instantly, answering a blocking call (the arm's scan)
            rid, index, waits_for = reports.pop(0)
            server.segment_done(rid, index, 0.0, 0.0, result=None if waits_for is None else "true")
    return {int(k): v for k, v in segments.items()}


def check_dispatched(model: SkillModel, plan: str, segments: list[str]) -> bool:
    """Calls a prefix of the plan's and the plan grammatical; True where a dispatched header was closed empty."""
    grammar = plan_grammar(model)
    text = "".join(segments)
    calls: list[SkillCall] = [c for s in segments for c in model.find_calls(s)]
    assert calls == model.find_calls(plan)[:len(calls)], (plan, segments)
    if model.language == "sentence":
        text = text.rstrip()  # a sentence's segment takes the space after it along
    if not text.strip() or grammar.accepts(text):
        return False
    done, last = "".join(segments[:-1]), segments[-1]
    assert done.endswith("{") and set(last) == {"}"} and grammar.accepts_prefix(done), (plan, segments)
    parse(text)  # the robot's interpreter runs it
    return True


@pytest.mark.parametrize("robot", ["tello", "arm", "chatbot"])
@pytest.mark.parametrize("policy", ["timelyllm", "vllm"])
def test_every_truncation_dispatches_only_calls_the_plan_holds(robot: str, policy: str) -> None:
    model = MODELS[robot]
    grammar = plan_grammar(model)
    tokenizer = SimTokenizer()
    checked = closed_empty = 0
    for plan in plans(robot):
        assert grammar.accepts(plan), plan
        token_ids = tokenizer.encode(plan)
        char_ids = [i for ch in plan for i in tokenizer.encode(ch)]  # one token per character
        assert tokenizer.decode(token_ids) == tokenizer.decode(char_ids) == plan
        for ids in (token_ids, char_ids):
            outcome = replay_every_prefix(model, ids, tokenizer, policy)
            assert "".join(outcome[len(ids)]) == plan  # the whole plan goes out as generated
            for budget in range(1, len(ids) + 1):
                closed_empty += check_dispatched(model, plan, outcome[budget])
                checked += 1
    assert checked > 1000
    if robot != "tello":
        assert closed_empty == 0  # no blocks



@pytest.mark.parametrize("replayed", [False, True])
def test_only_a_generation_bound_to_the_grammar_is_cut_before_a_forced_ending(replayed: bool) -> None:
    # 'mb' '(' '80': nothing but ');' may follow a move of 20..500 cm. A replay goes out as recorded.
    tokenizer, model = SimTokenizer(), MODELS["tello"]
    ids = tokenizer.encode_continuation("mb(80);mu(60);")
    plan = PlanRequest("r", "test", model.robot, tokenizer.encode("Plan: "), TUF(1.0, -2.0, 1.0),
                       forced_ids=ids if replayed else None)
    request = plan.request(model, 0.0, 64, tokenizer.decode, streaming=True)
    assert request.stream is not None
    cuts = []
    for count, token in enumerate(ids, 1):
        request.output_ids.append(token)
        pieces, _ = request.stream.push(request, [token], finished=False)
        cuts += [(piece, count) for piece in pieces]
    assert cuts == ([("mb(80);", 4), ("mu(60);", 8)] if replayed else [("mb(80);", 3), ("mu(60);", 7)])


@pytest.mark.parametrize("robot", ["tello", "arm"])  # a sentence's end is never forced
def test_an_ending_the_grammar_forces_is_what_every_plan_writes_there(robot: str) -> None:
    root = plan_grammar(MODELS[robot]).root
    forced = 0
    for plan in plans(robot):
        for cut in range(len(plan)):
            ending = forced_text(derive_text(root, plan[:cut]), AHEAD_LIMIT)
            assert plan[cut:].startswith(ending), (plan, cut, ending)
            forced += bool(ending)
    assert forced > 0
