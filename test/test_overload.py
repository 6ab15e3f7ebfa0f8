"""Overload control (features.shed) and TimeBill's overrun strategies, on the simulator's virtual clock."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
from record_checks import check_record, check_shed_record

from timely_llm.cli import main
from timely_llm.clock import VirtualClock
from timely_llm.core.features import Features
from timely_llm.core.kv_reuse import COUNTERS as KV_REUSE_COUNTERS
from timely_llm.core.overload import INFEASIBLE_REASON, OverloadControl, Verdict, in_first_segment, infeasible_at
from timely_llm.core.request import Outcome, Request, Status
from timely_llm.core.tuf import TUF, URGENT_TUF
from timely_llm.engines.hardware import load_profile
from timely_llm.engines.sim import SimEngine
from timely_llm.errors import ConfigError
from timely_llm.plan.robot_file import load_skill_models
from timely_llm.server import PlanRequest, Server
from timely_llm.serving import Driver, ServerConfig, build_server
from timely_llm.traces import load_catalog
from timely_llm_bench.evaluation.harness import SimulatedRobots, run_bench
from timely_llm_bench.evaluation.metrics import markdown_table, run_end, shed_utility, summarize
from timely_llm_bench.workloads.generator import BUILTIN, Workload, generate, load_workload

SKILLS = load_skill_models()
CATALOG = load_catalog()
LATENCY = 0.008
DRONE_TRACES = (1, 3, 4, 6, 7, 8)


class ServerLog:
    """Notes, on a server built the product's way, the time of every scheduling point, where each request was
    when it was told it is infeasible, and the running first segments predicted past their cut-off (checked at
    every scheduling point)."""

    def __init__(self, server: Server) -> None:
        self.points: list[float] = []
        self.told_while: dict[str, Status] = {}
        self.past_cutoff: dict[str, float] = {}
        """Request id -> the first scheduling point at which it ran predicted past its cut-off."""
        check, tell, step, overload = server.overload.check, server.overload.tell, server.step, server.overload

        def noting_check(now: float) -> list[Verdict]:  # at every scheduling point
            for r in server.running.values():
                if in_first_segment(r) and now + overload.first_segment_left(r, now, len(server.running)) > (
                        r.arrival + r.tuf.cutoff - server.network_latency):
                    self.past_cutoff.setdefault(r.id, now)
            return check(now)

        def noting_tell(request: Request, now: float, left: float | None) -> Verdict:
            self.told_while[request.id] = request.status
            return tell(request, now, left)

        def noting_step() -> bool:
            self.points.append(server.clock.now())  # each step is one scheduling point
            return step()

        overload.check, overload.tell, server.step = noting_check, noting_tell, noting_step


class Run:
    """A server on the simulator with simulated robots; ``ended`` holds (time, record) per request."""

    def __init__(self, features: Features, profile: str = "rtx4090-llama3-8b", max_batch: int | None = 4) -> None:
        self.clock = VirtualClock()
        hardware = load_profile(profile)
        self.engine = SimEngine(hardware)
        self.ended: list[tuple[float, dict]] = []
        self.told: list[tuple[float, str]] = []
        self.driver = Driver(self.clock)
        robots = SimulatedRobots(SKILLS, LATENCY, 0, self.driver.at)
        config = ServerConfig("timelyllm", LATENCY, features, max_batch, step_profile=hardware)
        self.server = build_server(config, self.engine, SKILLS, self.clock, on_segment=robots.on_segment,
                                   on_finish=self._finished,
                                   on_infeasible=lambda r: self.told.append((self.clock.now(), r.id)))
        self.log = ServerLog(self.server)

    def _finished(self, request: Request) -> None:
        self.ended.append((self.clock.now(), Outcome.of(request).to_record()))

    def plan(self, rid: str, trace: int, tuf: TUF, at: float = 0.0, **options: object) -> PlanRequest:
        t = CATALOG[trace]
        encode = self.engine.tokenizer.encode
        return PlanRequest(rid, f"agent-{rid}", t.robot, encode(CATALOG.prompt_text(t.robot, t.prompt)), tuf,
                           t.category, forced_ids=encode(t.plan), trace=trace, arrival=at, **options)

    def submit_at(self, plan: PlanRequest) -> None:
        self.driver.arrive(plan)

    def burst(self, n: int, tuf: TUF, **options: object) -> None:
        """``n`` drone requests at once (a WID2-like event), cycling through the drone traces."""
        for i in range(n):
            self.submit_at(self.plan(f"b{i:03d}", DRONE_TRACES[i % len(DRONE_TRACES)], tuf, **options))

    def records(self) -> dict[str, dict]:
        return {rec["id"]: rec for _, rec in self.ended}


def infeasible_time(rec: dict) -> float:
    robot = SKILLS[CATALOG[rec["trace"]].robot]
    return infeasible_at(rec["arrival"], TUF(**rec["tuf"]).cutoff, robot.segment_generation_time, LATENCY)


def test_off_changes_nothing_even_when_requests_become_infeasible() -> None:
    run = Run(Features())
    run.burst(60, URGENT_TUF)
    run.driver.run(run.server)
    records = run.records()
    done = set(run.server.counters) - set(KV_REUSE_COUNTERS)  # resumes are counted whatever the parts
    assert len(records) == 60 and not done and not run.told
    for rec in records.values():
        check_record(rec, LATENCY)
        assert rec["infeasible_at"] is None and not rec["shed"]
    assert min(r["utility"] for r in records.values()) < 0  # some were served past their cut-off


def test_infeasible_requests_are_shed_within_one_scheduling_step() -> None:
    run = Run(Features(shed=True))
    run.burst(60, URGENT_TUF)
    run.driver.run(run.server)
    records = run.records()
    shed = [r for r in records.values() if r["shed"]]
    assert len(records) == 60 and len(shed) == run.server.counters["shed"] > 0
    points = run.log.points
    for rec in shed:
        check_shed_record(rec, SKILLS[rec["robot"]].segment_generation_time, LATENCY)
        due = infeasible_time(rec)
        assert due < rec["infeasible_at"]  # never before it was infeasible
        # ... and at the first scheduling point after it was
        assert not [p for p in points if due < p < rec["infeasible_at"]]
    for rec in records.values():
        if not rec["shed"]:
            check_record(rec, LATENCY)
            # served: its first segment started generating before it would have been infeasible
            assert rec["segments"][0]["gen_start"] <= infeasible_time(rec)


def test_with_timebill_the_fastest_first_segment_is_predicted_for_the_hardware() -> None:
    """On an edge GPU a first segment takes far longer than the robot's profiled G: TimeBill's estimate
    (prefill and expected length at a batch of one) sheds earlier, yet never before the cut-off less it."""
    profile = "jetson-agx-orin-64gb-llama3-8b-q4"
    runs = {}
    for features in (Features(shed=True), Features(shed=True, timebill=True)):
        runs[features.timebill] = run = Run(features, profile=profile)
        run.burst(60, URGENT_TUF)
        run.driver.run(run.server)
    told = {tb: {r["id"]: r for r in run.records().values() if r["shed"] and run.log.told_while[r["id"]].queued}
            for tb, run in runs.items()}  # shed from the queue (those shed while running: the test below)
    assert len(told[True]) > len(told[False]) > 0
    for rec in told[True].values():
        fastest = rec["best_response"] - (rec["infeasible_at"] - rec["arrival"]) - LATENCY
        assert fastest > SKILLS[rec["robot"]].segment_generation_time  # slower hardware than the profiled G's
        due = infeasible_at(rec["arrival"], URGENT_TUF.cutoff, fastest, LATENCY)
        assert due < rec["infeasible_at"]
        assert not [p for p in runs[True].log.points if due < p < rec["infeasible_at"]]


EDGE_TUF = TUF(ert=1.2, alpha=-2.0, beta=1.0)


def test_running_first_segments_predicted_past_their_cutoff_in_their_batch_are_shed_at_that_point() -> None:
    """Admitted into a batch whose steps are too slow (an edge GPU, 16 at once), a first segment can still pass
    its cut-off: it is told at the first scheduling point at which it is predicted to, and served urgent
    requests stay above zero where, without shedding, they end below."""
    profile, utility = "jetson-agx-orin-64gb-llama3-8b-q4", {}
    for shed in (False, True):
        run = Run(Features(shed=shed, timebill=True), profile=profile, max_batch=16)
        for i in range(48):  # three every 0.1 s; a cut-off (1.7 s) that a first segment's prefill here leaves room for
            run.submit_at(run.plan(f"u{i:02d}", DRONE_TRACES[i % len(DRONE_TRACES)], EDGE_TUF, at=0.1 * (i // 3)))
        run.driver.run(run.server)
        records = run.records()
        assert len(records) == 48
        served = [r["utility"] for r in records.values() if not r["shed"]]
        utility[shed] = sum(served) / len(served)
    assert utility[False] < 0 < utility[True]
    log = run.log
    running = {rid for rid, status in log.told_while.items() if status is Status.RUNNING}
    assert running and run.server.counters["shed_running"] == len(running)
    assert set(log.past_cutoff) == running  # every one predicted past its cut-off was shed...
    for rid in running:
        rec = records[rid]
        assert rec["shed"] and rec["infeasible_at"] == log.past_cutoff[rid]  # ...at that very point
        tuf = rec["tuf"]
        assert tuf["alpha"] * (rec["best_response"] - tuf["ert"]) + tuf["beta"] < 0


def test_admission_keeps_running_first_segments_able_to_make_their_cutoff(monkeypatch) -> None:
    """A newcomer that would push a more urgent running first segment past its cut-off waits: fewer running
    first segments then turn infeasible (and are shed) than when admission ignores them."""
    shed_running = {}
    for guarded in (True, False):
        if not guarded:
            monkeypatch.setattr(OverloadControl, "breaks_a_cutoff", lambda self, newcomer, now: False)
        run = Run(Features(shed=True, timebill=True), profile="jetson-agx-orin-64gb-llama3-8b-q4", max_batch=16)
        for i in range(48):
            run.submit_at(run.plan(f"u{i:02d}", DRONE_TRACES[i % len(DRONE_TRACES)], EDGE_TUF, at=0.1 * (i // 3)))
        run.driver.run(run.server)
        assert len(run.records()) == 48
        shed_running[guarded] = run.server.counters["shed_running"]
    assert shed_running[True] < shed_running[False]


def test_goal_time_infeasible_is_ended_at_the_next_scheduling_point_unless_the_robot_keeps_waiting() -> None:
    impossible = TUF(ert=0.0, alpha=-100.0, beta=1.0)  # cut-off 10 ms: below network latency + G
    run = Run(Features(shed=True))
    run.server.submit(run.plan("gone", 6, impossible))
    assert not run.ended  # a submit ends no request, not even its own
    assert not run.server.step()  # the scheduling point sheds it before the engine could start it
    assert [rec["id"] for _, rec in run.ended] == ["gone"]
    rec = run.ended[0][1]
    assert rec["status"] == "aborted" and rec["reason"] == INFEASIBLE_REASON and rec["infeasible_at"] == 0.0
    run.server.submit(run.plan("kept", 6, impossible, keep_if_infeasible=True))
    assert not run.told
    run.driver.run(run.server)
    assert run.told == [(0.0, "kept")] and len(run.ended) == 2
    kept = run.records()["kept"]
    check_record(kept, LATENCY)
    assert kept["infeasible_at"] == 0.0 and not kept["shed"] and kept["utility"] < 0
    assert run.server.counters == {"shed": 1, "infeasible_kept": 1}


def test_shed_is_off_with_the_switch_even_for_goal_time_infeasible_requests() -> None:
    run = Run(Features())
    run.server.submit(run.plan("late", 6, TUF(ert=0.0, alpha=-100.0, beta=1.0)))
    run.driver.run(run.server)
    assert run.records()["late"]["status"] == "succeeded" and not run.told


# Segments overrun when their robot waits on them: TUF_1's cut-off (beta / |alpha|) is 50 ms; the first's 5.05 s.
IDLE_INTOLERANT = TUF(ert=5.0, alpha=-1.0, beta=0.05)


def overrun_run(strategy: str) -> Run:
    run = Run(Features(), max_batch=1)
    run.burst(60, IDLE_INTOLERANT, overrun=strategy)
    run.driver.run(run.server)
    return run


def test_kill_aborts_a_plan_whose_segment_overran() -> None:
    run = overrun_run("kill")
    killed = [(t, rec) for t, rec in run.ended if rec["status"] == "aborted"]
    assert killed and len(killed) == run.server.counters["overruns_killed"]
    checked = {0: 0, 1: 0}
    for t, rec in killed:
        index = len(rec["segments"])
        assert rec["reason"] == f"segment {index} overran its deadline (overrun strategy kill)"
        # killed after the deadline of the segment it was waiting for, at the first scheduling point past it
        if index == 0:
            deadline = rec["arrival"] + IDLE_INTOLERANT.cutoff - LATENCY
        elif rec["segments"][-1]["exec_end"] is not None:  # else its robot was still executing on our estimate
            deadline = rec["segments"][-1]["exec_end"] + 0.05 - LATENCY
        else:
            continue
        assert deadline < t
        assert not [p for p in run.log.points if deadline < p < t]
        checked[min(index, 1)] += 1
    assert checked[0] and checked[1]  # first segments and later ones
    for _, rec in run.ended:
        if rec["status"] == "succeeded":
            check_record(rec, LATENCY)


def test_skip_next_drops_late_segments_and_completes_the_plan() -> None:
    plain, skipping = overrun_run("none").records(), overrun_run("skip-next")
    records = skipping.records()
    assert all(rec["status"] == "succeeded" for rec in records.values())
    skipped = sum(rec["skipped_segments"] for rec in records.values())
    assert skipped == skipping.server.counters["overruns_skipped"] > 0
    for rid, rec in records.items():
        if rec["skipped_segments"] == 0:
            check_record(rec, LATENCY)
            continue
        sent = [s["text"] for s in rec["segments"] if s["text"]]
        whole = [s["text"] for s in plain[rid]["segments"]]
        assert len(sent) + rec["skipped_segments"] == len(whole)
        assert all(s in whole for s in sent)  # the segments sent are the plan's own, in its order
        assert [whole.index(s) for s in sent] == sorted(whole.index(s) for s in sent)


def test_unknown_overrun_strategy_is_rejected() -> None:
    run = Run(Features())
    with pytest.raises(Exception, match="unknown overrun strategy 'skip'"):
        run.server.submit(run.plan("x", 6, URGENT_TUF, overrun="skip"))


def _record(rid: str, status: str, utility: float | None, **extra: object) -> dict:
    return {"id": rid, "category": "urgent", "status": status, "utility": utility, "tuf": URGENT_TUF.to_dict(),
            "response_time": 0.1, "waiting_time": 0.0, "completion_time": 1.0, "shed": False,
            "infeasible_at": None, "best_response": None, "segments": [], **extra}


def test_summary_reports_utility_with_and_without_shed_requests() -> None:
    served = _record("a", "succeeded", 2.0, segments=[{"exec_end": 50.0}])
    shed = _record("b", "aborted", None, shed=True, infeasible_at=10.0, best_response=0.6)
    summary = summarize([served, shed])["urgent"]
    assert summary["shed"] == 1 and summary["aborted"] == 1
    assert summary["mean_utility"] == 2.0  # without: the served one only
    counted = URGENT_TUF(0.6 + 40.0)  # its best response, pushed past the run's end (50 s) from when it was shed
    assert shed_utility(shed, 50.0) == pytest.approx(counted)
    assert summary["mean_utility_with_shed"] == pytest.approx((2.0 + counted) / 2)
    assert counted < URGENT_TUF(0.6) < 0  # never better than its best case when it was shed


def test_killed_plans_count_back_at_their_first_action_or_else_after_the_run() -> None:
    served = _record("a", "succeeded", 2.0, arrival=0.0, segments=[{"exec_start": 0.1, "exec_end": 50.0}])
    acted = _record("b", "aborted", None, arrival=5.0, killed_at=30.0,
                    segments=[{"exec_start": 5.3, "exec_end": 8.0}, {"exec_start": 9.0, "exec_end": 12.0}])
    never = _record("c", "aborted", None, arrival=20.0, killed_at=60.0)  # killed before its first action
    summary = summarize([served, acted, never])["urgent"]
    assert summary["killed"] == 2 and summary["aborted"] == 2 and summary["shed"] == 0
    assert summary["mean_utility"] == 2.0
    end = 60.0  # the kill after every segment's end
    assert shed_utility(acted, end) == pytest.approx(URGENT_TUF(0.3))
    assert shed_utility(never, end) == pytest.approx(URGENT_TUF(40.0))
    assert summary["mean_utility_with_shed"] == pytest.approx((2.0 + URGENT_TUF(0.3) + URGENT_TUF(40.0)) / 3)
    assert "killed" not in summarize([served])["urgent"]


def test_summary_without_shed_requests_has_equal_figures() -> None:
    from_ros = {k: v for k, v in _record("c", "aborted", None).items() if k not in ("segments", "shed")}  # fleet's
    summary = summarize([_record("a", "succeeded", 1.5), from_ros])["all"]
    assert summary["shed"] == 0 and summary["mean_utility_with_shed"] == summary["mean_utility"] == 1.5
    assert math.isfinite(summary["mean_utility"])


def test_tables_show_shed_counts_only_when_something_was_shed() -> None:
    served = _record("a", "succeeded", 2.0, segments=[{"exec_end": 50.0}])
    shed = _record("b", "aborted", None, shed=True, infeasible_at=10.0, best_response=0.6)
    result = {"workload": "w", "policy": "timelyllm"}
    with_shed = markdown_table([{**result, "summary": summarize([served, shed])}])
    assert "| shed | utility with shed |" in with_shed.splitlines()[0]
    assert with_shed.splitlines()[-1].endswith(f"| 1 | {(2.0 + URGENT_TUF(40.6)) / 2:.3f} |")
    assert "shed" not in markdown_table([{**result, "summary": summarize([served])}])


# ----- overrun strategies in bench: set per request in the workload, or for all by bench --overrun-strategy -----

AGX = "jetson-agx-orin-64gb-llama3-8b-q4"
WID2 = generate(BUILTIN["WID2"], CATALOG, SKILLS, 0)
WID2_START = dataclasses.replace(WID2, requests=tuple(r for r in WID2.requests if r.arrival < 60.0))
"""The first minute of WID2: on the Jetson AGX at a batch of 8, some robots wait past a segment's cut-off."""


