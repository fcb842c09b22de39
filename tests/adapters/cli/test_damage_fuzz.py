"""Damaged files never give a traceback (DESIGN §9 "no input can make a ledger unusable").

Truncated and bit-flipped SQLite ledgers, damaged snapshot blobs and changed
records are fed to ``replay``, ``tree``, ``audit`` and ``snapshot`` in process:

* any outcome is an exit status 0, 1 or 2, never an exception; 2 comes with a
  ``quotaledger: error:`` line;
* a damaged snapshot is a warning naming it, then the full replay's state;
* a changed record covered by a ``LedgerDigest`` fails ``audit`` (exit 1) with a
  digest mismatch whose range holds the record's offset.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quotaledger.adapters.cli import main
from tests.paths import REPO

REPO = REPO
QUOTA_DECREASE = REPO / "examples" / "quota-decrease.jsonl"

FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))  # an exception here fails the test: that is the point
    out, err = capsys.readouterr()
    assert code in (0, 1, 2), (argv, code, err)
    if code == 2:
        assert err.startswith("quotaledger: error:") or "\nquotaledger: error:" in err, err
    assert "Traceback" not in err
    return code, out, err


class Base(dict[str, Any]):
    """The base ledger's facts (a short repr: hypothesis prints its arguments)."""

    def __repr__(self) -> str:
        return f"<base ledger {self['path']}>"


@pytest.fixture(scope="module")
def base() -> Iterator[dict[str, Any]]:
    """A simulated ledger with decisions, a snapshot and a LedgerDigest for it."""
    directory = Path(tempfile.mkdtemp(prefix="ql-fuzz-"))
    ledger = directory / "base.db"
    assert main(["simulate", str(QUOTA_DECREASE), "--out", str(ledger)]) == 0
    assert main(["snapshot", str(ledger)]) == 0
    with sqlite3.connect(ledger) as conn:
        through, blob = conn.execute("SELECT offset, blob FROM snapshots").fetchone()
        count = conn.execute("SELECT count(*) FROM records").fetchone()[0]
    yield Base(
        path=ledger,
        bytes=ledger.read_bytes(),
        through=int(through),
        blob=bytes(blob),
        records=int(count),
    )
    shutil.rmtree(directory)


def _copy(base: dict[str, Any], directory: str) -> Path:
    path = Path(directory) / "ledger.db"
    path.write_bytes(base["bytes"])
    return path


def _every_command(capsys: pytest.CaptureFixture[str], path: Path) -> dict[str, int]:
    codes = {}
    for argv in (
        ["replay", str(path), "--json"],
        ["replay", str(path), "--no-snapshot"],
        ["tree", str(path)],
        ["audit", str(path), "--json"],
        ["snapshot", str(path)],
    ):
        codes[" ".join(argv[:1] + argv[2:])] = cli(capsys, *argv)[0]
    return codes


flips = st.lists(
    st.tuples(st.integers(min_value=0), st.integers(min_value=1, max_value=255)),
    min_size=1,
    max_size=6,
)


@FUZZ
@given(flips=flips, truncate=st.one_of(st.none(), st.floats(0.0, 1.0)))
def test_damaged_ledger_file(
    base: dict[str, Any],
    capsys: pytest.CaptureFixture[str],
    flips: list[tuple[int, int]],
    truncate: float | None,
) -> None:
    """Bits flipped anywhere in the file, or the file cut short: a clear outcome."""
    with tempfile.TemporaryDirectory() as directory:
        path = _copy(base, directory)
        data = bytearray(base["bytes"])
        if truncate is not None:
            del data[int(len(data) * truncate) :]
        for position, mask in flips:
            if data:
                data[position % len(data)] ^= mask
        path.write_bytes(bytes(data))
        _every_command(capsys, path)


