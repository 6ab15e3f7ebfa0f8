"""One registry per concept: each policy's and engine's name is defined in one module (its registry), the node's
ROS side reads the server through its read API, and docs/node.md's tables are the registries'."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from timely_llm.core.policies import POLICIES
from timely_llm.engines.registry import ENGINES
from timely_llm_bench.evaluation.harness import BENCH_POLICY_HELP

REPO = Path(__file__).resolve().parents[1]
SOURCES = (REPO / "timely_llm", REPO / "timely_llm_robot" / "timely_llm_robot",
           REPO / "timely_llm_bench" / "timely_llm_bench", REPO / "launch")
POLICY_REGISTRY = "timely_llm/core/policies.py"
ENGINE_REGISTRY = "timely_llm/engines/registry.py"
BENCH_POLICIES = "timely_llm_bench/timely_llm_bench/evaluation/harness.py"


def definitions(tree: ast.AST) -> set[str]:
    """The strings of ``tree`` used as definitions: compared with, a dict key, an element of a tuple, list or
    set, a value assigned, a default (of a parameter, or argparse's ``default=``/``choices=``), a case pattern, the
    first argument of a class made (``ServingPolicy("timelyllm", ...)``)."""
    found: set[str] = set()

    def add(node: ast.AST | None) -> None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.add(node.value)
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            for element in node.elts:
                add(element)

    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            for operand in (node.left, *node.comparators):
                add(operand)
        elif isinstance(node, ast.Dict):
            for key in node.keys:
                add(key)
        elif isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            add(node)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            add(node.value)
        elif isinstance(node, ast.arguments):
            for default in (*node.defaults, *node.kw_defaults):
                add(default)
        elif isinstance(node, ast.keyword) and node.arg in ("default", "choices"):
            add(node.value)
        elif isinstance(node, ast.MatchValue):
            add(node.value)
        elif isinstance(node, ast.Call) and node.args and _constructor(node.func):
            add(node.args[0])
    return found


def _constructor(func: ast.expr) -> bool:
    """A class made (``EngineKind(...)``): its first argument names what it makes."""
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    return name[:1].isupper() and not name.isupper()


def defining_modules() -> dict[str, set[str]]:
    """Each string used as a definition -> the source modules that do so."""
    found: dict[str, set[str]] = {}
    for root in SOURCES:
        for path in root.rglob("*.py"):
            for text in definitions(ast.parse(path.read_text())):
                found.setdefault(text, set()).add(str(path.relative_to(REPO)))
    return found


def expected_modules(name: str) -> set[str]:
    modules = set()
    if name in POLICIES:
        modules.add(POLICY_REGISTRY)
    if name in BENCH_POLICY_HELP:
        modules.add(BENCH_POLICIES)
    if name in ENGINES:
        modules.add(ENGINE_REGISTRY)
    return modules


@pytest.mark.parametrize("name", sorted({*POLICIES, *BENCH_POLICY_HELP, *ENGINES}))
def test_a_policy_or_engine_name_is_defined_in_its_registry_only(name: str) -> None:
    """``vllm`` is both a policy and an engine: each registry defines it once."""
    assert defining_modules().get(name, set()) == expected_modules(name)


def test_the_definition_finder_sees_comparisons_keys_tuples_and_defaults() -> None:
    code = ('if e == "a": pass\nd = {"b": 1}\nt = ("c", 1)\ndef f(x="d"): pass\np.add_argument(default="e")\n'
            'print("f")\n"""g"""\nKind("h", "i")\n')
    assert definitions(ast.parse(code)) == {"a", "b", "c", "d", "e", "h"}


def test_no_two_registries_share_a_name_but_vllm() -> None:
    assert not set(POLICIES) & set(BENCH_POLICY_HELP)
    assert set(POLICIES) & set(ENGINES) == {"vllm"}


# ----- one owner of request state -----

SERVER_INSIDES = {"scheduler", "queue", "batch", "places", "running", "parked", "blocked", "times", "memory",
                  "overload", "filling"}
"""The server's parts that hold request state or the scheduler's: read through ``Server.view`` instead."""
OWNERS = ("timely_llm/core/", "timely_llm/scheduler.py", "timely_llm/server.py")


def reaches_inside(tree: ast.AST) -> list[str]:
    """``<...server>.<inside>`` accesses: a server's scheduler parts or request places."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in SERVER_INSIDES:
            base = node.value
            name = base.attr if isinstance(base, ast.Attribute) else base.id if isinstance(base, ast.Name) else ""
            if name.lstrip("_") in ("server", "srv"):
                found.append(f"{ast.unparse(node)} (line {node.lineno})")
    return found


def test_outside_the_core_nothing_reaches_into_the_servers_request_state() -> None:
    offenders = {}
    for root in SOURCES:
        for path in root.rglob("*.py"):
            where = str(path.relative_to(REPO))
            if not where.startswith(OWNERS) and (found := reaches_inside(ast.parse(path.read_text()))):
                offenders[where] = found
    assert not offenders


def test_the_reach_finder_sees_it() -> None:
    found = reaches_inside(ast.parse("len(self._node.server.scheduler.blocked); server.batch.max_batch"))
    assert sorted(found) == ["self._node.server.scheduler (line 1)", "server.batch (line 1)"]


# ----- the docs' tables -----


def doc_table(heading: str) -> dict[str, str]:
    """The first column (a name in backquotes) -> the rest of the row, of the table under ``heading``."""
    text = (REPO / "docs" / "node.md").read_text()
    section = text.split(heading, 1)[1]
    rows = {}
    for line in section.split("\n\n", 2)[1].splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if m := re.fullmatch(r"`([\w-]+)`", cells[0]):
            rows[m.group(1)] = " | ".join(cells[1:])
    return rows


def test_the_docs_policy_table_is_the_registry() -> None:
    table = doc_table("**Policies**")
    assert set(table) == set(POLICIES)
    for name, policy in POLICIES.items():
        assert policy.mode_name in table[name] and policy.help.replace("|", "\\|") in table[name]


def test_the_docs_engine_table_is_the_registry() -> None:
    table = doc_table("**Engines**")
    assert set(table) == set(ENGINES)
    for name, kind in ENGINES.items():
        assert kind.description in table[name] and kind.needs in table[name]
