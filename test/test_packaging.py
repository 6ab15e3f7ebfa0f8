"""ROS-native packaging and the command line, run as a user runs them, each in a process of its own.

- ``timely-llm serve`` from an activated venv with nothing sourced: ROS arguments anywhere, ``-p`` beating the
  parameters file, a clear refusal when no robot type is known.
- A workspace holding only the interfaces (``timely_llm_interfaces/``, what a robot builds) beside a C++ robot
  package using them: plain ``colcon build`` gives the C++ headers the robot compiles against and the Python
  modules.
- A fresh colcon workspace (this checkout in ``src/timely_llm``, its ``timely_llm_interfaces/`` linked beside it
  as docs/packaging.md says, plain ``colcon build``, ``source install/setup.bash``):
  the command line launch_ros builds against the installed executable, and the launch file itself, run the way
  ``ros2 launch`` runs it (the ROS installation's ``launch``/``launch_ros`` where the tests run in one, else the
  Jazzy sources in ../shared/ros2-launch), each serve a goal;
  with ``autostart:=false`` the launched lifecycle node stays unconfigured; two launches in two namespaces, each
  with a user's parameters file, serve their own fleets at once; ``colcon test`` runs the suite (a part of it).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import subprocess
import xml.etree.ElementTree as ET
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import pytest
from lifecycle_msgs.srv import GetState
from node_processes import (
    READY_LINE,
    REPO,
    SERVER,
    START_TIMEOUT_S,
    VENV_BIN,
    Running,
    ask,
    parameters_of,
    running,
    serve_one_goal,
    venv_env,
)
from rclpy.node import Node

from timely_llm.plan.grammar import plan_grammar
from timely_llm.plan.robot_file import load_skill_models
from timely_llm_bench.robots.simulated import SimulatedSkills
from timely_llm_robot.client import PlanLink, RobotClient

pytestmark = pytest.mark.ros

VLLM_START_TIMEOUT_S = 900.0
"""The launch file's default: the vLLM engine (CPU build) starting with SmolLM2, compiling, on a loaded machine."""
FREE_TEXT_TASK = "Scene: [], Task: [A] Could you find the cat? If so, go to it."
BUILD_TIMEOUT_S = 1500.0


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
        out = subprocess.run([VENV_BIN / command[0], *command[1:], "--help"], env=venv_env(0),
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
    params.write_text(f"{SERVER}:\n  ros__parameters:\n    engine: sim\n    policy: edf\n    max_new_tokens: 200\n")
    command = [str(VENV_BIN / "timely-llm"), *(str(params) if a == "PARAMS" else a for a in argv)]
    with running(command, venv_env(ros_domain)) as server:
        assert parameters_of(link.node, server, ["policy", "max_new_tokens"]) == {"policy": "fcfs",
                                                                               "max_new_tokens": 200}
        serve_one_goal(link, server)
        assert READY_LINE in server.output()


def test_bad_ros_args_exit_2_with_a_reason() -> None:
    for argv, reason in ((["serve", "--ros-args", "--no-such-flag"], "unknown ROS arguments"),
                         (["serve", "--params", "/nonexistent/params.yaml"], "params file"),
                         (["table", "r.json", "--ros-args", "-p", "policy:=fcfs"], "only serve")):
        out = subprocess.run([VENV_BIN / "timely-llm", *argv], env=venv_env(0), capture_output=True,
                             text=True, timeout=START_TIMEOUT_S)
        assert out.returncode == 2 and reason in out.stderr, (argv, out.stderr)


def test_node_without_skill_models_refuses_to_start(tmp_path: Path, ros_domain: int) -> None:
    """An install whose share/timely_llm has no skill_models/ (the package outside a checkout, found through
    the ament index): the node must not start knowing no robot type; nor without the shipped params file, which
    holds its defaults. Each refusal is one line naming what is missing."""
    shutil.copytree(REPO / "timely_llm", tmp_path / "python" / "timely_llm",
                    ignore=shutil.ignore_patterns("__pycache__"))
    prefix = tmp_path / "prefix"
    (prefix / "share" / "ament_index" / "resource_index" / "packages").mkdir(parents=True)
    (prefix / "share" / "ament_index" / "resource_index" / "packages" / "timely_llm").touch()
    share = prefix / "share" / "timely_llm"
    share.mkdir()
    env = venv_env(ros_domain, tmp_path / "python", AMENT_PREFIX_PATH=str(prefix))
    for missing in (share / "config" / "timely_llm.yaml", share / "skill_models"):
        out = subprocess.run([VENV_BIN / "timely-llm", "serve"], env=env, capture_output=True, text=True,
                             timeout=START_TIMEOUT_S)
        assert out.returncode != 0 and str(missing) in out.stdout + out.stderr, out.stdout + out.stderr
        assert "Traceback" not in out.stdout + out.stderr, out.stdout + out.stderr
        shutil.copytree(REPO / "config", share / "config", dirs_exist_ok=True)
    assert "no skill models" in out.stdout + out.stderr, out.stdout + out.stderr


# ----- a fresh colcon workspace -----

LAUNCH_MISSING = ("no launch_ros to run launch files with: source a ROS 2 installation (Humble or Jazzy), or put "
                  "the ros2-launch sources in ../shared/ros2-launch beside the checkout (README.md, Run the tests)")


def _shared_ros2_launch() -> Path | None:
    """../shared/ros2-launch beside the checkout (beside the main checkout, for a git worktree), if there is one."""
    common = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--path-format=absolute", "--git-common-dir"],
                            capture_output=True, text=True, check=True).stdout.strip()
    for root in (REPO, Path(common).parent):
        if (root.parent / "shared" / "ros2-launch" / "launch_ros").is_dir():
            return root.parent / "shared" / "ros2-launch"
    return None


