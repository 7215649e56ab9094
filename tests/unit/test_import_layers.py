"""The package's import structure: no import circles, and the layering rules between subpackages.

The import graph is read from the source with ``ast`` (nothing is imported): one node per
module of ``src/usg`` (a package is its ``__init__``), one edge per ``import`` /
``from ... import`` of a ``usg`` module. Circles are checked over module-level imports,
those under ``if TYPE_CHECKING:`` included (a circle mypy follows is still a circle: main had
``backends.base -> runtime.batcher -> backends.base`` that way); layering rules over every
import, including those inside functions.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
ROOT = "usg"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES: dict[str, Path] = {_module_name(p): p for p in sorted((SRC / ROOT).rglob("*.py"))}


def _target(name: str) -> str | None:
    """The module an imported dotted name refers to (a name inside a module: that module)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str, tree: ast.Module, *, top_level: bool) -> set[str]:
    """usg modules that ``module`` imports (only at module level when ``top_level``)."""
    found: set[str] = set()
    package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.Import):
                found.update(t for a in node.names if (t := _target(a.name)) is not None)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join([*up, base] if base else up)
                for alias in node.names:
                    t = _target(f"{base}.{alias.name}") or _target(base)
                    if t is not None:
                        found.add(t)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and top_level:
                if isinstance(node, ast.ClassDef):
                    visit(node.body)
                continue
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.stmt):
                    visit([child])

    visit(tree.body)
    found.discard(module)
    return {t for t in found if t.startswith(ROOT)}


TREES = {name: ast.parse(path.read_text(encoding="utf-8")) for name, path in MODULES.items()}
TOP = {name: _imports(name, tree, top_level=True) for name, tree in TREES.items()}
ALL = {name: _imports(name, tree, top_level=False) for name, tree in TREES.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle through every strongly connected group of modules (Tarjan), as a path."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def strongconnect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            strongconnect(v)
    return [_circle(graph, set(g)) for g in groups]


def _circle(graph: dict[str, set[str]], group: set[str]) -> list[str]:
    """A shortest path from the group's first module back to itself, inside the group."""
    start = min(group)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v] & group):
                if w == start:
                    return [*paths[v], start]
                if w not in paths:
                    paths[w] = [*paths[v], w]
                    nxt.append(w)
        frontier = nxt
    return sorted(group)


def test_the_import_graph_sees_the_package() -> None:
    # the reader finds what it should, so the checks below are not vacuous
    assert "usg.runtime.executor" in MODULES and "usg.records" in MODULES
    assert "usg.runtime.kernel" in TOP["usg.runtime.batcher"]
    assert "usg.paths" in ALL["usg.ops.ocr"] and "usg.paths" not in TOP["usg.ops.ocr"]  # a function-level import
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]


def test_no_import_circles_between_modules() -> None:
    # the root package re-exports the public API from everywhere; it is the top, not a layer
    graph = {m: {t for t in deps if t != ROOT} for m, deps in TOP.items() if m != ROOT}
    circles = _cycles(graph)
    assert not circles, "import circles: " + "; ".join(" -> ".join(c) for c in circles)


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


# (importer package, imported package, why): the importer must not import the other, at any level
FORBIDDEN = [
    ("usg.graph", "usg.backends", "graph validation learns backend kinds from usg.graph.catalog"),
    ("usg.graph", "usg.export", "graph loading finds the exporter in usg.graph.catalog"),
    ("usg.graph", "usg.runtime", "the runtime runs graphs; graphs do not know the runtime"),
    ("usg.graph", "usg.serve", "graphs do not know the server"),
    ("usg.graph", "usg.scale", "graphs do not know the Ray engine"),
    ("usg.ops", "usg.graph", "ops are plain functions nodes call; path rules are in usg.paths"),
    ("usg.ops", "usg.runtime", "ops are plain functions nodes call"),
    ("usg.backends", "usg.runtime", "a backend runs one batch; runners call it"),
    ("usg.backends", "usg.serve", "a backend runs one batch"),
    ("usg.runtime", "usg.serve", "the executor does not know HTTP"),
    ("usg.runtime", "usg.scale", "the in-process executor does not know Ray"),
]
GROUND_FLOOR = ["usg.errors", "usg.records", "usg.callables", "usg.paths"]


@pytest.mark.parametrize(("importer", "imported", "why"), FORBIDDEN)
def test_layering(importer: str, imported: str, why: str) -> None:
    leaks = sorted(f"{m} imports {t}" for m, deps in ALL.items() if _in(m, importer) for t in deps if _in(t, imported))
    assert not leaks, f"{importer} must not import {imported} ({why}): {leaks}"


@pytest.mark.parametrize("module", GROUND_FLOOR)
def test_ground_floor_modules_import_nothing_of_usg_but_errors(module: str) -> None:
    assert ALL[module] <= {"usg.errors"}, f"{module} imports {sorted(ALL[module])}"


def test_backends_are_not_created_from_a_model_def() -> None:
    assert "usg.graph.model" not in ALL["usg.backends"], "create_backend takes kind, path and options"
