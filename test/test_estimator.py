"""TimeBill's execution-time estimator, segment-length predictor and G(s) in the scheduler."""

import pytest

from timely_llm.cli import main
from timely_llm.clock import VirtualClock
from timely_llm.core.estimator import (
    PESSIMISTIC_FACTOR,
    ExecutionTimeEstimator,
    SegmentLengths,
    SegmentTimes,
)
from timely_llm.core.features import Features
from timely_llm.core.priority import PUD
from timely_llm.core.queue import GenerationQueue
from timely_llm.core.request import Request, Segment, Status
from timely_llm.core.tuf import NORMAL_TUF
from timely_llm.engines.base import GenerationSpec
from timely_llm.engines.hardware import estimator_profile, load_profile
from timely_llm.engines.profile_fit import fit_profile
from timely_llm.engines.sim import SimEngine
from timely_llm.plan.robot_file import load_skill_models
from timely_llm.serving import ServerConfig
from timely_llm.traces import load_catalog
from timely_llm_bench.evaluation.estimate_error import measure, segment_errors
from timely_llm_bench.evaluation.harness import EngineSetup, run_bench
from timely_llm_bench.workloads.generator import WorkloadSpec, generate

SKILLS = load_skill_models()
CATALOG = load_catalog()
TELLO = SKILLS["tello"]
PROFILE = load_profile("rtx4090-llama3-8b")
ESTIMATOR = ExecutionTimeEstimator.from_profile(PROFILE)


def request(rid, prompt_len=100, output=0, robot=TELLO, prompt=None):
    r = Request(rid, "a", robot, NORMAL_TUF, 0.0, prompt or [7] * prompt_len, 64)
    r.output_ids = [3] * output
    return r


def test_least_squares_fit_recovers_known_coefficients():
    truth = ExecutionTimeEstimator(a=3e-9, b=8e-5, c=0.02, s=5e-4, p=2e-7, stall=0.004)
    prefills = [n for n in (32, 128, 512, 1024, 2048)]
    decodes = [(b, ctx) for b in (1, 2, 8, 16) for ctx in (200, 900)]
    samples = [([(n, n)], [], 0, truth.prefill_time(n)) for n in prefills]
    samples += [([], [ctx] * b, 0, truth.decode_step(b, b * ctx)) for b, ctx in decodes]
    fitted = ExecutionTimeEstimator.from_profile(fit_profile(samples, "fit", PROFILE.memory, 4096))
    for name in ("a", "b", "c", "s", "p", "stall"):
        assert getattr(fitted, name) == pytest.approx(getattr(truth, name), rel=1e-4), name
    n = 700
    assert fitted.prefill_time(n) == pytest.approx(fitted.a * n * n + fitted.b * n + fitted.c + fitted.stall)
    assert fitted.decode_step(1, 900) == pytest.approx(fitted.p * 900 + fitted.q)


def test_estimator_predicts_the_simulators_steps():
    engine = SimEngine(PROFILE)
    engine.start(GenerationSpec("g", list(range(10, 610)), max_new_tokens=8, forced_ids=[5] * 8))
    assert engine.step().duration == pytest.approx(ESTIMATOR.prefill_time(600))
    for i in range(3):
        engine.start(GenerationSpec(f"h{i}", list(range(1000 + 300 * i, 1300 + 300 * i)), max_new_tokens=8,
                                    forced_ids=[5] * 8))
    engine.step()  # their prefill
    out = engine.step()  # four decoding, each over its context so far (prompt + tokens generated)
    assert out.duration == pytest.approx(ESTIMATOR.decode_step(4, 602 + 3 * 301))


def test_segment_lengths_start_from_the_skill_model_and_learn_online():
    lengths = SegmentLengths(SKILLS)
    assert lengths.expected("tello", 0) == TELLO.segment_max_tokens / 2  # the prior
    for tokens in (4, 4, 3, 8):
        lengths.observe("tello", 0, tokens)
    assert lengths.expected("tello", 0) == pytest.approx(11 / 3)  # the commonest class (3-4 tokens), its mean
    assert lengths.expected("tello", 1) == TELLO.segment_max_tokens / 2  # another index: still the prior
    lengths.observe("tello", 9, 12)
    assert lengths.expected("tello", 5) == 12  # late indices share one class
    # A task seen before is predicted from its own history; an unseen one from its robot's.
    lengths.observe("tello", 0, 8, task=42)
    assert lengths.expected("tello", 0, task=42) == 8
    assert lengths.expected("tello", 0, task=43) == pytest.approx(11 / 3)


