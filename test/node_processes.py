"""Processes of the node and of commands, run as a user runs them (an activated venv, nothing sourced), and what a
test asks a running node: its parameters, a goal served.

``humble_env`` adds what test/startup/sitecustomize.py does at the start of such a process: rclpy stripped of every
name Humble's lacks (so the node runs as on Humble), and a log of the vllm and torch imports. A test of the node on
Humble's names runs ``timely-llm serve`` with ``venv_env(...) | humble_env(...)``.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import tempfile
import time
import typing
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from rclpy.node import Node
from rclpy.parameter_client import AsyncParameterClient
from rclpy.task import Future

from timely_llm.plan.robot_file import load_skill_models
from timely_llm.traces import load_catalog
from timely_llm_bench.robots.simulated import SimulatedSkills
from timely_llm_robot.client import PlanLink, RobotClient

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
SERVER = "timely_llm_server"
STARTUP_DIR = Path(__file__).with_name("startup")
WATCHED_LIBRARIES = ("libtorch", "/torch/", "/vllm/")
"""A path in /proc/PID/maps with one of these: the process loaded torch's or vLLM's native code."""

START_TIMEOUT_S = 120.0
"""Node start (sim engine) or one goal served, on a loaded 2-core machine."""
STOP_TIMEOUT_S = 30.0
ASK_AGAIN_S = 10.0
"""An idempotent query unanswered this long is asked again (see ``ask``)."""
TRACE_ID = 1  # a tello trace
READY_LINE = "active: accepting goals"
"""What the node logs once it serves goals."""
ROS_ENV_VARS = ("AMENT_PREFIX_PATH", "CMAKE_PREFIX_PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "RMW_IMPLEMENTATION",
                "COLCON_PREFIX_PATH", "_ROS_WHEELS_BOOTSTRAP_COMPLETE", "LD_PRELOAD")
"""Left out of a user's environment: what sourcing ROS sets, and the LD_PRELOAD (torch's libgomp) that an embedded
vLLM engine of an earlier test puts in this process's environment."""


