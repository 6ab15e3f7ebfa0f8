"""The peer benchmark's parts that need no server: workloads, robot timing, stream parsing, the table."""

from __future__ import annotations

import dataclasses
import json
import random
import zlib
from collections import Counter

import pytest

from timely_llm.core.request import Outcome, Status
from timely_llm.core.tuf import TUF
from timely_llm.plan.robot_file import load_skill_models
from timely_llm.traces import load_catalog
from timely_llm_bench.evaluation.peer_bench import (
    FLOOR,
    EngineConfig,
    PeerBench,
    Run,
    RunRecord,
    _chunk,
    _node_record,
    core_slices,
    failures,
    first_segments,
    floor_requests,
    robot_times,
    table,
)
from timely_llm_bench.workloads.peer import PEER_WORKLOADS, generate_peer


@pytest.fixture(scope="module")
def catalog():
    return load_catalog()


def test_workloads_mix_every_category_and_contended_comes_in_bursts(catalog) -> None:
    light = generate_peer(PEER_WORKLOADS["light"], catalog, seed=0)
    contended = generate_peer(PEER_WORKLOADS["contended"], catalog, seed=0)
    assert len(light.requests) == 15 and len(contended.requests) == 34
    for workload in (light, contended):
        assert set(Counter(catalog[r.trace].category for r in workload.requests)) == {"urgent", "normal", "arm"}
        assert [r.arrival for r in workload.requests] == sorted(r.arrival for r in workload.requests)
        assert len({r.agent for r in workload.requests}) == len(workload.requests)
    # contended: several tasks arrive within 10 ms of each other; light: never
    gaps = lambda w: [b.arrival - a.arrival for a, b in zip(w.requests, w.requests[1:], strict=False)]  # noqa: E731
    assert min(gaps(light)) > 0.01
    assert sum(g < 0.01 for g in gaps(contended)) >= 10
    assert contended.requests[-1].arrival < light.requests[-1].arrival
    assert generate_peer(PEER_WORKLOADS["light"], catalog, seed=1) != light


def test_capped_sends_every_burst_larger_than_a_server_cap_of_8(catalog) -> None:
    bursty = generate_peer(PEER_WORKLOADS["capped"], catalog, seed=0)
    bursts: list[list] = []
    for r in bursty.requests:
        if bursts and r.arrival - bursts[-1][-1].arrival < 0.01:
            bursts[-1].append(r)
        else:
            bursts.append([r])
    assert len(bursts) >= 3 and all(len(b) > 8 for b in bursts), [len(b) for b in bursts]
    assert set(Counter(catalog[r.trace].category for r in bursty.requests)) == {"urgent", "normal", "arm"}


def test_floor_has_one_request_per_task(catalog) -> None:
    workload = generate_peer(PEER_WORKLOADS["contended"], catalog, seed=0)
    floor = floor_requests(workload)
    assert sorted(r.trace for r in floor) == sorted({r.trace for r in workload.requests})


def test_both_sides_serve_the_arms_blocking_scan_open_loop(catalog) -> None:
    skills = load_skill_models()
    bench = PeerBench(EngineConfig("smollm2", "/nowhere", None), [], skills, catalog)
    assert skills["arm"].blocking_call("scan('cup');") is not None  # the shipped arm waits for its scan
    assert bench.skills["arm"].blocking_call("scan('cup');") is None  # a streamed completion cannot
    assert bench.skills["arm"].system_prompt == skills["arm"].system_prompt


def test_robot_times_match_the_simulated_robots() -> None:
    robot = load_skill_models()["tello"]
    cuts = [("tc(90);", 1.0), ("mf(50);", 1.2), ("tp;", 5.0)]
    response, completion = robot_times(0, "r1", robot, 0.5, cuts, 0.01)
    durations = [robot.sample_exec_time(text, random.Random(zlib.crc32(f"0/r1/{i}".encode())))
                 for i, (text, _) in enumerate(cuts)]
    assert response == pytest.approx(1.0 + 0.01 - 0.5)
    # each segment starts when generated and the robot is free: the second waits for the first
    end = 1.01 + durations[0]
    end = max(1.21, end) + durations[1]
    end = max(5.01, end) + durations[2]
    assert completion == pytest.approx(end - 0.5)