@dataclass(frozen=True)
class LaunchPackages:
    """Where a launch process finds ``launch`` and ``launch_ros`` (``pythonpath``), the workspaces to source under the
    one launched from (``underlays``), and the ROS installation's variables it keeps (``env``)."""
    pythonpath: str
    underlays: tuple[Path, ...]
    env: dict[str, str]


@pytest.fixture(scope="module")
def launch_packages(tmp_path_factory: pytest.TempPathFactory) -> LaunchPackages:
    """The ROS installation's own launch and launch_ros where the tests run in one (a sourced Humble or Jazzy:
    launch_ros importable here), else the Jazzy sources in ../shared/ros2-launch and an underlay with the
    composition_interfaces that launch_ros needs (part of a ROS installation, missing from the wheels: its lint
    tests need tools the wheels lack); neither: the test fails saying so, in one line."""
    if importlib.util.find_spec("launch_ros") is not None:
        return LaunchPackages(os.environ.get("PYTHONPATH", ""), (), {
            name: os.environ[name] for name in ("AMENT_PREFIX_PATH", "LD_LIBRARY_PATH") if name in os.environ})
    shared = _shared_ros2_launch()
    if shared is None:
        pytest.fail(LAUNCH_MISSING, pytrace=False)
    underlay = tmp_path_factory.mktemp("underlay")
    shutil.copytree(shared / "composition_interfaces", underlay / "src" / "composition_interfaces")
    _run_sourced(underlay, [], "colcon build --cmake-args -DBUILD_TESTING=OFF")
    return LaunchPackages(str(shared), (underlay,), {})


def _copy_checkout(destination: Path) -> None:
    """This checkout's files as a commit of the working tree would hold them."""
    files = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        if (REPO / name).is_file():
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, destination / name)


