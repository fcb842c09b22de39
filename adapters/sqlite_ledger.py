"""The embedded SQLite ledger: one file, WAL, group commit (DESIGN §3).

Layout of the file (readable with the ``sqlite3`` shell for ad-hoc audit)::

    meta      (key TEXT PRIMARY KEY, value TEXT)      format, schema_version, ledger_id
    records   (offset INTEGER PRIMARY KEY, ts INTEGER NOT NULL, payload BLOB NOT NULL)
    snapshots (offset INTEGER PRIMARY KEY, blob BLOB NOT NULL, digest TEXT, state_hash TEXT,
               checksum TEXT, parts TEXT)
    snapshot_parts (token TEXT, part INTEGER, offset INTEGER, data BLOB,
                    PRIMARY KEY (token, part))

``snapshots.digest``/``state_hash``/``checksum`` (DESIGN §9: a snapshot stores offset, digest
and state hash) were added after schema version 1 shipped without them; they
are nullable, added to an older file when it first saves a snapshot, and a
snapshot without them loads with ``None`` (unverifiable: readers do not use it).
A blob longer than :data:`SNAPSHOT_PART_BYTES` is stored in ``snapshot_parts``
(its row's ``blob`` empty, ``parts`` naming the parts' token; the column and the
table are added by the first such snapshot); the blob is its parts' ``data``
concatenated in ``part`` order (DECISIONS 241).

The read-only commands open with ``read_only=True``: a query-only connection,
read-write where the file and its directory are writable (as before), else
``mode=ro``, and ``immutable=1`` when SQLite cannot create the ``-shm`` file
next to it (a read-only medium). ``sqlite3 'file:ledger.db?mode=ro&immutable=1'``
reads such a file by hand.
``payload`` holds the event JSON. It is stored as TEXT when it is valid UTF-8
without NUL bytes (so ``sqlite3 ledger.db "select * from records"`` prints the
JSON) and as a BLOB otherwise; either way it reads back as the exact bytes that
were appended.

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
import random
import sqlite3
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from itertools import starmap
from types import TracebackType
from typing import Any, TypeVar
from urllib.parse import quote

import msgspec

from quotaledger.events.codec import EventError, decode_event, encode_event
from quotaledger.events.ledger import Append, LedgerError, LedgerMismatch, Record, Snapshot
from quotaledger.events.model import LedgerOpened

__all__ = ["FORMAT", "SCHEMA_VERSION", "SqliteLedger", "wall_clock_ms"]

#: ``meta.format`` of a quotaledger ledger file.
FORMAT = "quotaledger-ledger"
#: ``meta.schema_version`` this module writes; files with a newer one are refused.
SCHEMA_VERSION = 1

_INT64_MIN = -(2**63)
_INT64_MAX = 2**63 - 1

_SCHEMA = (
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE records (offset INTEGER PRIMARY KEY, ts INTEGER NOT NULL, payload BLOB NOT NULL)",
    "CREATE TABLE snapshots (offset INTEGER PRIMARY KEY, blob BLOB NOT NULL,"
    " digest TEXT, state_hash TEXT, checksum TEXT)",
)
#: Columns of ``snapshots`` added after schema version 1 (nullable).
_SNAPSHOT_META = ("digest", "state_hash", "checksum")
#: The column naming a snapshot's parts (NULL: the blob is inline), added with
#: the ``snapshot_parts`` table by the first snapshot stored in parts.
_PARTS_COLUMN = "parts"
_PARTS_TABLE = (
    "CREATE TABLE IF NOT EXISTS snapshot_parts (token TEXT NOT NULL, part INTEGER NOT NULL,"
    " offset INTEGER NOT NULL, data BLOB NOT NULL, PRIMARY KEY (token, part))"
)
_INSERT_PART = "INSERT INTO snapshot_parts (token, part, offset, data) VALUES (?, ?, ?, ?)"
#: A snapshot blob longer than this is stored in parts of this size, one
#: short transaction each (DECISIONS 241).
SNAPSHOT_PART_BYTES = 1024 * 1024
#: How long a part waits for this object's queued appends before it goes anyway.
_PART_YIELD_S = 0.25
_TABLES = frozenset({"meta", "records", "snapshots"})
_SELECT_FROM = "SELECT offset, ts, payload FROM records WHERE offset >= ? ORDER BY offset LIMIT ?"
_SELECT_TAIL = "SELECT offset, ts FROM records ORDER BY offset DESC LIMIT 1"
_INSERT = "INSERT INTO records (offset, ts, payload) VALUES (?, ?, ?)"


def wall_clock_ms() -> int:
    """Milliseconds since the epoch by the wall clock (the default ledger clock)."""
    return time.time_ns() // 1_000_000


def _db_payload(payload: bytes) -> str | bytes:
    """TEXT when the payload is valid UTF-8 without NUL, else the BLOB as is."""
    if b"\x00" in payload:
        return payload
    try:
        return payload.decode("utf-8")
    except UnicodeDecodeError:
        return payload


def _as_bytes(value: object) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    raise LedgerError(f"unexpected value in the ledger: {value!r}")


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
        #: Snapshots have their own thread and connection, opened on first use.
        self._snapshot_executor: ThreadPoolExecutor | None = None
        self._sconn: sqlite3.Connection | None = None
        self._snapshots_closing = threading.Event()
        #: Blobs longer than this are stored in parts (DECISIONS 241).
        self.snapshot_part_bytes = SNAPSHOT_PART_BYTES
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
        if (read_only or not create) and not os.path.exists(fspath):
            raise LedgerError(f"no ledger at {fspath} (and create=False)")
        if os.path.isdir(fspath):
            raise LedgerError(f"cannot open ledger {fspath}: it is a directory")
        if not create and os.path.getsize(fspath) == 0:
            # Before connecting: setting WAL would write a header into the file.
            raise LedgerError(f"{fspath} is an empty file, not a ledger (and create=False)")
        if not read_only and os.path.exists(fspath):
            directory = os.path.dirname(fspath)
            if not os.access(fspath, os.W_OK) or not os.access(directory, os.W_OK | os.X_OK):
                # SQLite would open it read-only and fail at the first append.
                raise LedgerError(
                    f"cannot open ledger {fspath} for writing: the file or its directory is"
                    " not writable (a read-only medium?); this command writes to the ledger,"
                    " while replay, tree, audit and whatif only read it"
                )
        if create and not read_only and not os.path.exists(fspath):
            _check_creatable(fspath)
        if read_only:
            return await cls._open_read_only(
                fspath,
                expect_ledger_id=expect_ledger_id if expect_ledger_id is not None else ledger_id,
                clock_ms=clock_ms,
                busy_timeout_ms=busy_timeout_ms,
                poll_interval=poll_interval,
            )
        now = clock_ms()
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-ledger")
        loop = asyncio.get_running_loop()
        writer: sqlite3.Connection | None = None
        reader: sqlite3.Connection | None = None
        try:
            # The writer waits for the lock in _write_transaction, not in SQLite.
            writer = await loop.run_in_executor(
                executor, _connect, fspath, "rwc" if create else "rw", 0
            )
            found = await loop.run_in_executor(
                executor, _init_file, writer, fspath, create, ledger_id, now, busy_timeout_ms
            )
            reader = _connect(fspath, "rw", busy_timeout_ms)
            reader.execute("PRAGMA query_only = ON")
        except sqlite3.OperationalError as exc:  # cannot open, locked, read-only, ...
            await _discard(loop, executor, writer, reader)
            if _is_read_only_error(exc) and not os.path.exists(fspath):
                raise LedgerError(_cannot_create(fspath, str(exc))) from None
            if _is_read_only_error(exc) and os.path.exists(fspath):
                raise LedgerError(
                    f"cannot open ledger {fspath} for writing: {exc} (a read-only file,"
                    " directory or medium?); this command writes to the ledger, while"
                    " replay, tree, audit and whatif only read it"
                ) from None
            raise LedgerError(f"cannot open ledger {fspath}: {exc}") from None
        except sqlite3.DatabaseError as exc:  # "file is not a database", corruption
            await _discard(loop, executor, writer, reader)
            raise LedgerError(f"{fspath} is not a quotaledger ledger: {exc}") from None
        except sqlite3.Error as exc:
            await _discard(loop, executor, writer, reader)
            raise LedgerError(f"cannot open ledger {fspath}: {exc}") from None
        except (ValueError, TypeError) as exc:  # undecodable names or values: damage
            await _discard(loop, executor, writer, reader)
            raise LedgerError(f"{fspath} is not a readable quotaledger ledger: {exc}") from None
        except BaseException:
            await _discard(loop, executor, writer, reader)
            raise
        for wanted in (expect_ledger_id, ledger_id):
            if wanted is not None and wanted != found:
                await _discard(loop, executor, writer, reader)
                raise LedgerMismatch(
                    f"ledger {fspath} has ledger_id {found!r}, expected {wanted!r}: "
                    "refusing to mix two histories"
                )
        return cls(
            fspath,
            found,
            writer,
            reader,
            executor,
            clock_ms=clock_ms,
            busy_timeout_ms=busy_timeout_ms,
            poll_interval=poll_interval,
        )

    @classmethod
    async def _open_read_only(
        cls,
        fspath: str,
        *,
        expect_ledger_id: str | None,
        clock_ms: Callable[[], int],
        busy_timeout_ms: int,
        poll_interval: float,
    ) -> SqliteLedger:
        """Open for reading only: ``mode=ro``, else ``immutable=1`` (see module doc)."""
        reader: sqlite3.Connection | None = None
        # Where the file and its directory are writable, a query-only read-write
        # connection reads as before (its last close removes the -wal/-shm files);
        # elsewhere mode=ro, then immutable=1 (module docstring).
        writable = os.access(fspath, os.W_OK) and os.access(os.path.dirname(fspath), os.W_OK)
        tries = ("mode=rw", *READ_ONLY_PARAMS) if writable else READ_ONLY_PARAMS
        try:
            reader, params = _connect_read_only(fspath, busy_timeout_ms, tries)
            tables = {
                _as_bytes(row[0]).decode()
                for row in reader.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            }
            if not tables:
                raise LedgerError(f"{fspath} is an empty file, not a ledger")
            found = _retry_busy(busy_timeout_ms, _check_file, reader, fspath, tables)
        except sqlite3.OperationalError as exc:
            if reader is not None:
                reader.close()
            raise LedgerError(f"cannot open ledger {fspath} for reading: {exc}") from None
        except sqlite3.DatabaseError as exc:
            if reader is not None:
                reader.close()
            raise LedgerError(f"{fspath} is not a quotaledger ledger: {exc}") from None
        except (ValueError, TypeError) as exc:  # undecodable names or values: damage
            if reader is not None:
                reader.close()
            raise LedgerError(f"{fspath} is not a readable quotaledger ledger: {exc}") from None
        except BaseException:
            if reader is not None:
                reader.close()
            raise
        if expect_ledger_id is not None and expect_ledger_id != found:
            reader.close()
            raise LedgerMismatch(
                f"ledger {fspath} has ledger_id {found!r}, expected {expect_ledger_id!r}: "
                "refusing to mix two histories"
            )
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-ledger")
        return cls(
            fspath,
            found,
            None,
            reader,
            executor,
            clock_ms=clock_ms,
            busy_timeout_ms=busy_timeout_ms,
            poll_interval=poll_interval,
            read_params=params,
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
        firsts = _write_transaction(self._wconn, self._busy_timeout_ms, _insert, batches, now)
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
            conn = _connect(self._path, self._read_params, self._busy_timeout_ms)
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
        next part and the snapshot stays absent (DECISIONS 241).
        """
        self._check_open()
        self._check_writable("save a snapshot to")
        if not isinstance(snapshot.blob, bytes):
            raise TypeError(f"Snapshot.blob must be bytes, not {type(snapshot.blob).__name__}")
        if self._snapshot_executor is None:
            self._snapshot_executor = ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="sqlite-snapshots"
            )
        loop = asyncio.get_running_loop()
        cancel = threading.Event()
        try:
            await loop.run_in_executor(
                self._snapshot_executor, self._save_snapshot, snapshot, cancel
            )
        except asyncio.CancelledError:
            cancel.set()  # the thread stops before its next part
            raise
        except _SnapshotStopped:
            raise LedgerError(
                f"saving a snapshot to {self._path} stopped: the ledger is closing"
            ) from None
        except (sqlite3.Error, ValueError) as exc:  # ValueError: a damaged schema
            raise LedgerError(f"saving a snapshot to {self._path} failed: {exc}") from None

    def _save_snapshot(self, snapshot: Snapshot, cancel: threading.Event) -> None:
        """Snapshot thread: the parts, then the row (see :meth:`save_snapshot`)."""
        if self._sconn is None:
            self._sconn = _connect(self._path, "rw", 0)
            self._sconn.execute("PRAGMA synchronous = NORMAL")
        conn, timeout = self._sconn, self._busy_timeout_ms
        size = max(1, self.snapshot_part_bytes)
        blob = memoryview(snapshot.blob)
        parts: tuple[str, int] | None = None
        if len(blob) > size:
            token = f"{snapshot.offset}-{uuid.uuid4().hex}"
            _retry_busy(timeout, conn.execute, _PARTS_TABLE)
            count = 0
            for start in range(0, len(blob), size):
                self._before_part(cancel)
                # one statement, its own transaction: one call into SQLite per
                # part (each call waits for the GIL again, up to 5 ms while the
                # event loop's thread is busy)
                _retry_busy(
                    timeout,
                    conn.execute,
                    _INSERT_PART,
                    (token, count, snapshot.offset, blob[start : start + size]),
                )
                count += 1
            parts = (token, count)
        self._before_part(cancel)
        _write_transaction(conn, timeout, _insert_snapshot, snapshot, parts)

    def _before_part(self, cancel: threading.Event) -> None:
        """Snapshot thread: stop if asked; else let this object's queued
        appends commit first (for at most ``_PART_YIELD_S``)."""
        deadline = time.monotonic() + _PART_YIELD_S
        while True:
            if cancel.is_set() or self._snapshots_closing.is_set():
                raise _SnapshotStopped
            if self._appends_idle.wait(0.005) or time.monotonic() >= deadline:
                break
        if cancel.is_set() or self._snapshots_closing.is_set():
            raise _SnapshotStopped

    async def load_snapshot(self, at_most: int | None = None) -> Snapshot | None:
        """The newest snapshot whose offset is ``<= at_most`` (the newest if None)."""
        if at_most is None:
            return self._select_snapshot("ORDER BY offset DESC LIMIT 1", ())
        return self._select_snapshot("WHERE offset <= ? ORDER BY offset DESC LIMIT 1", (at_most,))

    def snapshot_at(self, offset: int) -> Snapshot | None:
        """The snapshot at exactly ``offset``, if any (synchronous: ``audit --jobs``)."""
        return self._select_snapshot("WHERE offset = ?", (offset,))

    def snapshot_sizes(self) -> list[tuple[int, int]]:
        """``(offset, blob length)`` of the snapshots that store a digest and a state
        hash (the only ones a reader may use), by offset (synchronous: ``audit
        --jobs`` plans its segments with them; the blobs are not read)."""
        self._check_open()
        try:
            columns = _snapshot_columns(self._rconn)
            if not columns >= set(_SNAPSHOT_META):
                return []
            size = "length(blob)"
            if _PARTS_COLUMN in columns:
                size = (
                    "CASE WHEN parts IS NULL THEN length(blob) ELSE (SELECT sum(length(data))"
                    " FROM snapshot_parts p WHERE p.token = snapshots.parts) END"
                )
            rows = self._rconn.execute(
                f"SELECT offset, {size} FROM snapshots WHERE digest IS NOT NULL"
                " AND state_hash IS NOT NULL ORDER BY offset"
            ).fetchall()
        except (sqlite3.Error, ValueError) as exc:
            raise LedgerError(f"reading the snapshots of {self._path} failed: {exc}") from None
        return [(row[0], row[1]) for row in rows if type(row[0]) is int and type(row[1]) is int]

    def _select_snapshot(self, where: str, params: tuple[int, ...]) -> Snapshot | None:
        self._check_open()
        conn = self._rconn
        try:
            conn.execute("BEGIN")  # the row and its parts from one read transaction
            try:
                columns = _snapshot_columns(conn)
                has_meta = columns >= set(_SNAPSHOT_META)
                selected = (
                    "offset, blob, digest, state_hash, checksum" if has_meta else "offset, blob"
                )
                with_parts = _PARTS_COLUMN in columns
                if with_parts:
                    selected += ", parts"
                rows = conn.execute(f"SELECT {selected} FROM snapshots {where}", params).fetchall()
                token = _text_or_none(rows[0][-1]) if rows and with_parts else None
                parts = (
                    conn.execute(
                        "SELECT data FROM snapshot_parts WHERE token = ? ORDER BY part", (token,)
                    ).fetchall()
                    if token is not None
                    else []
                )
            finally:
                conn.execute("COMMIT")
        except (sqlite3.Error, ValueError) as exc:
            raise LedgerError(f"reading a snapshot from {self._path} failed: {exc}") from None
        if not rows:
            return None
        row = rows[0]
        if type(row[0]) is not int or not isinstance(row[1], bytes | str):
            raise LedgerError(f"the snapshot table of {self._path} is damaged")
        blob = _as_bytes(row[1])
        if token is not None:
            if not all(isinstance(part[0], bytes) for part in parts):
                raise LedgerError(f"the snapshot parts of {self._path} are damaged")
            blob = b"".join(part[0] for part in parts)
        meta = [_text_or_none(value) for value in row[2:5]] if has_meta else [None] * 3
        return Snapshot(
            offset=int(row[0]),
            blob=blob,
            digest=meta[0],
            state_hash=meta[1],
            checksum=meta[2],
        )

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
        self._snapshots_closing.set()  # a snapshot being written stops before its next part
        if self._snapshot_executor is not None:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(self._snapshot_executor, self._close_snapshots)
            self._snapshot_executor.shutdown(wait=True)
        # The writer connection closes last, on its thread: the last close
        # checkpoints the WAL, which should not block the event loop.
        self._rconn.close()
        if self._wconn is not None:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(self._executor, self._wconn.close)
        self._executor.shutdown(wait=True)

    def _close_snapshots(self) -> None:
        if self._sconn is not None:
            self._sconn.close()
            self._sconn = None

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


