"""A ledger's records for audit, whatif and replay, read in one place (adapters/ledgers/sources.py).

The same records, offsets and payloads come out of a SQLite ledger (read lazily),
any other backend (read whole), and the ledger's JSONL export (DESIGN §9); a JSONL
file that is no export keeps replay's numbering; progress follows the first full
pass only; nothing is written.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from quotaledger.adapters.ledgers.jsonl import records
from quotaledger.adapters.ledgers.memory import MemoryLedger, MemoryLog
from quotaledger.adapters.ledgers.sources import (
    jsonl_file_records,
    ledger_record_source,
    metered,
    with_record_source,
)
from quotaledger.adapters.ledgers.sqlite.ledger import SqliteLedger
from quotaledger.events import Append, LedgerError, Record
from quotaledger.events.codec import decode_event, peek_kind
from quotaledger.events.ledger import RecordSource
from quotaledger.events.model import FactRejected, LedgerOpened

FACTS = [
    b'{"kind":"NodeUpserted","name":"n%d","allocatable":{"cpu":8},"at":"2026-01-01T00:00:0%dZ"}'
    % (i, i)
    for i in range(4)
]


async def _sqlite(path: Path) -> list[Record]:
    ledger = await SqliteLedger.open(str(path), ledger_id="sources", clock_ms=lambda: 0)
    try:
        await ledger.append([Append(payload=fact, ts=1000 * i) for i, fact in enumerate(FACTS)])
        return [record async for batch in ledger.read(0) for record in batch]
    finally:
        await ledger.close()


def _export(rows: list[Record], path: Path) -> Path:
    path.write_bytes(b"".join(record.payload + b"\n" for record in rows))
    return path


def _pairs(rows: list[Record]) -> list[tuple[int, bytes]]:
    return [(record.offset, record.payload) for record in rows]


async def test_an_open_ledger_reads_the_same_from_every_offset_on_every_backend(
    tmp_path: Path,
) -> None:
    written = await _sqlite(tmp_path / "l.db")
    sqlite = await SqliteLedger.open(str(tmp_path / "l.db"), read_only=True)
    log = MemoryLog(ledger_id="sources")
    memory = MemoryLedger(log)
    await memory.append([Append(payload=fact, ts=1000 * i) for i, fact in enumerate(FACTS)])
    try:
        for ledger in (sqlite, memory):
            source = await ledger_record_source(ledger)
            for start in (0, 2, 4, 5):
                assert _pairs(list(source(start))) == _pairs(written[start:])
            # read again, as an audit does for a decision's basis
            assert _pairs(list(source(1))) == _pairs(written[1:])
    finally:
        await sqlite.close()
        await memory.close()


async def test_a_ledgers_jsonl_export_keeps_its_offsets(tmp_path: Path) -> None:
    written = await _sqlite(tmp_path / "l.db")
    export = _export(written, tmp_path / "export.jsonl")
    assert _pairs(jsonl_file_records(export)) == _pairs(written)
    # replay's numbering of the same file: its LedgerOpened line is just line 1
    replayed = list(records(export))
    assert peek_kind(replayed[0].payload) == "LedgerOpened"
    assert _pairs(replayed[1:]) == [(r.offset + 1, r.payload) for r in written]


def test_a_file_that_is_no_export_is_numbered_as_replay_numbers_it(tmp_path: Path) -> None:
    path = tmp_path / "facts.jsonl"
    path.write_bytes(b"\n".join([FACTS[0], b"", b'{"kind":"Nope"}', FACTS[1]]) + b"\n")
    rows = jsonl_file_records(path)
    assert _pairs(rows) == _pairs(list(records(path)))
    assert [r.offset for r in rows] == [0, 1, 2, 3]
    opened = decode_event(rows[0].payload)
    assert isinstance(opened, LedgerOpened) and opened.ledger_id.startswith("jsonl-")
    rejected = decode_event(rows[2].payload)
    assert isinstance(rejected, FactRejected)
    assert rejected.offset == 2 and rejected.reason.startswith("line 3:")
    assert rows[0].ts == 0 and rows[1].ts == rows[2].ts < rows[3].ts  # the bad line keeps its ts


def test_a_bad_line_of_an_export_names_the_offset_it_has_there(tmp_path: Path) -> None:
    opened = b'{"kind":"LedgerOpened","ledger_id":"x"}'
    path = tmp_path / "export.jsonl"
    path.write_bytes(b"\n".join([opened, FACTS[0], b"{not json"]) + b"\n")
    rows = jsonl_file_records(path)
    assert [r.offset for r in rows] == [0, 1, 2]
    assert rows[0].payload == opened
    rejected = decode_event(rows[2].payload)
    assert isinstance(rejected, FactRejected) and rejected.offset == 2


class Meter:
    def __init__(self, total: int) -> None:
        self.total, self.closed = total, False
        self.calls: list[int] = []
        made.append(self)

    def __call__(self, done: int) -> None:
        self.calls.append(done)

    def close(self) -> None:
        self.closed = True


made: list[Meter] = []


def test_progress_follows_the_first_full_pass_only() -> None:
    made.clear()
    rows = [Record(offset=i, ts=0, payload=b"{}") for i in range(2500)]
    source: RecordSource = metered(lambda start: rows[start:], len(rows), Meter)
    assert made == []  # a meter is made when its pass starts
    assert len(list(source(0))) == 2500
    assert len(made) == 1 and made[0].total == 2500
    assert made[0].calls == [1000, 2000] and made[0].closed
    assert len(list(source(0))) == 2500 and len(list(source(7))) == 2493
    assert len(made) == 1
    assert metered(source, 1, None) is source


def test_with_record_source_reads_files_and_ledgers_read_only(tmp_path: Path) -> None:
    path = tmp_path / "l.db"
    written = asyncio.run(_sqlite(path))
    before = (path.read_bytes(), path.stat().st_mtime_ns)
    export = _export(written, tmp_path / "export.ndjson")
    for location in (path, str(path), f"sqlite:///{path}", export):
        made.clear()
        got = with_record_source(location, lambda source: _pairs(list(source(0))), Meter)
        assert got == _pairs(written), location
        assert [m.total for m in made] == [len(written)]
    assert (path.read_bytes(), path.stat().st_mtime_ns) == before


def test_a_missing_ledger_is_an_error_naming_it(tmp_path: Path) -> None:
    missing = tmp_path / "none.db"
    with pytest.raises(LedgerError, match=f"{missing}: no such file"):
        with_record_source(missing, lambda source: list(source(0)))
    assert not missing.exists()


def test_jsonl_names(tmp_path: Path) -> None:
    """Which names are JSONL (the rest is a ledger): .jsonl, .ndjson, .json and ``-``."""
    line = json.dumps({"kind": "LedgerOpened", "ledger_id": "x"}).encode() + b"\n"
    for name in ("a.jsonl", "a.NDJSON", "a.json"):
        (tmp_path / name).write_bytes(line)
        assert with_record_source(tmp_path / name, lambda s: len(list(s(0)))) == 1
