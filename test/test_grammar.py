"""Plan grammars from the skill models, and their continuations for resumed generations.

The continuation grammars are checked with xgrammar, the backend vLLM compiles them
with, not only with our own derivative code.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import xgrammar as xgr

from timely_llm.plan.grammar import plan_grammar
from timely_llm.plan.regex import int_range, matches, render
from timely_llm.plan.robot_file import load_skill_model, load_skill_models, skill_model_dir
from timely_llm.plan.segmenter import Segmenter
from timely_llm.traces import load_catalog

MODELS = load_skill_models()
CATALOG = load_catalog()
NESTED_PLANS = [
    "4{?iv('cup')==True{g('cup');->True}tc(90);}",
    "?s('bottle')==True{_2=oh('bottle');l(_2);};mu(50);",
    "_1=sa('something to sit on');?_1!=False{g(_1);tp;}",
    "3{?od('door')<120&iv('door')==True{mf(100);}ml(40);}l('done');",
    " tc(180);?s('chair')==True{g('chair');}",
]
_COMPILER = xgr.GrammarCompiler(xgr.TokenizerInfo([]), cache_enabled=False)


def xgrammar_accepts(ebnf: str, text: str) -> bool:
    """Whether xgrammar, compiling ``ebnf`` as vLLM does, accepts exactly ``text``."""
    matcher = xgr.GrammarMatcher(_COMPILER.compile_grammar(ebnf), terminate_without_stop_token=True)
    return matcher.accept_string(text) and matcher.is_completed()


def drone_plans() -> list[str]:
    return [t.plan for t in CATALOG.traces.values() if t.robot == "tello"] + NESTED_PLANS


def boundaries(plan: str) -> list[int]:
    """Every statement boundary: after each ';', '{' and '}' outside quotes."""
    cuts, quoted = [], False
    for i, ch in enumerate(plan):
        quoted = quoted != (ch == "'")
        if not quoted and ch in ";{}":
            cuts.append(i + 1)
    return cuts


def test_int_ranges_hold_exactly_their_numbers() -> None:
    for low, high in [(20, 500), (1, 360), (0, 9999), (2, 10), (7, 7)]:
        r = int_range(low, high)
        assert all(matches(r, str(n)) == (low <= n <= high) for n in range(0, 12000)), render(r)
        assert not matches(r, "0" + str(high))  # no leading zeros


def test_lrtrace_plans_are_in_their_robots_grammar() -> None:
    for trace in CATALOG.traces.values():
        grammar = plan_grammar(MODELS[trace.robot])
        assert grammar.accepts(trace.plan), trace.id
        assert xgrammar_accepts(grammar.continuation(""), trace.plan), trace.id


@pytest.mark.parametrize("robot,plan", [
    ("tello", "mf(10);"),  # below the Tello's 20 cm
    ("tello", "tc(400);"),
    ("tello", "zz(50);"),  # no such skill
    ("tello", "?mf(50)==True{g('cat');}"),  # an action has no value to test
    ("tello", "g(50);"),  # goto takes an object name
    ("tello", "?iv('cat')==True{g('cat');"),  # block never closed
    ("tello", "mf(50)"),  # statement never ended
    ("arm", "pick(3);"),
    ("arm", "pick(_1);"),  # an arm plan has no variables
    ("arm", "fly('cup');"),
    ("chatbot", "hello there."),
])
def test_plans_outside_the_grammar_are_rejected(robot: str, plan: str) -> None:
    grammar = plan_grammar(MODELS[robot])
    assert not grammar.accepts(plan)
    assert not xgrammar_accepts(grammar.continuation(""), plan)


def test_adding_a_skill_to_the_yaml_extends_the_grammar(tmp_path: Path) -> None:
    source = (skill_model_dir() / "tello.yaml").read_text()
    extended = tmp_path / "tello.yaml"
    extended.write_text(source + "  - {abbr: fl, name: flip, args: [{direction: name}], time: {fixed: 1.0},\n"
                        "     description: flip towards a direction}\n")
    plan = "?iv('gap')==True{fl('left');}"
    assert not plan_grammar(MODELS["tello"]).accepts(plan)
    grammar = plan_grammar(load_skill_model(extended))
    assert grammar.accepts(plan)
    assert xgrammar_accepts(grammar.continuation(""), plan)


@pytest.mark.parametrize("plan", drone_plans())
def test_a_resumed_generation_continues_where_it_stopped(plan: str) -> None:
    """Cut at every statement boundary: the continuation grammar accepts exactly the rest,
    and inside an open block the start symbol would not (so resuming from it would be wrong)."""
    grammar = plan_grammar(MODELS["tello"])
    for cut in boundaries(plan):
        head, rest = plan[:cut], plan[cut:]
        continuation = grammar.continuation(head)
        assert xgrammar_accepts(continuation, rest), (head, rest)
        assert not xgrammar_accepts(continuation, rest + "}")
        if head.count("{") > head.count("}"):
            assert not grammar.accepts(rest), (head, rest)


def test_continuations_mid_statement_match_the_whole_grammar() -> None:
    """A token may run past a boundary (``;}``, ``);?``): resumption can start anywhere."""
    grammar = plan_grammar(MODELS["tello"])
    plan = NESTED_PLANS[3]
    for cut in range(len(plan) + 1):
        assert xgrammar_accepts(grammar.continuation(plan[:cut]), plan[cut:]), plan[:cut]
    assert grammar.continuation(plan[:5] + "X") is None


def test_arm_and_chatbot_continuations() -> None:
    arm = plan_grammar(MODELS["arm"])
    plan = CATALOG[9].plan
    for cut in boundaries(plan):
        assert xgrammar_accepts(arm.continuation(plan[:cut]), plan[cut:])
    chat = plan_grammar(MODELS["chatbot"])
    text = "The cup is on the shelf. I can bring it, if you like!"
    assert chat.accepts(text)
    assert xgrammar_accepts(chat.continuation(text[:25]), text[25:])


@pytest.mark.parametrize("plan", drone_plans())
def test_every_segment_the_stop_checker_cuts_parses_and_names_known_skills(plan: str) -> None:
    model = MODELS["tello"]
    grammar = plan_grammar(model)
    rng = random.Random(plan)
    segmenter, segments, i = Segmenter(model), [], 0
    while i < len(plan):  # text arrives in chunks of 1-4 characters, as tokens do
        step = rng.randint(1, 4)
        segments += segmenter.feed(plan[i:i + step])
        i += step
    segments.append(segmenter.flush())
    assert "".join(segments) == plan
    done = ""
    for segment in segments[:-1]:
        assert segment[-1] in ";{}", segment
        assert grammar.accepts_prefix(done + segment), segment
        names = [c.name for c in model.find_calls(segment)]
        assert names and set(names) <= set(model.skills), segment
        done += segment
    assert grammar.accepts(done + segments[-1])


@pytest.mark.parametrize("head,last", [
    ("?iv('cat')==True{g('cat');mf(5", "}"),  # partial statement dropped, block closed
    ("4{?iv('cup')==True{g('cup');}tc(9", "}}"),
    ("mf(50);_1=p('is it", ""),
    ("mf(50);5{tc(90);mu(", "}"),
    ("mf(50);5{mu(", ""),  # a block without a complete statement is dropped, not filled with a made-up one
    ("mf(50);5{_1=p('You are not allowed", ""),  # the plan reached its robot as '5{tp;}'
])
def test_a_plan_cut_short_is_closed_into_a_runnable_plan(head: str, last: str) -> None:
    model = MODELS["tello"]
    grammar = plan_grammar(model)
    segmenter = Segmenter(model)
    done = "".join(segmenter.feed(head))
    closed = grammar.close(done, segmenter.flush())
    assert closed == last
    assert grammar.accepts(done + closed)


def test_a_block_whose_header_was_dispatched_is_closed_empty_not_filled() -> None:
    """The robot ran the header (its condition) already; closing it may only add braces."""
    model = MODELS["tello"]
    segmenter = Segmenter(model)
    done = "".join(segmenter.feed("mf(50);4{?iv('cup')==True{g('c"))
    assert done == "mf(50);4{?iv('cup')==True{"
    assert plan_grammar(model).close(done, segmenter.flush()) == "}}"


def test_a_quoted_argument_closes_at_its_robot_files_bound(tmp_path: Path) -> None:
    """A model repeating itself inside a string (SmolLM2 on the remote engine: 48 tokens of one ``p('...``) must
    close the quote at the argument's bound, not spend the segment's token budget."""
    tello = plan_grammar(MODELS["tello"])
    question = "is it a cat, " * 30  # 390 characters: longer than every bound below
    at_bound, past = f"_1=p('{question[:64]}');", f"_1=p('{question[:65]}');"  # text: 64
    assert tello.accepts(at_bound) and not tello.accepts(past)
    assert xgrammar_accepts(tello.continuation(""), at_bound)
    assert not xgrammar_accepts(tello.continuation(""), past)
    assert not xgrammar_accepts(tello.continuation(past[:70]), "a');")  # only the closing quote may follow
    assert xgrammar_accepts(tello.continuation(past[:70]), "');")
    assert not tello.accepts(f"g('{'a' * 33}');") and tello.accepts(f"g('{'a' * 32}');")  # name: 32
    extended = tmp_path / "tello.yaml"
    extended.write_text((skill_model_dir() / "tello.yaml").read_text()
                        + "  - {abbr: sy, name: say, args: [{line: text ..300}, {voice: name ..8}], time: {fixed: 1.0},"
                          "\n     description: say a line}\n")
    grammar = plan_grammar(load_skill_model(extended))
    for plan, accepted in ((f"sy('{question[:300]}','soft');", True), (f"sy('{question[:301]}','soft');", False),
                           ("sy('hi','whispers_');", False), ("sy('hi','whispers');", True)):
        assert grammar.accepts(plan) == accepted == xgrammar_accepts(grammar.continuation(""), plan), plan
