"""Rows read back as records (adapters/ledgers/sqlite/ledger.py ``_to_records``; DECISIONS 173).

A batch is converted by msgspec in one call; a row whose columns lost their
types (a damaged page) must still be a ``LedgerError`` naming that record, and a
text payload (SQLite's dynamic typing allows one) still reads as its bytes.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from quotaledger.adapters.ledgers.sqlite.ledger import SqliteLedger
from quotaledger.events import Append, LedgerError, Record


async def _ledger(path: Path) -> None:
    ledger = await SqliteLedger.open(str(path), ledger_id="rows", clock_ms=lambda: 1000)
    try:
        await ledger.append(
            [Append(payload=b'{"kind":"PodRemoved","uid":"p%d"}' % i) for i in range(5)]
        )
    finally:
        await ledger.close()


def _damage(path: Path, sql: str) -> None:
    conn = sqlite3.connect(path)
    with conn:
        conn.execute(sql)
    conn.close()


async def _read_all(path: Path) -> list[Record]:
    ledger = await SqliteLedger.open(str(path), read_only=True)
    try:
        return [record for batch in ledger.iter_batches(0, batch=2) for record in batch]
    finally:
        await ledger.close()


async def test_rows_read_back_as_the_records_appended(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    await _ledger(path)
    records = await _read_all(path)
    assert [r.offset for r in records] == list(range(6))
    assert all(type(r.payload) is bytes and type(r.ts) is int for r in records)
    assert records[3].payload == b'{"kind":"PodRemoved","uid":"p2"}'


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        ("UPDATE records SET ts = 1.5 WHERE offset = 3", "record 3 has ts 1.5"),
        ("UPDATE records SET ts = x'00' WHERE offset = 4", "record 4 has ts b'\\x00'"),
        ("UPDATE records SET payload = 42 WHERE offset = 2", "record 2 has a int payload"),
        ("UPDATE records SET payload = 4.5 WHERE offset = 5", "record 5 has a float payload"),
    ],
)
async def test_a_row_of_the_wrong_type_is_named(tmp_path: Path, sql: str, message: str) -> None:
    path = tmp_path / "l.db"
    await _ledger(path)
    _damage(path, sql)
    with pytest.raises(LedgerError, match=message.replace("\\", "\\\\").replace(".", r"\.")):
        await _read_all(path)


async def test_a_text_payload_reads_as_its_bytes(tmp_path: Path) -> None:
    """Base64-looking text is not decoded as base64: the payload is the text's bytes."""
    path = tmp_path / "l.db"
    await _ledger(path)
    _damage(path, "UPDATE records SET payload = 'eA==' WHERE offset = 1")
    records = await _read_all(path)
    assert records[1].payload == b"eA=="
