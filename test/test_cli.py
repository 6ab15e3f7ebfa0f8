"""The command line: every bad argument is a one-line error with exit code 2, before any work; help says it all."""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import pytest
import yaml

from timely_llm.cli import build_parser, main
from timely_llm.core.policies import POLICIES
from timely_llm.engines.hardware import load_profile
from timely_llm_bench.evaluation.harness import BENCH_POLICIES, BENCH_POLICY_HELP


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """Exit code and stderr of ``timely-llm ARGV``, argparse's exits included."""
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    return code, capsys.readouterr().err


def assert_one_line_error(code: int, err: str, *needles: str) -> None:
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "error" in lines[0] and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], (needle, err)


@pytest.fixture
def no_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any bench, replay or vLLM start fails the test: the errors must come before them."""
    import timely_llm_bench.evaluation.harness as harness

    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("the run started before the bad argument was reported")

    import timely_llm_bench.robots.fleet as fleet

    monkeypatch.setattr(harness, "run_bench", forbidden)
    monkeypatch.setattr(fleet, "ros_session", forbidden)
    monkeypatch.setitem(sys.modules, "timely_llm.engines.vllm_engine", None)  # importing it raises ImportError


BENCH = ["bench", "--workload", "WID1", "--policy", "timelyllm"]
ORIN = "jetson-orin-nx-16gb-llama32-3b-q4"


@pytest.mark.parametrize("argv,needles", [
    ([*BENCH, "--out", "/nonexistent_dir/r.json"], ["--out", "/nonexistent_dir"]),
    (["bench", "--engine", "vllm", "--workload", "WID1", "--policy", "isolated", "--out", "{tmp}/r.json"],
     ["isolated", "--engine sim"]),
    (["bench", "--engine", "vllm", "--hw", "h100-llama3-8b", "--workload", "WID1", "--policy", "vllm",
      "--out", "{tmp}/r.json"], ["--hw"]),
    ([*BENCH, "--model", "{tmp}", "--out", "{tmp}/r.json"], ["--model", "--engine vllm"]),
    (["bench", "--engine", "vllm", "--suspend-in-place", "--workload", "WID1", "--policy", "vllm",
      "--out", "{tmp}/r.json"], ["--suspend-in-place", "--engine sim"]),
    (["bench", "--engine", "vllm", "--model", "/no/such/model", "--workload", "WID1", "--policy", "vllm",
      "--out", "{tmp}/r.json"], ["--model", "/no/such/model"]),
    ([*BENCH, "--out", "{tmp}"], ["--out", "is a directory"]),
    ([*BENCH, "--seed", "-1", "--out", "{tmp}/r.json"], ["--seed", "-1"]),
    ([*BENCH, "--max-batch", "0", "--out", "{tmp}/r.json"], ["--max-batch"]),
    ([*BENCH, "--max-batch", "many", "--out", "{tmp}/r.json"], ["--max-batch", "not an integer"]),
    (["bench", "--workload", "WID1", "--policy", "best", "--out", "{tmp}/r.json"], ["--policy", "best"]),
    ([*BENCH, "--hw", "no-such-gpu", "--out", "{tmp}/r.json"],
     ["timely-llm bench: error: no-such-gpu: neither a shipped hardware profile"]),
    (["bench", "--workload", "WID9", "--policy", "vllm", "--out", "{tmp}/r.json"], ["WID9"]),
    ([*BENCH, "--skill-models", "/no/robot.yaml", "--out", "{tmp}/r.json"], ["/no/robot.yaml"]),
    ([*BENCH], ["--out"]),
    ([*BENCH, "--features", "timebill,warp", "--out", "{tmp}/r.json"], ["--features", "warp"]),
    (["workload", "--workload", "WID1", "--out", "/nonexistent_dir/w.json"], ["/nonexistent_dir"]),
    (["table", "/no/such/result.json"], ["/no/such/result.json"]),
    (["plot", "{tmp}/result.json", "--out", "{tmp}/result.json"], ["not a directory"]),
    (["sched-overhead", "--repeat", "0"], ["--repeat"]),
    (["sched-overhead", "--sizes", "10", "-5"], ["--sizes"]),
    (["profile", "--max-model-len", "100", "--out", "{tmp}/hw.yaml"], ["--max-model-len", "128"]),
    (["profile", "--out", "/nonexistent_dir/hw.yaml"], ["/nonexistent_dir"]),
    (["profile", "--model", "/no/model", "--out", "{tmp}/hw.yaml"], ["--model", "no such model directory"]),
    (["profile", "--url", "http://127.0.0.1:9", "--max-model-len", "512", "--out", "{tmp}/hw.yaml"],
     ["--url", "not taken"]),
    (["fidelity", "--url", "http://127.0.0.1:9", "--hw", "{tmp}/box.yaml", "--first", "2"],
     ["--url", "no remote server answers", "http://127.0.0.1:9"]),
    (["fleet", "--duration", "0"], ["--duration"]),
    (["fleet", "--domain-id", "999"], ["--domain-id", "0-232"]),
    (["fleet", "--out", "/nonexistent_dir/f.json"], ["/nonexistent_dir"]),
    (["demo", "--max-drones", "-2"], ["--max-drones"]),
    (["demo", "--policies", "isolated"], ["--policies"]),
    (["demo", "--policies", "vllm", "vllm"], ["--policies", "given twice"]),
    (["demo", "--point", "bursty", "--workload", "WID2"], ["--workload", "bursty point"]),
    (["demo", "--rounds", "0"], ["--rounds"]),
    (["demo", "--engine", "sim", "--point", "light", "--duration", "0.5"],
     ["--duration", "no request of WID1 arrives"]),
    (["demo", "--workload", "/no/workload.json"], ["/no/workload.json"]),
    (["sweep", "--agents", "0", "--out", "{tmp}/s.json"], ["--agents"]),
    (["sweep", "--out", "/nonexistent_dir/s.json"], ["/nonexistent_dir"]),
    (["sweep", "--features", "none", "fast", "--out", "{tmp}/s.json"], ["--features", "fast"]),
    (["launch"], ["launch"]),
    ([*BENCH, "--out", "{tmp}/r.json", "--duration", "20"],
     ["timely-llm bench: error: unrecognized arguments: --duration 20", "(see timely-llm bench --help)"]),
    (["table", "{tmp}/result.json", "--wide"], ["timely-llm table: error: unrecognized arguments: --wide"]),
])
def test_bad_arguments_fail_fast_on_one_line(argv: list[str], needles: list[str], tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str], no_runs: None) -> None:
    (tmp_path / "result.json").write_text("{}")
    (tmp_path / "box.yaml").write_text(yaml.safe_dump({**load_profile("cpu-2core-smollm2-135m").to_dict(),
                                                       "http": {"request_overhead": 0.01, "token_delay": 0.001}}))
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    code, err = run(argv, capsys)
    assert_one_line_error(code, err, *[n.replace("{tmp}", str(tmp_path)) for n in needles])
    assert not (tmp_path / "r.json").exists()


@pytest.mark.parametrize("content", ['{"requests": []}', "[1, 2]", '{"policy": "vllm", "workload": "w", '
                                     '"requests": [], "summary": {"all": 3}}', "not json"])
def test_table_and_plot_refuse_files_that_are_not_results(content: str, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "notes.json"
    path.write_text(content)
    assert_one_line_error(*run(["table", str(path)], capsys), f"timely-llm table: error: {path}: ")
    assert_one_line_error(*run(["plot", str(path), "--out", str(tmp_path / "plots")], capsys),
                          f"timely-llm plot: error: {path}: ")
    assert not (tmp_path / "plots").exists()


def test_table_reads_a_bench_result(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    workload = tmp_path / "w.json"
    workload.write_text(json.dumps({"name": "one", "requests": [{"arrival": 0.5, "agent": "d1", "trace": 6}]}))
    out = tmp_path / "r.json"
    assert main(["bench", "--workload", str(workload), "--policy", "timelyllm", "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["table", str(out)]) == 0
    assert "| one | timelyllm |" in capsys.readouterr().out


def test_bench_suspends_in_place_on_the_simulator_when_asked(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    from timely_llm.engines.hardware import load_profile

    block = load_profile(ORIN).block_tokens
    resumes = {}
    for flags in ([], ["--suspend-in-place"]):
        out = tmp_path / f"r{len(flags)}.json"
        assert main([*BENCH, "--hw", ORIN, *flags, "--out", str(out)]) == 0
        reuse = re.search(r"KV reuse: ([\d.]+)% of resumed context .*; (\d+) recomputed\)", capsys.readouterr().out)
        assert reuse is not None and (reuse[1] == "100.0") == bool(flags) and (reuse[2] == "0") == bool(flags)
        result = json.loads(out.read_text())
        resumes[result["hw"]] = [s["cached_tokens"] for r in result["requests"] for s in r["segments"][1:]
                                 if s["cached_tokens"] is not None]
    # the prefix cache serves whole blocks (all but the last token of a context that fills its last block);
    # a resume in place has its whole context, whatever its length
    whole_blocks = (0, block - 1)
    assert resumes[ORIN] and all(cached % block in whole_blocks for cached in resumes[ORIN])
    assert any(cached % block not in whole_blocks for cached in resumes[f"{ORIN}-in-place"])


def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


@pytest.mark.parametrize("name", sorted(subcommands()))
def test_every_option_has_help(name: str) -> None:
    undocumented = [a.dest for a in subcommands()[name]._actions
                    if not isinstance(a, argparse._HelpAction) and not (a.help or "").strip()]
    assert not undocumented


def test_top_level_help_describes_policies_and_profiles_in_plain_text(capsys: pytest.CaptureFixture[str]) -> None:
    from timely_llm.engines.hardware import PROFILE_DIR

    assert set(BENCH_POLICIES) == {*POLICIES, *BENCH_POLICY_HELP} and not set(POLICIES) & set(BENCH_POLICY_HELP)
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    assert "``" not in text and ":class:" not in text
    for policy in BENCH_POLICIES:
        assert f"  {policy} " in text
    for profile in PROFILE_DIR.glob("*.yaml"):
        assert profile.stem in text


def test_the_readme_workload_example_loads(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The workload file example of docs/simulator.md (linked from README.md), as a user would save it."""
    import re

    doc = (Path(__file__).resolve().parent.parent / "docs" / "simulator.md").read_text()
    example = re.search(r"```json\n(.*?)```", doc, re.S)
    assert example, "docs/simulator.md has no workload example"
    workload = tmp_path / "example.json"
    workload.write_text(example.group(1))
    assert main(["bench", "--workload", str(workload), "--policy", "timelyllm", "--out", str(tmp_path / "r.json")]) == 0
    result = json.loads((tmp_path / "r.json").read_text())
    assert [r["status"] for r in result["requests"]] == ["succeeded", "succeeded"]
    assert result["requests"][1]["tuf"] == {"ert": 0.5, "alpha": -4.0, "beta": 2.0}


