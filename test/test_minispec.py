"""MiniSpec parsing, execution, and streamed (segment-by-segment) execution."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from timely_llm_robot.executors.minispec import (
    Call,
    Interpreter,
    Literal,
    Loop,
    MiniSpecError,
    SkillFailed,
    StreamedPlan,
    Value,
    parse,
    split_units,
)


class RecordingSkills:
    """A dispatch function that records calls and answers from a table of results."""

    def __init__(self, results: dict[str, Value] | None = None) -> None:
        self.results = results or {}
        self.calls: list[tuple[str, list[Value]]] = []

    def __call__(self, name: str, args: Sequence[Value]) -> Value:
        self.calls.append((name, list(args)))
        result = self.results.get(name)
        return result(*args) if callable(result) else result

    def names(self) -> list[str]:
        return [name for name, _ in self.calls]


def run(source: str, results: dict[str, Value] | None = None) -> tuple[Value, RecordingSkills]:
    skills = RecordingSkills(results)
    return Interpreter(skills).run(source).value, skills


def test_parses_calls_with_typed_literal_arguments() -> None:
    assert parse("mf(50);d(1.5);l('hi');tp") == (
        Call("mf", (Literal(50),)), Call("d", (Literal(1.5),)), Call("l", (Literal("hi"),)), Call("tp"))


def test_parses_a_loop_with_its_body() -> None:
    (loop,) = parse("3{tc(30)}")
    assert loop == Loop(3, (Call("tc", (Literal(30),)),))


def test_runs_statements_in_order_with_arguments() -> None:
    _, skills = run("mu(100); mf(50); tu(90);")
    assert skills.calls == [("mu", [100]), ("mf", [50]), ("tu", [90])]


def test_conditional_runs_its_block_only_when_true() -> None:
    _, seen = run("?iv('cat')==True{mf(50)};tc(90)", {"iv": True})
    _, unseen = run("?iv('cat')==True{mf(50)};tc(90)", {"iv": False})
    assert seen.names() == ["iv", "mf", "tc"]
    assert unseen.names() == ["iv", "tc"]


def test_condition_without_comparator_tests_truth() -> None:
    _, skills = run("?iv('cat'){l('cat')}", {"iv": True})
    assert skills.calls[-1] == ("l", ["cat"])


@pytest.mark.parametrize(("condition", "expected"), [
    ("ox('cat')>0.6", False), ("ox('cat')<0.6", True), ("ox('cat')>=0.5", True),
    ("ox('cat')<=0.4", False), ("ox('cat')!=0.5", False),
    ("ox('cat')>0.6|ox('cat')<0.6", True), ("ox('cat')>0.4&ox('cat')<0.6", True),
    ("ox('cat')>0.6&ox('cat')<0.6|True", True),
])
def test_comparisons_and_boolean_operators(condition: str, expected: bool) -> None:
    value, _ = run(f"?{condition}{{->True}}->False", {"ox": 0.5})
    assert value is expected


def test_and_binds_tighter_than_or() -> None:
    value, _ = run("?True|False&False{->1}->2")
    assert value == 1


def test_loop_repeats_its_body() -> None:
    _, skills = run("4{tc(90)}")
    assert skills.calls == [("tc", [90])] * 4


def test_return_inside_loop_ends_the_whole_program() -> None:
    answers = iter([False, False, True, True])
    value, skills = run("8{?iv('cat')==True{->True}tc(45)}->False", {"iv": lambda _: next(answers)})
    assert value is True
    assert skills.names() == ["iv", "tc", "iv", "tc", "iv"]


def test_return_runs_nothing_after_it() -> None:
    value, skills = run("->'done';mf(50)")
    assert value == "done"
    assert skills.calls == []


def test_variables_hold_skill_results_for_later_statements() -> None:
    value, skills = run("_1=oh('bottle');l(_1);?_1>0.2{->_1}", {"oh": 0.3})
    assert skills.calls == [("oh", ["bottle"]), ("l", [0.3])]
    assert value == 0.3


def test_program_without_return_reports_no_return() -> None:
    outcome = Interpreter(RecordingSkills()).run("mf(50)")
    assert not outcome.returned and outcome.value is None


def test_nested_calls_evaluate_inner_first() -> None:
    _, skills = run("l(ox('cat'))", {"ox": 0.25})
    assert skills.calls == [("ox", ["cat"]), ("l", [0.25])]


def test_typefly_plan_example_runs() -> None:
    plan = "tu(90);?iv('apple')==True&iv('orange'){l('Yes');->True}l('No');->False"
    value, skills = run(plan, {"iv": lambda name: name == "apple"})
    assert value is False
    assert skills.calls[-1] == ("l", ["No"])


@pytest.mark.parametrize("source", [
    "mf(50", "?iv('cat')==True{mf(50)", "mf(50))", "_1 mf(50)", "?{mf(1)}", "mf(50);@", "True", "3 tc(1)",
])
def test_malformed_programs_are_rejected(source: str) -> None:
    with pytest.raises(MiniSpecError):
        parse(source)


def test_undefined_variable_is_an_error() -> None:
    with pytest.raises(MiniSpecError, match="_2"):
        run("l(_2)")


def test_comparing_incompatible_values_is_an_error() -> None:
    with pytest.raises(MiniSpecError, match="compare"):
        run("?iv('cat')>3{mf(1)}", {"iv": "yes"})


def test_skill_failure_stops_the_program() -> None:
    def dispatch(name: str, args: Sequence[Value]) -> Value:
        if name == "mf":
            raise SkillFailed("error out of range")
        return None

    interpreter = Interpreter(dispatch)
    with pytest.raises(SkillFailed, match="out of range"):
        interpreter.run("tc(90);mf(999);tc(90)")


@pytest.mark.parametrize(("text", "units", "rest"), [
    ("mf(50)", ["mf(50)"], ""),
    ("mf(50);tc(9", ["mf(50)"], "tc(9"),
    ("?iv('cat')==True{mf(50);", ["?iv('cat')==True{", "mf(50)"], ""),
    ("4{tc(1)}mf(3", ["4{", "tc(1)", "}"], "mf(3"),
    ("_1=iv('a;b}')", ["_1=iv('a;b}')"], ""),
    ("tp", [], "tp"),
    ("tp}", ["tp", "}"], ""),
    ("tp;->Tr", ["tp"], "->Tr"),
    ("?oh('c')>0.2{->od('c')}", ["?oh('c')>0.2{", "->od('c')", "}"], ""),
])
def test_split_units_cuts_statements_block_headers_and_closing_braces(text: str, units: list[str],
                                                                      rest: str) -> None:
    assert split_units(text) == (units, rest)


def test_streamed_plan_runs_each_statement_once_complete_inside_a_block_too() -> None:
    skills = RecordingSkills({"iv": True})
    plan = StreamedPlan(skills)

    plan.feed("mf(50);?iv('cat')==True{")
    after_first = skills.names()
    plan.feed("tc(90);")
    after_second = skills.names()
    plan.feed("mu(20)}")
    after_third = skills.names()
    outcome = plan.feed("->True", final=True)

    assert after_first == ["mf", "iv"]
    assert after_second == ["mf", "iv", "tc"]
    assert after_third == ["mf", "iv", "tc", "mu"]
    assert outcome.returned and outcome.value is True


def test_streamed_plan_skips_a_block_whose_condition_fails_and_what_it_nests() -> None:
    skills = RecordingSkills({"iv": False})
    plan = StreamedPlan(skills)
    for segment in ("?iv('cat')==True{", "g('cat');", "2{tc(90)}", "}", "mu(20);"):
        plan.feed(segment)
    assert skills.names() == ["iv", "mu"]


def test_streamed_plan_runs_a_loops_first_round_as_it_arrives_and_the_rest_at_its_close() -> None:
    skills = RecordingSkills({"iv": lambda name: name == "cat"})
    plan = StreamedPlan(skills)

    plan.feed("3{tc(90);")
    first_round = skills.names()
    plan.feed("2{mu(1)};?iv('dog'){mf(5)}")
    plan.feed("}")

    assert first_round == ["tc"]
    assert skills.names() == ["tc", "mu", "mu", "iv"] * 3


def test_streamed_plan_ends_inside_a_loop_at_a_return() -> None:
    skills = RecordingSkills({"iv": lambda name: len(skills.calls) > 3})
    plan = StreamedPlan(skills)
    plan.feed("5{tc(90);?iv('cat'){->True}")
    outcome = plan.feed("}mf(50)", final=True)
    assert outcome.returned and outcome.value is True
    assert skills.names() == ["tc", "iv", "tc", "iv"]


@pytest.mark.parametrize("segments", [["mf(50);}"], ["?iv('cat'){", "mf(50)"], ["tp;x{", "mf(1)}"]],
                         ids=["close_without_open", "never_closed", "bad_header"])
def test_streamed_plan_rejects_unbalanced_or_malformed_blocks(segments: list[str]) -> None:
    plan = StreamedPlan(RecordingSkills({"iv": True}))
    with pytest.raises(MiniSpecError):
        for index, segment in enumerate(segments):
            plan.feed(segment, final=index == len(segments) - 1)


def test_streamed_plan_keeps_variables_across_segments() -> None:
    skills = RecordingSkills({"s": True})
    plan = StreamedPlan(skills)
    plan.feed("_1=s('person');")
    plan.feed("?_1==True{g('person')}", final=True)
    assert skills.names() == ["s", "g"]


def test_streamed_plan_ignores_text_after_return() -> None:
    skills = RecordingSkills()
    plan = StreamedPlan(skills)
    plan.feed("->False;")
    plan.feed("mf(50)", final=True)
    assert skills.calls == []
