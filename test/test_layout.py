"""The package's layers, read from its imports (every import statement, lazy and type-only ones too): no module
imports itself back through others, and each layer imports only the layers below it."""

from __future__ import annotations

import ast
import xml.etree.ElementTree as ET
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


REPO = PACKAGE.parent
PACKAGE_SOURCES = {"timely_llm": PACKAGE, "timely_llm_robot": REPO / "timely_llm_robot" / "timely_llm_robot",
                   "timely_llm_bench": REPO / "timely_llm_bench" / "timely_llm_bench"}
"""Each Python package of the repository and its source folder."""
MAY_IMPORT = {"timely_llm": {"timely_llm"}, "timely_llm_robot": {"timely_llm_robot"},
              "timely_llm_bench": {"timely_llm_bench", "timely_llm", "timely_llm_robot"}}
"""Which of the repository's packages each may import: the node neither of the others; the robot side nothing of the
node (a robot installs only timely_llm_interfaces and timely_llm_robot); the benchmarks both."""


def test_the_import_finder_sees_lazy_imports(tmp_path: Path) -> None:
    (tmp_path / "m.py").write_text("def f():\n    from timely_llm_bench.cli import register\n    import timely_llm\n")
    assert _imports_under(tmp_path) == {tmp_path / "m.py": {"timely_llm_bench", "timely_llm"}}


def _imports_under(source: Path) -> dict[Path, set[str]]:
    """Each module file under ``source`` -> the top-level packages it imports (lazy and type-only imports too)."""
    return {path: _top_names(path) for path in source.rglob("*.py")}


def _top_names(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
    return names


@pytest.mark.parametrize("package", sorted(PACKAGE_SOURCES))
def test_a_package_imports_only_the_packages_it_may(package: str) -> None:
    ours = set(PACKAGE_SOURCES)
    wrong = {(str(path.relative_to(REPO)), name) for path, names in _imports_under(PACKAGE_SOURCES[package]).items()
             for name in names & ours - MAY_IMPORT[package]}
    assert wrong == set()


def test_only_the_tello_executor_imports_djitellopy() -> None:
    importers = {str(path.relative_to(REPO)) for source in PACKAGE_SOURCES.values()
                 for path, names in _imports_under(source).items() if "djitellopy" in names}
    assert importers <= {"timely_llm_robot/timely_llm_robot/executors/tello.py",
                         "timely_llm_bench/timely_llm_bench/robots/sim_robots.py"}
    assert "timely_llm_robot/timely_llm_robot/executors/tello.py" in importers


def test_only_the_behaviour_tree_leaf_imports_py_trees() -> None:
    """A robot without behaviour trees needs no py_trees: only timely_llm_robot.bt imports it."""
    importers = {str(path.relative_to(REPO)) for source in PACKAGE_SOURCES.values()
                 for path, names in _imports_under(source).items() if "py_trees" in names}
    assert importers == {"timely_llm_robot/timely_llm_robot/bt.py"}


def test_only_the_nav2_bridge_imports_nav2_msgs() -> None:
    importers = {str(path.relative_to(REPO)) for source in PACKAGE_SOURCES.values()
                 for path, names in _imports_under(source).items() if "nav2_msgs" in names}
    assert importers == {"timely_llm_robot/timely_llm_robot/executors/nav2.py"}


def test_the_node_needs_no_plotting_and_no_drone_library() -> None:
    imported = {name for path, names in _imports_under(PACKAGE).items() for name in names}
    assert not imported & {"matplotlib", "djitellopy"}
    run_depends = {e.text for e in ET.parse(REPO / "package.xml").getroot() if e.tag in ("exec_depend", "depend")}
    assert not {d for d in run_depends if "matplotlib" in d or "tello" in d}


SIZED = (PACKAGE, PACKAGE.parent / "timely_llm_robot" / "timely_llm_robot",
         PACKAGE.parent / "timely_llm_bench" / "timely_llm_bench")
MAX_CLASS_LINES, MAX_FUNCTION_LINES = 250, 40


def oversized(source: str) -> list[str]:
    """The classes over MAX_CLASS_LINES and the functions over MAX_FUNCTION_LINES lines (def to last line)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        limit = (MAX_CLASS_LINES if isinstance(node, ast.ClassDef) else
                 MAX_FUNCTION_LINES if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else None)
        if limit is not None and (lines := node.end_lineno - node.lineno + 1) > limit:
            found.append(f"{node.name}: {lines} lines")
    return found


def test_no_class_over_250_lines_and_no_function_over_40() -> None:
    found = {str(path.relative_to(PACKAGE.parent)): big for root in SIZED for path in sorted(root.rglob("*.py"))
             if (big := oversized(path.read_text()))}
    assert not found


def test_the_size_finder_counts_from_def_to_last_line() -> None:
    def function(statements: int) -> str:
        return "def f():\n" + "".join(f"    x{i} = {i}\n" for i in range(statements))

    assert oversized(function(40)) == ["f: 41 lines"] and oversized(function(39)) == []


ROSDEP_KEYS = {"yaml": "python3-yaml", "numpy": "python3-numpy", "httpx": "python3-httpx", "pytest": "python3-pytest",
               "xmlschema": "python3-xmlschema"}
"""The rosdep key of each Python library the node or its tests import whose key is not its import name."""
PIP_ONLY = {"vllm", "torch", "transformers", "huggingface_hub", "xgrammar", "tokenizers", "safetensors"}
"""The embedded engine and what comes with it (tokenizers also reads remote.tokenizer's files, safetensors writes
the tiny test model): pip, not rosdep (package.xml says how)."""
NOT_DECLARED = {"timely_llm", "timely_llm_bench", "djitellopy"}
"""The package itself; the benchmarks (they depend on the node: a test dependency back would be a cycle); the Tello
library (only where a Tello is flown). Tests needing them are left out where they are not installed."""


def _third_party(paths: list[Path], local: set[str]) -> set[str]:
    import sys

    found = set().union(*(_top_names(path) for path in paths))
    return {name for name in found if name not in sys.stdlib_module_names and name not in local}


def test_package_xml_declares_every_run_and_test_dependency_by_its_rosdep_key() -> None:
    """What the node's modules import is a run dependency, what its tests import a run or test dependency; djitellopy
    is neither (the node flies no Tello)."""
    root = ET.parse(REPO / "package.xml").getroot()
    declared = {kind: {e.text for e in root if e.tag in (kind, "depend")} for kind in ("exec_depend", "test_depend")}
    tests = sorted((REPO / "test").glob("*.py"))
    run = _third_party(sorted(PACKAGE.rglob("*.py")), set()) - PIP_ONLY - NOT_DECLARED
    test = _third_party(tests, {p.stem for p in tests} | {"startup"}) - PIP_ONLY - NOT_DECLARED
    assert {ROSDEP_KEYS.get(name, name) for name in run} - declared["exec_depend"] == set()
    assert {ROSDEP_KEYS.get(name, name) for name in test} - declared["exec_depend"] - declared["test_depend"] == set()
    assert "djitellopy" not in str(declared)