def test_a_peer_workload_by_name_is_the_one_fidelity_and_peer_bench_replay(tmp_path: Path) -> None:
    """``--workload capped`` in bench and workload: the peer generator's requests, so a peer point can be sized on
    any profile without a real engine."""
    from timely_llm.traces import load_catalog
    from timely_llm_bench.workloads.peer import PEER_WORKLOADS, generate_peer

    expected = generate_peer(PEER_WORKLOADS["capped"], load_catalog(), seed=3).to_json()
    assert main(["workload", "--workload", "capped", "--seed", "3", "--out", str(tmp_path / "w.json")]) == 0
    assert json.loads((tmp_path / "w.json").read_text()) == expected
    out = tmp_path / "r.json"
    assert main(["bench", "--workload", "capped", "--seed", "3", "--policy", "timelyllm", "--max-batch", "8",
                 "--out", str(out)]) == 0
    records = json.loads(out.read_text())["requests"]
    assert [(r["id"], r["trace"]) for r in records] == [(r["id"], r["trace"]) for r in expected["requests"]]
    gaps = [round(r["arrival"] - records[0]["arrival"], 6) for r in records]  # the harness starts its clock earlier
    assert gaps == [round(r["arrival"] - expected["requests"][0]["arrival"], 6) for r in expected["requests"]]
    assert {r["status"] for r in records} == {"succeeded"}


