"""``vllm serve`` for the remote-engine tests, started the one way the project starts it (peer_bench.ServeProcess):
SmolLM2 on the CPU build, loopback, a small KV cache, a bearer key in its environment. ``TIMELY_LLM_VLLM_PYTHON``
names the Python whose vLLM serves (default: this one), for tests run from a venv without vLLM."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from timely_llm_bench.evaluation.peer_bench import EngineConfig, ServeProcess

API_KEY_ENV = "TIMELY_LLM_TEST_API_KEY"
API_KEY = "test-key-7f3a9c1e"
"""The servers' bearer token; tests put it in API_KEY_ENV and check it never shows in a log or a reason."""
MAX_NUM_SEQS = 8
START_TIMEOUT_S = 900.0


def free_tcp_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_serve(log_dir: Path, name: str) -> ServeProcess:
    """A fresh ``vllm serve`` of SmolLM2 on a free loopback port (1-2 min of compiling on a 2-core CPU)."""
    path, dtype = smollm2(serving_python())
    engine = EngineConfig("smollm2", str(path), dtype, max_model_len=2048, kv_cache_gib=0.25,
                          max_batch=MAX_NUM_SEQS)
    return ServeProcess(engine, free_tcp_port(), priority=False, reserved_cpus=0, log=log_dir / f"{name}.log",
                        start_timeout=START_TIMEOUT_S, api_key=API_KEY,
                        python=serving_python())


def serving_python() -> str:
    return os.environ.get("TIMELY_LLM_VLLM_PYTHON", sys.executable)


def smollm2(python: str) -> tuple[str, str]:
    """SmolLM2's directory and dtype as ``python``'s installation resolves them: a venv without vLLM has no
    converted model of its own."""
    script = "from timely_llm.models import resolve_model; print(*resolve_model('smollm2'), sep='\\n')"
    out = subprocess.run([python, "-c", script], capture_output=True, text=True, timeout=600, check=True)
    path, dtype = out.stdout.split()
    return path, dtype


def settings(*urls: str, **fields: object):  # noqa: ANN201 - RemoteSettings
    """Remote engine settings for ``urls`` with the test key's variable and the servers' batch cap."""
    from timely_llm.engines.remote_settings import RemoteSettings

    return RemoteSettings.parse({"url": list(urls), "api_key_env": API_KEY_ENV, "max_num_seqs": MAX_NUM_SEQS,
                                 **fields})
