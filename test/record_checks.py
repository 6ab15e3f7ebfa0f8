"""Checks shared by test modules: a bench record obeys the definitions of its times and utility."""

import pytest

from timely_llm.core.overload import INFEASIBLE_REASON
from timely_llm.traces import load_catalog

CATALOG = load_catalog()
EPS = 1e-9


def check_record(rec, latency):
    assert rec["status"] == "succeeded", rec
    segs = rec["segments"]
    assert segs and [s["index"] for s in segs] == list(range(len(segs)))
    for i, s in enumerate(segs):
        assert s["gen_start"] <= s["gen_end"]
        assert s["exec_start"] >= s["gen_end"] + latency - EPS
        assert s["exec_end"] >= s["exec_start"]
        if i:
            assert s["exec_start"] >= segs[i - 1]["exec_end"] - EPS
        assert s["tokens"] >= 0
        if s["tokens"]:  # G(s) as predicted when the segment's generation started
            assert s["predicted_gen_time"] > 0
    assert sum(s["tokens"] for s in segs) <= rec["output_tokens"]
    arrival = rec["arrival"]
    assert rec["response_time"] == pytest.approx(segs[0]["exec_start"] - arrival)
    assert rec["completion_time"] == pytest.approx(segs[-1]["exec_end"] - arrival)
    assert rec["exec_time"] == pytest.approx(sum(s["exec_end"] - s["exec_start"] for s in segs))
    assert rec["waiting_time"] == pytest.approx(rec["completion_time"] - rec["exec_time"])
    tuf = rec["tuf"]
    expected = min(tuf["beta"], tuf["alpha"] * (rec["response_time"] - tuf["ert"]) + tuf["beta"])
    assert rec["utility"] == pytest.approx(expected)
    assert not rec["shed"]
    if rec["infeasible_at"] is not None:  # kept waiting after the robot was told: served past its cut-off
        assert rec["utility"] < 0
    if rec["skipped_segments"] == 0:  # skip-next sends only part of the plan
        assert "".join(s["text"] for s in segs) == CATALOG[rec["trace"]].plan


def check_shed_record(rec, generation_time, latency):
    """A request overload control ended: told when even served at once its utility was below zero."""
    assert rec["status"] == "aborted" and rec["reason"] == INFEASIBLE_REASON and rec["shed"]
    assert rec["segments"] == [] and rec["utility"] is None and rec["response_time"] is None
    assert rec["infeasible_at"] >= rec["arrival"]
    assert rec["best_response"] == pytest.approx(rec["infeasible_at"] + generation_time + latency - rec["arrival"])
    tuf = rec["tuf"]
    assert min(tuf["beta"], tuf["alpha"] * (rec["best_response"] - tuf["ert"]) + tuf["beta"]) < 0