def test_an_unknown_workload_name_lists_the_peer_ones_too(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run(["workload", "--workload", "burstyy", "--out", "/tmp/never.json"], capsys)
    assert_one_line_error(code, err, "--workload", "burstyy", "WID1", "bursty", "capped")


@pytest.mark.parametrize("command", [["fidelity"], ["bench", "--policy", "timelyllm", "--out", "/tmp/never.json"]])
def test_fidelity_and_bench_refuse_categories_they_cannot_keep(command: list[str],
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    code, err = run([*command, "--workload", "bursty", "--only", "urgentt"], capsys)
    assert_one_line_error(code, err, "--only", "urgentt")
    code, err = run([*command, "--workload", "bursty", "--only", "arm"], capsys)  # drones only: no arm request
    assert_one_line_error(code, err, "--only", "no request of peer-bursty is of arm")


def test_bench_only_urgent_replays_the_urgent_requests_at_their_own_arrivals(tmp_path: Path) -> None:
    from timely_llm.traces import load_catalog
    from timely_llm_bench.workloads.peer import PEER_WORKLOADS, generate_peer

    catalog = load_catalog()
    whole = generate_peer(PEER_WORKLOADS["bursty"], catalog, seed=2)
    urgent = [r for r in whole.requests if catalog[r.trace].category == "urgent"]
    assert 0 < len(urgent) < len(whole.requests)
    out = tmp_path / "r.json"
    assert main(["bench", "--workload", "bursty", "--seed", "2", "--policy", "timelyllm", "--max-batch", "8",
                 "--only", "urgent", "--out", str(out)]) == 0
    records = json.loads(out.read_text())["requests"]
    assert [r["id"] for r in records] == [r.id for r in urgent]
    assert {r["category"] for r in records} == {"urgent"} and {r["status"] for r in records} == {"succeeded"}
    gaps = [round(r["arrival"] - records[0]["arrival"], 6) for r in records]  # the harness starts its clock earlier
    assert gaps == [round(r.arrival - urgent[0].arrival, 6) for r in urgent]


def test_progress_prints_done_over_total_periodically(capsys: pytest.CaptureFixture[str]) -> None:
    import time

    from timely_llm_bench.cli.common import _progress

    with _progress("timelyllm", 5, period_s=0.05) as progress:
        progress(3)
        deadline = time.monotonic() + 10.0
        while "3/5" not in capsys.readouterr().out:  # each line is read once: wait for one after the update
            assert time.monotonic() < deadline, "no progress line"
            time.sleep(0.05)


def test_demo_help_gives_the_arrivals_each_engine_replays() -> None:
    from timely_llm_bench.cli.ros import DEMO_GENERATED_SECONDS

    duration = next(a for a in subcommands()["demo"]._actions if a.dest == "duration")
    assert f"--point light: {DEMO_GENERATED_SECONDS:.0f} with --engine vllm generating plans, else 60" in duration.help
    assert "--point bursty: from its first arrival, 1 (its first burst) with --engine vllm" in duration.help
    policies = next(a for a in subcommands()["demo"]._actions if a.dest == "policies")
    assert policies.default == ["timelyllm", "vllm-stream", "vllm"]


def test_each_profile_description_in_the_help_is_a_whole_clause_of_its_file() -> None:
    from timely_llm.cli import _first_comment
    from timely_llm.engines.hardware import PROFILE_DIR

    for profile in PROFILE_DIR.glob("*.yaml"):
        comment = " ".join(line.lstrip("# ").strip() for line in profile.read_text().splitlines()
                           if line.startswith("#"))
        description = _first_comment(profile)
        assert description and comment.startswith(description), profile
        assert comment[len(description):len(description) + 1] in (".", ":", ""), (profile, description)


def test_the_readme_command_table_lists_every_command() -> None:
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    table = readme[readme.index("## Commands"):]
    table = table[:table.index("\n## ", 1)]
    for name in subcommands():
        assert f"| `timely-llm {name}" in table, name
