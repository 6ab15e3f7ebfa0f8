"""ROS-native packaging and the command line, run as a user runs them, each in a process of its own.

- ``timely-llm serve`` from an activated venv with nothing sourced: ROS arguments anywhere, ``-p`` beating the
  parameters file, a clear refusal when no robot type is known.
- A fresh colcon workspace (this checkout in ``src/``, plain ``colcon build``, ``source install/setup.bash``):
  the command line launch_ros builds against the installed executable, and the launch file itself, run the way
  ``ros2 launch`` runs it (the Jazzy ``launch``/``launch_ros`` sources in ../shared/ros2-launch), each serve a goal;
  with ``autostart:=false`` the launched lifecycle node stays unconfigured; two launches in two namespaces, each
  with a user's parameters file, serve their own fleets at once; ``colcon test`` runs the suite (a part of it).
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import typing
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from lifecycle_msgs.srv import GetState
from rclpy.node import Node
from rclpy.parameter_client import AsyncParameterClient
from rclpy.task import Future

from timely_llm.core.grammar import plan_grammar
from timely_llm.core.skills import load_skill_models
from timely_llm.ros.robot_client import PlanLink, RobotClient, SimulatedSkills
from timely_llm.workloads.traces import load_catalog

pytestmark = pytest.mark.ros

REPO = Path(__file__).resolve().parents[1]
VENV_BIN = Path(sys.executable).parent
SERVER = "timely_llm_server"
START_TIMEOUT_S = 120.0
"""Node start (sim engine) or one goal served, on a loaded 2-core machine."""
VLLM_START_TIMEOUT_S = 900.0
"""The launch file's default: the vLLM engine (CPU build) starting with SmolLM2, compiling, on a loaded machine."""
FREE_TEXT_TASK = "Scene: [], Task: [A] Could you find the cat? If so, go to it."
STOP_TIMEOUT_S = 30.0
BUILD_TIMEOUT_S = 1500.0
ASK_AGAIN_S = 10.0
"""An idempotent query unanswered this long is asked again (see ``_ask``)."""
TRACE_ID = 1  # a tello trace
READY_LINE = "active: accepting goals"
"""What the node logs once it serves goals."""
ROS_ENV_VARS = ("AMENT_PREFIX_PATH", "CMAKE_PREFIX_PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "RMW_IMPLEMENTATION",
                "COLCON_PREFIX_PATH", "_ROS_WHEELS_BOOTSTRAP_COMPLETE")


