"""``timely-llm loop-cost`` runs and prints sane figures (no timing asserts: the machine is shared)."""

from __future__ import annotations

import pytest

from timely_llm.cli import main
from timely_llm_bench.evaluation.loop_cost import measure


def test_the_command_prints_a_row_per_batch_and_grammar_and_a_resume_row(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["loop-cost", "--steps", "30", "--batches", "1", "4"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = [line.split() for line in lines if line.split()[0] in ("timelyllm", "edf")]
    assert [(r[0], r[1], r[3]) for r in rows] == [("timelyllm", "1", "off"), ("timelyllm", "1", "on"),
                                                  ("timelyllm", "4", "off"), ("timelyllm", "4", "on"),
                                                  ("edf", "1", "on")]
    for row in rows:
        steps, tokens, step_ms, token_us = int(row[4]), int(row[5]), float(row[7]), float(row[8])
        assert steps == 30 and 0 < tokens <= steps * int(row[2])
        assert step_ms > 0 and token_us > 0
    assert int(rows[-1][6]) > 0  # over-subscribed: parked generations were suspended and resumed


def test_a_full_batch_generates_a_token_per_generation_and_step() -> None:
    """Finished plans are replaced at once, so the batch stays full (prefill steps aside)."""
    cost = measure(16, grammar=True, steps=100)
    assert 0.85 * 16 * 100 <= cost.tokens <= 16 * 100
    assert cost.loop_cpu_s > 0 and cost.engine_cpu_s > 0
    assert cost.resumes == 0  # every parked generation fits back in the batch
