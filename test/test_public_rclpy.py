"""The node's modules, the CLI, the robot side and the benchmarks' robots use rclpy's public API only, and no rclpy
module Humble lacks without a fallback (issue 29): rclpy's private API (``rclpy.impl``, ``rclpy._rclpy_pybind11``,
the private attributes of its objects) differs between distributions and releases. The few private uses there are
live in one module, ``timely_llm_interfaces/python/rclpy_compat.py`` (issue 43; docs/node.md, "Private rclpy
uses")."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import rclpy
from startup.humble_rclpy import MISSING_MODULES

ROOT = Path(__file__).resolve().parent.parent
SOURCES = sorted(path for folder in ("timely_llm/ros", "timely_llm/cli", "timely_llm_robot/timely_llm_robot",
                                     "timely_llm_bench/timely_llm_bench/robots",
                                     "timely_llm_bench/timely_llm_bench/cli", "timely_llm_interfaces/python")
                 for path in (ROOT / folder).glob("*.py"))
COMPAT = ROOT / "timely_llm_interfaces" / "python" / "rclpy_compat.py"
"""The one module where rclpy's private API may be used."""
PACKAGE_SOURCES = sorted(path for folder in ("timely_llm", "timely_llm_robot", "timely_llm_bench",
                                             "timely_llm_interfaces/python")
                         for path in (ROOT / folder).rglob("*.py") if path != COMPAT)


def _imports(tree: ast.AST) -> list[tuple[ast.AST, str]]:
    """Every imported module (and ``from M import N``: ``M.N`` too), with its statement."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found += [(node, node.module)] + [(node, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def _with_fallback(tree: ast.AST) -> set[int]:
    """ids of the import statements inside a ``try:`` that catches ImportError."""
    guarded = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(
                isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "ModuleNotFoundError")
                for h in node.handlers):
            guarded |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return guarded


def _private_rclpy(module: str) -> bool:
    parts = module.split(".")
    return parts[0] == "rclpy" and any(p == "impl" or p.startswith("_") for p in parts[1:])


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_imports_only_public_rclpy_that_humble_has(source: Path) -> None:
    tree = ast.parse(source.read_text(), str(source))
    guarded = _with_fallback(tree)
    private = [f"line {n.lineno}: {m}" for n, m in _imports(tree) if _private_rclpy(m)]
    assert not private, f"private rclpy API in {source.name}: {private}"
    unguarded = [f"line {n.lineno}: {m}" for n, m in _imports(tree)
                 if m in MISSING_MODULES and id(n) not in guarded]
    assert not unguarded, f"{source.name} imports rclpy modules Humble lacks, without a fallback: {unguarded}"


def test_the_check_sees_what_it_forbids() -> None:
    tree = ast.parse("from rclpy.impl.implementation_singleton import rclpy_implementation as _rclpy\n"
                     "from rclpy import _rclpy_pybind11\nfrom rclpy.event_handler import X\n")
    assert [m for _, m in _imports(tree) if _private_rclpy(m)] == [
        "rclpy.impl.implementation_singleton", "rclpy.impl.implementation_singleton.rclpy_implementation",
        "rclpy._rclpy_pybind11"]
    assert not _with_fallback(tree)


def _rclpy_private_names() -> frozenset[str]:
    """The private attributes and methods rclpy's own classes define (``self._x = ...``, ``def _x``)."""
    names: set[str] = set()
    for path in Path(rclpy.__file__).parent.rglob("*.py"):
        text = path.read_text()
        names |= set(re.findall(r"self\.(_[a-z]\w*)\s*[:=]", text)) | set(re.findall(r"def (_[a-z]\w*)", text))
    return frozenset(names)


RCLPY_PRIVATE = _rclpy_private_names()


def _rclpy_bases(tree: ast.AST) -> set[str]:
    """Names this module imports from rclpy (classes it may subclass)."""
    return {alias.asname or alias.name for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "rclpy"
            for alias in node.names}


def _own_attributes(tree: ast.AST) -> set[str]:
    """Attributes this module's own code assigns (``x._name = ...``), declares in a class body (dataclass fields)
    or defines as methods."""
    own = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            own.add(node.attr)
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    own.add(item.name)
                elif isinstance(item, ast.AnnAssign | ast.Assign):
                    targets = [item.target] if isinstance(item, ast.AnnAssign) else item.targets
                    own |= {t.id for t in targets if isinstance(t, ast.Name)}
    return own


def private_rclpy_uses(source: str) -> list[str]:
    """Where ``source`` uses a private attribute of rclpy's objects: reads one rclpy defines that this module does
    not assign itself (``executor._futures``, ``self._handle`` in an ActionServer), names one in a ``getattr``, calls
    one through ``super()``, or overrides one in a subclass of an rclpy class."""
    tree = ast.parse(source)
    own, bases, found = _own_attributes(tree), _rclpy_bases(tree), []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in RCLPY_PRIVATE and isinstance(node.ctx, ast.Load):
            via_super = isinstance(node.value, ast.Call) and getattr(node.value.func, "id", "") == "super"
            if via_super or node.attr not in own:
                found.append(f"line {node.lineno}: .{node.attr}")
        elif (isinstance(node, ast.Call) and getattr(node.func, "id", "") in ("getattr", "setattr", "hasattr")
              and len(node.args) > 1 and isinstance(node.args[1], ast.Constant)
              and node.args[1].value in RCLPY_PRIVATE):
            found.append(f"line {node.lineno}: {node.func.id}(..., {node.args[1].value!r})")
        elif isinstance(node, ast.ClassDef) and any(getattr(b, "id", "") in bases for b in node.bases):
            found += [f"line {item.lineno}: overrides {item.name}" for item in node.body
                      if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and item.name in RCLPY_PRIVATE]
    return sorted(found, key=lambda line: int(line.split(":")[0].split()[1]))


@pytest.mark.parametrize("source", PACKAGE_SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_private_rclpy_is_used_in_rclpy_compat_alone(source: Path) -> None:
    found = private_rclpy_uses(source.read_text())
    assert not found, f"private rclpy API in {source.relative_to(ROOT)} (use it through rclpy_compat): {found}"


def test_the_private_use_check_sees_what_it_forbids_and_what_rclpy_compat_does() -> None:
    assert {"_futures", "_handle", "_execute_cancel_request", "_parameter_overrides"} <= RCLPY_PRIVATE
    assert private_rclpy_uses(
        "from rclpy.action import ActionServer\n"
        "class A(ActionServer):\n"
        "    async def _execute_cancel_request(self, r):\n"
        "        await super()._execute_cancel_request(r)\n"
        "        self._handle.send_cancel_response(1, 2)\n"
        "def f(executor, node):\n"
        "    return getattr(executor, '_futures', ()), node._parameter_overrides\n") == [
        "line 3: overrides _execute_cancel_request", "line 4: ._execute_cancel_request", "line 5: ._handle",
        "line 7: getattr(..., '_futures')", "line 7: ._parameter_overrides"]
    assert private_rclpy_uses("class B:\n    def __init__(self):\n        self._handle = 1\n"
                              "    def f(self):\n        return self._handle\n") == []  # its own attribute
    assert len(private_rclpy_uses(COMPAT.read_text())) >= 3  # the uses it holds: await_handlers, the action server