def _venv_env(domain: int, pythonpath: Path | None = REPO, **extra: str) -> dict[str, str]:
    """An activated venv and nothing else ROS: no ros_env.sh, no setup.bash; ``pythonpath`` (default: this
    checkout, where `pip install -e .` of it points, even from a git worktree)."""
    env = {k: v for k, v in os.environ.items() if k not in ROS_ENV_VARS}
    env.update(VIRTUAL_ENV=str(VENV_BIN.parent), PATH=f"{VENV_BIN}{os.pathsep}/usr/local/bin:/usr/bin:/bin",
               ROS_DOMAIN_ID=str(domain), ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST")
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
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
def _process(argv: list[str], env: dict[str, str], cwd: Path | None = None) -> Iterator[Running]:
    """``argv`` running; on exit SIGINT, and it must exit 0 in time (its output is shown if not)."""
    with tempfile.TemporaryFile("w+") as log:
        running = Running(subprocess.Popen(argv, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
                                           start_new_session=True, preexec_fn=_default_sigint), log)
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


def _default_sigint() -> None:
    """In the child: SIGINT as a user's shell leaves it. An ignored or blocked SIGINT is inherited through exec,
    and the test process's may have been changed by what ran in it before (in-process engines, rclpy); the
    launched process then never sees the SIGINT the test sends."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _ask(server: Running, send: Callable[[], Future], what: str) -> object:
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


def _parameters(node: Node, server: Running, names: list[str], name: str = SERVER) -> dict[str, object]:
    client = AsyncParameterClient(node, name)
    server.wait_for(client.services_are_ready, "parameter services")
    answer = _ask(server, lambda: client.get_parameters(names), "get_parameters answer")
    return {name: _value(v) for name, v in zip(names, answer.values, strict=True)}


def _value(v: object) -> object:
    return {1: v.bool_value, 2: v.integer_value, 3: v.double_value, 4: v.string_value}.get(v.type)


def _serve_one_goal(link: PlanLink, server: Running) -> None:
    server.wait_for(link.action.server_is_ready, "action server")
    robot = RobotClient(link, "tello_1", "tello", SimulatedSkills(load_skill_models()["tello"], time_scale=0.1))
    try:
        outcome = robot.request(load_catalog()[TRACE_ID].prompt, None, TRACE_ID)
        server.wait_for(outcome.finished.done, "goal result")
    finally:
        robot.close()
    assert outcome.status == "succeeded" and outcome.result.num_segments == len(outcome.segments) > 0


# ----- timely-llm serve from an activated venv -----

def _readme_commands() -> list[list[str]]:
    """Each command of README.md's command table, without its arguments: ``timely-llm SUB`` or ``python -m M``."""
    section = (REPO / "README.md").read_text().split("\n## Commands\n", 1)[1].split("\n## ", 1)[0]
    words = [line.split("`")[1].split() for line in section.splitlines() if line.startswith("| `")]
    return [w[:3] if w[1] == "-m" else w[:2] for w in words]


def test_every_readme_command_answers_help_from_an_activated_venv() -> None:
    commands = _readme_commands()
    assert len(commands) >= 15 and ["timely-llm", "serve"] in commands, commands
    helps = {}
    for command in commands:
        out = subprocess.run([VENV_BIN / command[0], *command[1:], "--help"], env=_venv_env(0),
                             capture_output=True, text=True, timeout=START_TIMEOUT_S)
        assert out.returncode == 0 and out.stdout.startswith("usage:"), (command, out.stderr[-2000:])
        helps[" ".join(command)] = out.stdout
    assert "--ros-args" in helps["timely-llm serve"]


OVERRIDE = ["--ros-args", "-p", "policy:=fcfs"]


@pytest.mark.parametrize("argv", [
    ["serve", "--params", "PARAMS", *OVERRIDE],
    ["serve", "--params", "PARAMS", "--", *OVERRIDE],
    ["serve", *OVERRIDE, "--", "--params", "PARAMS"],
    [*OVERRIDE, "--", "serve", "--params", "PARAMS"],
], ids=["ros_args_last", "after_double_dash", "ros_args_first", "before_serve"])
def test_serve_takes_ros_args_anywhere_and_overrides_beat_the_params_file(tmp_path: Path, argv: list[str],
                                                                           ros_domain: int, link: PlanLink) -> None:
    params = tmp_path / "params.yaml"
    params.write_text(f"{SERVER}:\n  ros__parameters:\n    policy: edf\n    max_new_tokens: 200\n")
    command = [str(VENV_BIN / "timely-llm"), *(str(params) if a == "PARAMS" else a for a in argv)]
    with _process(command, _venv_env(ros_domain)) as server:
        assert _parameters(link.node, server, ["policy", "max_new_tokens"]) == {"policy": "fcfs",
                                                                               "max_new_tokens": 200}
        _serve_one_goal(link, server)
        assert READY_LINE in server.output()


def test_bad_ros_args_exit_2_with_a_reason() -> None:
    for argv, reason in ((["serve", "--ros-args", "--no-such-flag"], "unknown ROS arguments"),
                         (["serve", "--params", "/nonexistent/params.yaml"], "params file"),
                         (["table", "r.json", "--ros-args", "-p", "policy:=fcfs"], "only serve")):
        out = subprocess.run([VENV_BIN / "timely-llm", *argv], env=_venv_env(0), capture_output=True,
                             text=True, timeout=START_TIMEOUT_S)
        assert out.returncode == 2 and reason in out.stderr, (argv, out.stderr)


def test_node_without_skill_models_refuses_to_start(tmp_path: Path, ros_domain: int) -> None:
    """An install whose share/timely_llm has no skill_models/ (the package outside a checkout, found through
    the ament index): the node must not start knowing no robot type."""
    shutil.copytree(REPO / "timely_llm", tmp_path / "python" / "timely_llm",
                    ignore=shutil.ignore_patterns("__pycache__"))
    prefix = tmp_path / "prefix"
    (prefix / "share" / "ament_index" / "resource_index" / "packages").mkdir(parents=True)
    (prefix / "share" / "ament_index" / "resource_index" / "packages" / "timely_llm").touch()
    (prefix / "share" / "timely_llm").mkdir()
    env = _venv_env(ros_domain, tmp_path / "python", AMENT_PREFIX_PATH=str(prefix))
    out = subprocess.run([VENV_BIN / "timely-llm", "serve"], env=env, capture_output=True, text=True,
                         timeout=START_TIMEOUT_S)
    assert out.returncode != 0 and "no skill models" in out.stdout + out.stderr, out.stdout + out.stderr
    assert str(prefix / "share" / "timely_llm" / "skill_models") in out.stdout + out.stderr


# ----- a fresh colcon workspace -----

def _ros2_launch_sources() -> Path:
    """../shared/ros2-launch beside the checkout (beside the main checkout, for a git worktree)."""
    common = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--path-format=absolute", "--git-common-dir"],
                            capture_output=True, text=True, check=True).stdout.strip()
    for root in (REPO, Path(common).parent):
        if (root.parent / "shared" / "ros2-launch" / "launch_ros").is_dir():
            return root.parent / "shared" / "ros2-launch"
    raise AssertionError(f"no ../shared/ros2-launch beside {REPO}")


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This checkout's files (as a commit of the working tree would hold them) in ws/src, built by a plain
    `colcon build` over the venv's ROS and an underlay with the composition_interfaces that launch_ros needs
    (part of a ROS installation, missing from the wheels: its lint tests need tools the wheels lack)."""
    ws = tmp_path_factory.mktemp("ws")
    files = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        if (REPO / name).is_file():
            (ws / "src" / "timely_llm" / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, ws / "src" / "timely_llm" / name)
    underlay = tmp_path_factory.mktemp("underlay")
    shutil.copytree(_ros2_launch_sources() / "composition_interfaces", underlay / "src" / "composition_interfaces")
    _run_sourced(underlay, [], "colcon build --cmake-args -DBUILD_TESTING=OFF")
    _run_sourced(ws, [underlay], "colcon build")
    return Workspace(ws, underlay)


def _run_sourced(ws: Path, underlays: list[Path], command: str) -> None:
    build = subprocess.run(_sourced(underlays, command), cwd=ws, env=_venv_env(0, None), capture_output=True,
                           text=True, timeout=BUILD_TIMEOUT_S)
    assert build.returncode == 0, build.stdout[-4000:] + build.stderr[-4000:]


def _sourced(workspaces: list[Path], command: str) -> list[str]:
    """``command`` run as a user runs it: the venv's ROS, then each workspace's install/setup.bash."""
    setups = "".join(f". {ws}/install/setup.bash && " for ws in workspaces)
    return ["bash", "-c", f". {REPO / 'scripts' / 'ros_env.sh'} {VENV_BIN.parent} && {setups}exec {command}"]


@dataclass(frozen=True)
class Workspace:
    root: Path
    underlay: Path

    def sourced(self, command: str) -> list[str]:
        return _sourced([self.underlay, self.root], command)


def test_colcon_install_holds_the_package(workspace: Workspace) -> None:
    script = ("import timely_llm.msg, timely_llm.cli as cli; from timely_llm.core.skills import skill_model_dir; "
              "print(cli.__file__, skill_model_dir())")
    out = subprocess.run(workspace.sourced(f"python -c '{script}'"), cwd=workspace.root, env=_venv_env(0, None),
                         capture_output=True, text=True, timeout=START_TIMEOUT_S)
    assert out.returncode == 0, out.stderr
    install = workspace.root / "install" / "timely_llm"
    assert out.stdout.split() == [f"{install}/lib/python3.11/site-packages/timely_llm/cli.py",
                                  f"{install}/share/timely_llm/skill_models"]


def test_launch_ros_command_line_serves_a_goal(workspace: Workspace, ros_domain: int, link: PlanLink) -> None:
    install = workspace.root / "install" / "timely_llm"
    command = (f"{install}/lib/timely_llm/timely-llm serve --ros-args -r __node:={SERVER} "
               f"--params-file {install}/share/timely_llm/config/timely_llm.yaml -p policy:=timelyllm -p engine:=sim")
    with _process(workspace.sourced(command), _venv_env(ros_domain, None), workspace.root) as server:
        assert _parameters(link.node, server, ["policy"]) == {"policy": "timelyllm"}
        _serve_one_goal(link, server)


LAUNCH = """
import sys
from ament_index_python.packages import get_package_share_directory
from launch import LaunchService
from launch.actions import IncludeLaunchDescription
from launch.launch_description_sources import PythonLaunchDescriptionSource
path = get_package_share_directory("timely_llm") + "/launch/timely_llm.launch.py"
arguments = [tuple(a.split(":=", 1)) for a in sys.argv[1:]]
service = LaunchService()
service.include_launch_description(
    IncludeLaunchDescription(PythonLaunchDescriptionSource(path), launch_arguments=arguments))