def bench_overrun(workload: Workload) -> dict:
    return run_bench(workload, "timelyllm", load_profile(AGX), SKILLS, CATALOG, 0, 8)


def test_bench_overrun_strategies_change_the_records_as_specified() -> None:
    plain, killing, skipping = (bench_overrun(WID2_START.with_overrun(s)) for s in ("none", "kill", "skip-next"))
    whole = {r["id"]: [s["text"] for s in r["segments"]] for r in plain["requests"]}
    assert all(r["status"] == "succeeded" and r["skipped_segments"] == 0 for r in plain["requests"])
    assert not {"overruns_killed", "overruns_skipped"} & set(plain["counters"])

    killed = [r for r in killing["requests"] if r["status"] != "succeeded"]
    assert len(killed) == killing["counters"]["overruns_killed"] > 0
    for r in killed:
        sent = [s["text"] for s in r["segments"]]
        assert r["reason"] == f"segment {len(sent)} overran its deadline (overrun strategy kill)"
        assert sent == whole[r["id"]][:len(sent)] and len(sent) < len(whole[r["id"]])  # ended there
    assert {len(r["segments"]) > 0 for r in killed} == {False, True}  # first segments and later ones
    assert all(r["killed_at"] is not None for r in killed)
    assert not any(r["killed_at"] for r in killing["requests"] if r["status"] == "succeeded")
    end = run_end(killing["requests"])
    for category, summary in killing["summary"].items():  # the killed counted back in, not hidden by the served mean
        mine = [r for r in killing["requests"] if category in ("all", r["category"])]
        ended = [r for r in mine if r["killed_at"] is not None]
        assert summary.get("killed", 0) == len(ended)
        counted = [r["utility"] for r in mine if r["status"] == "succeeded"] + [shed_utility(r, end) for r in ended]
        assert summary["mean_utility_with_shed"] == pytest.approx(sum(counted) / len(counted))

    assert all(r["status"] == "succeeded" for r in skipping["requests"])
    assert sum(r["skipped_segments"] for r in skipping["requests"]) == skipping["counters"]["overruns_skipped"] > 0
    for r in skipping["requests"]:
        sent = [s["text"] for s in r["segments"] if s["text"]]
        assert len(sent) + r["skipped_segments"] == len(whole[r["id"]])
        assert [whole[r["id"]].index(s) for s in sent] == sorted(whole[r["id"]].index(s) for s in sent)


