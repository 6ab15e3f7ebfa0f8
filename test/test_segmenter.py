"""The segmenter on plans split at awkward token boundaries."""

import itertools
import random

import pytest

from timely_llm.plan.robot_file import load_skill_models
from timely_llm.plan.segmenter import IncrementalDetokenizer, Segmenter

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