@FUZZ
@given(flips=flips, cut=st.one_of(st.none(), st.integers(min_value=0)), keep_checksum=st.booleans())
def test_damaged_snapshot_blob(
    base: dict[str, Any],
    capsys: pytest.CaptureFixture[str],
    flips: list[tuple[int, int]],
    cut: int | None,
    keep_checksum: bool,
) -> None:
    """A damaged snapshot: a warning naming it, then the same state as --no-snapshot.

    With the checksum recomputed (a forger), a change the state hash and the time
    checks cannot see (a quota's ``at``, which no output shows) may pass: the
    state is the full replay's all the same."""
    import hashlib

    blob = bytearray(base["blob"])
    if cut is not None:
        del blob[cut % len(blob) :]
    for position, mask in flips:
        if blob:
            blob[position % len(blob)] ^= mask
    with tempfile.TemporaryDirectory() as directory:
        path = _copy(base, directory)
        with sqlite3.connect(path) as conn:
            conn.execute("UPDATE snapshots SET blob = ?", (bytes(blob),))
            if not keep_checksum:  # as a forger would: only the state hash can tell
                checksum = hashlib.sha256(bytes(blob)).hexdigest()
                conn.execute("UPDATE snapshots SET checksum = ?", (checksum,))
        code, out, err = cli(capsys, "replay", str(path), "--json")
        assert code == 0, err
        if keep_checksum and bytes(blob) != base["blob"]:
            assert f"snapshot at offset {base['through']} not used" in err
        code, full, _ = cli(capsys, "replay", str(path), "--json", "--no-snapshot")
        assert code == 0 and json.loads(out) == json.loads(full)
        assert cli(capsys, "tree", str(path))[0] == 0
        assert cli(capsys, "audit", str(path))[0] == 0  # audit never reads snapshots
        assert cli(capsys, "snapshot", str(path))[0] == 0
        code, again, err = cli(capsys, "replay", str(path), "--json")
        assert code == 0 and "warning" not in err
        assert json.loads(again)["hash"] == json.loads(full)["hash"]


@FUZZ
@given(data=st.data())
def test_changed_record_fails_the_audit(
    base: dict[str, Any], capsys: pytest.CaptureFixture[str], data: st.DataObject
) -> None:
    """A record covered by the LedgerDigest changed (payload bytes or ts): audit exit
    1 naming a range that holds it; replay and tree still answer."""
    offset = data.draw(st.integers(0, base["through"]), label="offset")
    with tempfile.TemporaryDirectory() as directory:
        path = _copy(base, directory)
        with sqlite3.connect(path) as conn:
            conn.text_factory = bytes
            ts, payload = conn.execute(
                "SELECT ts, payload FROM records WHERE offset = ?", (offset,)
            ).fetchone()
            if data.draw(st.booleans(), label="change ts"):
                conn.execute(
                    "UPDATE records SET ts = ? WHERE offset = ?",
                    (ts + data.draw(st.integers(1, 10**6)), offset),
                )
            else:
                changed = bytearray(payload)
                position = data.draw(st.integers(0, len(changed) - 1), label="byte")
                changed[position] ^= data.draw(st.integers(1, 255), label="mask")
                conn.execute(
                    "UPDATE records SET payload = ? WHERE offset = ?", (bytes(changed), offset)
                )
        code, out, err = cli(capsys, "audit", str(path), "--json")
        if offset == 0:
            # record 0 names the ledger: a file whose record 0 changed is not opened
            assert code in (1, 2), err
            if code == 2:
                assert "not a quotaledger ledger" in err or "inconsistent" in err
                return
        assert code == 1
        document = json.loads(out)
        mismatches = [
            p
            for check in document["digests"]
            for p in check["problem_data"]
            if p["code"] == "digest-mismatch"
        ]
        assert mismatches and mismatches[0]["first"] <= offset <= mismatches[0]["last"]
        for command in ("replay", "tree"):
            assert cli(capsys, command, str(path), "--no-snapshot")[0] in (0, 2)