def test_stream_lines_give_text_and_the_end() -> None:
    line = b'data: ' + json.dumps({"choices": [{"text": "tc(", "finish_reason": None}]}).encode()
    assert _chunk(line, False) == ("tc(", False)
    last = b'data: ' + json.dumps({"choices": [{"text": ";", "finish_reason": "length"}]}).encode()
    assert _chunk(last, False) == (";", True)
    assert _chunk(b"data: [DONE]", True) == ("", True)
    assert _chunk(b"", False) == ("", False)


def _record(i: int, category: str, trace: int, response: float, completion: float, ok: bool = True) -> RunRecord:
    return RunRecord(f"r{i}", category, trace, ok, ok, response if ok else None, completion if ok else None, "tp;")


def test_table_gives_ratios_to_the_same_sides_floor() -> None:
    floor = Run("node", FLOOR, "tasks", 1, [_record(0, "urgent", 6, 1.0, 4.0), _record(1, "normal", 1, 0.5, 3.0)])
    serve_floor = Run("serve", FLOOR, "tasks", 1, [_record(0, "urgent", 6, 2.0, 4.0),
                                                   _record(1, "normal", 1, 1.0, 3.0)])
    node = Run("node", "timelyllm", "peer-light", 1, [_record(2, "urgent", 6, 1.5, 6.0),
                                                      _record(3, "normal", 1, 1.0, 3.0, ok=False)])
    serve = Run("serve", "serve", "peer-light", 1, [_record(2, "urgent", 6, 3.0, 8.0),
                                                    _record(3, "normal", 1, 2.0, 3.0)])
    text = table([floor, serve_floor, node, serve])
    rows = {line.split(" | ")[1]: line for line in text.splitlines()[2:]}
    assert rows["node"].split(" | ")[3:7] == ["1.50x", "1.50x", "1.50x", "1.50x"]
    assert rows["node"].split(" | ")[7] == "-"  # no normal plan succeeded on the node
    assert rows["vllm serve"].split(" | ")[3:5] == ["1.50x", "1.50x"]
    assert rows["vllm serve"].split(" | ")[7] == "2.00x"
    assert rows["node"].rstrip(" |").endswith("1/2 | 1/2")
    second = Run("node", "timelyllm", "peer-light", 2, [_record(2, "urgent", 6, 2.0, 4.0)])
    floor2 = Run("node", FLOOR, "tasks", 2, [_record(0, "urgent", 6, 1.0, 4.0)])
    text = table([floor, node, floor2, second])
    assert "1.75x [1.50-2.00]" in text.splitlines()[2]


def test_the_node_on_the_remote_engine_has_rows_of_its_own_against_its_servers_floor() -> None:
    from timely_llm_bench.evaluation.peer_bench import NODE_REMOTE

    floor = [_record(0, "urgent", 6, 2.0, 4.0)]
    runs = [Run("serve", FLOOR, "tasks", 1, floor), Run(NODE_REMOTE, FLOOR, "tasks", 1, floor),
            Run("serve", "serve", "peer-bursty", 1, [_record(1, "urgent", 6, 4.0, 8.0)]),
            Run(NODE_REMOTE, "timelyllm", "peer-bursty", 1, [_record(1, "urgent", 6, 3.0, 8.0)])]
    rows = {line.split(" | ")[1]: line.split(" | ") for line in table(runs).splitlines()[2:]}
    assert rows["node on vllm serve"][2:4] == ["timelyllm", "1.50x"]
    assert rows["vllm serve"][3] == "2.00x"