def venv_env(domain: int, pythonpath: Path | str | None = REPO, **extra: str) -> dict[str, str]:
    """An activated venv and nothing else ROS: no ros_env.sh, no setup.bash; ``pythonpath`` (default: this
    checkout and its robot and benchmark packages, where `pip install -e` of them points, even from a git
    worktree)."""
    env = {k: v for k, v in os.environ.items() if k not in ROS_ENV_VARS}
    env.update(VIRTUAL_ENV=str(VENV_BIN.parent), PATH=f"{VENV_BIN}{os.pathsep}/usr/local/bin:/usr/bin:/bin",
               ROS_DOMAIN_ID=str(domain), ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST")
    if pythonpath is not None:
        roots = (REPO, REPO / "timely_llm_robot", REPO / "timely_llm_bench")  # also given as a str (launch's)
        env["PYTHONPATH"] = os.pathsep.join(map(str, roots)) if pythonpath == REPO else str(pythonpath)
    return env | extra


@dataclass
class Running:
    proc: subprocess.Popen
    log: typing.IO[str]

    def output(self, chars: int = 4000) -> str:
        """The last ``chars`` characters of the output; 0: all of it."""
        self.log.flush()
        self.log.seek(0)
        return self.log.read()[-chars:]

    def wait_for(self, ready: Callable[[], bool], what: str, timeout_s: float = START_TIMEOUT_S) -> None:
        """Until ``ready()``; fails at once, with the output, if the process ends first."""
        deadline = time.monotonic() + timeout_s
        while not ready():
            assert self.proc.poll() is None, f"exited {self.proc.returncode} before {what}:\n{self.output()}"
            assert time.monotonic() < deadline, f"no {what} in {timeout_s} s:\n{self.output()}"
            time.sleep(0.1)


@contextmanager
def running(argv: list[str], env: dict[str, str], cwd: Path | None = None) -> Iterator[Running]:
    """``argv`` running; on exit SIGINT, and it must exit 0 in time (its output is shown if not)."""
    with tempfile.TemporaryFile("w+") as log:
        running = Running(subprocess.Popen(argv, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
                                           start_new_session=True, preexec_fn=default_sigint), log)
        try:
            yield running
            running.proc.send_signal(signal.SIGINT)
            try:
                code = running.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                pytest.fail(f"still running {STOP_TIMEOUT_S} s after SIGINT:\n{running.output()}")
            assert code == 0, f"exit code {code}:\n{running.output()}"
        finally:
            if running.proc.poll() is None:
                os.killpg(running.proc.pid, signal.SIGKILL)
                running.proc.wait()


def default_sigint() -> None:
    """In the child: SIGINT as a user's shell leaves it. An ignored or blocked SIGINT is inherited through exec,
    and the test process's may have been changed by what ran in it before (in-process engines, rclpy); the
    launched process then never sees the SIGINT the test sends."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def ask(server: Running, send: Callable[[], Future], what: str) -> object:
    """The answer to an idempotent service query, asked again every ``ASK_AGAIN_S`` until one comes.

    rmw_fastrtps drops a service response when the server's response writer has not yet matched the client's
    reader within its 100 ms max_blocking_time ("failed to send response (timeout)"): right after the server
    starts, on a loaded machine, the first query can go unanswered although the client saw the service ready.
    """
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        future = send()
        server.wait_for(functools.partial(_done_or_past, future, time.monotonic() + ASK_AGAIN_S), what)
        if future.done():
            return future.result()
        assert time.monotonic() < deadline, f"no {what} in {START_TIMEOUT_S} s:\n{server.output()}"


def _done_or_past(future: Future, moment: float) -> bool:
    return future.done() or time.monotonic() > moment


def parameters_of(node: Node, server: Running, names: list[str], name: str = SERVER) -> dict[str, object]:
    client = AsyncParameterClient(node, name)
    server.wait_for(client.services_are_ready, "parameter services")
    answer = ask(server, lambda: client.get_parameters(names), "get_parameters answer")
    return {name: _value(v) for name, v in zip(names, answer.values, strict=True)}


def _value(v: object) -> object:
    return {1: v.bool_value, 2: v.integer_value, 3: v.double_value, 4: v.string_value}.get(v.type)


def serve_one_goal(link: PlanLink, server: Running) -> None:
    server.wait_for(link.action.server_is_ready, "action server")
    robot = RobotClient(link, "tello_1", "tello", SimulatedSkills(load_skill_models()["tello"], time_scale=0.1))
    try:
        outcome = robot.request(load_catalog()[TRACE_ID].prompt, None, TRACE_ID)
        server.wait_for(outcome.finished.done, "goal result")
    finally:
        robot.close()
    assert outcome.status == "succeeded" and outcome.result.num_segments == len(outcome.segments) > 0


def humble_env(env: dict[str, str], import_log: Path | None = None) -> dict[str, str]:
    """``env`` for a process whose rclpy lacks every name Humble's lacks (test/startup/humble_rclpy.py), and, with
    ``import_log``, that writes there at exit the modules of vllm and torch it imported (none: an empty file)."""
    pythonpath = os.pathsep.join(filter(None, (str(STARTUP_DIR), env.get("PYTHONPATH"))))
    extra = {"TIMELY_LLM_TEST_IMPORT_LOG": str(import_log)} if import_log else {}
    return env | {"PYTHONPATH": pythonpath, "TIMELY_LLM_TEST_HUMBLE_RCLPY": "1"} | extra


def loaded_libraries(pid: int) -> set[str]:
    """The files of torch or vLLM mapped into process ``pid``."""
    with open(f"/proc/{pid}/maps") as maps:
        paths = {line.split()[-1] for line in maps if len(line.split()) >= 6}
    return {p for p in paths if any(w in p for w in WATCHED_LIBRARIES)}
