"""Snapshots in SQLite: the SQLite ledger's own, and a Kafka ledger's local file (DESIGN §9, §10).

**The SQLite ledger's snapshots** (:class:`SnapshotRows`) live in its file, in
``snapshots`` and ``snapshot_parts`` (:mod:`.schema`). They are written on a
thread and connection of their own, never through the appends' writer: a blob
longer than :data:`SNAPSHOT_PART_BYTES` goes in parts, one short transaction
each, and before each part the writer waits until no append of the ledger is
queued or committing, so an append waits at most for the one part being
written, never for the snapshot. The row that makes the snapshot visible is
written last, in one transaction: a reader (one read transaction for the row
and its parts) finds the snapshot whole or not at all (DECISIONS 241).

**A Kafka ledger's snapshots** (:class:`SnapshotStore`) live in a local SQLite
file given with ``--snapshots PATH``, keyed by ledger_id: a Kafka topic cannot
hold the engine's snapshots next to the records. One file may hold the
snapshots of several ledgers: rows are keyed by ``(ledger_id, offset)``, and a
ledger only ever sees its own, so a snapshot can never be applied to another
history (§3). The file is written through the same connection and write-lock
helpers (:mod:`.connection`: WAL, jittered busy retry), so several engines may
share it. Each row keeps the whole :class:`~quotaledger.events.ledger.Snapshot`
struct as MessagePack, so fields added to it later (digest, state hash) are
stored without a schema change, plus ``ts``, the ledger time of the snapshot's
last record, which a Kafka reader needs to keep clamping ts from there (§3).
Both keep only the last few snapshots (:data:`KEEP_SNAPSHOTS`, the two newest
and older ones spread over the ledger: :func:`to_drop`), dropped in the
transaction that saves a new one (DECISIONS 270): a snapshot is a cache, and a
large state's tens of MB per snapshot would otherwise grow the file forever.
Opened ``read_only`` (the read-only commands, DESIGN §9), the file is read
through a query-only connection that never writes to it (not even its schema or
WAL setting), as the SQLite ledger reads a file on a read-only medium; ``save``
is refused.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
import time
import uuid
from bisect import bisect_right
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgspec

from quotaledger.events.ledger import LedgerError, Snapshot

from .connection import (
    READ_ONLY_PARAMS,
    as_bytes,
    connect,
    retry_busy,
    text_or_none,
    write_transaction,
)
from .schema import PARTS_COLUMN, PARTS_TABLE, SNAPSHOT_META, snapshot_columns, upgrade_snapshots

__all__ = ["KEEP_SNAPSHOTS", "SNAPSHOT_PART_BYTES", "SnapshotRows", "SnapshotStore", "to_drop"]

#: A snapshot blob longer than this is stored in parts of this size, one
#: short transaction each (DECISIONS 241).
SNAPSHOT_PART_BYTES = 1024 * 1024
#: How long a part waits for the ledger's queued appends before it goes anyway.
_PART_YIELD_S = 0.25
_INSERT_PART = "INSERT INTO snapshot_parts (token, part, offset, data) VALUES (?, ?, ?, ?)"
#: How many snapshots a ledger (or a Kafka ledger's snapshot file, per ledger)
#: keeps; a save that makes more drops the extra ones (:func:`to_drop`, DECISIONS 270).
KEEP_SNAPSHOTS = 6
#: The newest snapshots retention never drops.
_KEEP_NEWEST = 2
#: Retention looks ahead to the ledger at up to twice its newest offset, in this
#: many steps (a snapshot taken later lies at or after that offset).
_GROWTH_STEPS = 20
#: Above this many snapshots (a ledger from before retention) the extra ones are
#: dropped by the neighbours-nearest rule alone: the cost of each is evaluated for
#: every candidate, cubic in their number.
_COSTED = 16
#: The weight of the largest gap between kept snapshots against how far the
#: nearest snapshot lies before the ledger's middle (DECISIONS 370).
_SPREAD_WEIGHT = 0.25


def _retention_cost(kept: list[int]) -> float:
    """What keeping the sorted ``kept`` costs (DECISIONS 370): how far the nearest
    snapshot lies before the ledger's middle, as a share of its length, averaged
    over the ledger growing from its newest offset to twice that; plus a quarter
    of the largest gap between kept snapshots, as a share of the newest offset."""
    newest = kept[-1] + 1
    short = 0.0
    for step in range(_GROWTH_STEPS + 1):
        length = newest * (1 + step / _GROWTH_STEPS)
        middle = length / 2
        below = bisect_right(kept, middle) - 1
        short += (middle - (kept[below] if below >= 0 else 0)) / length
    widest = max(after - before for before, after in zip([-1, *kept], kept, strict=False))
    return short / (_GROWTH_STEPS + 1) + _SPREAD_WEIGHT * widest / newest


def to_drop(offsets: list[int], keep: int = KEEP_SNAPSHOTS) -> list[int]:
    """Which of the snapshots at ``offsets`` retention drops so that ``keep``
    remain, at least two (DECISIONS 270, 370): never the two newest (a restore
    starts from the newest); among the older ones, one at a time, the one whose
    loss costs least (:func:`_retention_cost`: a snapshot kept a little before
    the ledger's middle while the ledger grows, where ``audit --jobs 2`` cuts,
    and the others spread; ties: the one whose neighbours are nearest each
    other, then the older)."""
    kept = sorted(set(offsets))
    dropped: list[int] = []
    while len(kept) > max(keep, _KEEP_NEWEST):

        def span(i: int) -> tuple[int, int]:
            return kept[i + 1] - (kept[i - 1] if i > 0 else -1), kept[i]

        def loss(i: int) -> tuple[float, int, int]:
            return _retention_cost(kept[:i] + kept[i + 1 :]), *span(i)

        # many (a ledger from before retention): the neighbours-nearest rule first
        rule = loss if len(kept) <= _COSTED else span
        dropped.append(kept.pop(min(range(len(kept) - _KEEP_NEWEST), key=rule)))
    return dropped


class _SnapshotStopped(Exception):
    """A snapshot write stopped before its next part (cancelled, or closing)."""


class SnapshotRows:
    """The snapshots of one SQLite ledger file (see the module docstring).

    ``reader`` is the ledger's query-only connection (reads run on the caller's
    thread); ``appends_idle`` is set while no append of the ledger is queued or
    being committed: a part waits for it.
    """

    def __init__(
        self,
        path: str,
        reader: sqlite3.Connection,
        appends_idle: threading.Event,
        busy_timeout_ms: int,
    ) -> None:
        self.path = path
        self._rconn = reader
        self._appends_idle = appends_idle
        self._busy_timeout_ms = busy_timeout_ms
        #: The writes' own thread and connection, opened on first use.
        self._executor: ThreadPoolExecutor | None = None
        self._conn: sqlite3.Connection | None = None
        self._closing = threading.Event()
        #: Blobs longer than this are stored in parts (DECISIONS 241).
        self.part_bytes = SNAPSHOT_PART_BYTES
        #: How many snapshots the file keeps (DECISIONS 270).
        self.keep = KEEP_SNAPSHOTS

    # ------------------------------------------------------------------ write

    async def save(self, snapshot: Snapshot) -> None:
        """Store ``snapshot`` (replacing one at the same offset): its parts, then
        its row. If the caller is cancelled or :meth:`close` is called, the write
        stops before its next part and the snapshot stays absent."""
        if not isinstance(snapshot.blob, bytes):
            raise TypeError(f"Snapshot.blob must be bytes, not {type(snapshot.blob).__name__}")
        if self._executor is None:
            self._executor = ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="sqlite-snapshots"
            )
        loop = asyncio.get_running_loop()
        cancel = threading.Event()
        try:
            await loop.run_in_executor(self._executor, self._save, snapshot, cancel)
        except asyncio.CancelledError:
            cancel.set()  # the thread stops before its next part
            raise
        except _SnapshotStopped:
            raise LedgerError(
                f"saving a snapshot to {self.path} stopped: the ledger is closing"
            ) from None
        except (sqlite3.Error, ValueError) as exc:  # ValueError: a damaged schema
            raise LedgerError(f"saving a snapshot to {self.path} failed: {exc}") from None

    def _save(self, snapshot: Snapshot, cancel: threading.Event) -> None:
        """Snapshot thread: the parts, then the row (see :meth:`save`)."""
        if self._conn is None:
            self._conn = connect(self.path, "rw", 0)
            self._conn.execute("PRAGMA synchronous = NORMAL")
        conn, timeout = self._conn, self._busy_timeout_ms
        size = max(1, self.part_bytes)
        blob = memoryview(snapshot.blob)
        parts: tuple[str, int] | None = None
        if len(blob) > size:
            token = f"{snapshot.offset}-{uuid.uuid4().hex}"
            retry_busy(timeout, conn.execute, PARTS_TABLE)
            count = 0
            for start in range(0, len(blob), size):
                self.before_part(cancel)
                # one statement, its own transaction: one call into SQLite per
                # part (each call waits for the GIL again, up to 5 ms while the
                # event loop's thread is busy)
                retry_busy(
                    timeout,
                    conn.execute,
                    _INSERT_PART,
                    (token, count, snapshot.offset, blob[start : start + size]),
                )
                count += 1
            parts = (token, count)
        self.before_part(cancel)
        write_transaction(conn, timeout, _insert_snapshot, snapshot, parts, self.keep)

    def before_part(self, cancel: threading.Event) -> None:
        """Snapshot thread: stop if asked; else let the ledger's queued appends
        commit first (for at most ``_PART_YIELD_S``)."""
        deadline = time.monotonic() + _PART_YIELD_S
        while True:
            if cancel.is_set() or self._closing.is_set():
                raise _SnapshotStopped
            if self._appends_idle.wait(0.005) or time.monotonic() >= deadline:
                break
        if cancel.is_set() or self._closing.is_set():
            raise _SnapshotStopped

    # ------------------------------------------------------------------- read

    def load(self, at_most: int | None) -> Snapshot | None:
        """The newest snapshot whose offset is ``<= at_most`` (the newest if None)."""
        if at_most is None:
            return self._select("ORDER BY offset DESC LIMIT 1", ())
        return self._select("WHERE offset <= ? ORDER BY offset DESC LIMIT 1", (at_most,))

    def at(self, offset: int) -> Snapshot | None:
        """The snapshot at exactly ``offset``, if any."""
        return self._select("WHERE offset = ?", (offset,))

    def sizes(self) -> list[tuple[int, int]]:
        """``(offset, blob length)`` of the snapshots that store a digest and a state
        hash (the only ones a reader may use), by offset; the blobs are not read."""
        try:
            columns = snapshot_columns(self._rconn)
            if not columns >= set(SNAPSHOT_META):
                return []
            size = "length(blob)"
            if PARTS_COLUMN in columns:
                size = (
                    "CASE WHEN parts IS NULL THEN length(blob) ELSE (SELECT sum(length(data))"
                    " FROM snapshot_parts p WHERE p.token = snapshots.parts) END"
                )
            rows = self._rconn.execute(
                f"SELECT offset, {size} FROM snapshots WHERE digest IS NOT NULL"
                " AND state_hash IS NOT NULL ORDER BY offset"
            ).fetchall()
        except (sqlite3.Error, ValueError) as exc:
            raise LedgerError(f"reading the snapshots of {self.path} failed: {exc}") from None
        return [(row[0], row[1]) for row in rows if type(row[0]) is int and type(row[1]) is int]

    def _select(self, where: str, params: tuple[int, ...]) -> Snapshot | None:
        conn = self._rconn
        try:
            conn.execute("BEGIN")  # the row and its parts from one read transaction
            try:
                columns = snapshot_columns(conn)
                has_meta = columns >= set(SNAPSHOT_META)
                selected = (
                    "offset, blob, digest, state_hash, checksum" if has_meta else "offset, blob"
                )
                with_parts = PARTS_COLUMN in columns
                if with_parts:
                    selected += ", parts"
                rows = conn.execute(f"SELECT {selected} FROM snapshots {where}", params).fetchall()
                token = text_or_none(rows[0][-1]) if rows and with_parts else None
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
            raise LedgerError(f"reading a snapshot from {self.path} failed: {exc}") from None
        if not rows:
            return None
        row = rows[0]
        if type(row[0]) is not int or not isinstance(row[1], bytes | str):
            raise LedgerError(f"the snapshot table of {self.path} is damaged")
        blob = as_bytes(row[1])
        if token is not None:
            if not all(isinstance(part[0], bytes) for part in parts):
                raise LedgerError(f"the snapshot parts of {self.path} are damaged")
            blob = b"".join(part[0] for part in parts)
        meta = [text_or_none(value) for value in row[2:5]] if has_meta else [None] * 3
        return Snapshot(
            offset=int(row[0]),
            blob=blob,
            digest=meta[0],
            state_hash=meta[1],
            checksum=meta[2],
        )

    # ------------------------------------------------------------------ close

    async def close(self) -> None:
        """Stop a write under way before its next part; release the thread and
        the connection. The reader connection is the ledger's to close."""
        self._closing.set()
        if self._executor is not None:
            loop = asyncio.get_running_loop()
            await loop.run_in_executor(self._executor, self._close_connection)
            self._executor.shutdown(wait=True)

    def _close_connection(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _insert_snapshot(
    conn: sqlite3.Connection,
    snapshot: Snapshot,
    parts: tuple[str, int] | None = None,
    keep: int = KEEP_SNAPSHOTS,
) -> None:
    """Inside the transaction: the row that makes ``snapshot`` visible, its blob
    inline or, with ``parts`` (token, count), in the parts written before.

    Also drops the parts nothing refers to any more: those of the row this one
    replaces, and those of writes for an older offset that never finished (a
    crash, a stop). Parts of an unfinished write for this offset or a newer
    one are left alone: another engine may be writing them. Then retention:
    the snapshots beyond ``keep`` go, with their parts (:func:`to_drop`)."""
    last = conn.execute("SELECT max(offset) FROM records").fetchall()[0][0]
    if not 0 <= snapshot.offset <= (-1 if last is None else last):
        raise LedgerError(
            f"snapshot offset {snapshot.offset} is outside the ledger (last offset {last})"
        )
    columns = snapshot_columns(conn)
    upgrade_snapshots(conn, columns, parts is not None)  # a file from before the columns
    has_parts = parts is not None or PARTS_COLUMN in columns
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
            old = text_or_none(value)
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
    offsets = [row[0] for row in conn.execute("SELECT offset FROM snapshots").fetchall()]
    for offset in to_drop([o for o in offsets if type(o) is int], keep):
        if has_parts:
            conn.execute(
                "DELETE FROM snapshot_parts WHERE token IN"
                " (SELECT parts FROM snapshots WHERE offset = ? AND parts IS NOT NULL)",
                (offset,),
            )
        conn.execute("DELETE FROM snapshots WHERE offset = ?", (offset,))


# ------------------------------------------------------- a Kafka ledger's snapshot file

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS ledger_snapshots ("
    " ledger_id TEXT NOT NULL, offset INTEGER NOT NULL, ts INTEGER NOT NULL,"
    " snapshot BLOB NOT NULL, PRIMARY KEY (ledger_id, offset))"
)
_DECODER = msgspec.msgpack.Decoder(Snapshot)
_ENCODER = msgspec.msgpack.Encoder()


class SnapshotStore:
    """Snapshots of one ledger (``ledger_id``) in the SQLite file at ``path``."""

    def __init__(
        self, path: str, ledger_id: str, conn: sqlite3.Connection, *, read_only: bool = False
    ) -> None:
        """Internal: use :meth:`open`."""
        self.path = path
        self.ledger_id = ledger_id
        #: Opened read-only: ``save`` is refused, nothing is written to the file.
        self.read_only = read_only
        self._conn = conn
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="snapshot-store")
        #: How many snapshots of this ledger the file keeps (DECISIONS 270).
        self.keep = KEEP_SNAPSHOTS

    @classmethod
    def open(
        cls, path: str | os.PathLike[str], ledger_id: str, *, read_only: bool = False
    ) -> SnapshotStore:
        """Open (creating when missing) the snapshot file for ``ledger_id``;
        ``read_only`` opens an existing file without ever writing to it."""
        fspath = os.path.abspath(os.fspath(path))
        if os.path.isdir(fspath):
            raise LedgerError(f"--snapshots {fspath}: it is a directory")
        if read_only:
            return cls(fspath, ledger_id, _connect_query_only(fspath), read_only=True)
        try:
            conn = connect(fspath, "rwc", 10_000)
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute(_SCHEMA)
        except sqlite3.DatabaseError as exc:
            raise LedgerError(f"--snapshots {fspath}: not a snapshot file: {exc}") from None
        return cls(fspath, ledger_id, conn)

    async def save(self, snapshot: Snapshot, ts: int) -> None:
        """Store ``snapshot`` (its last record at ledger time ``ts``). The
        MessagePack encoding (a copy of a blob of tens of MB) and the insert run
        on the store's thread, never on the event loop (DESIGN §6: snapshots
        stay off the decision path)."""
        if self.read_only:
            raise LedgerError(f"--snapshots {self.path} is open read-only: cannot save a snapshot")
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._executor, self._save, snapshot, ts)
        except sqlite3.Error as exc:
            raise LedgerError(f"saving a snapshot to {self.path} failed: {exc}") from None

    def _save(self, snapshot: Snapshot, ts: int) -> None:
        """Store thread: encode, then insert (the encoder is this thread's alone)."""
        row = (self.ledger_id, snapshot.offset, ts, _ENCODER.encode(snapshot))
        ledger_id, keep = self.ledger_id, self.keep

        def insert(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT OR REPLACE INTO ledger_snapshots (ledger_id, offset, ts, snapshot)"
                " VALUES (?, ?, ?, ?)",
                row,
            )
            offsets = conn.execute(
                "SELECT offset FROM ledger_snapshots WHERE ledger_id = ?", (ledger_id,)
            ).fetchall()
            for offset in to_drop([o for (o,) in offsets if type(o) is int], keep):
                conn.execute(
                    "DELETE FROM ledger_snapshots WHERE ledger_id = ? AND offset = ?",
                    (ledger_id, offset),
                )

        write_transaction(self._conn, 10_000, insert)

    def load(self, at_most: int | None) -> tuple[Snapshot, int] | None:
        """The newest snapshot of this ledger at or before ``at_most``, with its ts."""
        query = "SELECT snapshot, ts FROM ledger_snapshots WHERE ledger_id = ?"
        params: tuple[object, ...] = (self.ledger_id,)
        if at_most is not None:
            query += " AND offset <= ?"
            params += (at_most,)
        query += " ORDER BY offset DESC LIMIT 1"
        try:
            rows = self._conn.execute(query, params).fetchall()
        except sqlite3.Error as exc:
            if self.read_only and "no such table" in str(exc):
                return None  # a file no writer has saved a snapshot to yet
            raise LedgerError(f"reading a snapshot from {self.path} failed: {exc}") from None
        if not rows:
            return None
        try:
            snapshot = _DECODER.decode(rows[0][0])
        except msgspec.DecodeError as exc:
            raise LedgerError(f"snapshot in {self.path} is unreadable: {exc}") from None
        return snapshot, int(rows[0][1])

    def close(self) -> None:
        """Release the file. Idempotent."""
        self._executor.shutdown(wait=True)
        self._conn.close()


def _connect_query_only(fspath: str) -> sqlite3.Connection:
    """A query-only connection to an existing snapshot file (DESIGN §9 read-only
    media): ``mode=ro``, or ``immutable=1`` where the ``-shm`` file cannot be
    made (a read-only directory or medium), as the SQLite ledger's readers."""
    if not os.path.exists(fspath):
        raise LedgerError(f"--snapshots {fspath}: no such file")
    failure: sqlite3.Error | None = None
    for params in READ_ONLY_PARAMS:
        conn: sqlite3.Connection | None = None
        try:
            conn = connect(fspath, params, 10_000)
            conn.execute("PRAGMA query_only = ON")
            conn.execute("SELECT count(*) FROM sqlite_master").fetchall()
        except sqlite3.OperationalError as exc:
            if conn is not None:
                conn.close()
            failure = exc
            if "locked" in str(exc) or "busy" in str(exc):
                break  # a writer holds it: immutable=1 would read it torn
            continue
        except sqlite3.DatabaseError as exc:
            if conn is not None:
                conn.close()
            raise LedgerError(f"--snapshots {fspath}: not a snapshot file: {exc}") from None
        return conn
    raise LedgerError(f"--snapshots {fspath}: cannot open it read-only: {failure}")
