"""Records of a ledger URL or a JSONL file, for ``audit``, ``whatif`` and ``replay`` (DESIGN §9).

Reading a ledger's records as a :data:`~quotaledger.events.ledger.RecordSource`
(``source(n)`` yields the records from offset n on, as often as it is called)
is written here once:

* :func:`ledger_record_source`: an open ledger. A SQLite ledger is read lazily,
  from any offset, through its own reader connections (also from a worker
  thread); any other backend (Kafka, memory) is read once, whole: an audit
  reads every record anyway, some ranges twice. A reader that stops at a hole
  (Kafka's, DESIGN §10) gives the records before it, and the ``LedgerGap`` to a
  caller that asks for it (``gaps``), as a SQLite ledger's records stop there
  for the auditor's chain; otherwise the gap is raised.
* :func:`jsonl_file_records`: a JSONL file as the records of a ledger, an
  export keeping its offsets (:func:`quotaledger.adapters.ledgers.jsonl.records` with
  ``export``).
* :func:`with_record_source`: a LEDGER (a path, ``sqlite:///PATH``,
  ``kafka://...``) or a JSONL file, opened around the work that reads it.

Nothing here writes: a ledger on a read-only medium can be audited (DESIGN §9).
The SQLite backend is imported when a ledger is read, as :mod:`.url`
does: reading a JSONL file, and every command's start-up, need no sqlite3.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Protocol, TypeVar

from quotaledger.events.ledger import Ledger, LedgerGap, Record, RecordSource

from .jsonl import is_jsonl_path, open_jsonl, records
from .url import is_kafka_url, open_ledger

__all__ = [
    "Meter",
    "MeterFor",
    "RecordSource",
    "jsonl_file_records",
    "ledger_record_source",
    "metered",
    "with_record_source",
]

T = TypeVar("T")


class Meter(Protocol):
    """Progress of one pass over the records: called with the records done so far."""

    def __call__(self, done: int) -> None: ...

    def close(self) -> None: ...


#: A meter for a pass over ``total`` records.
MeterFor = Callable[[int], Meter]


async def ledger_record_source(ledger: Ledger, gaps: list[LedgerGap] | None = None) -> RecordSource:
    """The records of an open ledger (see the module docstring): read lazily from
    a SQLite ledger while it stays open, else read whole here, once. A read that
    stops at a hole: the records before it, and the gap appended to ``gaps``
    (raised when ``gaps`` is None)."""
    from .sqlite.ledger import SqliteLedger  # here: sqlite3 is not needed to read a JSONL file

    if isinstance(ledger, SqliteLedger):
        iter_batches = ledger.iter_batches
        return lambda start: itertools.chain.from_iterable(iter_batches(start))
    rows: list[Record] = []
    try:
        async for batch in ledger.read(0):
            rows.extend(batch)
    except LedgerGap as gap:
        if gaps is None:
            raise
        gaps.append(gap)
    return lambda start: rows[start:]


def jsonl_file_records(path: Path) -> list[Record]:
    """A JSONL file (``-``: standard input) as ledger records, for ``audit`` and ``whatif``.

    A file exported from a ledger starts with its ``LedgerOpened``: that line is
    offset 0, so the decisions' ``basis`` offsets keep their meaning. Any other
    file gets a ``LedgerOpened`` at offset 0 and line n at offset n, as ``replay``.
    A bad line is a ``FactRejected`` at its offset, as in ``replay`` (DECISIONS 31).
    """
    with open_jsonl(str(path)) as source:
        return list(records(source, export=True))


def metered(source: RecordSource, total: int, meter_for: MeterFor | None) -> RecordSource:
    """``source`` whose first pass, the full one from offset 0, reports its progress
    to a meter made when that pass starts (later passes and other starts do not)."""
    if meter_for is None:
        return source
    passes = 0

    def counted(start: int) -> Iterable[Record]:
        nonlocal passes
        passes += 1
        if passes > 1 or start != 0:
            return source(start)
        return _counting(source(start), meter_for(total))

    return counted


def _counting(records: Iterable[Record], meter: Meter) -> Iterator[Record]:
    for done, record in enumerate(records, start=1):
        yield record
        if done % 1000 == 0:
            meter(done)
    meter.close()


async def _read_whole(url: str, gaps: list[LedgerGap] | None) -> RecordSource:
    ledger = await open_ledger(url, create=False, read_only=True)
    try:
        return await ledger_record_source(ledger, gaps)
    finally:
        await ledger.close()


def with_record_source(
    location: Path | str,
    work: Callable[[RecordSource], T],
    meter_for: MeterFor | None = None,
    *,
    gaps: list[LedgerGap] | None = None,
) -> T:
    """``work(source)`` over the records of ``location``: a JSONL file (a
    :class:`~pathlib.Path` with a JSONL suffix, or ``-``) or a ledger (a path or
    any LEDGER URL), opened read only. ``meter_for`` follows the first full pass
    over a SQLite ledger or a JSONL file. ``gaps``: a Kafka read that stops at a
    hole gives ``work`` the records before it and appends the gap there.

    A SQLite file stays open while ``work`` runs; a Kafka ledger is read whole
    first and closed, so no consumer waits on a blocked event loop.
    """
    if isinstance(location, Path) and is_jsonl_path(location):
        rows = jsonl_file_records(location)
        return work(metered(lambda start: rows[start:], len(rows), meter_for))
    url = str(location)
    if is_kafka_url(url):
        return work(asyncio.run(_read_whole(url, gaps)))

    async def run() -> T:
        ledger = await open_ledger(url, create=False, read_only=True)
        try:
            total = await ledger.last_offset() + 1
            return work(metered(await ledger_record_source(ledger), total, meter_for))
        finally:
            await ledger.close()

    return asyncio.run(run())
