"""Latency-guided batch control: admit and refuse decisions."""

import random
from collections import Counter

from timely_llm.core.batch import BatchController, StepModel
from timely_llm.core.request import Request, Segment
from timely_llm.core.tuf import NORMAL_TUF, URGENT_TUF
from timely_llm.plan.robot_file import load_skill_models

TELLO = load_skill_models()["tello"]  # segment max 10 tokens
NET = 0.008


def running(rid, arrival, tuf, seg_tokens=0, prev_end=None):
    r = Request(rid, "a", TELLO, tuf, arrival, [1], 64)
    r.seg_tokens = seg_tokens
    if prev_end is not None:
        r.segments.append(Segment(0, "mf(50);", [], 0, 0, 2.0))
        r.prev_end_est = prev_end
    return r


def controller(step=0.02, **kw):
    """Only batch-of-one steps seen so far: growth is taken as proportional to the batch."""
    c = BatchController(adaptive=True, network_latency=NET, **kw)
    c.record_step(step, batch=1)
    return c


def test_empty_batch_always_admits_if_memory_allows():
    c = controller()
    assert c.admits([], 0.0, free_blocks=10, needed_blocks=10)
    assert not c.admits([], 0.0, free_blocks=9, needed_blocks=10)


def test_refuses_when_growth_would_make_a_savable_segment_late():
    # Urgent request 0.05 s in: budget = 0.2 - 0.008 - 0.05 = 0.142 s.
    # 4 tokens left at 0.02 s/step = WCET 0.08 fits; with one running, growth to 2 doubles it: 0.16 > 0.142.
    urgent = running("u", 0.0, URGENT_TUF, seg_tokens=6)
    assert not controller().admits([urgent], 0.05, 100, 1)
    # With 3 tokens left WCET 0.06 -> 0.12 after growth still fits: admit.
    urgent.seg_tokens = 7
    assert controller().admits([urgent], 0.05, 100, 1)


def test_generation_past_saving_does_not_veto():
    # 10 tokens left at 0.02 s = 0.2 s > its 0.142 s budget: refusing cannot save it.
    late = running("late", 0.0, URGENT_TUF, seg_tokens=0)
    assert controller().admits([late], 0.05, 100, 1)


def test_many_admissions_per_iteration():
    # No per-iteration limit: with nothing to protect, admission goes on as long as asked.
    c = controller()
    batch = [running("n0", 0.0, NORMAL_TUF, prev_end=100.0)]
    for i in range(1, 20):
        assert c.admits(batch, 0.0, 100, 1)
        batch.append(running(f"n{i}", 0.0, NORMAL_TUF, prev_end=100.0))


def test_step_model_learns_the_marginal_cost_of_a_sequence():
    m = StepModel()
    assert m.predict(4) is None
    m.record(2, 0.030)
    assert m.predict(4) == 0.060  # one batch size seen: proportional (pessimistic)
    m = StepModel()
    for b in (2, 4, 8, 16):
        m.record(b, 0.020 + 0.001 * b)
    assert abs(m.predict(32) - 0.052) < 0.003  # the fitted line, not 32/b times slower


def test_learned_cheap_batching_admits_growth_the_proportional_guess_refuses():
    # Urgent, 4 tokens left, budget 0.142 s: proportional growth from 1 to 2 doubles its WCET (refused),
    # but steps measured at several batch sizes show +1 ms per sequence (admitted).
    urgent = running("u", 0.0, URGENT_TUF, seg_tokens=6)
    assert not controller().admits([urgent], 0.05, 100, 1)
    c = BatchController(adaptive=True, network_latency=NET)
    for b in (1, 2, 3, 4):
        c.record_step(0.019 + 0.001 * b, batch=b)
    assert c.admits([urgent], 0.05, 100, 1)


def test_prefill_steps_do_not_measure_decoding():
    c = controller()
    c.record_step(0.5, batch=1, prefill=True)
    assert c.step_time(1) == 0.02


def test_suspended_generation_budget_comes_from_robot_completion():
    # Next segment due when the robot finishes at 3.0: budget = 3.0 - 0.008 - 2.9 = 0.092 s.
    r = running("r", 0.0, NORMAL_TUF, seg_tokens=7, prev_end=3.0)
    c = controller()
    assert c.budget(r, 2.9) == 3.0 - NET - 2.9
    assert c.wcet(r, 1) == 3 * 0.02
    assert not c.admits([r], 2.9, 100, 1)  # 0.06 -> 0.12 after growth > 0.092


def test_fixed_batch_cap_and_non_adaptive_mode():
    c = BatchController(adaptive=False, max_batch=2)
    a, b = running("a", 0, NORMAL_TUF), running("b", 0, NORMAL_TUF)
    assert c.admits([a], 0.0, 100, 1)
    assert c.admits([a], 0.0, 100, 1)
    assert not c.admits([a, b], 0.0, 100, 1)


