"""The demo's verdict sentences and deadline flags, the progress line's stages, and the engine kept across nodes."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace

import pytest

from timely_llm.core.tuf import NORMAL_TUF, URGENT_TUF
from timely_llm.engines.keeper import EngineKeeper
from timely_llm_bench.evaluation.verdict import deadline_lines, missed_deadlines, verdict_sentences
from timely_llm_bench.robots.fleet import waiting_for


def _summary(urgent: float, normal: float) -> dict:
    return {"all": {"mean_response_time": (urgent + normal) / 2}, "urgent": {"mean_response_time": urgent},
            "normal": {"mean_response_time": normal}}


def test_one_sentence_per_baseline_with_the_direction_spelled_out() -> None:
    summaries = {"timelyllm": _summary(0.41, 0.80), "vllm-stream": _summary(0.74, 0.70), "vllm": _summary(1.6, 1.7)}
    met = {"timelyllm": "5 of 7", "vllm-stream": "3 of 7", "vllm": "0 of 7"}
    stream, whole = verdict_sentences(summaries, met, "the engine keeps up")
    assert stream == ("timelyllm: urgent robots got their first action 1.80x sooner than under vllm-stream "
                      "(0.41 s vs 0.74 s); normal robots 1.14x later (0.80 s vs 0.70 s); deadlines met 5 of 7 "
                      "against 3 of 7.")
    assert whole.startswith("timelyllm: urgent robots got their first action 3.90x sooner than under vllm ")


def test_level_policies_say_it_is_expected_here_and_why() -> None:
    summaries = {"timelyllm": _summary(0.72, 0.80), "vllm-stream": _summary(0.73, 0.82)}
    (sentence,) = verdict_sentences(summaries, {}, "the engine keeps up with the arrivals")
    assert sentence == ("timelyllm and vllm-stream are level (first action, mean: urgent 0.72 s vs 0.73 s, normal "
                        "0.80 s vs 0.82 s); as expected here: the engine keeps up with the arrivals.")


def _record(rid: str, category: str, response: float | None) -> dict:
    tuf = URGENT_TUF if category == "urgent" else NORMAL_TUF
    return {"id": rid, "agent": f"drone-{rid}", "category": category, "tuf": tuf.to_dict(), "response_time": response}


def test_requests_past_their_deadline_are_flagged_with_how_late() -> None:
    records = [_record("r1", "urgent", 0.30), _record("r2", "urgent", 0.92), _record("r3", "normal", 1.2),
               _record("r4", "normal", None)]
    assert [r["id"] for r in missed_deadlines(records)] == ["r2", "r4"]
    assert deadline_lines(records) == [
        "  deadlines met: 1 of 2 normal, 1 of 2 urgent; 2 missed:",
        "    missed: r2 (drone-r2, urgent): first action at 0.92 s, 0.42 s late (deadline 0.50 s)",
        "    missed: r4 (drone-r4, normal): no first action (deadline 1.50 s)"]


def _outcome(accepted: bool = True, segments: int = 0, final: bool = False, executed: int = 0,
             done: bool = False) -> SimpleNamespace:
    finished: Future = Future()
    if done:
        finished.set_result(None)
    return SimpleNamespace(accepted=accepted, executed=executed, finished=finished,
                           segments=[SimpleNamespace(final=final and i == segments - 1) for i in range(segments)])


def test_progress_names_what_each_open_request_waits_for() -> None:
    sent = [(SimpleNamespace(agent=f"drone-{i}"), outcome) for i, outcome in enumerate([
        _outcome(done=True), _outcome(accepted=False), _outcome(), _outcome(segments=2, executed=1),
        _outcome(segments=2, executed=2), _outcome(segments=3, final=True, executed=3), _outcome()])]
    assert waiting_for(sent) == ("drone-1 (the node has not accepted it yet), drone-2 (its plan: generating the first "
                                 "segment), drone-3 (robot executing segment 2 of 2 received so far) and 3 more")
    assert waiting_for(sent[4:6]) == ("drone-4 (its plan: generating segment 3 (robot done with 2)), drone-5 (its "
                                      "result: the robot executed the whole plan)")
    assert waiting_for(sent[:1]) == ""


class _Engine:
    def __init__(self) -> None:
        self.resets = self.closes = 0

    def reset_cache(self) -> None:
        self.resets += 1

    def close(self) -> None:
        self.closes += 1


def test_the_keeper_loads_once_per_engine_parameters_and_resets_the_cache_between_nodes() -> None:
    keeper, made = EngineKeeper(), []

    def make() -> _Engine:
        made.append(_Engine())
        return made[-1]

    first = keeper.take("a", make)
    keeper.give_back(first)
    assert keeper.take("a", make) is first and len(made) == 1 and first.resets == 1
    keeper.give_back(first)
    other = keeper.take("b", make)  # other parameters: the old engine closed, a new one loaded
    assert other is not first and first.closes == 1 and len(keeper.loads) == 2
    keeper.give_back(other)
    keeper.close()
    assert other.closes == 1


def test_an_engine_that_cannot_reset_is_closed_not_lent_again() -> None:
    keeper, engine = EngineKeeper(), _Engine()
    engine.reset_cache = lambda: (_ for _ in ()).throw(RuntimeError("busy"))  # type: ignore[method-assign]
    keeper.take("a", lambda: engine)
    with pytest.raises(RuntimeError, match="busy"):
        keeper.give_back(engine)
    assert engine.closes == 1
    assert keeper.take("a", _Engine) is not engine


def test_a_baseline_cut_short_is_compared_on_the_first_actions_its_robots_saw() -> None:
    from timely_llm_bench.evaluation.verdict import first_actions

    mine = [_record("a", "urgent", 2.0), _record("b", "normal", 3.0)]
    theirs = [_record("a", "urgent", 20.0), _record("b", "normal", None), _record("c", "normal", 30.0)]
    (sentence,) = verdict_sentences({"timelyllm": first_actions(mine), "vllm-stream": first_actions(theirs)}, {}, "")
    assert sentence == ("timelyllm: urgent robots got their first action 10.00x sooner than under vllm-stream "
                        "(2.00 s vs 20.00 s); normal robots 10.00x sooner (3.00 s vs 30.00 s); under vllm-stream "
                        "1 normal got no first action at all.")
