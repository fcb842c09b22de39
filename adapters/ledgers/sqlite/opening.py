"""From a path to the checked connections of a SQLite ledger file (DESIGN §3, §9).

Before anything is connected, the path is checked in words (missing, a
directory, an empty file, a directory that cannot be written), so a user reads
what is wrong instead of SQLite's "unable to open database file".

* :func:`open_read_write`: the writer connection, on the ledger's own writer
  thread (it sets WAL and creates the schema and record 0 of a new file), and a
  query-only reader;
* :func:`open_read_only`: one query-only connection, read-write where the file
  and its directory are writable (its last close removes the ``-wal``/``-shm``
  files), else ``mode=ro``, then ``immutable=1`` (:func:`.connection.connect_read_only`),
  so nothing is ever written, not even the WAL setting.

Either refuses a file whose ledger id is not the expected one with
:class:`~quotaledger.events.ledger.LedgerMismatch` (DESIGN §3).
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from quotaledger.events.ledger import LedgerError, LedgerMismatch

from .connection import (
    READ_ONLY_PARAMS,
    cannot_create,
    check_creatable,
    connect,
    connect_read_only,
    is_read_only_error,
    retry_busy,
)
from .schema import check_file, init_file, table_names

__all__ = ["Opened", "check_path", "open_read_only", "open_read_write"]


@dataclass(slots=True)
class Opened:
    """What an open ledger file holds: its id, the writer connection (None when
    read-only), the query-only reader, the writer thread and the URI query other
    readers of the file use."""

    ledger_id: str
    writer: sqlite3.Connection | None
    reader: sqlite3.Connection
    executor: ThreadPoolExecutor
    read_params: str = "mode=rw"


def check_path(fspath: str, *, create: bool, read_only: bool) -> None:
    """Refuse, in words, a path that cannot be opened as asked."""
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
        check_creatable(fspath)


def _refuse_other(fspath: str, found: str, wanted: Sequence[str | None]) -> None:
    for expected in wanted:
        if expected is not None and expected != found:
            raise LedgerMismatch(
                f"ledger {fspath} has ledger_id {found!r}, expected {expected!r}: "
                "refusing to mix two histories"
            )


async def open_read_write(
    fspath: str,
    *,
    create: bool,
    ledger_id: str | None,
    wanted: Sequence[str | None],
    now: int,
    busy_timeout_ms: int,
) -> Opened:
    """The writer (on a new writer thread) and the reader of the file at
    ``fspath``; a new or empty file gets the schema and record 0 at ``now``."""
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-ledger")
    loop = asyncio.get_running_loop()
    writer: sqlite3.Connection | None = None
    reader: sqlite3.Connection | None = None
    try:
        # The writer waits for the lock in write_transaction, not in SQLite.
        writer = await loop.run_in_executor(executor, connect, fspath, "rwc" if create else "rw", 0)
        found = await loop.run_in_executor(
            executor, init_file, writer, fspath, create, ledger_id, now, busy_timeout_ms
        )
        reader = connect(fspath, "rw", busy_timeout_ms)
        reader.execute("PRAGMA query_only = ON")
        _refuse_other(fspath, found, wanted)
    except sqlite3.OperationalError as exc:  # cannot open, locked, read-only, ...
        await _discard(loop, executor, writer, reader)
        if is_read_only_error(exc) and not os.path.exists(fspath):
            raise LedgerError(cannot_create(fspath, str(exc))) from None
        if is_read_only_error(exc) and os.path.exists(fspath):
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
    return Opened(found, writer, reader, executor)


def open_read_only(fspath: str, *, expect_ledger_id: str | None, busy_timeout_ms: int) -> Opened:
    """One query-only connection to the file at ``fspath`` (see the module docstring)."""
    reader: sqlite3.Connection | None = None
    writable = os.access(fspath, os.W_OK) and os.access(os.path.dirname(fspath), os.W_OK)
    tries = ("mode=rw", *READ_ONLY_PARAMS) if writable else READ_ONLY_PARAMS
    try:
        reader, params = connect_read_only(fspath, busy_timeout_ms, tries)
        tables = table_names(reader)
        if not tables:
            raise LedgerError(f"{fspath} is an empty file, not a ledger")
        found = retry_busy(busy_timeout_ms, check_file, reader, fspath, tables)
        _refuse_other(fspath, found, [expect_ledger_id])
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
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-ledger")
    return Opened(found, None, reader, executor, params)


async def _discard(
    loop: asyncio.AbstractEventLoop,
    executor: ThreadPoolExecutor,
    writer: sqlite3.Connection | None,
    reader: sqlite3.Connection | None,
) -> None:
    """Release what a failed :func:`open_read_write` had acquired."""
    if reader is not None:
        reader.close()
    if writer is not None:
        await loop.run_in_executor(executor, writer.close)
    executor.shutdown(wait=False)