def test_cli_prints_the_table_of_saved_runs_and_needs_out_to_run(tmp_path, capsys) -> None:
    from timely_llm.cli import main

    runs = [Run("node", FLOOR, "tasks", 1, [_record(0, "urgent", 6, 1.0, 4.0)]),
            Run("node", "vllm-stream", "peer-light", 1, [_record(1, "urgent", 6, 2.0, 6.0)])]
    saved = tmp_path / "peer.json"
    saved.write_text(json.dumps({"runs": [r.to_json() for r in runs]}))
    assert main(["peer-bench", "--from", str(saved)]) == 0
    row = capsys.readouterr().out.splitlines()[2]
    assert row.startswith("| peer-light | node | vllm-stream | 2.00x | 2.00x | 1.50x | 1.50x |")
    assert main(["peer-bench", "--rounds", "1"]) != 0
    assert "--out: is required" in capsys.readouterr().err


def test_the_floor_is_each_tasks_quickest_succeeded_pass() -> None:
    from timely_llm_bench.evaluation.peer_bench import quickest

    loaded = [_record(0, "urgent", 6, 3.0, 9.0), _record(1, "normal", 1, 1.0, 3.0, ok=False)]
    quiet = [_record(0, "urgent", 6, 1.0, 4.0), _record(1, "normal", 1, 2.0, 5.0)]
    floor = {r.trace: r for r in quickest([loaded, quiet, loaded])}
    assert (floor[6].response, floor[6].completion) == (1.0, 4.0)
    assert floor[1].succeeded and floor[1].response == 2.0  # a failed pass never stands for the floor


def test_first_segments_split_an_urgent_requests_wait_by_step_kind() -> None:
    # arrives at 10.0, starts at 10.02, first segment dispatched at 10.5; a prefill step (0.1 s), an empty
    # step (vLLM compiling a grammar), three decode steps at batch 2 and 4; the step after dispatch is not its
    log = {
        "arrivals": {"u": 10.0, "n": 10.0},
        "segments": {"u": [[10.02, 10.5, 9, 896], [10.5, 11.0, 4, None]], "n": [[10.0, 10.1, 3, 896]]},
        "steps": [[9.9, 3, 0, 0.02], [10.02, 1, 1, 0.1], [10.12, 0, 0, 0.001], [10.13, 2, 0, 0.02],
                  [10.2, 4, 0, 0.03], [10.3, 4, 0, 0.03], [10.5, 1, 0, 0.02]],
    }
    records = [_record(0, "urgent", 6, 0.5, 1.0), _record(1, "normal", 1, 0.1, 1.0)]
    records[0].id, records[1].id = "u", "n"
    out = first_segments([Run("node", "timelyllm", "w", 1, records, log)], "urgent")
    row = [cell.strip() for cell in out.splitlines()[-1].strip("| ").split("|")]
    assert row[:4] == ["w", "timelyllm", "1", "1"]
    response, queued, prefill, decode, steps, per_step, batch, empty, outside = map(float, row[4:13])
    assert (response, queued, prefill, decode, steps) == (0.5, 0.02, 0.1, 0.08, 3)
    assert per_step == pytest.approx(26.7, abs=0.05) and batch == pytest.approx(3.3, abs=0.05)
    assert empty == 0.001 and outside == pytest.approx(0.5 - 0.181, abs=1e-3)


