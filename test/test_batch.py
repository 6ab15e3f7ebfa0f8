"""Latency-guided batch control: admit and refuse decisions."""

from timely_llm.core.batch import BatchController
from timely_llm.core.request import Request, Segment
from timely_llm.core.skills import load_skill_models
from timely_llm.core.tuf import NORMAL_TUF, URGENT_TUF

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
    c = BatchController(adaptive=True, network_latency=NET, **kw)
    c.record_step(step)
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


def test_one_admission_per_iteration_while_running():
    relaxed = running("n", 0.0, NORMAL_TUF)
    c = controller()
    assert c.admits([relaxed], 0.0, 100, 1)
    assert not c.admits([relaxed], 0.0, 100, 1)  # waits for a step measured with the newcomer
    c.record_step(0.021)
    assert c.admits([relaxed], 0.0, 100, 1)


def test_suspended_generation_budget_comes_from_robot_completion():
    # Next segment due when the robot finishes at 3.0: budget = 3.0 - 0.008 - 2.9 = 0.092 s.
    r = running("r", 0.0, NORMAL_TUF, seg_tokens=7, prev_end=3.0)
    c = controller()
    assert c.budget(r, 2.9) == 3.0 - NET - 2.9
    assert c.wcet(r) == 3 * 0.02
    assert not c.admits([r], 2.9, 100, 1)  # 0.06 -> 0.12 after growth > 0.092


def test_fixed_batch_cap_and_non_adaptive_mode():
    c = BatchController(adaptive=False, max_batch=2)
    a, b = running("a", 0, NORMAL_TUF), running("b", 0, NORMAL_TUF)
    assert c.admits([a], 0.0, 100, 1)
    assert c.admits([a], 0.0, 100, 1)  # no per-step limit without adaptation
    assert not c.admits([a, b], 0.0, 100, 1)