sys.exit(service.run())
"""


def _launch(workspace: Workspace, domain: int, *arguments: str) -> contextlib.AbstractContextManager[Running]:
    """What `ros2 launch timely_llm timely_llm.launch.py ARGUMENTS` does; leaving, SIGINT stops it cleanly."""
    command = f"python -c '{LAUNCH}' {' '.join(arguments)}"
    return _process(workspace.sourced(command), _venv_env(domain, _ros2_launch_sources()), workspace.root)


def test_launch_file_starts_the_node_active(workspace: Workspace, ros_domain: int, link: PlanLink) -> None:
    with _launch(workspace, ros_domain, "policy:=edf", "engine:=sim",
                 '"vllm_args:=max_num_seqs:=8 dtype:=float16"') as server:
        assert _parameters(link.node, server, ["policy", "engine", "vllm.max_num_seqs", "vllm.dtype"]) == {
            "policy": "edf", "engine": "sim", "vllm.max_num_seqs": 8, "vllm.dtype": "float16"}
        _serve_one_goal(link, server)


@pytest.mark.vllm
def test_launch_file_with_no_arguments_serves_a_free_text_task(workspace: Workspace, ros_domain: int,
                                                               link: PlanLink) -> None:
    """The default launch: the vLLM engine with the shipped model generates a plan in the robot's grammar."""
    tello = load_skill_models()["tello"]
    with _launch(workspace, ros_domain) as server:
        server.wait_for(lambda: READY_LINE in server.output(chars=0), "the engine started", VLLM_START_TIMEOUT_S)
        assert _parameters(link.node, server, ["engine", "model", "vllm.max_num_seqs"]) == {
            "engine": "vllm", "model": "smollm2", "vllm.max_num_seqs": 64}
        server.wait_for(link.action.server_is_ready, "action server")
        robot = RobotClient(link, "tello_1", "tello", SimulatedSkills(tello, time_scale=0.1))
        try:
            outcome = robot.request(FREE_TEXT_TASK)
            server.wait_for(outcome.finished.done, "goal result")
        finally:
            robot.close()
    assert outcome.status == "succeeded", outcome.result.reason
    assert outcome.result.num_segments == len(outcome.segments) > 0
    assert plan_grammar(tello).accepts(outcome.result.plan), outcome.result.plan
    assert "".join(s.text for s in outcome.segments) == outcome.result.plan