def test_a_node_plan_without_a_statement_gave_no_action_as_on_the_streaming_side() -> None:
    skills = load_skill_models()
    base = Outcome("r", "a", 8, "urgent", "tello", Status.SUCCEEDED, "", 0.0, TUF(0.2, -6.67, 2.0), "mf(50);", 12, (),
                   response_time=0.4, completion_time=2.0)
    assert _node_record(base, skills) == RunRecord("r", "urgent", 8, True, True, 0.4, 2.0, "mf(50);")
    budget_out = "the plan's 48-token budget ran out before its first complete statement"
    empty = dataclasses.replace(base, status=Status.ABORTED, reason=budget_out, plan="", response_time=None,
                                completion_time=None)
    assert _node_record(empty, skills) == RunRecord("r", "urgent", 8, False, False, None, None, "", budget_out)
    failed = dataclasses.replace(base, status=Status.ABORTED, reason="engine error: http://s sent nothing for 60 s",
                                 plan="", response_time=None, completion_time=None)
    assert _node_record(failed, skills).reason == "engine error: http://s sent nothing for 60 s"
    runs = [Run("node-remote", "timelyllm", "w", 1, [_node_record(o, skills) for o in (base, empty, failed, failed)])]
    assert failures(runs) == ("w node-remote timelyllm round 1: 2 x engine error: http://s sent nothing for 60 s; "
                              f"1 x {budget_out}")
    assert failures([Run("node", "timelyllm", "w", 1, [_node_record(base, skills)])]) == "none"


def test_saved_runs_print_the_machines_load_and_refuse_a_verdict_when_it_differs(tmp_path, capsys) -> None:
    from timely_llm.cli import main
    from timely_llm_bench.evaluation.machine_load import MachineLoad

    def run(config: str, others: float, round_: int = 1) -> Run:
        return Run("node", config, "peer-light", round_, [_record(1, "urgent", 6, 2.0, 6.0)],
                   load=MachineLoad(60.0, others, 1.0, 2, 1.0).to_json())

    floor = Run("node", FLOOR, "tasks", 1, [_record(0, "urgent", 6, 1.0, 4.0)])
    saved = tmp_path / "peer.json"
    saved.write_text(json.dumps({"runs": [r.to_json() for r in (floor, run("timelyllm", 0.2),
                                                                  run("vllm-stream", 0.3))]}))
    assert main(["peer-bench", "--from", str(saved)]) == 0
    out = capsys.readouterr().out
    assert "peer-light, node timelyllm: other processes kept 0.20 of 2 cores busy" in out
    assert out.strip().endswith("peer-light: comparable loads")
    # a second round on a busy machine, for timelyllm only: rounds combined, 0.2 and 2.0 -> 1.1 against 0.3
    saved.write_text(json.dumps({"runs": [r.to_json() for r in (floor, run("timelyllm", 0.2),
                                                                  run("vllm-stream", 0.3), run("timelyllm", 2.0, 2))]}))
    assert main(["peer-bench", "--from", str(saved)]) == 0
    assert "peer-light: no verdict: other processes kept 1.10 cores busy during node timelyllm's run" in \
        capsys.readouterr().out


@pytest.mark.parametrize("given", [None, 64])
def test_both_sides_get_the_embedded_engines_block_size_unless_one_is_given(tmp_path, given) -> None:
    from timely_llm.cli import build_parser
    from timely_llm.engines.vllm_engine import CPU_BLOCK_SIZE, default_block_size
    from timely_llm_bench.cli.engine import _peer_bench_of

    assert default_block_size() == CPU_BLOCK_SIZE  # this suite runs on vLLM's CPU build
    argv = ["peer-bench", "--out", str(tmp_path / "peer.json")] + (["--block-size", str(given)] if given else [])
    bench = _peer_bench_of(build_parser().parse_args(argv))
    assert bench.engine.block_size == (given or CPU_BLOCK_SIZE)


def test_several_cpu_servers_get_disjoint_cores_and_one_keeps_vllms_binding(monkeypatch) -> None:
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    assert core_slices(2, [1, 0]) == ["0", "1"]
    assert core_slices(2, [0, 1, 2, 3, 4]) == ["0,1", "2,3"]
    assert core_slices(1, [0, 1]) == [None]
    assert core_slices(3, [0, 1]) == [None, None, None]  # fewer cores than servers: nothing to split
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0-1|")
    assert core_slices(2, [0, 1]) == [None, None]  # the user's binding wins