def test_no_veto_when_waiting_would_make_the_newcomer_late_too():
    # A savable urgent generation (3 tokens left, 0.06 s -> 0.12 s after growth, budget 0.092 s)...
    protected = running("p", 0.0, NORMAL_TUF, seg_tokens=7, prev_end=3.0)
    # ...refuses a newcomer with time to spare (budget 0.992 s) but not one (budget 0.292 s, later than the
    # protected 0.092 s) that would be late after waiting 0.06 s for it (its own WCET at batch 2: 0.4 s).
    relaxed = running("r", 2.9, NORMAL_TUF)
    due_now = running("d", 2.2, NORMAL_TUF)
    assert not controller().admits([protected], 2.9, 100, 1, relaxed)
    assert controller().admits([protected], 2.9, 100, 1, due_now)


def test_a_generation_exactly_as_urgent_as_the_newcomer_does_not_veto():
    # At batch 1 (0.02 s a step, 0.04 s at 2) a running later segment, 10 tokens left, budget 0.3 s: savable
    # (0.2 s) until the batch grows (0.4 s). A resumed newcomer (1 token left: 0.04 s) due as late as it or
    # later could wait for it (0.3 - 0.2 >= 0.04), so only urgency decides.
    protected = running("p", 0.0, NORMAL_TUF, prev_end=0.3 + NET)
    same = running("same", 0.0, NORMAL_TUF, seg_tokens=9, prev_end=0.3 + NET)
    later = running("later", 0.0, NORMAL_TUF, seg_tokens=9, prev_end=0.31 + NET)
    c = controller()
    assert c.budget(same, 0.0) == c.budget(protected, 0.0)
    assert c.admits([protected], 0.0, 100, 1, same)  # not more urgent: no veto
    assert not c.admits([protected], 0.0, 100, 1, later)
    assert c.admits(c.ordered([protected]), 0.0, 100, 1, same)
    assert not c.admits(c.ordered([protected]), 0.0, 100, 1, later)


def test_a_generation_admitted_at_a_scheduling_point_vetoes_the_next_candidates():
    c = controller()
    calm = running("calm", 0.0, NORMAL_TUF, prev_end=100.0)
    protected = running("p", 0.0, NORMAL_TUF, seg_tokens=8, prev_end=0.1 + NET)  # 2 tokens left, budget 0.1 s
    later = running("later", 0.0, NORMAL_TUF, seg_tokens=9, prev_end=0.5)
    batch = c.ordered([calm])
    assert c.admits(batch, 0.0, 100, 1, protected)
    assert c.admits(batch, 0.0, 100, 1, later)  # nothing more urgent than it runs yet
    batch.add(protected)
    assert [r.id for r in batch] == ["p", "calm"]  # deadline order
    assert c.wcet(protected, 2) <= c.budget(protected, 0.0) < c.wcet(protected, 3)  # 0.08 <= 0.1 < 0.12
    assert not c.admits(batch, 0.0, 100, 1, later)


def _walk(c, batch, now, newcomer):
    """The veto rule as first written, every running generation looked at (None: admitted, else why not)."""
    n = len(batch)
    due, own = c.budget(newcomer, now), c.wcet(newcomer, n + 1)
    spared = False
    for r in batch:
        budget = c.budget(r, now)
        wcet_now, wcet_grown = c.wcet(r, n), c.wcet(r, n + 1)
        if budget < due and wcet_now <= budget < wcet_grown:
            if due - wcet_now < own:
                spared = True
                continue
            return "veto"
    return "spared" if spared else None


def _generation(rng, name, deadlines):
    return running(name, 0.0, NORMAL_TUF, seg_tokens=rng.randrange(4, 10), prev_end=rng.choice(deadlines) + NET)


def test_kept_order_decides_as_walking_the_whole_batch_through_many_scheduling_points():
    """Random scheduling points: candidates of every urgency, some due at the same time as a running one,
    some past saving; each one admitted joins the batch, as in ``Server._schedule``."""
    rng = random.Random(7)
    c = BatchController(adaptive=True, network_latency=NET)
    for b in (1, 2, 4, 8):
        c.record_step(0.016 + 0.01 * b, batch=b)
    seen = Counter()
    for point in range(300):
        now = rng.uniform(0.0, 0.1)
        deadlines = [rng.uniform(0.0, 0.7) for _ in range(6)]  # drawn from few: ties are common
        walked = [_generation(rng, f"{point}r{i}", deadlines) for i in range(rng.randrange(1, 6))]
        batch = c.ordered(walked)
        for k in range(6):
            candidate = _generation(rng, f"{point}c{k}", deadlines)
            why_not = _walk(c, walked, now, candidate)
            seen[why_not] += 1
            assert c.admits(batch, now, 100, 1, candidate) == (why_not != "veto")
            if why_not != "veto":
                batch.add(candidate)
                walked.append(candidate)
    assert min(seen["veto"], seen["spared"], seen[None]) >= 50  # every branch of the rule was taken
