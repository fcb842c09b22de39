"""The embedded SQLite ledger: one file, WAL, group commit (DESIGN §3).

The file's tables are in :mod:`.schema`, connections and transactions in
:mod:`.connection`, opening a file (and opening it read-only, DESIGN §9) in
:mod:`.opening`, snapshots in :mod:`.snapshots`; this module is the
:class:`SqliteLedger`: appending, reading, closing.

Invariants (DESIGN §3), kept even with several processes appending to the same
file and across crashes (``kill -9``) of any of them:

* offsets are 0, 1, 2, ... without gaps: each commit runs under
  ``BEGIN IMMEDIATE`` (the one SQLite write lock), reads the current tail inside
  that transaction and numbers its records from there;
* ``ts`` never decreases: a ``ts`` smaller than the previous record's is clamped
  up to it, and ``ts=None`` takes the ledger clock (read once per commit group);
* record 0 is ``LedgerOpened{ledger_id}``, written in the same transaction that
  creates the schema, so a file is either not a ledger yet or a complete one;
  opening with another ``expect_ledger_id`` raises :class:`LedgerMismatch`;
* an :meth:`SqliteLedger.append` returns only after its records are committed.
  With ``synchronous=NORMAL`` a commit survives a crash of the process (the WAL
  is in the OS page cache); an OS crash or power loss may lose the last commits
  but never leaves a gap or a torn record.

Threading model: all appends (the group commit, opening and closing) run on
one dedicated writer thread with its own connection, because
``BEGIN IMMEDIATE`` may wait up to ``busy_timeout_ms`` for another process. That
wait is a retry loop with short jittered sleeps (0.1-2 ms) rather than SQLite's
own busy handler, whose sleeps grow to 100 ms and let a busy process starve
another one.
Concurrent :meth:`~SqliteLedger.append` calls queue their batches; a writer task
drains everything queued, commits it in **one** transaction on that thread and
then resolves every caller (group commit; :attr:`~SqliteLedger.commit_count`
counts the transactions). Snapshots are written on a thread and connection of
their own, in parts that give way to this object's appends
(:meth:`~SqliteLedger.save_snapshot`), so an append never waits for a snapshot
to be written. Reads (:meth:`~SqliteLedger.read`,
:meth:`~SqliteLedger.last_offset`, :meth:`~SqliteLedger.load_snapshot`) are short
blocking calls on the event loop through a second, query-only connection: WAL
readers never wait for writers, and one batch of 1000 rows takes well under a
millisecond. :meth:`~SqliteLedger.iter_batches` is a plain generator with its
own connection, for CLI replays and benchmarks, usable from any thread.

An instance belongs to the event loop it is used on.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from itertools import starmap
from types import TracebackType
from typing import Any

import msgspec

from quotaledger.events.ledger import Append, LedgerError, Record, Snapshot
from quotaledger.events.times import wall_clock_ms

from .connection import connect, db_payload, write_transaction
from .opening import check_path, open_read_only, open_read_write
from .schema import FORMAT, INSERT_RECORD, SCHEMA_VERSION
from .snapshots import SNAPSHOT_PART_BYTES, SnapshotRows

__all__ = ["FORMAT", "SCHEMA_VERSION", "SNAPSHOT_PART_BYTES", "SqliteLedger"]

_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1
_SELECT_FROM = "SELECT offset, ts, payload FROM records WHERE offset >= ? ORDER BY offset LIMIT ?"
_SELECT_TAIL = "SELECT offset, ts FROM records ORDER BY offset DESC LIMIT 1"


class SqliteLedger:
    """A :class:`quotaledger.events.Ledger` in one SQLite file (DESIGN §3).

    Create with ``await SqliteLedger.open(path)``; see the module docstring for
    the invariants and the threading model.
    """

    def __init__(
        self,
        path: str,
        ledger_id: str,
        writer: sqlite3.Connection | None,
        reader: sqlite3.Connection,
        executor: ThreadPoolExecutor,
        *,
        clock_ms: Callable[[], int],
        busy_timeout_ms: int,
        poll_interval: float,
        read_params: str = "mode=rw",
    ) -> None:
        """Internal: use :meth:`open`."""
        self._path = path
        self._ledger_id = ledger_id
        self._wconn = writer
        self._rconn = reader
        self._executor = executor
        self._clock_ms = clock_ms
        self._busy_timeout_ms = busy_timeout_ms
        self._poll_interval = poll_interval
        self._read_params = read_params
        self._pending: list[tuple[list[Append], asyncio.Future[list[int]]]] = []
        self._writer_task: asyncio.Task[None] | None = None
        #: Set while no append of this object is queued or being committed: a
        #: snapshot part waits for it (DECISIONS 241).
        self._appends_idle = threading.Event()
        self._appends_idle.set()
        #: Snapshots: their own thread and connection (opened on first use), this
        #: object's reader for reading them.
        self._snapshots = SnapshotRows(path, reader, self._appends_idle, busy_timeout_ms)
        self._tail_event = asyncio.Event()
        self._closing = False
        self._closed = False
        #: Number of append transactions committed by this object (group commit
        #: makes it smaller than the number of :meth:`append` calls under load).
        self.commit_count = 0

    # ------------------------------------------------------------------ open

    @classmethod
    async def open(
        cls,
        path: str | os.PathLike[str],
        *,
        create: bool = True,
        expect_ledger_id: str | None = None,
        ledger_id: str | None = None,
        clock_ms: Callable[[], int] = wall_clock_ms,
        busy_timeout_ms: int = 10_000,
        poll_interval: float = 0.01,
        read_only: bool = False,
    ) -> SqliteLedger:
        """Open the ledger at ``path``, creating it when missing or empty.

        A new ledger gets record 0 = ``LedgerOpened{ledger_id}`` with
        ``ledger_id`` (default: a random uuid4 hex) at ``clock_ms()``.

        Raises :class:`LedgerMismatch` when the file's ledger id differs from
        ``expect_ledger_id`` (or from ``ledger_id``, when that is given for an
        existing file), and :class:`LedgerError` when the file is not a
        quotaledger ledger, or is missing/empty with ``create=False``.

        ``poll_interval`` (seconds) is how often a ``follow`` reader looks for
        records appended by other connections; appends through this object wake
        its readers at once.

        ``read_only`` opens an existing ledger without ever writing to it (not
        even the WAL setting), so a file on a read-only medium can be read
        (DESIGN §9); :meth:`append` and :meth:`save_snapshot` then raise
        :class:`LedgerError`.
        """
        fspath = os.path.abspath(os.fspath(path))
        check_path(fspath, create=create, read_only=read_only)
        if read_only:
            opened = open_read_only(
                fspath,
                expect_ledger_id=expect_ledger_id if expect_ledger_id is not None else ledger_id,
                busy_timeout_ms=busy_timeout_ms,
            )
        else:
            opened = await open_read_write(
                fspath,
                create=create,
                ledger_id=ledger_id,
                wanted=(expect_ledger_id, ledger_id),
                now=clock_ms(),
                busy_timeout_ms=busy_timeout_ms,
            )
        return cls(
            fspath,
            opened.ledger_id,
            opened.writer,
            opened.reader,
            opened.executor,
            clock_ms=clock_ms,
            busy_timeout_ms=busy_timeout_ms,
            poll_interval=poll_interval,
            read_params=opened.read_params,
        )

    @property
    def read_only(self) -> bool:
        """True when opened with ``read_only`` (nothing can be written)."""
        return self._wconn is None

    async def __aenter__(self) -> SqliteLedger:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # ------------------------------------------------------------ properties

    @property
    def ledger_id(self) -> str:
        """The id in record 0's ``LedgerOpened``."""
        return self._ledger_id

    @property
    def path(self) -> str:
        """Absolute path of the ledger file."""
        return self._path

    @property
    def closed(self) -> bool:
        """True once :meth:`close` has finished committing what was queued."""
        return self._closed

    # ---------------------------------------------------------------- append

    async def append(self, batch: Sequence[Append]) -> list[int]:
        """Append ``batch`` atomically; return its offsets once committed.

        The batch's records are consecutive and land in one transaction,
        possibly shared with batches of concurrent callers (group commit). A
        ``ts`` smaller than the previous record's is clamped up to it; ``None``
        means ``clock_ms()`` at commit time (DESIGN §3). If the caller is
        cancelled before its batch is taken by the writer, nothing is written;
        after that, the batch may or may not be committed.
        """
        self._check_open()
        self._check_writable("append to")
        items = list(batch)
        for item in items:
            if not isinstance(item, Append):
                raise TypeError(f"append() takes Append items, not {type(item).__name__}")
            if not isinstance(item.payload, bytes):
                raise TypeError(f"Append.payload must be bytes, not {type(item.payload).__name__}")
            ts = item.ts
            if ts is not None and (
                not isinstance(ts, int)
                or isinstance(ts, bool)
                or not _INT64_MIN <= ts <= _INT64_MAX
            ):
                raise ValueError(f"Append.ts must be None or a 64-bit integer, not {ts!r}")
        if not items:
            return []
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[list[int]] = loop.create_future()
        self._pending.append((items, fut))
        self._appends_idle.clear()
        if self._writer_task is None:
            self._writer_task = loop.create_task(self._write_loop())
        return await fut

    async def _write_loop(self) -> None:
        """Drain the queue: one transaction per drained group, until it is empty."""
        loop = asyncio.get_running_loop()
        try:
            while self._pending:
                group = [(items, fut) for items, fut in self._pending if not fut.done()]
                self._pending = []
                if not group:
                    continue
                now = self._clock_ms()
                try:
                    firsts = await loop.run_in_executor(
                        self._executor, self._commit, [items for items, _ in group], now
                    )
                except Exception as exc:
                    for _, fut in group:
                        if not fut.done():
                            fut.set_exception(_append_error(exc))
                    continue
                self._wake()
                for (items, fut), first in zip(group, firsts, strict=True):
                    if not fut.done():
                        fut.set_result(list(range(first, first + len(items))))
        finally:
            self._writer_task = None
            self._appends_idle.set()

    def _commit(self, batches: list[list[Append]], now: int) -> list[int]:
        """Writer thread: one ``BEGIN IMMEDIATE`` transaction for all ``batches``.

        Returns the first offset of each batch.
        """
        assert self._wconn is not None
        firsts = write_transaction(self._wconn, self._busy_timeout_ms, _insert, batches, now)
        self.commit_count += 1
        return firsts

    def _wake(self) -> None:
        """Wake every follow reader of this object (new records or closing)."""
        self._tail_event.set()
        self._tail_event = asyncio.Event()

    # ------------------------------------------------------------------ read

    async def read(
        self, from_offset: int = 0, *, follow: bool = False, batch: int = 1000
    ) -> AsyncIterator[list[Record]]:
        """Yield records from ``from_offset`` on, in offset order, ``batch`` at a time.

        Without ``follow`` it stops at the tail. With ``follow`` it waits for
        new records: it polls every ``poll_interval`` for appends by other
        connections and wakes at once on appends through this object. It ends
        when the ledger is closed and stops cleanly (``CancelledError``) when
        the consuming task is cancelled. No read transaction is held while the
        consumer processes a batch.
        """
        if from_offset < 0:
            raise ValueError(f"from_offset must be >= 0, not {from_offset}")
        if batch < 1:
            raise ValueError(f"batch must be >= 1, not {batch}")
        self._check_open()
        offset = from_offset
        while not self._closed:
            woken = self._tail_event
            records = self._fetch(offset, batch)
            if records:
                offset = records[-1].offset + 1
                yield records
                if follow or len(records) == batch:
                    continue
                return
            if not follow:
                return
            try:
                async with asyncio.timeout(self._poll_interval):
                    await woken.wait()
            except TimeoutError:
                pass

    def _fetch(self, offset: int, limit: int) -> list[Record]:
        try:
            rows = self._rconn.execute(_SELECT_FROM, (offset, limit)).fetchall()
        except sqlite3.Error as exc:
            raise LedgerError(f"reading ledger {self._path} failed: {exc}") from None
        return _to_records(rows, self._path)

    def iter_batches(self, from_offset: int = 0, batch: int = 5000) -> Iterator[list[Record]]:
        """Synchronously yield all records from ``from_offset`` up to the tail.

        Uses its own connection (opened on first ``next()``, closed when the
        generator ends or is closed), so it works from any thread and does not
        need the event loop. Meant for CLI replays and benchmarks.
        """
        if from_offset < 0:
            raise ValueError(f"from_offset must be >= 0, not {from_offset}")
        if batch < 1:
            raise ValueError(f"batch must be >= 1, not {batch}")
        try:
            conn = connect(self._path, self._read_params, self._busy_timeout_ms)
            conn.execute("PRAGMA query_only = ON")
        except sqlite3.Error as exc:
            raise LedgerError(f"cannot read ledger {self._path}: {exc}") from None
        try:
            offset = from_offset
            while True:
                try:
                    rows = conn.execute(_SELECT_FROM, (offset, batch)).fetchall()
                except sqlite3.Error as exc:
                    raise LedgerError(f"reading ledger {self._path} failed: {exc}") from None
                if not rows:
                    return
                records = _to_records(rows, self._path)
                yield records
                if len(records) < batch:
                    return
                offset = records[-1].offset + 1
        finally:
            conn.close()

    async def last_offset(self) -> int:
        """Offset of the newest record, committed by any connection (-1 for none)."""
        self._check_open()
        try:
            rows = self._rconn.execute("SELECT max(offset) FROM records").fetchall()
        except sqlite3.Error as exc:
            raise LedgerError(f"reading ledger {self._path} failed: {exc}") from None
        value = rows[0][0]
        if value is not None and type(value) is not int:
            raise LedgerError(f"ledger {self._path} is damaged: last offset {value!r}")
        return -1 if value is None else value

    # ------------------------------------------------------------- snapshots

    async def save_snapshot(self, snapshot: Snapshot) -> None:
        """Store ``snapshot`` (replacing one at the same offset).

        Its offset must name an existing record: a snapshot covers records
        ``0..offset`` of this ledger.

        Written on a thread and connection of its own, never through the
        appends' writer. A blob longer than :attr:`snapshot_part_bytes` goes in
        parts, one short transaction each; before each part the writer waits
        until no append of this object is queued or committing, so an append
        waits at most for the one part being written, never for the snapshot.
        The row that makes the snapshot visible is written last, in one
        transaction: a reader finds the snapshot whole or not at all. If the
        caller is cancelled or the ledger closed, the write stops before its
        next part and the snapshot stays absent (DECISIONS 241). The same
        transaction drops the snapshots beyond :attr:`snapshot_keep`
        (DECISIONS 270).
        """
        self._check_open()
        self._check_writable("save a snapshot to")
        await self._snapshots.save(snapshot)

    @property
    def snapshot_part_bytes(self) -> int:
        """Snapshot blobs longer than this are stored in parts (DECISIONS 241)."""
        return self._snapshots.part_bytes

    @snapshot_part_bytes.setter
    def snapshot_part_bytes(self, value: int) -> None:
        self._snapshots.part_bytes = value

    @property
    def snapshot_keep(self) -> int:
        """How many snapshots the file keeps; a save drops the extra ones (DECISIONS 270)."""
        return self._snapshots.keep

    @snapshot_keep.setter
    def snapshot_keep(self, value: int) -> None:
        self._snapshots.keep = value

    async def load_snapshot(self, at_most: int | None = None) -> Snapshot | None:
        """The newest snapshot whose offset is ``<= at_most`` (the newest if None)."""
        self._check_open()
        return self._snapshots.load(at_most)

    def snapshot_at(self, offset: int) -> Snapshot | None:
        """The snapshot at exactly ``offset``, if any (synchronous: ``audit --jobs``)."""
        self._check_open()
        return self._snapshots.at(offset)

    def snapshot_sizes(self) -> list[tuple[int, int]]:
        """``(offset, blob length)`` of the snapshots that store a digest and a state
        hash (the only ones a reader may use), by offset (synchronous: ``audit
        --jobs`` plans its segments with them; the blobs are not read)."""
        self._check_open()
        return self._snapshots.sizes()

    # ----------------------------------------------------------------- close

    async def close(self) -> None:
        """Commit what is queued, end follow readers, release the file. Idempotent."""
        if self._closing:
            return
        self._closing = True
        task = self._writer_task
        if task is not None:
            await asyncio.wait({task})
        self._closed = True
        self._wake()
        await self._snapshots.close()  # a write under way stops before its next part
        # The writer connection closes last, on its thread: the last close
        # checkpoints the WAL, which should not block the event loop.
        self._rconn.close()
        if self._wconn is not None:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(self._executor, self._wconn.close)
        self._executor.shutdown(wait=True)

    def _check_open(self) -> None:
        if self._closing:
            raise LedgerError(f"ledger {self._path} is closed")

    def _check_writable(self, what: str) -> None:
        if self._wconn is None:
            raise LedgerError(f"ledger {self._path} is open read-only: cannot {what} it")

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"<SqliteLedger {self._path} ledger_id={self._ledger_id} {state}>"


