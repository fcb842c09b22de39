"""Helpers of the ``quotaledger import`` tests (DESIGN §13, IMPORT.md): the real
files, IMPORT.md's equivalence rule (:func:`equivalent`), running the command,
and the fold that must accept every imported fact (DESIGN §5 validation).
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
from hypothesis import strategies as st

from quotaledger.adapters.cli import main
from quotaledger.events.codec import decode_event
from quotaledger.events.model import LedgerOpened
from quotaledger.events.quantity import canonical_amount
from quotaledger.projections import Projection

DATA = Path(__file__).resolve().parent / "data" / "import"
REAL_FILES = sorted(DATA.glob("*/*.yaml"))
QUOTA_DEFAULTS: dict[str, Any] = {
    "parent": "root",
    "is_parent": False,
    "min": {},
    "max": None,
    "shared_weight": None,
    "allow_lent": True,
    "lending_limit": None,
    "borrowing_limit": None,
    "namespaces": [],
    "preemption_delay_s": 0,
}
RL_FIELDS = ("min", "max", "shared_weight", "lending_limit", "borrowing_limit")


def _canonical(fact: dict[str, Any]) -> dict[str, Any]:
    """IMPORT.md §1 Equivalence: defaults filled, quantities canonical (DESIGN §2),
    ``min`` with absent = 0."""
    if fact.get("kind") != "QuotaUpserted":
        return fact
    out = {**QUOTA_DEFAULTS, **fact}
    for name in RL_FIELDS:
        if out[name] is not None:
            out[name] = {r: canonical_amount(r, v) for r, v in out[name].items()}
    out["min"] = {r: v for r, v in out["min"].items() if v != 0}
    out["preemption_delay_s"] = float(out["preemption_delay_s"])
    return out


def equivalent(lines: list[dict[str, Any]], expected: list[dict[str, Any]]) -> bool:
    return [_canonical(f) for f in lines] == [_canonical(f) for f in expected]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[dict[str, Any]], str]:
    code = main(["import", *argv])
    out, err = capsys.readouterr()
    return code, [json.loads(line) for line in out.splitlines()], err


def write(tmp_path: Path, text: str, name: str = "in.yaml") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def replay_rejections(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, facts: list[dict[str, Any]]
) -> list[Any]:
    path = tmp_path / "facts.jsonl"
    path.write_text("".join(json.dumps(f) + "\n" for f in facts))
    assert main(["replay", str(path), "--json"]) == 0
    out, _ = capsys.readouterr()
    rejected: list[Any] = json.loads(out)["rejected"]
    return rejected


def warning_keys(err: str) -> set[tuple[str, str]]:
    pairs = set()
    for line in err.splitlines():
        assert line.startswith("warning: "), line
        key, subject, _ = line.removeprefix("warning: ").split(": ", 2)
        pairs.add((key, subject))
    return pairs


def quotas(facts: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {f["name"]: f for f in facts if f["kind"] == "QuotaUpserted"}


def fold_accepts(facts: list[dict[str, Any]]) -> None:
    """Every fact decodes and DESIGN §5 validation accepts it; parents come first."""
    projection = Projection()
    projection.apply(0, 0, LedgerOpened(ledger_id="t"))
    emitted = {"root"}
    names = {f["name"] for f in facts if f["kind"] == "QuotaUpserted"}
    for offset, fact in enumerate(facts, start=1):
        assert projection.apply(offset, 0, decode_event(json.dumps(fact))), (
            fact,
            projection.state.rejected,
        )
        if fact["kind"] == "QuotaUpserted":
            assert fact["parent"] in emitted or fact["parent"] not in names
            emitted.add(fact["name"])
    assert projection.state.rejected == []


amounts = st.integers(0, 6)
