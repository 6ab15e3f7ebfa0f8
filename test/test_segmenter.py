"""The segmenter on plans split at awkward token boundaries."""

import itertools
import random

import pytest

from timely_llm.plan.grammar import plan_grammar
from timely_llm.plan.robot_file import load_skill_models
from timely_llm.plan.segmenter import IncrementalDetokenizer, Segmenter
from timely_llm.traces import load_catalog

MODELS = load_skill_models()


def segment(robot, pieces):
    seg = Segmenter(MODELS[robot])
    out = []
    for p in pieces:
        out.extend(seg.feed(p))
    rest = seg.flush()
    return out, rest


@pytest.mark.parametrize("plan,expected,rest", [
    ("mf(50);tc(90);", ["mf(50);", "tc(90);"], ""),
    ("?s('cat')==True{g('cat');}", ["?s('cat')==True{", "g('cat');"], "}"),
    ("mu(60);?iv('book')==True{tp;}", ["mu(60);", "?iv('book')==True{", "tp;"], "}"),
    ("4{?iv('cup')==True{g('cup');->True}tc(90);}", ["4{?iv('cup')==True{", "g('cup');", "->True}tc(90);"], "}"),
    ("l('mf(1); is not a call');", ["l('mf(1); is not a call');"], ""),
    ("_1=ox('cat');->_1;", ["_1=ox('cat');"], "->_1;"),
])
def test_minispec_segments_at_every_split(plan, expected, rest):
    # Every way of cutting the plan into two or three pieces yields the same segments.
    for i, j in itertools.combinations(range(1, len(plan)), 2):
        assert segment("tello", [plan[:i], plan[i:j], plan[j:]]) == (expected, rest), (i, j)


def test_character_by_character_and_random_chunks():
    plan = "mb(80);mu(60);d(2);mf(100);"
    expected = ["mb(80);", "mu(60);", "d(2);", "mf(100);"]
    assert segment("tello", list(plan)) == (expected, "")
    rng = random.Random(7)
    for _ in range(50):
        cuts = sorted(rng.sample(range(1, len(plan)), 5))
        pieces = [plan[a:b] for a, b in zip([0, *cuts], [*cuts, len(plan)], strict=True)]
        assert segment("tello", pieces) == (expected, "")


def test_no_segment_without_a_complete_call():
    seg = Segmenter(MODELS["tello"])
    assert seg.feed("mf(5") == []  # call not closed yet
    assert seg.feed("0") == []
    assert seg.feed(")") == []  # closed, but the statement has not ended
    assert seg.feed(";") == ["mf(50);"]
    assert seg.feed("xy(3);") == []  # not a skill of this robot


def test_arm_calls_and_chatbot_sentences():
    pieces = ["goto('red_", "box');pi", "ck('red_box');"]
    assert segment("arm", pieces) == (["goto('red_box');", "pick('red_box');"], "")
    text = "Hello there. The cup is on the left! Shall I fetch it? Yes"
    out, rest = segment("chatbot", list(text))
    assert out == ["Hello there. ", "The cup is on the left! ", "Shall I fetch it? "]
    assert rest == "Yes"


def test_incremental_detokenizer_holds_back_split_characters():
    data = "goto('café');ok".encode()
    # byte-level tokens: one byte each, so 'é' arrives in two pieces
    detok = IncrementalDetokenizer(lambda ids: bytes(ids).decode("utf-8", errors="replace"))
    out = "".join(detok.push([b]) for b in data)
    assert out == "goto('café');ok"
    assert "\ufffd" not in out


def test_exec_time_models():
    tello, arm, chat = MODELS["tello"], MODELS["arm"], MODELS["chatbot"]
    assert tello.min_exec_time("mf(100);") == pytest.approx(0.0072 * 100 + 1.8144)
    assert tello.min_exec_time("tc(90);tp;") == pytest.approx(0.0165 * 90 + 0.784 + 0.001)
    assert tello.min_exec_time("s('cat');") == pytest.approx(1.53)  # lower bound of the samples
    samples = {tello.sample_exec_time("s('cat');", random.Random(i)) for i in range(40)}
    assert min(samples) >= 1.53 and len(samples) > 1
    assert arm.min_exec_time("goto('a');pick('a');") == pytest.approx(3.8)
    assert chat.min_exec_time("one two three four five") == pytest.approx(1.0)  # 300 wpm


def bound(robot: str) -> Segmenter:
    """A segmenter for a generation bound to its robot's grammar."""
    return Segmenter(MODELS[robot], plan_grammar(MODELS[robot]).root)


def test_a_statement_the_grammar_lets_end_one_way_is_cut_before_its_ending_is_written():
    seg = bound("tello")
    assert seg.feed("mb(8") == []  # a move of 20..500 cm: 8 may go on to 80..89
    assert seg.feed("0") == ["mb(80);"]  # 800 is past the move's 500 cm: only ');' may follow
    assert seg.feed(");") == []  # the owed ending, written: nothing new
    assert seg.pending == ""
    assert seg.feed("mu(50") == []  # 500 is still a move: no ending is certain yet
    assert seg.feed(");d(2") == ["mu(50);", "d(2);"]  # a delay of at most 10 s: 2 can only end
    assert seg.feed(")") == []  # the ending may come in pieces
    assert seg.feed(";mf(10") == []
    assert seg.feed("0);") == ["mf(100);"]
    assert seg.flush() == ""


def test_nothing_is_cut_ahead_where_the_model_still_chooses():
    seg = bound("tello")
    assert seg.feed("?s('cat')==True{g('cat") == ["?s('cat')==True{"]  # the name may go on
    assert seg.feed("'") == ["g('cat');"]  # closed: ');' is all that may follow
    assert seg.feed(");") == []
    assert seg.feed("}") == []  # a closing brace alone is no segment
    assert seg.flush() == "}"


def test_a_blocking_call_is_not_cut_ahead():
    # The robot's value is written into the plan after the model's own text: its ending must be the model's.
    seg = bound("arm")
    assert seg.feed("goto('red_box'") == ["goto('red_box');"]
    assert seg.feed(");scan('red_box'") == []
    assert seg.feed(");") == ["scan('red_box');"]


def test_cuts_ahead_give_every_plan_the_same_segments_at_every_split():
    rng = random.Random(3)
    for trace in load_catalog().traces.values():
        model = MODELS[trace.robot]
        plain = segment(trace.robot, [trace.plan])
        for _ in range(20):
            cuts = sorted(rng.sample(range(1, len(trace.plan)), min(4, len(trace.plan) - 1)))
            pieces = [trace.plan[a:b] for a, b in zip([0, *cuts], [*cuts, len(trace.plan)], strict=True)]
            seg, out = Segmenter(model, plan_grammar(model).root), []
            for piece in pieces:
                out.extend(seg.feed(piece))
            assert (out, seg.flush()) == plain, (trace.id, pieces)


def test_text_other_than_the_owed_ending_stops_looking_ahead():
    # Only a generation not bound to the grammar after all could write it: cutting goes on as without one.
    seg = bound("tello")
    assert seg.feed("mb(80") == ["mb(80);"]
    assert seg.feed(")}mf(1") == []
    assert seg.feed("00") == []
    assert seg.feed(");") == ["}mf(100);"]
