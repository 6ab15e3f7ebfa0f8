"""Scheduling-overhead measurement: shape of the result, and that a decision picks the max of PUD (Eq. 4 on time)."""

from __future__ import annotations

import pytest

from timely_llm.core.request import Request
from timely_llm.plan.robot_file import load_skill_models
from timely_llm_bench.evaluation.sched_overhead import NETWORK_LATENCY, NOW, build_queue, measure

SKILLS = load_skill_models()


def _pud(r: Request, now: float, network: float = NETWORK_LATENCY) -> float:
    """PUD written out per request (core/priority.py): on time, Eq. 4, TUF_k(W) / (G * L) with L floored
    at G; late (L < 0), the utility lost per generation time, (delta_k * beta + |alpha| * G) / G^2,
    the longest late first among equals."""
    g = r.robot.segment_generation_time
    start = now + g + network
    first = r.seg_index == 0
    deadline = r.arrival + r.tuf.ert if first else r.prev_end_est
    slack = deadline - start
    if slack < 0:
        return ((r.tuf.beta if first else 0.0) + abs(r.tuf.alpha) * g) / (g * g) - 1e-6 * slack
    waited = start - (r.arrival + r.tuf.ert if first else r.prev_end_est)
    utility = min(r.tuf.beta, r.tuf.alpha * waited + r.tuf.beta)
    return utility / (g * max(slack, g))


def test_measure_returns_one_positive_time_per_size() -> None:
    sizes = [1, 8, 300]
    result = measure(sizes, repeat=3)
    assert [n for n, _ in result] == sizes
    assert all(seconds > 0 for _, seconds in result)


def test_timebill_decisions_rank_by_the_estimated_g() -> None:
    queue = build_queue(300, SKILLS, seed=5, timebill=True)
    g = queue._columns.column("gen_time")
    assert len(set(g.round(9))) == 2 and not set(g) & {m.segment_generation_time for m in SKILLS.values()}  # per robot
    queue.token_time *= 2  # a slower batch: every G(s) is recomputed from its terms at the next decision
    queue.best(NOW)
    fixed, tokens = queue._columns.column("gen_fixed"), queue._columns.column("gen_tokens")
    assert queue._columns.column("gen_time") == pytest.approx(fixed + tokens * queue.token_time)
    assert measure([8], repeat=3, timebill=True)[0][1] > 0


def test_measure_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError):
        measure([0], repeat=3)


def test_queue_mixes_first_and_later_segments_of_both_urgencies() -> None:
    requests = list(build_queue(200, SKILLS))
    assert {r.seg_index == 0 for r in requests} == {True, False}
    assert {r.category for r in requests} == {"urgent", "normal"}
    assert {r.robot.robot for r in requests} == {"tello", "arm"}


@pytest.mark.parametrize("size,seed", [(1, 0), (5, 1), (40, 2), (500, 3)])
def test_decision_picks_the_max_pud_request(size: int, seed: int) -> None:
    queue = build_queue(size, SKILLS, seed)
    for now in (NOW - 1.0, NOW, NOW + 0.3, NOW + 2.0):
        best = queue.best(now)
        assert _pud(best, now) == pytest.approx(max(_pud(r, now) for r in queue))


def test_decision_after_removals_still_picks_the_max() -> None:
    queue = build_queue(30, SKILLS, seed=4)
    for _ in range(10):
        queue.remove(queue.best(NOW).id)
        assert _pud(queue.best(NOW), NOW) == pytest.approx(max(_pud(r, NOW) for r in queue))
