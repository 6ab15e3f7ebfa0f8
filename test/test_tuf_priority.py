"""TUF and priority arithmetic against hand-computed values."""

import math
import random

import numpy as np
import pytest

from timely_llm.core.priority import EDF, FCFS, PUD
from timely_llm.core.queue import GenerationQueue
from timely_llm.core.request import Request, Segment
from timely_llm.core.tuf import NORMAL_TUF, TUF, URGENT_TUF
from timely_llm.plan.robot_file import load_skill_models

TELLO = load_skill_models()["tello"]


def test_tuf_values_by_hand():
    tuf = TUF(ert=1.0, alpha=-2.0, beta=1.0)
    assert tuf(0.3) == 1.0
    assert tuf(1.0) == 1.0
    assert tuf(1.25) == pytest.approx(0.5)
    assert tuf(1.5) == pytest.approx(0.0)
    assert tuf(2.0) == pytest.approx(-1.0)  # negative past the cut-off
    assert tuf.cutoff == pytest.approx(1.5)
    assert URGENT_TUF(0.5) == pytest.approx(2 - 6.67 * 0.3)


def test_tuf1_has_zero_ert_and_inherits_slope():
    tuf1 = URGENT_TUF.for_segment(3)
    assert (tuf1.ert, tuf1.alpha, tuf1.beta) == (0.0, -6.67, 2.0)
    assert tuf1(-0.4) == 2.0  # arriving early is worth beta
    assert tuf1(0.1) == pytest.approx(2 - 0.667)
    assert URGENT_TUF.for_segment(0) is URGENT_TUF


@pytest.mark.parametrize("ert,alpha,beta", [(math.nan, -1, 1), (1, math.inf, 1), (-1, -1, 1), (1, 0.5, 1), (1, -1, 0)])
def test_tuf_rejects_invalid(ert, alpha, beta):
    with pytest.raises(ValueError):
        TUF(ert, alpha, beta)


def _request(rid, arrival, tuf, prev_end=None):
    r = Request(rid, "a", TELLO, tuf, arrival, [1, 2, 3], 64)
    if prev_end is not None:
        r.segments.append(Segment(0, "mf(50);", [], 0, 0, 2.0))
        r.prev_end_est = prev_end
    return r


def _scores(policy, requests, now):
    q = GenerationQueue(policy)
    for r in requests:
        q.push(r)
    return dict(zip([r.id for r in requests], policy.scores(q._columns, now), strict=True))


def test_pud_first_segment_by_hand():
    # G = 0.09 (tello), network 0.008, now = 10.0, arrival 9.9.
    # action start = 10.098; W = 0.198; urgent TUF(0.198) = 2 (before ERT 0.2)
    # slack L = 9.9 + 0.2 - 10.098 = 0.002 -> floored at G = 0.09; Pri = 2 / (0.09 * 0.09)
    urgent = _request("u", 9.9, URGENT_TUF)
    # normal: W = 0.598 -> utility 1; L = 9.5 + 1 - 10.098 = 0.402; Pri = 1 / (0.09 * 0.402)
    normal = _request("n", 9.5, NORMAL_TUF)
    s = _scores(PUD(0.008), [urgent, normal], now=10.0)
    assert s["u"] == pytest.approx(2 / (0.09 * 0.09))
    assert s["n"] == pytest.approx(1 / (0.09 * 0.402))


def test_pud_late_and_later_segments_by_hand():
    # Late urgent request (action would start 0.298 s past its deadline 9.8): it loses 6.67 per second,
    # so one more G of waiting costs 6.67 * G: Pri = (beta + 6.67 * G) / G^2 (+ 1e-6 * lateness tie-break)
    late = _request("late", 9.6, URGENT_TUF)
    # Later segment, previous action ends at 12.0: W = 10.098 - 12 < 0 -> TUF_1 = beta = 1;
    # L = 12 - 10.098 = 1.902 -> Pri = 1 / (0.09 * 1.902)
    later = _request("later", 5.0, NORMAL_TUF, prev_end=12.0)
    # Later segment already overdue (robot waiting since 9.8, 0.298 s late at action start): only the loss
    # rate counts, no beta (the first response is what the TUF_0 rewards): Pri = 2 * G / G^2
    overdue = _request("overdue", 5.0, NORMAL_TUF, prev_end=9.8)
    s = _scores(PUD(0.008), [late, later, overdue], now=10.0)
    assert s["late"] == pytest.approx((2 + 6.67 * 0.09) / (0.09 * 0.09) + 1e-6 * 0.298)
    assert s["later"] == pytest.approx(1 / (0.09 * 1.902))
    assert s["overdue"] == pytest.approx(2 * 0.09 / (0.09 * 0.09) + 1e-6 * 0.298)
    assert s["late"] > s["overdue"] > s["later"]