def test_workload_file_sets_the_strategy_per_request_and_refuses_an_unknown_one(tmp_path: Path) -> None:
    marked = {r.id for r in WID2_START.requests[::2]}
    data = WID2_START.to_json()
    for raw in data["requests"]:
        if raw["id"] in marked:
            raw["overrun"] = "kill"
    path = tmp_path / "w.json"
    path.write_text(json.dumps(data))
    workload = load_workload(path, CATALOG)
    assert workload.to_json() == data and "overrun" not in WID2_START.to_json()["requests"][0]
    killed = {r["id"] for r in bench_overrun(workload)["requests"] if r["status"] != "succeeded"}
    assert killed and killed <= marked

    data["requests"][3]["overrun"] = "skip"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=r"requests\[3\]\.overrun.*got 'skip'"):
        load_workload(path, CATALOG)


def test_bench_option_sets_every_requests_strategy(tmp_path: Path) -> None:
    path, out = tmp_path / "w.json", tmp_path / "r.json"
    path.write_text(json.dumps(WID2_START.to_json()))
    assert main(["bench", "--workload", str(path), "--hw", AGX, "--policy", "timelyllm", "--max-batch", "8",
                 "--overrun-strategy", "skip-next", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["counters"] == bench_overrun(WID2_START.with_overrun("skip-next"))["counters"]
