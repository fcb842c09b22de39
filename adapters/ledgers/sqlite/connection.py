"""Connections to a SQLite ledger file: opening, read-only opening, busy retry, transactions.

Every connection is in autocommit mode (transactions are explicit) and reads
text as bytes (``text_factory = bytes``), so a column comes back as ``int``,
``float``, ``bytes`` or ``None`` only, whatever a damaged page holds.

Read-only opening (DESIGN §9 read-only media): ``mode=ro``, and ``immutable=1``
when SQLite cannot create the ``-shm`` file next to the file (a read-only
directory or medium). ``sqlite3 'file:ledger.db?mode=ro&immutable=1'`` reads
such a file by hand.

Waiting for the one write lock: :func:`retry_busy` retries with short jittered
sleeps (0.1-2 ms) rather than relying on SQLite's own busy handler, whose sleeps
grow to 100 ms and let a busy process starve another one. The ledger's writer,
its snapshot writer and the Kafka ledger's snapshot file
(:mod:`.snapshots`) all write through :func:`write_transaction`.
"""

from __future__ import annotations

import os
import random
import sqlite3
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar
from urllib.parse import quote

from quotaledger.events.ledger import LedgerError

__all__ = [
    "READ_ONLY_PARAMS",
    "as_bytes",
    "cannot_create",
    "check_creatable",
    "connect",
    "connect_read_only",
    "db_payload",
    "is_busy",
    "is_read_only_error",
    "retry_busy",
    "text_or_none",
    "transaction",
    "write_transaction",
]

_T = TypeVar("_T")

#: URI queries for reading, in the order tried (DESIGN §9 read-only media).
READ_ONLY_PARAMS = ("mode=ro", "mode=ro&immutable=1")


def connect(path: str, params: str, busy_timeout_ms: int) -> sqlite3.Connection:
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


def connect_read_only(
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
            conn = connect(path, params, busy_timeout_ms)
            conn.execute("PRAGMA query_only = ON")
            conn.execute("SELECT count(*) FROM sqlite_master").fetchall()
        except sqlite3.OperationalError as exc:
            if conn is not None:
                conn.close()
            if is_busy(exc):
                raise
            failure = exc
            continue
        return conn, params
    assert failure is not None
    raise failure


def cannot_create(fspath: str, why: str) -> str:
    """The error text of a ledger that cannot be created at ``fspath``."""
    return (
        f"cannot create ledger {fspath}: {why}; choose a writable directory (replay, tree,"
        " audit and whatif read an existing ledger on a read-only medium)"
    )


def check_creatable(fspath: str) -> None:
    """A new ledger's directory must exist and be writable: say so in words
    instead of SQLite's "unable to open database file" (DESIGN §9 clear errors)."""
    directory = os.path.dirname(fspath)
    if not os.path.isdir(directory):
        raise LedgerError(cannot_create(fspath, f"no such directory {directory}"))
    if not os.access(directory, os.W_OK | os.X_OK):
        raise LedgerError(
            cannot_create(
                fspath,
                f"the directory {directory} is not writable (a read-only medium or"
                " another user's directory?)",
            )
        )


def is_read_only_error(exc: sqlite3.Error) -> bool:
    """Did SQLite refuse because the file, its directory or the medium is read-only?"""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None and (code & 0xFF) in (sqlite3.SQLITE_READONLY, sqlite3.SQLITE_CANTOPEN):
        return True
    text = str(exc)
    return "readonly" in text or "read-only" in text or "unable to open" in text


def is_busy(exc: sqlite3.Error) -> bool:
    """Is ``exc`` SQLite's "database is locked/busy" (another connection writes)?"""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return (code & 0xFF) in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
    return "locked" in str(exc) or "busy" in str(exc)


def retry_busy(timeout_ms: int, fn: Callable[..., _T], *args: Any) -> _T:
    """Run ``fn(*args)`` until SQLite stops answering "busy", for ``timeout_ms`` at most.

    ``fn`` must leave no transaction open when it raises (nothing of it is kept).
    """
    deadline = time.monotonic() + timeout_ms / 1000
    pause = 0.0002
    while True:
        try:
            return fn(*args)
        except sqlite3.OperationalError as exc:
            if not is_busy(exc) or time.monotonic() >= deadline:
                raise
        time.sleep(random.uniform(pause / 2, pause))
        pause = min(pause * 2, 0.002)


def transaction(conn: sqlite3.Connection, fn: Callable[..., _T], *args: Any) -> _T:
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


def write_transaction(
    conn: sqlite3.Connection, timeout_ms: int, fn: Callable[..., _T], *args: Any
) -> _T:
    """A write transaction that waits up to ``timeout_ms`` for the write lock."""

    def attempt() -> _T:
        return transaction(conn, fn, *args)

    return retry_busy(timeout_ms, attempt)


def db_payload(payload: bytes) -> str | bytes:
    """TEXT when the payload is valid UTF-8 without NUL, else the BLOB as is."""
    if b"\x00" in payload:
        return payload
    try:
        return payload.decode("utf-8")
    except UnicodeDecodeError:
        return payload


def as_bytes(value: object) -> bytes:
    """A TEXT or BLOB column's value as bytes; anything else is damage."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    raise LedgerError(f"unexpected value in the ledger: {value!r}")


def text_or_none(value: object) -> str | None:
    """A nullable TEXT column's value (None when absent or not text)."""
    if value is None:
        return None
    try:
        return as_bytes(value).decode("utf-8")
    except (LedgerError, UnicodeDecodeError):
        return None