def test_pud_late_urgent_outranks_fresh_normal_however_late():
    # Eq. 4 alone ranks by the falling utility: a long-late urgent request (utility << 0) would sink
    # below every fresh normal one and, under overload, wait without bound.
    stale = _request("stale", 0.0, URGENT_TUF)
    fresh = _request("fresh", 9.99, NORMAL_TUF)
    s = _scores(PUD(0.008), [stale, fresh], now=10.0)
    assert s["stale"] > s["fresh"] > 0


def test_edf_and_fcfs_keep_the_first_deadline_and_arrival():
    a = _request("a", 1.0, NORMAL_TUF)  # deadline 2.0
    b = _request("b", 1.5, URGENT_TUF, prev_end=50.0)  # deadline 1.7, even though suspended
    assert _scores(EDF(), [a, b], 3.0) == {"a": -2.0, "b": pytest.approx(-1.7)}
    assert _scores(FCFS(), [a, b], 3.0) == {"a": -1.0, "b": -1.5}


def test_queue_fetch_reevaluates_with_time():
    # At t=10 a fresh request (deadline 11, slack 0.902) outranks a suspended generation whose
    # robot finishes at 12 (slack 1.902). At t=11.6 both still rank the fresh one first: it is late and
    # losing utility, while the suspended one (slack 0.302) loses nothing by waiting one more G.
    # At t=12.5 the suspended one's robot waits too: both late, the first response goes first.
    suspended = _request("s", 0.0, NORMAL_TUF, prev_end=12.0)
    fresh = _request("f", 10.0, NORMAL_TUF)
    q = GenerationQueue(PUD(0.008))
    q.push(suspended)
    q.push(fresh)
    assert q.best(10.0).id == "f"
    assert q.best(11.6).id == "f"
    assert q.best(12.5).id == "f"
    q.remove("f")
    assert q.best(11.6).id == "s"
    q.push(fresh)
    q.remove("s")
    assert q.best(11.6).id == "f" and len(q) == 1


def test_a_fetch_of_first_segments_only_passes_over_later_ones_and_finds_none_among_them():
    later = _request("s", 0.0, URGENT_TUF, prev_end=10.0)  # late and urgent: the best of all at t=12
    first = _request("f", 11.0, TUF(30.0, NORMAL_TUF.alpha, NORMAL_TUF.beta))  # on time, with slack to spare
    q = GenerationQueue(PUD(0.008))
    q.push(later)
    q.push(first)
    assert q.best(12.0).id == "s" and q.best(12.0, first_segments_only=True).id == "f"
    q.remove("f")
    assert q.best(12.0, first_segments_only=True) is None and q.best(12.0).id == "s"


def _best_scored_afresh(q, now):
    """What a fetch picks with every score computed anew (the first of equals in row order)."""
    cols = q._columns
    if q.token_time is not None:
        cols.column("gen_time")[:] = cols.column("gen_fixed") + cols.column("gen_tokens") * q.token_time
    return q._requests[int(np.argmax(q.policy.scores(cols, now)))]


@pytest.mark.parametrize("policy", [PUD(0.008), EDF(), FCFS()], ids=lambda p: type(p).__name__.lower())
def test_fetches_at_one_time_pick_as_if_every_score_were_computed_anew(policy):
    """A scheduling point fetches many times at one ``now`` and the queue keeps its scores in between: after
    removals (rows moved), pushes, rewritten rows and a new token time, the pick is the same, ties included."""
    rng = random.Random(3)
    q = GenerationQueue(policy, gen_terms=lambda r: (0.05, 2.0 + r.seg_index))
    q.token_time = 0.02
    arrivals, ends = [9.0, 9.5, 10.0], [10.5, 11.0, 12.0]  # few values: equal scores are common
    now, made = 10.0, 0
    for _ in range(400):
        op = rng.choice(["push", "push", "best", "remove", "update", "time", "token"])
        if op == "push" or len(q) == 0:
            tuf, prev_end = rng.choice([URGENT_TUF, NORMAL_TUF]), rng.choice([None, *ends])
            q.push(_request(f"r{made}", rng.choice(arrivals), tuf, prev_end))
            made += 1
        elif op == "best":
            q.remove(q.best(now).id)
        elif op == "remove":
            q.remove(rng.choice(list(q)).id)
        elif op == "update":
            request = rng.choice(list(q))
            request.prev_end_est = rng.choice(ends)
            q.update(request)
        elif op == "time":
            now = rng.choice([10.0, 10.3, 11.5])
        else:
            q.token_time = rng.choice([0.02, 0.05, None])
        if len(q):
            assert q.best(now) is _best_scored_afresh(q, now)
