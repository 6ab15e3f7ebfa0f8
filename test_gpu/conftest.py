"""GPU-only tests, run by scripts/test_gpu.sh on a machine with an NVIDIA GPU and vLLM's CUDA build.

Not in test/: the CPU suite (scripts/test.sh collects test/ only) neither runs nor skips them.
"""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "test"))  # the CPU suite's helpers (guards, drive)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs an NVIDIA GPU and vLLM's CUDA build")
    config.addinivalue_line("markers", "multi_gpu: needs two or more NVIDIA GPUs (tensor parallel)")