def _laid_out(clone: Path, ws: Path, packages: str | None = None) -> Path:
    """A workspace laid out from a copy of this checkout by the documented command (scripts/workspace.sh);
    ``packages``: the PACKAGES it takes (default: all of them)."""
    _copy_checkout(clone)
    env = {**os.environ, **({"PACKAGES": packages} if packages else {})}
    made = subprocess.run(["bash", str(clone / "scripts" / "workspace.sh"), str(ws)], env=env, capture_output=True,
                          text=True, check=False)
    assert made.returncode == 0, made.stderr
    return ws


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every package of a clone linked into ws/src by scripts/workspace.sh, built by a plain `colcon build` over
    the venv's ROS."""
    root = tmp_path_factory.mktemp("clone")
    ws = _laid_out(root / "timely_llm", root / "ws")
    _run_sourced(ws, [], "colcon build")
    return Workspace(ws)


def _run_sourced(ws: Path, underlays: list[Path], command: str) -> None:
    build = subprocess.run(_sourced(underlays, command), cwd=ws, env=venv_env(0, None), capture_output=True,
                           text=True, timeout=BUILD_TIMEOUT_S)
    assert build.returncode == 0, build.stdout[-4000:] + build.stderr[-4000:]


def _sourced(workspaces: list[Path], command: str) -> list[str]:
    """``command`` run as a user runs it: the venv's ROS, then each workspace's install/setup.bash."""
    setups = "".join(f". {ws}/install/setup.bash && " for ws in workspaces)
    return ["bash", "-c", f". {REPO / 'scripts' / 'ros_env.sh'} {VENV_BIN.parent} && {setups}exec {command}"]


@dataclass(frozen=True)
class Workspace:
    root: Path

    def sourced(self, command: str, underlays: tuple[Path, ...] = ()) -> list[str]:
        return _sourced([*underlays, self.root], command)


def test_workspace_command_refuses_an_unknown_package(tmp_path: Path) -> None:
    made = subprocess.run(["bash", str(REPO / "scripts" / "workspace.sh"), str(tmp_path / "ws")],
                          env={**os.environ, "PACKAGES": "timely_llm_robot no_such_pkg"}, capture_output=True,
                          text=True)
    assert made.returncode == 2 and "unknown package no_such_pkg" in made.stderr


def test_colcon_install_holds_every_package(workspace: Workspace) -> None:
    script = ("import timely_llm_robot.client as robot, timely_llm_bench.cli as bench; print(robot.__file__, "
              "bench.__file__)")
    out = subprocess.run(workspace.sourced(f"python -c '{script}'"), cwd=workspace.root, env=venv_env(0, None),
                         capture_output=True, text=True, timeout=START_TIMEOUT_S)
    assert out.returncode == 0, out.stderr
    install = workspace.root / "install"
    assert out.stdout.split() == [
        f"{install}/timely_llm_robot/lib/python3.11/site-packages/timely_llm_robot/client.py",
        f"{install}/timely_llm_bench/lib/python3.11/site-packages/timely_llm_bench/cli/__init__.py"]
    help_text = subprocess.run(workspace.sourced(f"{install}/timely_llm/lib/timely_llm/timely-llm --help"),
                               cwd=workspace.root, env=venv_env(0, None), capture_output=True, text=True,
                               timeout=START_TIMEOUT_S)
    assert help_text.returncode == 0 and "peer-bench" in help_text.stdout and "serve" in help_text.stdout


def test_colcon_install_holds_the_package(workspace: Workspace) -> None:
    script = ("import timely_llm_interfaces.msg as msg, timely_llm.cli as cli; from timely_llm.plan.robot_file import "
              "skill_model_dir; print(cli.__file__, skill_model_dir(), msg.__file__)")
    out = subprocess.run(workspace.sourced(f"python -c '{script}'"), cwd=workspace.root, env=venv_env(0, None),
                         capture_output=True, text=True, timeout=START_TIMEOUT_S)
    assert out.returncode == 0, out.stderr
    install = workspace.root / "install"
    assert out.stdout.split() == [
        f"{install}/timely_llm/lib/python3.11/site-packages/timely_llm/cli/__init__.py",
        f"{install}/timely_llm/share/timely_llm/skill_models",
        f"{install}/timely_llm_interfaces/lib/python3.11/site-packages/timely_llm_interfaces/msg/__init__.py"]