def test_uncached_tokens_of_waiting_suspended_and_running_generations():
    times = SegmentTimes(ESTIMATOR, SKILLS, block_tokens=16)
    prefix = list(range(100, 300))  # 200 tokens: 12 full blocks
    times.warmed(prefix)
    waiting = request("w", prompt=prefix + [1] * 50)
    assert times.uncached_tokens(waiting) == 250 - 192
    assert times.uncached_tokens(request("cold", prompt=[1] * 250)) == 250  # shares no warmed prefix
    suspended = request("s", prompt_len=250, output=12)
    for status in (Status.RUNNING, Status.PARKED):
        suspended.advance(status)
        assert times.uncached_tokens(suspended) == 0
    suspended.advance(Status.SUSPENDED)
    assert times.uncached_tokens(suspended) == 262 - 256


def test_g_is_resume_prefill_plus_expected_tokens_times_the_step():
    times = SegmentTimes(ESTIMATOR, SKILLS, block_tokens=16)
    times.join([900] * 3, max_batch=8)
    r = request("r", prompt_len=900)
    uncached = times.uncached_tokens(r)
    step = ESTIMATOR.decode_step(4, 4 * 900)
    expected = ESTIMATOR.prefill_extra(uncached, 900) + TELLO.segment_max_tokens / 2 * step
    assert times.gen_time(r, uncached, batch=4) == pytest.approx(expected)
    prefill, tokens = times.queue_terms(r)
    assert prefill + tokens * times.token_time() == pytest.approx(expected)  # the batch it would join: 4
    times.join([900] * 8, max_batch=8)
    assert times.token_time() == pytest.approx(ESTIMATOR.decode_step(8, 8 * 900))  # full: it joins a batch of 8


def test_measured_steps_scale_the_token_time():
    times = SegmentTimes(ESTIMATOR, SKILLS, block_tokens=16)
    times.join([500] * 3, max_batch=None)
    modelled = times.token_time()
    for _ in range(200):  # a machine twice as slow as the profile says
        times.record_step(2 * ESTIMATOR.decode_step(3, 1500), 3, 1500)
    assert times.token_time() == pytest.approx(2 * modelled, rel=1e-3)


def test_wcet_uses_the_pessimistic_length_and_the_estimator():
    times = SegmentTimes(ESTIMATOR, SKILLS, block_tokens=16)
    r = request("r", prompt_len=900)
    r.advance(Status.RUNNING)
    r.seg_tokens = 2
    for _ in range(3):
        times.observe(r, 0, 1)  # tiny segments: k * 1 = 5 < N_max = 10
    times.join([900] * 2, max_batch=None)
    step = ESTIMATOR.decode_step(3, 3 * 900)
    assert times.wcet(r, 3) == pytest.approx((PESSIMISTIC_FACTOR * 1 - 2) * step)  # k * N̂ < N_max
    for _ in range(5):
        times.observe(r, 0, 8)
    assert times.wcet(r, 3) == pytest.approx((TELLO.segment_max_tokens - 2) * step)  # capped at N_max
    queued = request("q", prompt_len=900)
    assert times.wcet(queued, 3) == pytest.approx(ESTIMATOR.prefill_extra(900, 900) + TELLO.segment_max_tokens * step)
    with pytest.raises(ValueError, match="pessimistic factor"):
        SegmentTimes(ESTIMATOR, SKILLS, 16, k=0.5)


def test_g_reaches_pud_as_the_action_start_and_eq4_density_keeps_the_profiled_average():
    times = SegmentTimes(ESTIMATOR, SKILLS, block_tokens=16)
    queue = GenerationQueue(PUD(0.008), times.queue_terms)
    long_task, short_task = request("long", prompt=[1] * 64), request("short", prompt=[2] * 64)
    times.observe(long_task, 0, 16)
    times.observe(short_task, 0, 2)
    queue.push(long_task)
    queue.push(short_task)
    queue.token_time = times.token_time()
    assert queue.best(0.0) is long_task
    gen_time = dict(zip(("long", "short"), queue._columns.column("gen_time"), strict=True))
    assert gen_time["long"] > 4 * gen_time["short"]
    # Both on time (utility 1 = beta): Eq. 4 ranks by slack, L = arrival + ERT - (now + G(s) + network),
    # over the robot's average G; the long segment's action would start later, so it has less slack.
    g = TELLO.segment_generation_time
    scores = dict(zip(("long", "short"), PUD(0.008).scores(queue._columns, 0.0), strict=True))
    for name in ("long", "short"):
        slack = 1.0 - (gen_time[name] + 0.008)
        assert scores[name] == pytest.approx(1.0 / (g * max(slack, g)))
    plain = GenerationQueue(PUD(0.008))  # off: every drone segment takes the profiled constant
    plain.push(long_task)
    assert list(plain._columns.column("gen_time")) == [TELLO.segment_generation_time]


