"""Snapshots of a ledger kept in a local SQLite file, keyed by ledger_id (DESIGN §10).

A Kafka topic cannot hold the engine's snapshots next to the records, so a Kafka
ledger keeps them in a file given with ``--snapshots PATH``. One file may hold
the snapshots of several ledgers: rows are keyed by ``(ledger_id, offset)``, and
a ledger only ever sees its own, so a snapshot can never be applied to another
history (§3).

The file reuses the SQLite ledger's connection and write-lock helpers (WAL,
jittered busy retry): several engines may share it. Each row keeps the whole
:class:`~quotaledger.events.ledger.Snapshot` struct as MessagePack, so fields
added to it later (digest, state hash) are stored without a schema change, plus
``ts``, the ledger time of the snapshot's last record, which a Kafka reader needs
to keep clamping ts from there (§3).

Opened ``read_only`` (the read-only commands, DESIGN §9), the file is read
through a query-only connection that never writes to it (not even its schema or
WAL setting), as the SQLite ledger reads a file on a read-only medium; ``save``
is refused.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
from concurrent.futures import ThreadPoolExecutor

import msgspec

from quotaledger.events.ledger import LedgerError, Snapshot

from .sqlite_ledger import READ_ONLY_PARAMS, _connect, _write_transaction

__all__ = ["SnapshotStore"]

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
            conn = _connect(fspath, "rwc", 10_000)
            conn.execute("PRAGMA journal_mode = WAL")
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute(_SCHEMA)
        except sqlite3.DatabaseError as exc:
            raise LedgerError(f"--snapshots {fspath}: not a snapshot file: {exc}") from None
        return cls(fspath, ledger_id, conn)

    async def save(self, snapshot: Snapshot, ts: int) -> None:
        """Store ``snapshot`` (its last record at ledger time ``ts``)."""
        if self.read_only:
            raise LedgerError(f"--snapshots {self.path} is open read-only: cannot save a snapshot")
        row = (self.ledger_id, snapshot.offset, ts, _ENCODER.encode(snapshot))
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._executor, self._save, row)
        except sqlite3.Error as exc:
            raise LedgerError(f"saving a snapshot to {self.path} failed: {exc}") from None

    def _save(self, row: tuple[str, int, int, bytes]) -> None:
        def insert(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT OR REPLACE INTO ledger_snapshots (ledger_id, offset, ts, snapshot)"
                " VALUES (?, ?, ?, ?)",
                row,
            )

        _write_transaction(self._conn, 10_000, insert)

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
            conn = _connect(fspath, params, 10_000)
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
