"""The package's layers, read from its imports (every import statement, lazy and type-only ones too): no module
imports itself back through others, and each layer imports only the layers below it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "timely_llm"
BASICS = ("timely_llm.errors", "timely_llm.share")
LOWER_ONLY = {
    "timely_llm.plan": ("timely_llm.plan", *BASICS),
    "timely_llm.core": ("timely_llm.core", "timely_llm.plan", "timely_llm.engines.base", "timely_llm.engines.hardware",
                        *BASICS),
    "timely_llm.engines": ("timely_llm.engines", "timely_llm.plan", "timely_llm.models", *BASICS),
}
"""What each layer may import: the plan language at the bottom; the scheduling core above it, which plans with
the engine interface and the hardware profiles (not with any engine); the engines beside the core."""


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def in_package(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def imports() -> dict[str, set[str]]:
    """Each module of the package -> the package's modules it imports."""
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    found: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                targets |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
            elif isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names}
        found[name] = {t for t in targets if t in modules and t != name}
    return found


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module."""
    order: list[str] = []
    seen: set[str] = set()

    def visit(node: str, edges: dict[str, set[str]], out: list[str]) -> None:
        stack = [(node, iter(sorted(edges[node])))]
        seen.add(node)
        while stack:
            current, rest = stack[-1]
            nxt = next((n for n in rest if n not in seen), None)
            if nxt is None:
                stack.pop()
                out.append(current)
            else:
                seen.add(nxt)
                stack.append((nxt, iter(sorted(edges[nxt]))))

    for node in sorted(graph):
        if node not in seen:
            visit(node, graph, order)
    reverse: dict[str, set[str]] = {n: set() for n in graph}
    for node, targets in graph.items():
        for target in targets:
            reverse[target].add(node)
    seen.clear()
    groups = []
    for node in reversed(order):
        if node not in seen:
            group: list[str] = []
            visit(node, reverse, group)
            if len(group) > 1:
                groups.append(sorted(group))
    return groups


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_itself_back_through_others() -> None:
    assert cycles(imports()) == []


@pytest.mark.parametrize("layer", sorted(LOWER_ONLY))
def test_a_layer_imports_only_the_layers_below_it(layer: str) -> None:
    allowed = LOWER_ONLY[layer]
    upward = {(module, target) for module, targets in imports().items() if in_package(module, (layer,))
              for target in targets if not in_package(target, allowed)}
    assert upward == set()


def test_the_node_imports_no_robot_client_fleet_or_benchmark() -> None:
    node = {module: targets for module, targets in imports().items() if in_package(module, ("timely_llm.ros",))}
    node_to_robots = {(module, target) for module, targets in node.items() for target in targets
                      if in_package(target, ("timely_llm.robots",))}
    assert node_to_robots == set()
