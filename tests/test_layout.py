"""Dependencies run one way: events ← projections ← engine ← adapters (DESIGN §1).

Read from the source, so a stray import — even a lazy one inside a function —
fails here, and tooling that is not the engine (benchmarks, generators) has to
live in ``adapters/``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ["events", "projections", "engine", "adapters"]


def imported_layers(path: Path) -> set[str]:
    """The ``quotaledger`` layers a module imports, at any depth of its code."""
    layer = path.parent.name
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: inside its own layer, or `..layer`
                names = [f"quotaledger.{layer}"] if node.level == 1 else []
                if node.level == 2 and node.module:
                    names = [f"quotaledger.{node.module}"]
            else:
                names = [node.module or ""]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if len(parts) > 1 and parts[0] == "quotaledger" and parts[1] in LAYERS:
                out.add(parts[1])
    return out


@pytest.mark.parametrize("layer", LAYERS)
def test_a_layer_imports_only_itself_and_the_layers_below(layer: str) -> None:
    allowed = set(LAYERS[: LAYERS.index(layer) + 1])
    modules = sorted((ROOT / layer).glob("*.py"))
    assert modules
    for path in modules:
        assert imported_layers(path) <= allowed, f"{path.relative_to(ROOT)} imports upward"