CPP_ROBOT_PACKAGE = """<?xml version="1.0"?>
<package format="3">
  <name>cpp_robot</name>
  <version>0.0.1</version>
  <description>A C++ robot that reports to timely_llm</description>
  <maintainer email="robot@example.invalid">robot</maintainer>
  <license>Apache-2.0</license>
  <buildtool_depend>ament_cmake</buildtool_depend>
  <depend>timely_llm_interfaces</depend>
  <export><build_type>ament_cmake</build_type></export>
</package>
"""
CPP_ROBOT_CMAKE = """cmake_minimum_required(VERSION 3.8)
project(cpp_robot)
find_package(ament_cmake REQUIRED)
find_package(timely_llm_interfaces REQUIRED)
add_executable(report main.cpp)
target_link_libraries(report ${timely_llm_interfaces_TARGETS})
install(TARGETS report DESTINATION lib/${PROJECT_NAME})
ament_package()
"""
CPP_ROBOT_MAIN = """#include <iostream>
#include "timely_llm_interfaces/action/request_plan.hpp"
#include "timely_llm_interfaces/msg/segment_done.hpp"
#include "timely_llm_interfaces/msg/server_status.hpp"

int main() {
  timely_llm_interfaces::msg::SegmentDone done;
  done.agent_id = "cpp_robot";
  done.duration.sec = 2;
  done.duration.nanosec = 500000000;
  timely_llm_interfaces::action::RequestPlan::Goal goal;
  goal.overrun_strategy = timely_llm_interfaces::action::RequestPlan::Goal::OVERRUN_SKIP_NEXT;
  timely_llm_interfaces::msg::ServerStatus status;
  status.categories.resize(1);
  std::cout << done.agent_id << " " << done.duration.sec << " " << int(goal.overrun_strategy) << " "
            << int(timely_llm_interfaces::action::RequestPlan::Result::STATUS_CANCELED) << " "
            << status.categories.size() << std::endl;
  return 0;
}
"""


def test_a_workspace_of_the_interfaces_alone_builds_for_a_cpp_robot_and_python(tmp_path: Path) -> None:
    """What a robot team builds: timely_llm_interfaces alone (no node, none of its Python dependencies), with plain
    `colcon build`, beside their own C++ package that includes its headers; Python imports it from the install."""
    shutil.copytree(REPO / "timely_llm_interfaces", tmp_path / "src" / "timely_llm_interfaces")
    robot = tmp_path / "src" / "cpp_robot"
    robot.mkdir()
    for name, text in (("package.xml", CPP_ROBOT_PACKAGE), ("CMakeLists.txt", CPP_ROBOT_CMAKE),
                       ("main.cpp", CPP_ROBOT_MAIN)):
        (robot / name).write_text(text)
    _run_sourced(tmp_path, [], "colcon build")
    install = tmp_path / "install" / "timely_llm_interfaces"
    assert list(install.glob("include/**/timely_llm_interfaces/msg/segment_done.hpp")), "no C++ header"
    ran = subprocess.run(_sourced([tmp_path], f"{tmp_path}/install/cpp_robot/lib/cpp_robot/report"),
                         cwd=tmp_path, env=venv_env(0, None), capture_output=True, text=True, timeout=START_TIMEOUT_S)
    assert ran.returncode == 0 and ran.stdout.split() == ["cpp_robot", "2", "2", "3", "1"], ran.stdout + ran.stderr
    script = ("import timely_llm_interfaces.msg as msg; from timely_llm_interfaces.action import RequestPlan; "
              "print(msg.__file__, RequestPlan.Result.STATUS_SUCCEEDED, msg.SegmentDone(index=4).index)")
    out = subprocess.run(_sourced([tmp_path], f"python -c '{script}'"), cwd=tmp_path, env=venv_env(0, None),
                         capture_output=True, text=True, timeout=START_TIMEOUT_S)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [
        f"{install}/lib/python3.11/site-packages/timely_llm_interfaces/msg/__init__.py", "1", "4"]


