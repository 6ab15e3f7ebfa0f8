"""README's "Add your robot", followed end to end as a user would: its files written, its commands run.

The robot file (a forklift, skills this code has never seen) is checked with ``plan --show-prompt``,
served on embedded vLLM (SmolLM2) by ``timely-llm serve`` from the venv and by the launch file with the
section's params file in a fresh colcon workspace (``ros2 launch`` run as test_packaging runs it), and
each time the Python robot client script sends a free-text task and executes the segments: the plan
uses only the forklift's skills.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import test_packaging
import yaml
from node_processes import default_sigint, venv_env
from test_packaging import LAUNCH, LaunchPackages, Workspace

from timely_llm.plan.grammar import plan_grammar
from timely_llm.plan.robot_file import load_skill_model

pytestmark = [pytest.mark.vllm, pytest.mark.ros]

workspace = test_packaging.workspace
"""A fresh colcon workspace of this checkout, as test_packaging builds it (once for this module)."""
launch_packages = test_packaging.launch_packages
"""launch and launch_ros, as test_packaging finds them."""

README = Path(__file__).resolve().parents[1] / "README.md"
READY_LINE = "active: accepting goals"
START_TIMEOUT_S = 600
"""An embedded vLLM start on a loaded 2-core machine."""
STOP_TIMEOUT_S = 120


def section_blocks() -> list[tuple[str, str]]:
    """(language, body) of every fenced block of the section, in order."""
    section = README.read_text().split("\n## Add your robot\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```(\w+)\n(.*?)```", section, re.S)


def write_files(blocks: list[tuple[str, str]], where: Path) -> dict[str, Path]:
    """Each block that starts with ``# FILE`` is that file's text."""
    files = {}
    for _, body in blocks:
        if m := re.match(r"# (my_\w+\.(?:yaml|py))\b", body):
            files[m.group(1)] = where / m.group(1)
            files[m.group(1)].write_text(body)
    return files


def commands(blocks: list[tuple[str, str]]) -> list[str]:
    return [line for lang, body in blocks if lang == "bash" for line in body.splitlines() if line.strip()]


def test_the_section_holds_a_file_of_each_kind_and_the_commands_to_use_them(tmp_path: Path) -> None:
    blocks = section_blocks()
    assert set(write_files(blocks, tmp_path)) == {"my_robot.yaml", "my_params.yaml", "my_robot_client.py"}
    assert [c.split()[:2] for c in commands(blocks)] == [["timely-llm", "plan"], ["timely-llm", "serve"],
                                                         ["ros2", "launch"], ["python", "my_robot_client.py"]]


def test_the_params_file_sets_what_the_serve_command_line_sets(tmp_path: Path) -> None:
    blocks = section_blocks()
    files = write_files(blocks, tmp_path)
    serve = next(c for c in commands(blocks) if c.startswith("timely-llm serve"))
    overrides = dict(arg.split(":=", 1) for arg in shlex.split(serve) if ":=" in arg)
    params = yaml.safe_load(files["my_params.yaml"].read_text())["/**"]["ros__parameters"]
    assert {k: yaml.safe_load(v) for k, v in overrides.items()} == params
    assert "params_file:=$PWD/my_params.yaml" in next(c for c in commands(blocks) if c.startswith("ros2 launch"))


@contextlib.contextmanager
def serving(argv: list[str], cwd: Path, env: dict[str, str]) -> Iterator[list[str]]:
    """``argv`` started and logging READY_LINE; its output lines. Leaving: SIGINT, and it must exit 0."""
    server = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              start_new_session=True, preexec_fn=default_sigint)
    log: list[str] = []
    threading.Thread(target=lambda: log.extend(server.stdout), daemon=True).start()
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not any(READY_LINE in line for line in log):
            assert server.poll() is None and time.monotonic() < deadline, "".join(log)[-3000:]
            time.sleep(1.0)
        yield log
        server.send_signal(signal.SIGINT)
        assert server.wait(STOP_TIMEOUT_S) == 0, "".join(log)[-3000:]
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def check_client_run(client: subprocess.CompletedProcess, model_path: Path) -> None:
    """The client script's output: each executed segment, then ``succeeded PLAN``; PLAN of the robot's skills only."""
    model = load_skill_model(model_path)
    lines = client.stdout.splitlines()
    assert client.returncode == 0 and lines and lines[-1].startswith("succeeded "), client.stdout + client.stderr
    plan = lines[-1].removeprefix("succeeded ")
    assert plan_grammar(model).accepts(plan), plan
    called = [c.name for c in model.find_calls(plan)]
    assert called and set(called) <= set(model.skills), plan
    segments = [line for line in lines[:-1] if line.startswith("segment ")]
    assert segments and "".join(s.split(": ", 1)[1].split("  skills ")[0] for s in segments) == plan


def test_a_user_robot_from_the_readme_serves_a_free_text_task_over_ros(tmp_path: Path, ros_domain: int) -> None:
    blocks = section_blocks()
    files = write_files(blocks, tmp_path)
    model = load_skill_model(files["my_robot.yaml"])
    env = os.environ | {"ROS_DOMAIN_ID": str(ros_domain), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    plan_cmd, serve_cmd, _, client_cmd = commands(blocks)

    shown = subprocess.run(shlex.split(plan_cmd), cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0 and shown.stdout == model.system_prompt, shown.stderr
    for skill in model.skills.values():
        assert f"- {skill.abbr}(" in shown.stdout and skill.description in shown.stdout

    with serving(shlex.split(serve_cmd), tmp_path, env):
        client = subprocess.run(shlex.split(client_cmd), cwd=tmp_path, env=env, capture_output=True, text=True,
                                timeout=360)
    check_client_run(client, files["my_robot.yaml"])


def test_the_readme_launch_form_serves_the_robot_from_a_colcon_workspace(launch_packages: LaunchPackages,
                                                                         workspace: Workspace, tmp_path: Path,
                                                                         ros_domain: int) -> None:
    blocks = section_blocks()
    files = write_files(blocks, tmp_path)
    _, _, launch_cmd, client_cmd = commands(blocks)
    # The venv has no `ros2 launch` (the launch packages are not on PyPI): run what it runs, as test_packaging does.
    launch = launch_cmd.replace("ros2 launch timely_llm timely_llm.launch.py", f"python -c '{LAUNCH}'")
    with serving(workspace.sourced(launch, launch_packages.underlays), tmp_path,
                 venv_env(ros_domain, launch_packages.pythonpath, **launch_packages.env)):
        client = subprocess.run(workspace.sourced(client_cmd), cwd=tmp_path, env=venv_env(ros_domain, None),
                                capture_output=True, text=True, timeout=360)
    check_client_run(client, files["my_robot.yaml"])
