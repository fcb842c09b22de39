"""Reading a Kafka ledger in a second process, for replays (DESIGN §10 throughput).

A replay folds every record; reading them from Kafka (aiokafka's unpacking, the
ts rules of :mod:`quotaledger.adapters.kafka_ledger`) costs a third of the fold
again, in Python, so a thread would only share the GIL. :func:`read_in_process`
runs the ledger's own reader in a child process and ships the records to the
folding process as MessagePack batches through a pipe (back-pressure: the child
waits when the pipe is full). The records are the same, byte for byte: the child
uses the same reader, from the same resume point and ts.
"""

from __future__ import annotations

import asyncio
import multiprocessing
from collections.abc import AsyncIterator
from multiprocessing.connection import Connection
from typing import Any

import msgspec

from quotaledger.events.ledger import LedgerError, LedgerMismatch, Record

from .kafka_ledger import KafkaLedger, LedgerGap

__all__ = ["read_in_process"]

_BATCH = msgspec.msgpack.Encoder()
_RECORDS = msgspec.msgpack.Decoder(list[Record])
_ERRORS: dict[str, type[LedgerError]] = {
    "LedgerGap": LedgerGap,
    "LedgerMismatch": LedgerMismatch,
    "LedgerError": LedgerError,
}


class _Job(msgspec.Struct, frozen=True):
    bootstrap: list[str]
    topic: str
    options: dict[str, Any]
    ledger_id: str
    fill_gaps: bool
    from_offset: int
    known_offset: int
    known_ts: int


def _child(conn: Connection, job: bytes) -> None:
    """Child process: read the ledger from the job's offset and send every batch."""
    spec = msgspec.msgpack.decode(job, type=_Job)
    try:
        asyncio.run(_read(conn, spec))
    except LedgerError as exc:
        name = type(exc).__name__ if type(exc).__name__ in _ERRORS else "LedgerError"
        conn.send_bytes(b"E" + msgspec.msgpack.encode([name, str(exc)]))
    finally:
        conn.close()


async def _read(conn: Connection, job: _Job) -> None:
    ledger = await KafkaLedger.open(
        job.bootstrap,
        job.topic,
        create=False,
        client_options=job.options,
        expect_ledger_id=job.ledger_id,
        gaps="fill" if job.fill_gaps else "stop",
    )
    try:
        if job.known_offset >= 0:
            ledger.remember_ts(job.known_offset, job.known_ts)
        async for batch in ledger.read(job.from_offset):
            conn.send_bytes(b"R" + _BATCH.encode(batch))
        conn.send_bytes(b".")
    finally:
        await ledger.close()


async def read_in_process(ledger: KafkaLedger, from_offset: int = 0) -> AsyncIterator[list[Record]]:
    """The records of ``ledger`` from ``from_offset`` to the tail, read by a child process."""
    known = ledger.resume_point(from_offset)
    job = _Job(
        bootstrap=list(ledger.bootstrap),
        topic=ledger.topic,
        options=ledger.client_options,  # no ssl_context: KafkaLedger.read_for_replay
        ledger_id=ledger.ledger_id,
        fill_gaps=ledger.fill_gaps,
        from_offset=from_offset,
        known_offset=known[0] - 1 if known[0] > 0 else -1,
        known_ts=known[1],
    )
    context = multiprocessing.get_context("spawn")
    receiver, sender = context.Pipe(duplex=False)
    process = context.Process(
        target=_child, args=(sender, msgspec.msgpack.encode(job)), daemon=True
    )
    process.start()
    sender.close()
    loop = asyncio.get_running_loop()
    try:
        while True:
            try:
                data = await loop.run_in_executor(None, receiver.recv_bytes)
            except EOFError:
                raise LedgerError(
                    f"{ledger.where}: the reader process ended unexpectedly"
                    f" (exit code {process.exitcode})"
                ) from None
            tag = data[:1]
            if tag == b"R":
                yield _RECORDS.decode(memoryview(data)[1:])
            elif tag == b".":
                return
            else:
                name, message = msgspec.msgpack.decode(memoryview(data)[1:])
                raise _ERRORS.get(name, LedgerError)(message)
    finally:
        receiver.close()
        if process.is_alive():
            process.terminate()
        await loop.run_in_executor(None, process.join)