ROBOT_SCRIPT = """
import importlib.abc, sys

class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("timely_llm", "timely_llm_bench", "matplotlib", "vllm", "torch", "djitellopy"):
            raise ImportError(f"a robot imported {name}")

sys.meta_path.insert(0, Refuse())
import time
import rclpy
from rclpy.node import Node
import timely_llm_robot
from timely_llm_interfaces.rclpy_compat import spinning
from timely_llm_robot.client import PlanLink, RobotClient
from timely_llm_robot.executors.base import run_timed

rclpy.init()
node = Node("robot_1")
with spinning() as executor:
    executor.add_node(node)
    link = PlanLink(node)
    assert link.wait_for_server(timeout_s=60), "no node"
    robot = RobotClient(link, "tello_1", "tello", lambda segment, label: run_timed(lambda: time.sleep(0.01)))
    outcome = robot.request("Fly up and look around.", trace_id=1).wait(timeout_s=120)
    robot.close()
node.destroy_node()
rclpy.shutdown()
print(timely_llm_robot.__file__, outcome.status, len(outcome.segments) == outcome.result.num_segments > 0)
"""


def test_a_robot_workspace_holds_only_the_interfaces_and_the_robot_package_and_serves_a_goal(
        tmp_path: Path, ros_domain: int) -> None:
    """A robot's computer: timely_llm_interfaces and timely_llm_robot alone, laid out by the documented command and
    built by plain `colcon build`; a Python robot from that install, which refuses to import the node, the
    benchmarks, matplotlib, vLLM, torch and djitellopy, gets a plan from a node served beside it."""
    ws = _laid_out(tmp_path / "timely_llm", tmp_path / "ws", "timely_llm_interfaces timely_llm_robot")
    assert sorted(p.name for p in (ws / "src").iterdir()) == ["timely_llm_interfaces", "timely_llm_robot"]
    _run_sourced(ws, [], "colcon build")
    (tmp_path / "robot.py").write_text(ROBOT_SCRIPT)
    with running([str(VENV_BIN / "timely-llm"), "serve", "--ros-args", "-p", "engine:=sim"],
                 venv_env(ros_domain), tmp_path) as server:
        server.wait_for(lambda: READY_LINE in server.output(chars=0), "the node active")
        robot = subprocess.run(_sourced([ws], f"python {tmp_path / 'robot.py'}"), cwd=tmp_path,
                               env=venv_env(ros_domain, None), capture_output=True, text=True,
                               timeout=START_TIMEOUT_S)
    assert robot.returncode == 0, robot.stdout[-2000:] + robot.stderr[-4000:]
    assert robot.stdout.split() == [
        f"{ws}/install/timely_llm_robot/lib/python3.11/site-packages/timely_llm_robot/__init__.py", "succeeded", "True"]


def test_launch_ros_command_line_serves_a_goal(workspace: Workspace, ros_domain: int, link: PlanLink) -> None:
    install = workspace.root / "install" / "timely_llm"
    command = (f"{install}/lib/timely_llm/timely-llm serve --ros-args -r __node:={SERVER} "
               f"--params-file {install}/share/timely_llm/config/timely_llm.yaml -p policy:=timelyllm -p engine:=sim")
    with running(workspace.sourced(command), venv_env(ros_domain, None), workspace.root) as server:
        assert parameters_of(link.node, server, ["policy"]) == {"policy": "timelyllm"}
        serve_one_goal(link, server)


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


def _launch(workspace: Workspace, launch: LaunchPackages, domain: int,
            *arguments: str) -> contextlib.AbstractContextManager[Running]:
    """What `ros2 launch timely_llm timely_llm.launch.py ARGUMENTS` does; leaving, SIGINT stops it cleanly."""
    command = f"python -c '{LAUNCH}' {' '.join(arguments)}"
    return running(workspace.sourced(command, launch.underlays), venv_env(domain, launch.pythonpath, **launch.env),
                   workspace.root)


