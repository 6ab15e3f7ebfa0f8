"""The node's modules and the CLI use rclpy's public API only, and no rclpy module Humble lacks without a fallback
(issue 29): rclpy's private API (``rclpy.impl``, ``rclpy._rclpy_pybind11``) differs between distributions."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from startup.humble_rclpy import MISSING_MODULES

ROOT = Path(__file__).resolve().parent.parent
SOURCES = sorted(path for package in ("ros", "robots", "cli") for path in (ROOT / "timely_llm" / package).glob("*.py"))


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
