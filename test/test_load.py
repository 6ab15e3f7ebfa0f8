"""The scheduler under load on the virtual clock: no collapse, the vllm-priority baseline, the load map."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from guards import bounded

from timely_llm.cli import main
from timely_llm.clock import VirtualClock
from timely_llm.core.tuf import NORMAL_TUF, URGENT_TUF
from timely_llm.engines.hardware import load_profile
from timely_llm.engines.sim import SimEngine
from timely_llm.plan.robot_file import load_skill_models
from timely_llm.server import PlanRequest, Server
from timely_llm.serving import ServerConfig, build_server
from timely_llm.traces import load_catalog
from timely_llm_bench.evaluation.harness import run_bench
from timely_llm_bench.evaluation.sweep import workload_for

SKILLS = load_skill_models()
CATALOG = load_catalog()
PROFILE = load_profile("rtx4090-llama3-8b")


def last_generation_end(result: dict) -> float:
    return max(s["gen_end"] for r in result["requests"] for s in r["segments"])


@pytest.mark.parametrize("cap", [None, 8])
def test_no_collapse_at_400_agents(cap):
    # 400 agents (event rate 2.4/s, up to 16 tasks each): the old one-admission-per-iteration rule let the
    # queue grow without bound here (urgent response 34.6 s over 200 s). Segmented generation must keep up
    # with streaming: every plan generated about as soon, nobody waiting long for a first action.
    workload = workload_for(400, 20.0, 3, CATALOG, SKILLS)
    stream, timely = (run_bench(workload, p, PROFILE, SKILLS, CATALOG, 0, cap) for p in ("vllm-stream", "timelyllm"))
    for result in (stream, timely):
        assert result["summary"]["all"]["succeeded"] == len(workload.requests) > 300
    assert last_generation_end(timely) <= last_generation_end(stream) + 1.0
    assert max(r["response_time"] for r in timely["requests"]) < 2.0
    urgent = {n: r["summary"]["urgent"]["mean_utility"] for n, r in (("stream", stream), ("timely", timely))}
    normal = {n: r["summary"]["normal"]["mean_utility"] for n, r in (("stream", stream), ("timely", timely))}
    assert urgent["timely"] >= 0.97 * urgent["stream"]
    assert normal["timely"] >= 0.95 * normal["stream"]
    if cap == 8:  # scarce: suspending at segment boundaries pays
        assert urgent["timely"] >= 1.2 * urgent["stream"]


def priority_server(max_batch: int) -> tuple[Server, VirtualClock, SimEngine]:
    clock = VirtualClock()
    engine = SimEngine(PROFILE)
    return build_server(ServerConfig("vllm-priority", 0.008, max_batch=max_batch), engine, SKILLS, clock), clock, engine


def plan(engine: SimEngine, rid: str, trace: int, arrival: float) -> PlanRequest:
    t, tok = CATALOG[trace], engine.tokenizer
    return PlanRequest(rid, rid, t.robot, tok.encode(CATALOG.prompt_text(t.robot, t.prompt)),
                       URGENT_TUF if t.category == "urgent" else NORMAL_TUF, t.category,
                       forced_ids=tok.encode(t.plan), trace=trace, arrival=arrival)


def test_vllm_priority_admits_by_urgency_and_never_preempts_a_full_batch():
    # vLLM V1's priority policy: the waiting queue is ordered by (priority, arrival); a full batch
    # (max_num_seqs) makes newcomers wait, whatever their priority; only a KV shortage preempts.
    server, clock, engine = priority_server(max_batch=1)
    server.submit(plan(engine, "n1", 1, 0.0))
    server.step()  # n1 runs
    server.submit(plan(engine, "n2", 2, clock.now()))
    server.submit(plan(engine, "u1", 7, clock.now()))
    server.step()
    assert engine.running_ids() == ["n1"]  # the urgent one waits: no preemption on a full batch
    guard = bounded()
    while "n1" in server.running:
        next(guard)
        server.step()
    server.step()
    assert engine.running_ids() == ["u1"]  # admitted before the earlier normal one
    assert engine._running["u1"].spec.priority == 200 < 1000  # ERT in ms reaches the engine


def test_sweep_json_and_plot(tmp_path: Path):
    out = tmp_path / "sweep.json"
    assert main(["sweep", "--hw", "rtx4090-llama3-8b", "jetson-orin-nx-16gb-llama32-3b-q4", "--agents", "25", "50",
                 "--caps", "8", "none", "--duration", "15", "--jobs", "1", "--out", str(out)]) == 0
    sweep = json.loads(out.read_text())
    assert sweep["kind"] == "timely-llm sweep" and sweep["grid"]["caps"] == [8, None]
    points = sweep["points"]
    assert len(points) == 2 * 2 * 2 * 3
    assert {(p["hw"], p["cap"], p["agents"], p["policy"]) for p in points} == {
        (hw, cap, a, pol) for hw in ("rtx4090-llama3-8b", "jetson-orin-nx-16gb-llama32-3b-q4") for cap in (8, None)
        for a in (25, 50) for pol in ("vllm-stream", "vllm-priority", "timelyllm")}
    for p in points:
        assert p["summary"]["all"]["succeeded"] == p["requests"] > 0
        assert p["events_per_second"] == pytest.approx(0.25 * p["agents"] / 42)
        assert set(p["isolated_response"]) == {"normal", "urgent"}
        # the isolated bound is a lower bound on what any policy achieves under load
        assert p["summary"]["urgent"]["mean_response_time"] >= p["isolated_response"]["urgent"] - 1e-9
    assert main(["plot", str(out), "--out", str(tmp_path / "plots")]) == 0
    for hw in ("rtx4090-llama3-8b", "jetson-orin-nx-16gb-llama32-3b-q4"):
        png = (tmp_path / "plots" / f"map_{hw}.png").read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n"
        width, height = struct.unpack(">II", png[16:24])
        assert width > 2 * 300 and height > 3 * 200  # two cap columns, three metric rows
    assert main(["sweep", "--hw", "rtx4090-llama3-8b", "--caps", "0", "--out", str(out)]) == 2