def test_pud_density_does_not_favour_a_short_late_later_segment_over_a_late_first_one():
    # Under overload both are late. With G(s) as the density's divisor, the late first segment (its prompt to
    # prefill, a long first statement) would score (beta + |alpha| G) / G^2 below a short later segment's
    # |alpha| / G: fresh requests would wait behind every plan in flight. Eq. 4's average G keeps the first
    # response first, as with the profiled constant.
    times = SegmentTimes(ESTIMATOR, SKILLS, block_tokens=16)
    first = request("first", prompt=[1] * 400)
    later = request("later", prompt=[2] * 64, output=6)
    later.segments.append(Segment(0, "mf(50);", [], 0, 0, 2.0))
    later.prev_end_est = 1.0
    times.observe(first, 0, 20)
    times.observe(later, 1, 2)
    queue = GenerationQueue(PUD(0.008), times.queue_terms)
    queue.token_time = times.token_time(8, 1000)
    queue.push(first)
    queue.push(later)
    assert queue.best(5.0) is first
    gen_time = dict(zip(("first", "later"), queue._columns.column("gen_time"), strict=True))
    assert gen_time["first"] > 4 * gen_time["later"]


def workload(seed=0):
    return generate(WorkloadSpec("mini", 0.3, 8, tuple(range(1, 12)), 20, 40.0), CATALOG, SKILLS, seed)


def test_timebill_predicts_the_simulators_segment_times_and_off_keeps_the_constant():
    constant, timebill = measure(workload(), PROFILE, SKILLS, CATALOG, max_batch=8)
    assert timebill.segments == constant.segments > 50
    assert timebill.median < 0.15 < constant.median
    assert timebill.median_first < 0.15 and timebill.median_later < 0.15
    off = run_bench(workload(), "timelyllm", PROFILE, SKILLS, CATALOG, max_batch=8, features=Features())
    predicted = {s["predicted_gen_time"] for r in off["requests"] for s in r["segments"] if s["tokens"]}
    assert predicted == {TELLO.segment_generation_time, SKILLS["arm"].segment_generation_time}
    assert len(segment_errors(off)) == constant.segments


def test_estimate_error_command_prints_both_predictors(capsys):
    assert main(["estimate-error", "--workload", "WID1", "--max-batch", "4"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "timelyllm on WID1" in lines[0] and "max batch 4" in lines[0]
    assert [line.split()[0] for line in lines[2:]] == ["profiled", "TimeBill"]


def test_estimate_error_reads_bench_records(tmp_path, capsys):
    out = tmp_path / "r.json"
    assert main(["bench", "--workload", "WID3", "--policy", "timelyllm", "--features", "timebill",
                 "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["estimate-error", "--results", str(out)]) == 0
    row = capsys.readouterr().out.splitlines()[1].split()
    assert row[:3] == ["timelyllm", "[timebill]", "rtx4090-llama3-8b"] and int(row[3]) > 100
    assert float(row[4].rstrip("%")) < 15


def test_bench_on_a_real_engine_needs_its_step_profile_for_timebill(tmp_path, capsys):
    out = str(tmp_path / "r.json")
    args = ["bench", "--engine", "vllm", "--model", "tiny", "--workload", "WID1", "--policy", "timelyllm",
            "--features", "timebill", "--out", out]
    assert main(args) == 2
    assert "timely-llm profile --model tiny" in capsys.readouterr().err
    assert estimator_profile(None, False, "smollm2", "rtx4090-llama3-8b").name == "cpu-2core-smollm2-135m"
    assert estimator_profile(None, True, "smollm2", "h100-llama3-8b").name == "h100-llama3-8b"
    assert estimator_profile("h100-llama3-8b", False, "tiny", "rtx4090-llama3-8b").name == "h100-llama3-8b"


def test_timebill_needs_an_estimator():
    engine = SimEngine(PROFILE)
    with pytest.raises(ValueError, match="the timebill and deferred_prefill features need"):
        ServerConfig("timelyllm", 0.008, Features(timebill=True))
    setup = EngineSetup("real", lambda: engine, VirtualClock)
    with pytest.raises(ValueError, match="timely-llm profile"):
        run_bench(workload(), "timelyllm", setup, SKILLS, CATALOG, features=Features(timebill=True))