def test_launch_file_without_autostart_leaves_the_node_unconfigured(workspace: Workspace, ros_domain: int,
                                                                   link: PlanLink) -> None:
    get_state = link.node.create_client(GetState, f"/{SERVER}/get_state")
    with _launch(workspace, ros_domain, "autostart:=false") as server:
        server.wait_for(get_state.service_is_ready, "lifecycle services")
        state = _ask(server, lambda: get_state.call_async(GetState.Request()), "get_state answer")
        assert state.current_state.label == "unconfigured"
        assert READY_LINE not in server.output()


def test_launches_in_two_namespaces_take_their_params_files_and_serve_their_fleets(
        workspace: Workspace, ros_domain: int, session: tuple, tmp_path: Path) -> None:
    context, executor = session
    policies = {"fleet_a": "fcfs", "fleet_b": "edf"}
    nodes = []
    with ExitStack() as stack:
        servers = {}
        for namespace, policy in policies.items():
            params = tmp_path / f"{namespace}.yaml"  # a user's file, keyed as the shipped one is
            params.write_text(f"/**:\n  ros__parameters:\n    policy: {policy}\n    max_new_tokens: 300\n")
            servers[namespace] = stack.enter_context(
                _launch(workspace, ros_domain, f"namespace:={namespace}", f"params_file:={params}"))
        for namespace, server in servers.items():
            node = Node("robots", namespace=namespace, context=context)
            executor.add_node(node)
            nodes.append(node)
            answer = _parameters(node, server, ["policy", "max_new_tokens"], f"/{namespace}/{SERVER}")
            assert answer == {"policy": policies[namespace], "max_new_tokens": 300}
            _serve_one_goal(PlanLink(node), server)
    for node in nodes:
        executor.remove_node(node)
        node.destroy_node()


def test_colcon_test_runs_the_suite_against_the_install(workspace: Workspace) -> None:
    """Narrowed to two small modules here (PYTEST_ADDOPTS): the whole fast part takes many minutes."""
    env = _venv_env(0, None, PYTEST_ADDOPTS="-k 'test_segmenter or test_tuf_priority'")
    out = subprocess.run(workspace.sourced("colcon test --packages-select timely_llm --event-handlers console_direct+"),
                         cwd=workspace.root, env=env, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    result = workspace.root / "build" / "timely_llm" / "test_results" / "timely_llm" / "pytest_fast.xunit.xml"
    suite = ET.parse(result).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    assert int(suite.get("tests")) >= 10 and suite.get("failures") == suite.get("errors") == "0", ET.tostring(suite)
    verdict = subprocess.run(workspace.sourced("colcon test-result --all"), cwd=workspace.root, env=env,
                             capture_output=True, text=True, timeout=START_TIMEOUT_S)
    assert verdict.returncode == 0 and "0 errors, 0 failures" in verdict.stdout, verdict.stdout
