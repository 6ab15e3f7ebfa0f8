"""The node as it runs on a robot's ROS 2 Humble: ``timely-llm serve`` in a process of its own whose rclpy lacks every
name Humble's lacks (test/startup/humble_rclpy.py), on the sim engine. Its lifecycle over the services, goals
served, a live parameter set and configure-time ones refused, an engine's parameters refused on another engine; and
the process never imports vLLM or torch nor maps their libraries. And the same process on the remote engine,
serving free-text goals from a real ``vllm serve`` (started from the venv that has vLLM: remote_servers).

Marked ``no_vllm``: scripts/test.sh runs these on Python 3.10 too, in a venv without vLLM or torch.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from lifecycle_msgs.msg import Transition
from lifecycle_msgs.srv import ChangeState, GetState
from node_processes import (
    READY_LINE,
    SERVER,
    VENV_BIN,
    Running,
    ask,
    humble_env,
    loaded_libraries,
    parameters_of,
    running,
    serve_one_goal,
    venv_env,
)
from rclpy.parameter import Parameter
from rclpy.parameter_client import AsyncParameterClient

from timely_llm.plan.grammar import plan_grammar
from timely_llm.plan.robot_file import load_skill_models
from timely_llm_robot.client import PlanLink

pytestmark = [pytest.mark.ros, pytest.mark.no_vllm]

SERVE = [str(VENV_BIN / "timely-llm"), "serve", "--ros-args", "-p", "engine:=sim"]


def _serve(domain: int, tmp_path: Path, *overrides: str) -> tuple[Running, Path]:
    """``timely-llm serve`` on the sim engine and Humble's rclpy names, with ``-p`` ``overrides``; and its import
    log."""
    log = tmp_path / "imports.log"
    args = [a for o in overrides for a in ("-p", o)]
    return running([*SERVE, *args], humble_env(venv_env(domain), log)), log


def _state(link: PlanLink, server: Running) -> str:
    client = link.node.create_client(GetState, f"/{SERVER}/get_state")
    server.wait_for(client.service_is_ready, "get_state service")
    return ask(server, lambda: client.call_async(GetState.Request()), "get_state answer").current_state.label


def _change(link: PlanLink, server: Running, transition: int) -> bool:
    client = link.node.create_client(ChangeState, f"/{SERVER}/change_state")
    server.wait_for(client.service_is_ready, "change_state service")
    future = client.call_async(ChangeState.Request(transition=Transition(id=transition)))
    server.wait_for(future.done, "change_state answer")
    return future.result().success


def test_the_strip_removes_what_humble_lacks() -> None:
    """The mechanism itself: in a process started so, those names are gone and the rest of rclpy is there."""
    script = ("import rclpy.node, rclpy.qos\n"
              "assert not hasattr(rclpy.node.Node, 'add_post_set_parameters_callback')\n"
              "assert hasattr(rclpy.node.Node, 'add_on_set_parameters_callback')\n"
              "assert not hasattr(rclpy.qos, 'qos_profile_default')\n"
              "try:\n    import rclpy.parameter_client\nexcept ImportError:\n    print('stripped')\n")
    out = subprocess.run([str(VENV_BIN / "python"), "-c", script], env=humble_env(venv_env(0)), capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and out.stdout == "stripped\n", out.stderr[-2000:]


def test_serves_goals_without_importing_vllm_or_torch(ros_domain: int, link: PlanLink, tmp_path: Path) -> None:
    server_run, log = _serve(ros_domain, tmp_path)
    with server_run as server:
        server.wait_for(lambda: READY_LINE in server.output(chars=0), "the node active")
        serve_one_goal(link, server)
        assert loaded_libraries(server.proc.pid) == set()
    assert log.read_text() == ""  # written at exit: no module of vllm or torch imported


def test_lifecycle_over_its_services(ros_domain: int, link: PlanLink, tmp_path: Path) -> None:
    server_run, _ = _serve(ros_domain, tmp_path, "autostart:=false")
    with server_run as server:
        assert _state(link, server) == "unconfigured"
        assert _change(link, server, Transition.TRANSITION_CONFIGURE) and _state(link, server) == "inactive"
        assert _change(link, server, Transition.TRANSITION_ACTIVATE) and _state(link, server) == "active"
        serve_one_goal(link, server)
        assert not _change(link, server, Transition.TRANSITION_CONFIGURE)  # not from active: refused, node up
        assert _change(link, server, Transition.TRANSITION_DEACTIVATE) and _state(link, server) == "inactive"
        assert _change(link, server, Transition.TRANSITION_CLEANUP) and _state(link, server) == "unconfigured"


def test_a_live_parameter_applies_and_a_configure_time_one_is_refused(ros_domain: int, link: PlanLink,
                                                                      tmp_path: Path) -> None:
    server_run, _ = _serve(ros_domain, tmp_path, "status_period:=0.5")
    with server_run as server:
        server.wait_for(lambda: READY_LINE in server.output(chars=0), "the node active")
        client = AsyncParameterClient(link.node, f"/{SERVER}")
        server.wait_for(client.services_are_ready, "parameter services")

        def set_one(name: str, value: object) -> object:
            future = client.set_parameters([Parameter(name, value=value)])
            server.wait_for(future.done, f"set {name}")
            return future.result().results[0]

        assert set_one("policy", "fcfs").successful
        server.wait_for(lambda: "parameters set: policy" in server.output(chars=0), "the live policy applied")
        refused = set_one("max_batch", 8)
        assert not refused.successful and "configure-time" in refused.reason, refused
        assert parameters_of(link.node, server, ["policy", "max_batch"]) == {"policy": "fcfs", "max_batch": 64}
        serve_one_goal(link, server)


def test_another_engines_parameters_fail_configure_naming_them(ros_domain: int, link: PlanLink,
                                                               tmp_path: Path) -> None:
    server_run, _ = _serve(ros_domain, tmp_path, "vllm.max_model_len:=1024", "remote.url:=http://127.0.0.1:9/v1")
    with server_run as server:
        server.wait_for(lambda: "configure failed" in server.output(chars=0), "the configure refused")
        (line,) = [line for line in server.output(chars=0).splitlines() if "]: configure failed: " in line]
        assert "vllm.max_model_len (engine vllm)" in line and "remote.url (engine remote)" in line, line
        assert "this node's, sim" in line, line
        assert _state(link, server) == "unconfigured"


FREE_TEXT_TASKS = {
    "tello": "Scene: [chair_1], Task: [A] Turn around, then fly up 50 cm and take a picture.",
    "arm": "Scene: [cup, sink], Task: Put the cup in the sink.",
}
REMOTE_RESULT_TIMEOUT_S = 600.0
"""Grammars compile and prompts prefill on a loaded 2-core CPU server."""


@pytest.mark.remote
def test_serves_free_text_goals_from_a_remote_server_without_vllm_or_torch(ros_domain: int, link: PlanLink,
                                                                            robots: Callable, tmp_path: Path,
                                                                            vllm_serve: object) -> None:
    from remote_servers import API_KEY, API_KEY_ENV

    log = tmp_path / "imports.log"
    argv = [str(VENV_BIN / "timely-llm"), "serve", "--ros-args", "-p", "engine:=remote",
            "-p", f"remote.url:={vllm_serve.url}/v1", "-p", f"remote.api_key_env:={API_KEY_ENV}"]
    models = load_skill_models()
    with running(argv, humble_env(venv_env(ros_domain, **{API_KEY_ENV: API_KEY}), log)) as server:
        server.wait_for(lambda: READY_LINE in server.output(chars=0), "the node active")
        server.wait_for(link.action.server_is_ready, "action server")
        sent = {robot: robots(f"{robot}_free", robot).request(task) for robot, task in FREE_TEXT_TASKS.items()}
        for outcome in sent.values():
            server.wait_for(outcome.finished.done, "goal result", REMOTE_RESULT_TIMEOUT_S)
        assert loaded_libraries(server.proc.pid) == set()
    assert log.read_text() == ""
    for robot, outcome in sent.items():
        assert outcome.status == "succeeded", (robot, outcome.result.reason)
        plan = "".join(s.text for s in outcome.segments)
        assert outcome.result.num_segments == len(outcome.segments) >= 1
        assert plan == models[robot].without_observations(outcome.result.plan)  # the arm's scan answers shown
        assert plan_grammar(models[robot]).accepts(plan), plan
