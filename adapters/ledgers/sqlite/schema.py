"""The SQLite ledger file's schema: creating it, checking it, upgrading it (DESIGN §3, §9).

Layout of the file (readable with the ``sqlite3`` shell for ad-hoc audit)::

    meta      (key TEXT PRIMARY KEY, value TEXT)      format, schema_version, ledger_id
    records   (offset INTEGER PRIMARY KEY, ts INTEGER NOT NULL, payload BLOB NOT NULL)
    snapshots (offset INTEGER PRIMARY KEY, blob BLOB NOT NULL, digest TEXT, state_hash TEXT,
               checksum TEXT, parts TEXT)
    snapshot_parts (token TEXT, part INTEGER, offset INTEGER, data BLOB,
                    PRIMARY KEY (token, part))

``payload`` holds the event JSON. It is stored as TEXT when it is valid UTF-8
without NUL bytes (so ``sqlite3 ledger.db "select * from records"`` prints the
JSON) and as a BLOB otherwise; either way it reads back as the exact bytes that
were appended.

Record 0 is ``LedgerOpened{ledger_id}``, written in the same transaction that
creates the schema, so a file is either not a ledger yet or a complete one.

Upgrades, without a new ``schema_version``: ``snapshots.digest``/``state_hash``/
``checksum`` (DESIGN §9: a snapshot stores offset, digest and state hash) were
added after schema version 1 shipped without them; they are nullable, added to
an older file when it first saves a snapshot, and a snapshot without them loads
with ``None`` (unverifiable: readers do not use it). The ``parts`` column and
the ``snapshot_parts`` table are added by the first snapshot stored in parts
(DECISIONS 241; :mod:`.snapshots`).
"""

from __future__ import annotations

import sqlite3
import uuid
from typing import Any

from quotaledger.events.codec import EventError, decode_event, encode_event
from quotaledger.events.ledger import LedgerError
from quotaledger.events.model import LedgerOpened

from .connection import as_bytes, db_payload, retry_busy, write_transaction

__all__ = [
    "FORMAT",
    "INSERT_RECORD",
    "PARTS_COLUMN",
    "PARTS_TABLE",
    "SCHEMA_VERSION",
    "SNAPSHOT_META",
    "check_file",
    "init_file",
    "snapshot_columns",
    "table_names",
    "upgrade_snapshots",
]

#: ``meta.format`` of a quotaledger ledger file.
FORMAT = "quotaledger-ledger"
#: ``meta.schema_version`` this module writes; files with a newer one are refused.
SCHEMA_VERSION = 1

_SCHEMA = (
    "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE records (offset INTEGER PRIMARY KEY, ts INTEGER NOT NULL, payload BLOB NOT NULL)",
    "CREATE TABLE snapshots (offset INTEGER PRIMARY KEY, blob BLOB NOT NULL,"
    " digest TEXT, state_hash TEXT, checksum TEXT)",
)
_TABLES = frozenset({"meta", "records", "snapshots"})
#: Columns of ``snapshots`` added after schema version 1 (nullable).
SNAPSHOT_META = ("digest", "state_hash", "checksum")
#: The column naming a snapshot's parts (NULL: the blob is inline), added with
#: the ``snapshot_parts`` table by the first snapshot stored in parts.
PARTS_COLUMN = "parts"
PARTS_TABLE = (
    "CREATE TABLE IF NOT EXISTS snapshot_parts (token TEXT NOT NULL, part INTEGER NOT NULL,"
    " offset INTEGER NOT NULL, data BLOB NOT NULL, PRIMARY KEY (token, part))"
)
INSERT_RECORD = "INSERT INTO records (offset, ts, payload) VALUES (?, ?, ?)"


def init_file(
    conn: sqlite3.Connection,
    path: str,
    create: bool,
    ledger_id: str | None,
    now: int,
    timeout_ms: int,
) -> str:
    """Writer thread: set WAL, create schema + record 0 if empty, return the ledger id."""
    mode = retry_busy(timeout_ms, _journal_mode_wal, conn)
    if mode.lower() != "wal":
        raise LedgerError(f"ledger {path}: SQLite refused WAL mode (journal_mode={mode})")
    conn.execute("PRAGMA synchronous = NORMAL")
    tables = write_transaction(conn, timeout_ms, _create_schema, path, create, ledger_id, now)
    return retry_busy(timeout_ms, check_file, conn, path, tables)


def _journal_mode_wal(conn: sqlite3.Connection) -> str:
    return as_bytes(conn.execute("PRAGMA journal_mode = WAL").fetchall()[0][0]).decode()


def table_names(conn: sqlite3.Connection) -> set[str]:
    """The names of the file's tables."""
    return {
        as_bytes(row[0]).decode()
        for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
    }


def _create_schema(
    conn: sqlite3.Connection, path: str, create: bool, ledger_id: str | None, now: int
) -> set[str]:
    """Inside the transaction: the schema and record 0 of an empty file; the table names."""
    tables = table_names(conn)
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
    conn.execute(INSERT_RECORD, (0, now, db_payload(opened)))
    return set(_TABLES)


def check_file(conn: sqlite3.Connection, path: str, tables: set[str]) -> str:
    """Refuse anything but a quotaledger ledger; return its ledger id."""
    not_ledger = f"{path} is not a quotaledger ledger"
    if not tables >= _TABLES:
        raise LedgerError(f"{not_ledger} (a SQLite database with tables {sorted(tables)})")
    meta = {
        as_bytes(k).decode(): as_bytes(v).decode()
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
        event: Any = decode_event(as_bytes(first[0][0]))
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


def snapshot_columns(conn: sqlite3.Connection) -> set[str]:
    """The columns of the ``snapshots`` table (older files lack some)."""
    return {as_bytes(row[1]).decode() for row in conn.execute("PRAGMA table_info(snapshots)")}


def upgrade_snapshots(conn: sqlite3.Connection, columns: set[str], parts: bool) -> None:
    """Inside a write transaction: add the nullable ``snapshots`` columns a file
    from before them lacks (and ``parts`` when a snapshot is stored in parts)."""
    missing = [c for c in SNAPSHOT_META if c not in columns]
    if parts and PARTS_COLUMN not in columns:
        missing.append(PARTS_COLUMN)
    for column in missing:
        conn.execute(f"ALTER TABLE snapshots ADD COLUMN {column} TEXT")
