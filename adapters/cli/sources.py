"""A ledger's records for ``audit`` and ``whatif``: a SQLite or Kafka ledger, or a JSONL file."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from quotaledger.events.codec import encode_event, peek_kind
from quotaledger.events.ledger import Record
from quotaledger.events.model import LedgerOpened

from ..jsonl import Line, open_jsonl, read_lines
from ..ledger_url import open_ledger
from ..sqlite_ledger import SqliteLedger
from .common import Progress, UserError, is_jsonl, progress_for


def jsonl_ledger_records(path: Path) -> list[Record]:
    """A JSONL file as ledger records for ``audit``/``whatif``.

    A file exported from a ledger starts with its ``LedgerOpened``: that line is
    offset 0, so the decisions' ``basis`` offsets keep their meaning. Any other
    file gets a ``LedgerOpened`` at offset 0 and line n at offset n, as ``replay``.
    A bad line is a ``FactRejected`` at its offset, as in ``replay`` (DECISIONS 31).
    """
    with open_jsonl(str(path)) as source:
        ledger_id = source.ledger_id()
        first_line_is_opened = False
        lines: list[Line] = []
        for line in read_lines(source, export=True):
            if not lines and peek_kind(line.payload) == "LedgerOpened":
                first_line_is_opened = True
            lines.append(line)
    if first_line_is_opened:
        head = Record(offset=0, ts=lines[0].ts, payload=lines[0].payload)
        lines = lines[1:]
    else:
        opened = LedgerOpened(ledger_id=ledger_id)
        head = Record(offset=0, ts=0, payload=encode_event(opened))
    out = [head]
    last = head.ts
    for offset, line in enumerate(lines, start=1):
        last = max(last, line.ts)
        out.append(Record(offset=offset, ts=last, payload=line.payload))
    return out


RecordSource = Callable[[int], Iterable[Record]]


def _with_progress(label: str, total: int, source: RecordSource) -> RecordSource:
    """``source`` whose first pass (the full one, from offset 0) reports progress."""
    passes = 0

    def counted(start: int) -> Iterable[Record]:
        nonlocal passes
        passes += 1
        if passes > 1 or start != 0:
            return source(start)
        return _counting(source(start), progress_for(label, total, None))

    return counted


def _counting(records: Iterable[Record], progress: Progress) -> Iterator[Record]:
    for done, record in enumerate(records, start=1):
        yield record
        if done % 1000 == 0:
            progress(done)
    progress.close()


async def _kafka_records(url: str) -> RecordSource:
    """Every record of a Kafka ledger, read once (audit reads them all anyway)."""
    ledger = await open_ledger(url, create=False)
    try:
        rows: list[Record] = []
        async for batch in ledger.read(0):
            rows.extend(batch)
    finally:
        await ledger.close()
    return lambda start: rows[start:]


def with_ledger_records(
    path: Path | str, work: Callable[[RecordSource], Any], label: str = "audit"
) -> Any:
    """Run ``work(source)`` where ``source(n)`` yields the ledger's records from offset n.

    Read only: the SQLite file is opened through its own reader connections and
    nothing is appended, snapshotted or rewritten.
    """
    if isinstance(path, str):
        return work(asyncio.run(_kafka_records(path)))
    if is_jsonl(path):
        rows = jsonl_ledger_records(path)
        return work(_with_progress(label, len(rows), lambda start: rows[start:]))
    if not path.exists():
        raise UserError(f"{path}: no such file")

    async def run() -> Any:
        ledger = await SqliteLedger.open(str(path), read_only=True)
        try:
            total = await ledger.last_offset() + 1
            return work(
                _with_progress(
                    label,
                    total,
                    lambda start: itertools.chain.from_iterable(ledger.iter_batches(start)),
                )
            )
        finally:
            await ledger.close()

    return asyncio.run(run())