# ------------------------------------------------------------------ helpers


def _to_records(rows: list[Any], path: str) -> list[Record]:
    """Rows as records; a row whose columns do not have their types (a damaged
    page can hold anything) is a :class:`LedgerError` naming it.

    msgspec converts and type-checks a whole batch in one call (the replay's
    hot path; DECISIONS 173). It is exact here because every connection has
    ``text_factory = bytes``, so a column comes back as ``int``, ``float``,
    ``bytes`` or ``None`` only (never the ``str`` msgspec would read as base64):
    msgspec accepts a row exactly when the checks below do. When it refuses
    one, those checks find it and name it."""
    try:
        return msgspec.convert(rows, list[Record])
    except msgspec.ValidationError:
        pass
    records = list(starmap(Record, rows))
    for record in records:
        if type(record.offset) is not int or type(record.ts) is not int:
            raise LedgerError(
                f"ledger {path} is damaged: record {record.offset!r} has ts {record.ts!r}"
            )
        if type(record.payload) is not bytes:
            raise LedgerError(
                f"ledger {path} is damaged: record {record.offset} has a"
                f" {type(record.payload).__name__} payload"
            )
    return records


def _append_error(exc: Exception) -> Exception:
    if isinstance(exc, LedgerError):
        return LedgerError(str(exc))
    if isinstance(exc, sqlite3.Error | ValueError | TypeError):  # the two: damage
        return LedgerError(f"append failed, nothing of this batch was written: {exc}")
    return exc


def _insert(conn: sqlite3.Connection, batches: list[list[Append]], now: int) -> list[int]:
    """Number and insert ``batches`` after the current tail (inside the transaction).

    Reading the tail under the write lock is what keeps offsets gap-free and
    ``ts`` non-decreasing with several writers (DESIGN §3).
    """
    tail = conn.execute(_SELECT_TAIL).fetchall()
    if not tail:
        raise LedgerError("the ledger lost its record 0")
    offset = tail[0][0] + 1
    last_ts = tail[0][1]
    rows: list[tuple[int, int, str | bytes]] = []
    firsts: list[int] = []
    for items in batches:
        firsts.append(offset)
        for item in items:
            ts = now if item.ts is None else item.ts
            if ts < last_ts:
                ts = last_ts
            last_ts = ts
            rows.append((offset, ts, db_payload(item.payload)))
            offset += 1
    conn.executemany(INSERT_RECORD, rows)
    return firsts
