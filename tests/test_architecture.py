"""The house's rules, checked over the source tree: module size, no packed lines, no import circles,
no private reach.

The floors themselves (which room may import which) are import-linter contracts in
pyproject.toml, run by ``nox -s lint``; ARCHITECTURE.md describes both.
"""

from __future__ import annotations

import ast
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[1]
#: Where the code of the house lives (tests and spec text are excepted).
HOUSE = [ROOT / "kvref", ROOT / "backends", ROOT / "conformance"]
PACKAGES = ("kvref", "kvref_arraypool", "kvref_torch", "kvref_cupy", "kvref_conformance")
#: Files are sized by their concept: about 600 lines is long, and this is the limit. A module past
#: it holds more than one concept; its parts become objects of their own (compose, don't cut).
MAX_LINES = 800


def house_modules() -> list[Path]:
    return sorted(p for top in HOUSE for p in top.rglob("*.py") if ".nox" not in p.parts)


def test_no_module_of_the_house_is_over_800_lines() -> None:
    long = {str(p.relative_to(ROOT)): n for p in house_modules() if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, (
        f"modules over {MAX_LINES} lines: {long}; each holds more than one concept: make its parts objects "
        "the module composes (ARCHITECTURE.md)"
    )


def test_no_line_of_the_house_is_kept_from_the_formatter() -> None:
    """``# fmt: skip`` packs lines the formatter would lay out; the house is formatted as ruff formats it."""
    packed = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in [*house_modules(), *sorted((ROOT / "tests").rglob("*.py")), *sorted((ROOT / "scripts").glob("*.py"))]
        if p != Path(__file__).resolve()
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if "fmt: skip" in line or "fmt: off" in line
    ]
    assert not packed, f"lines kept from the formatter (# fmt: skip / off): {packed}"


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one module (each an import circle)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_circle_finder_finds_a_circle() -> None:
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert strongly_connected({"a": {"b"}, "b": set()}) == []


def test_no_import_circles_between_modules() -> None:
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)
    edges = {m: set(graph.find_modules_directly_imported_by(m)) & graph.modules for m in graph.modules}
    circles = strongly_connected(edges)
    assert not circles, f"import circles (each list imports itself round): {circles}; break them (ARCHITECTURE.md)"


def _first_party(module: str | None) -> bool:
    return module is not None and module.split(".")[0] in PACKAGES


def private_reaches(path: Path) -> list[str]:
    """``from m import _x`` of a first-party module, and ``name._x`` on anything but self or cls."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and _first_party(node.module):
            found += [f"line {node.lineno}: from {node.module} import {a.name}" for a in node.names if _private(a.name)]
        elif (
            isinstance(node, ast.Attribute)
            and _private(node.attr)
            and isinstance(node.value, ast.Name)
            and node.value.id not in ("self", "cls")
        ):
            found.append(f"line {node.lineno}: {node.value.id}.{node.attr}")
    return found


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def test_the_private_reach_finder_finds_both_forms(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("from kvref.oracle.blockpool.references import _x\nimport y\ny._z\nself._ok\nos.__name__\n")
    assert private_reaches(module) == [
        "line 1: from kvref.oracle.blockpool.references import _x",
        "line 3: y._z",
    ]


@pytest.mark.parametrize("path", house_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_reads_another_modules_private_names(path: Path) -> None:
    reaches = private_reaches(path)
    assert not reaches, (
        f"{path.relative_to(ROOT)} reads private names of other modules or objects: {reaches}; "
        "give the owner a public or declared internal interface (ARCHITECTURE.md)"
    )
