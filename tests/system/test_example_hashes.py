"""The shipped examples fold to the same state as before the fold was made faster
(the numbers in columns and on arrays, DECISIONS 120-173): every acceptance behaviour of
DESIGN §5 stays as it was.

The state hash covers the persisted fields; the digest of the whole state JSON
also covers every derived number (request, runtime, available, ...), so a
change in how those are computed or stored shows here first.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from quotaledger.adapters.cli import main
from tests.paths import REPO

EXAMPLES = REPO / "examples"

#: example -> (state hash, sha256 of the ``replay --json`` output), recorded
#: before that work (re-recorded once when the hash began to cover
#: finished preemptions by id, DECISIONS 66: the output of the code before the
#: array recompute and after it was compared byte for byte then; and once when
#: the hash became incremental, DECISIONS 230-235: each output was the old one
#: byte for byte but for its ``hash`` value).
RECORDED = {
    "koordinator.jsonl": (
        "dc7b347178afcdfa882e4d5153360c02c9d5c43f83f786ae66af810295ef9202",
        "403c08ccf92caa6f1d6e8b69aab877d35f85791d3770c0588748fc6f0f0f4e5e",
    ),
    "overuse.jsonl": (
        "2c28d3d1fd0907921945f2adad2af89b6afc31f15d170827c03ab315cd651edf",
        "48eea6630839a3b2f027efb6f0e3a0d94be259796821d5a416768ed1ec9e3eaa",
    ),
    "quota-decrease.jsonl": (
        "11e3ad3834062184d9a37b9dd3f36e3307993df3714fab56ff8eb5838db88083",
        "9cd092280b776cbc97937fa41fc3a9f612663e9df526acd353bb85c7d33f8491",
    ),
    "reclaim.jsonl": (
        "ecb60daf6aea37e10155be5f1e240649b67102167178190a4e2c90674621106a",
        "6c5272eeada98e70411a2f1fffee15be76a95bab0560746cc7f48cca83e1372c",
    ),
}


#: Examples whose bad lines are the point: checked against their good lines, not pinned.
REJECTING = ("rejected-line.jsonl",)


def test_every_shipped_example_is_recorded() -> None:
    shipped = sorted(path.name for path in EXAMPLES.glob("*.jsonl"))
    assert shipped == sorted([*RECORDED, *REJECTING])


@pytest.mark.parametrize("example", sorted(RECORDED))
def test_recorded_examples_fold_without_a_rejection(
    example: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The README's first command (and every recorded example) runs clean."""
    code = main(["replay", str(EXAMPLES / example), "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert json.loads(out)["rejected"] == []
    assert main(["replay", str(EXAMPLES / example)]) == 0
    assert "rejected" not in capsys.readouterr().out


@pytest.mark.parametrize("example", REJECTING)
def test_rejected_lines_change_nothing_but_the_rejected_list(
    example: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every bad line of the example is rejected and listed, and the state (its hash and
    every number) is the state of its good lines alone (DESIGN §9: a stream keeps going)."""
    assert main(["replay", str(EXAMPLES / example), "--json"]) == 0
    whole = json.loads(capsys.readouterr().out)
    bad = {item["offset"] for item in whole["rejected"]}
    assert len(bad) >= 3  # a validation rejection, a bad amount, broken JSON
    assert {item["kind"] for item in whole["rejected"]} >= {"QuotaUpserted", "PodUpserted", None}
    lines = (EXAMPLES / example).read_text().splitlines()
    good = tmp_path / "good.jsonl"
    good.write_text("".join(f"{line}\n" for n, line in enumerate(lines, 1) if n not in bad))
    assert main(["replay", str(good), "--json"]) == 0
    clean = json.loads(capsys.readouterr().out)
    assert clean["rejected"] == []
    assert clean["hash"] == whole["hash"]
    assert clean["quotas"] == whole["quotas"] and clean["cluster"] == whole["cluster"]
    assert main(["replay", str(EXAMPLES / example)]) == 0
    assert f"{len(bad)} rejected record(s)" in capsys.readouterr().out


@pytest.mark.parametrize("example", sorted(RECORDED))
def test_example_state_is_unchanged(example: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["replay", str(EXAMPLES / example), "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    state_hash, document_digest = RECORDED[example]
    assert json.loads(out)["hash"] == state_hash
    assert hashlib.sha256(out.encode()).hexdigest() == document_digest
