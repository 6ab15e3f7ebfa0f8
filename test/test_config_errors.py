"""Malformed workload, trace or skill-model files: a message naming file and field, exit code 2."""

import json

import pytest

from timely_llm.cli import main


def bench(tmp_path, *extra):
    return main(["bench", "--policy", "timelyllm", "--out", str(tmp_path / "out.json"), *extra])


@pytest.mark.parametrize("request_patch,field", [
    ({"arrival": "soon"}, "requests[0].arrival"),
    ({"trace": 99}, "requests[0].trace"),
    ({"agent": ""}, "requests[0].agent"),
    ({"tuf": {"ert": 0.2, "alpha": 1.0, "beta": 2.0}}, "requests[0].tuf"),
    ({"tuf": {"ert": 0.2, "alpha": -1.0}}, "requests[0].tuf.beta"),
])
def test_malformed_workload(tmp_path, capsys, request_patch, field):
    req = {"arrival": 1.0, "agent": "drone-1", "trace": 6, **request_patch}
    path = tmp_path / "w.json"
    path.write_text(json.dumps({"name": "bad", "requests": [req]}))
    assert bench(tmp_path, "--workload", str(path)) == 2
    err = capsys.readouterr().err
    assert str(path) in err and field in err
    assert not (tmp_path / "out.json").exists()  # failed before any simulation


def test_unparseable_workload(tmp_path, capsys):
    path = tmp_path / "w.json"
    path.write_text("{not json")
    assert bench(tmp_path, "--workload", str(path)) == 2
    assert str(path) in capsys.readouterr().err


@pytest.mark.parametrize("text,field", [
    ("robot: x\nlanguage: klingon\nsegment: {max_tokens: 1, generation_time: 0.1}\nskills: []\n", "language"),
    ("robot: x\nlanguage: minispec\nskills: []\n", "segment"),
    ("robot: x\nlanguage: minispec\nsegment: {max_tokens: 1, generation_time: 0.1}\n"
     "skills: [{abbr: mf, name: f, args: [d], time: {linear: {slope: 1}}}]\n", "skills[0].time.linear"),
    ("robot: x\nlanguage: minispec\nsegment: {max_tokens: 1, generation_time: 0.1}\n"
     "skills: [{abbr: mf, args: [d], time: {fixed: 1}}]\n", "skills[0].name"),
])
def test_malformed_skill_model(tmp_path, capsys, text, field):
    path = tmp_path / "robot.yaml"
    path.write_text(text)
    assert bench(tmp_path, "--workload", "WID1", "--skill-models", str(path)) == 2
    err = capsys.readouterr().err
    assert str(path) in err and field in err


def test_skill_models_missing_a_robot_of_the_traces(tmp_path, capsys):
    from timely_llm.plan.robot_file import skill_model_dir

    assert bench(tmp_path, "--workload", "WID1", "--skill-models", str(skill_model_dir() / "tello.yaml")) == 2
    assert "robot" in capsys.readouterr().err


def test_malformed_trace_catalog(tmp_path):
    from timely_llm.errors import ConfigError
    from timely_llm.traces import load_catalog

    path = tmp_path / "cat.yaml"
    path.write_text("tasks:\n  - {id: 1, category: weird, robot: tello, description: d, prompt: p, plan: 'mf(1);'}\n")
    with pytest.raises(ConfigError, match=r"cat\.yaml: tasks\[0\]\.category"):
        load_catalog(path)


def test_unknown_hardware_profile(tmp_path, capsys):
    assert bench(tmp_path, "--workload", "WID1", "--hw", "no-such-gpu") == 2
    assert "no-such-gpu" in capsys.readouterr().err


def test_bench_refuses_the_remote_engine_saying_why_and_where_to_measure_it(tmp_path, capsys):
    assert bench(tmp_path, "--workload", "WID1", "--engine", "remote") == 2
    err = capsys.readouterr().err
    assert "force-decodes the recorded LRTrace plans" in err and "peer-bench --node-engines remote" in err
    assert len(err.strip().splitlines()) == 1


def test_peer_bench_refuses_more_servers_without_the_remote_engine_in_one_line(tmp_path, capsys):
    code = main(["peer-bench", "--servers", "2", "--out", str(tmp_path / "peer.json")])
    err = capsys.readouterr().err
    assert code == 2 and "--servers: are for the remote engine" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "peer.json").exists()
