"""``timely-llm profile --url``: a server behind HTTP profiled through its streams (engines/profile_http.py), on a
real ``vllm serve`` (marker ``remote``), by a process that imports neither vLLM nor torch."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from remote_servers import API_KEY_ENV, free_tcp_port

from timely_llm.engines.hardware import load_profile
from timely_llm.engines.profile_http import DECODE_BATCHES, DECODE_CONTEXTS, FRESH_PREFILLS, SHARED_DECODE_BATCHES

REPO = Path(__file__).resolve().parents[1]
FIT_TOLERANCE = 0.25
"""The fitted model reproduces the measured steps within this fraction at the median (one set of terms over
prefills of 16-1,024 tokens and decodes of 1-8 streams); single steps are not held to it, as one timed while
another process took the cores may be off several times."""
PROFILE_SCRIPT = """
import sys
from timely_llm.cli import main
status = main(sys.argv[1:])
heavy = sorted(m for m in ("vllm", "torch") if m in sys.modules)
print("imported:", " ".join(heavy) or "neither")
sys.exit(status)
"""


def _profile(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    return subprocess.run([sys.executable, "-c", PROFILE_SCRIPT, "profile", *args], capture_output=True, text=True,
                          env=env, timeout=900, cwd=REPO)


def test_a_url_that_does_not_answer_is_refused_in_one_line(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_tcp_port()}"
    done = _profile("--url", url, "--out", str(tmp_path / "box.yaml"))
    assert done.returncode == 2
    assert re.fullmatch(rf"timely-llm profile: error: --url: {url} does not answer as a vLLM server: ConnectError.*\n",
                        done.stderr)
    assert not (tmp_path / "box.yaml").exists()


def test_a_key_variable_that_is_not_set_is_refused_before_any_request(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_tcp_port()}"
    env_name = "TIMELY_LLM_NO_SUCH_KEY"
    done = _profile("--url", url, "--api-key-env", env_name, "--out", str(tmp_path / "box.yaml"))
    assert done.returncode == 2
    assert done.stderr == (f"timely-llm profile: error: --api-key-env: environment variable {env_name} "
                           "is not set\n")
    assert not (tmp_path / "box.yaml").exists()


@pytest.mark.remote
def test_a_served_model_profiled_through_its_streams(vllm_serve: object, tmp_path: Path) -> None:
    out = tmp_path / "box.yaml"
    done = _profile("--url", vllm_serve.url, "--api-key-env", API_KEY_ENV, "--out", str(out))  # type: ignore[attr-defined]
    assert done.returncode == 0, done.stderr
    assert "imported: neither" in done.stdout
    profile = load_profile(str(out))
    metrics = yaml.safe_load(out.read_text())
    assert metrics["tokenizer"] == "smollm2"  # the served model's name is a shipped model: its token counts
    http, step = profile.http, profile.step
    assert http is not None
    assert 0 < http["token_delay"] < 0.05  # half a loopback round trip through the API server
    assert 0 < http["request_overhead"] < 0.5
    assert step["per_prefill_token"] > 0  # the fixed cost may land in base, prefill_stall or per_decode_seq
    # SmolLM2 on a CPU: a prefill of 1,024 tokens takes 0.1-5 s, a decode step of one sequence 5-500 ms
    assert 0.1 < profile.step_time([(1024, 1024)], []) < 5.0
    assert 0.005 < profile.step_time([], [264]) < 0.5
    assert profile.block_tokens in (16, 32, 64, 128)  # the server's, not the --memory-from profile's alone
    pairs = re.search(r"measured vs fitted step \(ms\): (.*)", done.stdout)
    assert pairs is not None
    steps = [tuple(map(float, p.split("/"))) for p in pairs[1].split(", ")]
    assert len(steps) == (len(FRESH_PREFILLS) + 2 + len(DECODE_CONTEXTS) * len(DECODE_BATCHES)
                          + len(SHARED_DECODE_BATCHES))
    errors = sorted(abs(fitted - measured) / measured for measured, fitted in steps)
    assert errors[len(errors) // 2] <= FIT_TOLERANCE, steps
