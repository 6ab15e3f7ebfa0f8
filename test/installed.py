"""Which test modules can run where some packages are not installed: ``colcon test`` in a workspace built against
a venv without vLLM (or without the benchmark package, djitellopy, ...) runs the modules whose imports resolve, and
says which it left out and why. The test command (scripts/test.sh) installs everything and selects nothing out."""

from __future__ import annotations

import ast
import importlib.util
from functools import cache
from pathlib import Path

OURS = ("timely_llm", "timely_llm_robot", "timely_llm_bench", "timely_llm_interfaces")
TEST_DIR = Path(__file__).resolve().parent


def missing_imports(path: Path) -> frozenset[str]:
    """The packages a module needs at import time, following our own modules' and the tests' helpers' top-level
    imports, that are not installed here."""
    missing: set[str] = set()
    seen, todo = {str(path)}, [str(path)]
    while todo:
        absent, followed = _direct(todo.pop())
        missing |= absent
        todo += [f for f in followed if f not in seen]
        seen |= set(followed)
    return frozenset(missing)


@cache
def _direct(path: str) -> tuple[frozenset[str], tuple[str, ...]]:
    """What one file imports at load time: the packages not installed, and the files of ours it loads."""
    absent, followed = set(), []
    for name in _top_level_imports(Path(path)):
        origin = _origin(name)
        if origin is None:
            absent.add(name.split(".")[0])
        elif origin and (name.split(".")[0] in OURS or Path(origin).parent == TEST_DIR):
            followed.append(origin)
    return frozenset(absent), tuple(followed)


def _top_level_imports(path: Path) -> list[str]:
    """The modules a file imports when it is loaded: module-level imports (not those in functions or under
    ``if TYPE_CHECKING``); ``from A import B`` counts B when B is a module."""
    names: list[str] = []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.append(node.module)
            names += [full for alias in node.names if _is_module(full := f"{node.module}.{alias.name}")]
    return names


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _origin(name: str) -> str | None:
    """The file a module is loaded from ("" for a namespace or built-in one); None when it cannot be found."""
    if (TEST_DIR / f"{name}.py").is_file():  # the tests' own helpers (node_processes, guards ...)
        return str(TEST_DIR / f"{name}.py")
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    return spec.origin if spec.origin and spec.origin.endswith(".py") else ""