def _connect(path: str, params: str, busy_timeout_ms: int) -> sqlite3.Connection:
    """A connection in autocommit mode (transactions are explicit).

    ``params`` is the URI query: a bare mode (``rw``, ``rwc``) or ``mode=...&...``.
    """
    query = params if "=" in params else f"mode={params}"
    conn = sqlite3.connect(
        f"file:{quote(path)}?{query}",
        uri=True,
        timeout=busy_timeout_ms / 1000,
        isolation_level=None,
        check_same_thread=False,
    )
    conn.text_factory = bytes
    conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
    return conn


#: URI queries for reading, in the order tried (DESIGN §9 read-only media).
READ_ONLY_PARAMS = ("mode=ro", "mode=ro&immutable=1")


def _connect_read_only(
    path: str, busy_timeout_ms: int, tries: Sequence[str] = READ_ONLY_PARAMS
) -> tuple[sqlite3.Connection, str]:
    """A query-only connection, and the URI query it took (the first of ``tries``
    that opens). Only ``mode=rw`` may touch the file (its last close checkpoints
    and removes the ``-wal``/``-shm``); the read-only queries never do.

    ``mode=ro`` reads a WAL ledger while other processes write it, but needs
    the ``-shm`` file (created if missing); where that cannot be created (a
    read-only directory or medium) ``immutable=1`` reads the file as it is.
    """
    failure: sqlite3.OperationalError | None = None
    for params in tries:
        conn: sqlite3.Connection | None = None
        try:
            conn = _connect(path, params, busy_timeout_ms)
            conn.execute("PRAGMA query_only = ON")
            conn.execute("SELECT count(*) FROM sqlite_master").fetchall()
        except sqlite3.OperationalError as exc:
            if conn is not None:
                conn.close()
            if _is_busy(exc):
                raise
            failure = exc
            continue
        return conn, params
    assert failure is not None
    raise failure


