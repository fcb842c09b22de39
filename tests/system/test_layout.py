"""The package's shape (DESIGN §1): layers, no import cycles, no private reaches.

Everything is read from the syntax trees of every module of the four source
folders, recursively, imports inside functions included, so a lazy import
cannot hide a cycle or a dependency against the layer order:

* a module imports only its own layer and the layers below it
  (events ← projections ← engine ← adapters);
* the module graph has no cycle;
* no module imports another module's ``_private`` name;
* ``adapters/`` holds subpackages only, plus ``demo.py``; benchmark tooling in
  ``adapters/bench/`` is imported by nothing outside it but the ``bench`` command;
* no module is longer than :data:`MAX_LINES` unless its docstring says why
  (a line starting ``Longer than`` ... ).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.paths import REPO

ROOT = REPO
LAYERS = ("events", "projections", "engine", "adapters")
PACKAGE = "quotaledger"
MAX_LINES = 600


@dataclass(frozen=True, slots=True)
class Import:
    """One imported name: the module it resolves to, the name taken from it
    (None for ``import module``), and where the import stands."""

    target: str
    name: str | None
    line: int


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its ``__init__``)."""
    out: dict[str, Path] = {}
    for layer in LAYERS:
        for path in sorted((root / layer).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join([PACKAGE, *parts])] = path
    return out


def _owner(name: str, modules: Mapping[str, Path]) -> str | None:
    """The longest module prefix of a dotted name."""
    while name not in modules:
        if "." not in name:
            return None
        name = name.rsplit(".", 1)[0]
    return name


def imports_of(module: str, path: Path, modules: Mapping[str, Path]) -> Iterator[Import]:
    """The package modules ``module`` imports, at any depth of its code."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _owner(alias.name, modules)
                if target is not None:
                    yield Import(target, None, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                submodule = f"{source}.{alias.name}"
                if submodule in modules:
                    yield Import(submodule, None, node.lineno)
                    continue
                target = _owner(source, modules)
                if target is not None:
                    yield Import(target, alias.name, node.lineno)


def graph(root: Path = ROOT) -> dict[str, list[Import]]:
    modules = module_files(root)
    return {
        module: [item for item in imports_of(module, path, modules) if item.target != module]
        for module, path in modules.items()
    }


def layer_of(module: str) -> str:
    return module.split(".")[1]


def cycles(edges: Mapping[str, list[Import]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in sorted(edges):
        if start in index:
            continue
        work: list[tuple[str, Iterator[str]]] = [
            (start, iter(sorted({i.target for i in edges[start]})))
        ]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            advanced = False
            for succ in successors:
                if succ not in edges:
                    continue
                if succ not in index:
                    index[succ] = low[succ] = counter
                    counter += 1
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted({i.target for i in edges[succ]}))))
                    advanced = True
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def layer_violations(edges: Mapping[str, list[Import]]) -> list[str]:
    out = []
    for module, items in edges.items():
        allowed = LAYERS[: LAYERS.index(layer_of(module)) + 1]
        for item in items:
            if layer_of(item.target) not in allowed:
                out.append(f"{module}:{item.line} imports {item.target} (a layer above)")
    return out


def private_reaches(edges: Mapping[str, list[Import]]) -> list[str]:
    out = []
    for module, items in edges.items():
        for item in items:
            name = item.name
            if name and name.startswith("_") and not name.startswith("__"):
                out.append(f"{module}:{item.line} imports {item.target}.{name}")
    return out


def bench_reaches(edges: Mapping[str, list[Import]]) -> list[str]:
    bench = f"{PACKAGE}.adapters.bench"
    command = f"{PACKAGE}.adapters.cli.bench"
    out = []
    for module, items in edges.items():
        if module in (bench, command) or module.startswith(bench + "."):
            continue
        for item in items:
            if item.target == bench or item.target.startswith(bench + "."):
                out.append(f"{module}:{item.line} imports {item.target}")
    return out


def long_modules(root: Path = ROOT) -> list[str]:
    out = []
    for path in module_files(root).values():
        text = path.read_text(encoding="utf-8")
        lines = text.count("\n")
        if lines <= MAX_LINES:
            continue
        doc = ast.get_docstring(ast.parse(text)) or ""
        if "Longer than" not in doc:
            out.append(f"{path.relative_to(root)}: {lines} lines and no word in its docstring why")
    return out


EDGES = graph()


def test_every_layer_has_modules() -> None:
    assert {layer_of(module) for module in EDGES} == set(LAYERS)


def test_a_module_imports_only_its_layer_and_the_layers_below() -> None:
    assert layer_violations(EDGES) == []


def test_no_import_cycles() -> None:
    assert cycles(EDGES) == []


def test_no_module_imports_another_modules_private_name() -> None:
    assert private_reaches(EDGES) == []


def test_benchmark_tooling_is_imported_only_by_the_bench_command() -> None:
    assert bench_reaches(EDGES) == []


def test_adapters_holds_subpackages_and_the_demo_only() -> None:
    flat = sorted(p.name for p in (ROOT / "adapters").glob("*.py"))
    assert flat == ["__init__.py", "demo.py"]


def test_no_long_module_without_a_reason() -> None:
    assert long_modules() == []


# ---- the checks themselves catch what they are for (planted in a scratch tree)


def _tree(tmp_path: Path, files: Mapping[str, str]) -> Path:
    for layer in LAYERS:
        (tmp_path / layer).mkdir()
        (tmp_path / layer / "__init__.py").write_text("")
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    return tmp_path


def test_a_planted_cycle_through_a_function_level_import_is_found(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {
            "engine/a.py": "from . import b\n",
            "engine/b.py": "def f():\n    from quotaledger.engine import a\n",
        },
    )
    assert cycles(graph(root)) == [["quotaledger.engine.a", "quotaledger.engine.b"]]


def test_a_planted_private_import_is_found(tmp_path: Path) -> None:
    root = _tree(
        tmp_path,
        {"events/a.py": "_x = 1\n", "events/b.py": "def f():\n    from .a import _x\n"},
    )
    assert private_reaches(graph(root)) == [
        "quotaledger.events.b:2 imports quotaledger.events.a._x"
    ]


def test_a_planted_upward_import_is_found(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"projections/a.py": "import quotaledger.engine\n"})
    assert layer_violations(graph(root)) == [
        "quotaledger.projections.a:1 imports quotaledger.engine (a layer above)"
    ]


@pytest.mark.parametrize("ok", [True, False])
def test_a_long_module_needs_its_reason(tmp_path: Path, ok: bool) -> None:
    doc = '"""A module.\n\nLonger than 600 lines: one table."""\n' if ok else '"""A module."""\n'
    root = _tree(tmp_path, {"events/big.py": doc + "x = 1\n" * 700})
    assert (long_modules(root) == []) is ok


def test_a_planted_reach_into_the_benchmarks_is_found(tmp_path: Path) -> None:
    root = _tree(tmp_path, {"engine/a.py": "x = 1\n"})
    (root / "adapters" / "bench").mkdir()
    (root / "adapters" / "bench" / "__init__.py").write_text("")
    (root / "adapters" / "bench" / "fold.py").write_text("x = 1\n")
    (root / "adapters" / "demo.py").write_text("from .bench import fold\n")
    assert bench_reaches(graph(root)) == [
        "quotaledger.adapters.demo:1 imports quotaledger.adapters.bench.fold"
    ]