def test_launch_file_starts_the_node_active(launch_packages: LaunchPackages, workspace: Workspace, ros_domain: int,
                                            link: PlanLink) -> None:
    with _launch(workspace, launch_packages, ros_domain, "policy:=edf", "engine:=sim") as server:
        assert parameters_of(link.node, server, ["policy", "engine"]) == {"policy": "edf", "engine": "sim"}
        serve_one_goal(link, server)


@pytest.mark.vllm
def test_launch_file_with_no_arguments_serves_a_free_text_task(launch_packages: LaunchPackages, workspace: Workspace,
                                                               ros_domain: int, link: PlanLink) -> None:
    """The default launch: the vLLM engine with the shipped model generates a plan in the robot's grammar."""
    tello = load_skill_models()["tello"]
    with _launch(workspace, launch_packages, ros_domain) as server:
        server.wait_for(lambda: READY_LINE in server.output(chars=0), "the engine started", VLLM_START_TIMEOUT_S)
        assert parameters_of(link.node, server, ["engine", "model", "max_batch"]) == {
            "engine": "vllm", "model": "smollm2", "max_batch": 64}
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


def test_launch_file_without_autostart_leaves_the_node_unconfigured(launch_packages: LaunchPackages,
                                                                   workspace: Workspace, ros_domain: int,
                                                                   link: PlanLink) -> None:
    """... with the vLLM engine arguments given in vllm_args over the params file's."""
    get_state = link.node.create_client(GetState, f"/{SERVER}/get_state")
    engine_args = '"vllm_args:=max_num_batched_tokens:=4096 dtype:=float16"'
    with _launch(workspace, launch_packages, ros_domain, "autostart:=false", engine_args) as server:
        server.wait_for(get_state.service_is_ready, "lifecycle services")
        state = ask(server, lambda: get_state.call_async(GetState.Request()), "get_state answer")
        assert state.current_state.label == "unconfigured"
        assert parameters_of(link.node, server, ["engine", "vllm.max_num_batched_tokens", "vllm.dtype",
                                                 "vllm.max_model_len"]) \
            == {"engine": "vllm", "vllm.max_num_batched_tokens": 4096, "vllm.dtype": "float16",
                "vllm.max_model_len": 2048}
        assert READY_LINE not in server.output()


def test_launches_in_two_namespaces_take_their_params_files_and_serve_their_fleets(
        launch_packages: LaunchPackages, workspace: Workspace, ros_domain: int, session: tuple,
        tmp_path: Path) -> None:
    context, executor = session
    policies = {"fleet_a": "fcfs", "fleet_b": "edf"}
    nodes = []
    with ExitStack() as stack:
        servers = {}
        for namespace, policy in policies.items():
            params = tmp_path / f"{namespace}.yaml"  # a user's file, keyed as the shipped one is
            params.write_text(f"/**:\n  ros__parameters:\n    engine: sim\n    policy: {policy}\n"
                              "    max_new_tokens: 300\n")
            servers[namespace] = stack.enter_context(
                _launch(workspace, launch_packages, ros_domain, f"namespace:={namespace}", f"params_file:={params}"))
        for namespace, server in servers.items():
            node = Node("robots", namespace=namespace, context=context)
            executor.add_node(node)
            nodes.append(node)
            answer = parameters_of(node, server, ["policy", "max_new_tokens"], f"/{namespace}/{SERVER}")
            assert answer == {"policy": policies[namespace], "max_new_tokens": 300}
            serve_one_goal(PlanLink(node), server)
    for node in nodes:
        executor.remove_node(node)
        node.destroy_node()


def test_colcon_test_runs_the_suite_against_the_install(workspace: Workspace) -> None:
    """Narrowed to two small modules here (PYTEST_ADDOPTS): the whole fast part takes many minutes."""
    env = venv_env(0, None, PYTEST_ADDOPTS="-k 'test_segmenter or test_tuf_priority'")
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