def _cannot_create(fspath: str, why: str) -> str:
    return (
        f"cannot create ledger {fspath}: {why}; choose a writable directory (replay, tree,"
        " audit and whatif read an existing ledger on a read-only medium)"
    )


def _check_creatable(fspath: str) -> None:
    """A new ledger's directory must exist and be writable: say so in words
    instead of SQLite's "unable to open database file" (DESIGN §9 clear errors)."""
    directory = os.path.dirname(fspath)
    if not os.path.isdir(directory):
        raise LedgerError(_cannot_create(fspath, f"no such directory {directory}"))
    if not os.access(directory, os.W_OK | os.X_OK):
        raise LedgerError(
            _cannot_create(
                fspath,
                f"the directory {directory} is not writable (a read-only medium or"
                " another user's directory?)",
            )
        )


def _is_read_only_error(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None and (code & 0xFF) in (sqlite3.SQLITE_READONLY, sqlite3.SQLITE_CANTOPEN):
        return True
    text = str(exc)
    return "readonly" in text or "read-only" in text or "unable to open" in text


def _snapshot_columns(conn: sqlite3.Connection) -> set[str]:
    return {_as_bytes(row[1]).decode() for row in conn.execute("PRAGMA table_info(snapshots)")}


def _text_or_none(value: object) -> str | None:
    if value is None:
        return None
    try:
        return _as_bytes(value).decode("utf-8")
    except (LedgerError, UnicodeDecodeError):
        return None


_T = TypeVar("_T")


def _is_busy(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return (code & 0xFF) in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    return "locked" in str(exc) or "busy" in str(exc)


def _retry_busy(timeout_ms: int, fn: Callable[..., _T], *args: Any) -> _T:
    """Run ``fn(*args)`` until SQLite stops answering "busy", for ``timeout_ms`` at most.

    ``fn`` must leave no transaction open when it raises (nothing of it is kept).
    """
    deadline = time.monotonic() + timeout_ms / 1000
    pause = 0.0002
    while True:
        try:
            return fn(*args)
        except sqlite3.OperationalError as exc:
            if not _is_busy(exc) or time.monotonic() >= deadline:
                raise
        time.sleep(random.uniform(pause / 2, pause))
        pause = min(pause * 2, 0.002)


def _transaction(conn: sqlite3.Connection, fn: Callable[..., _T], *args: Any) -> _T:
    """``fn(conn, *args)`` inside ``BEGIN IMMEDIATE`` ... ``COMMIT``; rolled back if it raises."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        result = fn(conn, *args)
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return result


def _write_transaction(
    conn: sqlite3.Connection, timeout_ms: int, fn: Callable[..., _T], *args: Any
) -> _T:
    """A write transaction that waits up to ``timeout_ms`` for the write lock."""

    def attempt() -> _T:
        return _transaction(conn, fn, *args)

    return _retry_busy(timeout_ms, attempt)


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
            rows.append((offset, ts, _db_payload(item.payload)))
            offset += 1
    conn.executemany(_INSERT, rows)
    return firsts


class _SnapshotStopped(Exception):
    """A snapshot write stopped before its next part (cancelled, or closing)."""


def _insert_snapshot(
    conn: sqlite3.Connection, snapshot: Snapshot, parts: tuple[str, int] | None = None
) -> None:
    """Inside the transaction: the row that makes ``snapshot`` visible, its blob
    inline or, with ``parts`` (token, count), in the parts written before.

    Also drops the parts nothing refers to any more: those of the row this one
    replaces, and those of writes for an older offset that never finished (a
    crash, a stop). Parts of an unfinished write for this offset or a newer
    one are left alone: another engine may be writing them."""
    last = conn.execute("SELECT max(offset) FROM records").fetchall()[0][0]
    if not 0 <= snapshot.offset <= (-1 if last is None else last):
        raise LedgerError(
            f"snapshot offset {snapshot.offset} is outside the ledger (last offset {last})"
        )
    columns = _snapshot_columns(conn)
    missing = [c for c in _SNAPSHOT_META if c not in columns]
    if parts is not None and _PARTS_COLUMN not in columns:
        missing.append(_PARTS_COLUMN)
    for column in missing:  # a file from before the columns existed
        conn.execute(f"ALTER TABLE snapshots ADD COLUMN {column} TEXT")
    has_parts = parts is not None or _PARTS_COLUMN in columns
    token: str | None = None
    if parts is not None:
        token, count = parts
        found = conn.execute(
            "SELECT count(*), coalesce(sum(length(data)), 0) FROM snapshot_parts WHERE token = ?",
            (token,),
        ).fetchall()[0]
        if (found[0], found[1]) != (count, len(snapshot.blob)):
            raise LedgerError(
                f"snapshot {snapshot.offset}: {found[0]} of its {count} parts are stored"
            )
    replaced: list[Any] = []
    if has_parts:
        replaced = conn.execute(
            "SELECT parts FROM snapshots WHERE offset = ? AND parts IS NOT NULL",
            (snapshot.offset,),
        ).fetchall()
    values = (
        snapshot.offset,
        snapshot.blob if token is None else b"",
        snapshot.digest,
        snapshot.state_hash,
        snapshot.checksum,
    )
    if has_parts:
        conn.execute(
            "INSERT OR REPLACE INTO snapshots (offset, blob, digest, state_hash, checksum, parts)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (*values, token),
        )
        for (value,) in replaced:
            old = _text_or_none(value)
            if old is not None and old != token:
                conn.execute("DELETE FROM snapshot_parts WHERE token = ?", (old,))
        conn.execute(
            "DELETE FROM snapshot_parts WHERE offset < ? AND token NOT IN"
            " (SELECT parts FROM snapshots WHERE parts IS NOT NULL)",
            (snapshot.offset,),
        )
    else:
        conn.execute(
            "INSERT OR REPLACE INTO snapshots (offset, blob, digest, state_hash, checksum)"
            " VALUES (?, ?, ?, ?, ?)",
            values,
        )


def _init_file(
    conn: sqlite3.Connection,
    path: str,
    create: bool,
    ledger_id: str | None,
    now: int,
    timeout_ms: int,
) -> str:
    """Writer thread: set WAL, create schema + record 0 if empty, return the ledger id."""
    mode = _retry_busy(timeout_ms, _journal_mode_wal, conn)
    if mode.lower() != "wal":
        raise LedgerError(f"ledger {path}: SQLite refused WAL mode (journal_mode={mode})")
    conn.execute("PRAGMA synchronous = NORMAL")
    tables = _write_transaction(conn, timeout_ms, _create_schema, path, create, ledger_id, now)
    return _retry_busy(timeout_ms, _check_file, conn, path, tables)


def _journal_mode_wal(conn: sqlite3.Connection) -> str:
    return _as_bytes(conn.execute("PRAGMA journal_mode = WAL").fetchall()[0][0]).decode()


def _create_schema(
    conn: sqlite3.Connection, path: str, create: bool, ledger_id: str | None, now: int
) -> set[str]:
    """Inside the transaction: the schema and record 0 of an empty file; the table names."""
    tables = {
        _as_bytes(row[0]).decode()
        for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
    }
    if tables:
        return tables
    if not create:
        raise LedgerError(f"{path} is an empty file, not a ledger (and create=False)")
    new_id = ledger_id if ledger_id is not None else uuid.uuid4().hex
    for statement in _SCHEMA:
        conn.execute(statement)
    conn.executemany(
        "INSERT INTO meta (key, value) VALUES (?, ?)",
        [("format", FORMAT), ("schema_version", str(SCHEMA_VERSION)), ("ledger_id", new_id)],
    )
    opened = encode_event(LedgerOpened(ledger_id=new_id))
    conn.execute(_INSERT, (0, now, _db_payload(opened)))
    return set(_TABLES)


def _check_file(conn: sqlite3.Connection, path: str, tables: set[str]) -> str:
    """Refuse anything but a quotaledger ledger; return its ledger id."""
    not_ledger = f"{path} is not a quotaledger ledger"
    if not tables >= _TABLES:
        raise LedgerError(f"{not_ledger} (a SQLite database with tables {sorted(tables)})")
    meta = {
        _as_bytes(k).decode(): _as_bytes(v).decode()
        for k, v in conn.execute("SELECT key, value FROM meta").fetchall()
    }
    if meta.get("format") != FORMAT:
        raise LedgerError(f"{not_ledger} (meta.format is {meta.get('format')!r})")
    version = meta.get("schema_version", "")
    if not version.isdigit() or int(version) > SCHEMA_VERSION:
        raise LedgerError(
            f"ledger {path} has schema_version {version!r}; this quotaledger reads "
            f"up to {SCHEMA_VERSION}"
        )
    first = conn.execute("SELECT payload FROM records WHERE offset = 0").fetchall()
    if not first:
        raise LedgerError(f"{not_ledger} (it has no record 0)")
    try:
        event: Any = decode_event(_as_bytes(first[0][0]))
    except EventError as exc:
        raise LedgerError(f"{not_ledger} (record 0 is not an event: {exc})") from None
    if not isinstance(event, LedgerOpened):
        raise LedgerError(f"{not_ledger} (record 0 is {type(event).__name__}, not LedgerOpened)")
    if meta.get("ledger_id", event.ledger_id) != event.ledger_id:
        raise LedgerError(
            f"ledger {path} is inconsistent: meta.ledger_id {meta.get('ledger_id')!r} "
            f"differs from record 0's {event.ledger_id!r}"
        )
    return event.ledger_id


async def _discard(
    loop: asyncio.AbstractEventLoop,
    executor: ThreadPoolExecutor,
    writer: sqlite3.Connection | None,
    reader: sqlite3.Connection | None,
) -> None:
    """Release what a failed :meth:`SqliteLedger.open` had acquired."""
    if reader is not None:
        reader.close()
    if writer is not None:
        await loop.run_in_executor(executor, writer.close)
    executor.shutdown(wait=False)
