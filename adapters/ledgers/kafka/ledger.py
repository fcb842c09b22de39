"""The Kafka ledger: one topic, one partition, read and written with aiokafka (DESIGN §3, §10).

The topic and the producer's settings are in :mod:`.topic`, reading (the
partition offset is the ledger offset, ts, holes, the tail) in :mod:`.reader`
and :mod:`.fetch`; this module is the :class:`KafkaLedger`: opening, appending,
snapshots, closing.

**Appends** go with ``acks=all``, one Kafka record batch per call when it fits
(``max_batch_size``), and are retried on broker errors until
``append_timeout_s``. ``end_offsets``, ``offsets_for_times``, idempotent
producers and transactions are never used (tansu reports end offsets wrongly
and has neither of the others), so a retried append may land twice: the
projection ignores a duplicate decision (decisions are idempotent by id).

Snapshots live in a local SQLite file (``snapshots=PATH``), keyed by ledger_id
(:class:`quotaledger.adapters.ledgers.sqlite.snapshots.SnapshotStore`); without
one, ``save_snapshot`` is a no-op and ``load_snapshot`` finds nothing.

A handle opened ``read_only`` (the read-only commands, DESIGN §9) writes
nothing anywhere: it creates no topic, has no producer, refuses ``append`` and
``save_snapshot`` with a :class:`LedgerError` saying it is read-only, and reads
the snapshot file through a query-only connection (none when the file does not
exist). Whether the credentials may write is the broker's ACLs' business (§10;
DECISIONS 205).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from types import TracebackType
from typing import Any

from aiokafka import AIOKafkaProducer  # type: ignore[import-untyped]
from aiokafka.errors import KafkaError  # type: ignore[import-untyped]

from quotaledger.events.codec import encode_event
from quotaledger.events.ledger import Append, LedgerError, LedgerMismatch, Record, Snapshot
from quotaledger.events.model import LedgerOpened
from quotaledger.events.times import wall_clock_ms

from ..sqlite.snapshots import SnapshotStore
from .reader import GAP_PATIENCE_S, PartitionReads
from .stopping import stop_client
from .topic import PRODUCER_BATCH_BYTES, ensure_topic, producer_settings
from .walk import ms_datetime, opened_id

__all__ = ["KafkaLedger"]

log = logging.getLogger("quotaledger.kafka")


#: How long closing waits for appends still unacknowledged (then gives them up).
CLOSE_FLUSH_S = 1.0


def _outcome_read(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


class KafkaLedger:
    """A :class:`quotaledger.events.Ledger` in one Kafka partition (DESIGN §10).

    Create with ``await KafkaLedger.open(bootstrap, topic)``.
    """

    def __init__(
        self,
        reads: PartitionReads,
        producer: Any,
        *,
        clock_ms: Callable[[], int],
        append_timeout_s: float,
        read_only: bool = False,
    ) -> None:
        """Internal: use :meth:`open` (``producer`` is None when ``read_only``)."""
        #: The reads of this handle: their settings and what they learned (:mod:`.reader`).
        self.reads = reads
        self._read_only = read_only
        self._producer = producer
        self._clock_ms = clock_ms
        self._snapshots: SnapshotStore | None = None
        self.append_timeout_s = append_timeout_s
        self._closed = False
        #: Appends that were sent again after a broker error (each may have duplicated).
        self.append_retries = 0

    # ------------------------------------------------------------------ open

    @classmethod
    async def open(
        cls,
        bootstrap: Sequence[str] | str,
        topic: str,
        *,
        create: bool = True,
        client_options: Mapping[str, Any] | None = None,
        expect_ledger_id: str | None = None,
        ledger_id: str | None = None,
        opened_at_ms: int | None = None,
        clock_ms: Callable[[], int] = wall_clock_ms,
        snapshots: str | None = None,
        poll_ms: int = 100,
        append_timeout_s: float = 120.0,
        gaps: str = "stop",
        gap_patience_s: float = GAP_PATIENCE_S,
        read_only: bool = False,
    ) -> KafkaLedger:
        """Open the ledger in ``topic``; with ``create``, make the topic (one
        partition, kept forever) and write its ``LedgerOpened`` when missing.
        ``read_only`` never creates or writes anything (module docstring): it
        opens an existing ledger as with ``create=False``.

        ``LedgerOpened`` carries ``at`` = ``opened_at_ms`` (default: the wall
        clock), so later facts with an older ``at`` are clamped up to it (§10).
        Raises :class:`LedgerError` when the topic is missing or empty without
        ``create``, has more than one partition, or does not start with
        ``LedgerOpened``; :class:`LedgerMismatch` when its id is not
        ``expect_ledger_id``. At a skip in the offsets a reader fetches again
        for up to ``gap_patience_s`` unless the broker proves the offsets gone;
        then it stops with a ``LedgerGap``, or with ``gaps="fill"`` reads them
        as filler records (:class:`~.reader.GapJudge`, DECISIONS 200).
        """
        if gaps not in ("stop", "fill"):
            raise LedgerError(f"gaps must be 'stop' or 'fill', not {gaps!r}")
        if not gap_patience_s >= 0:
            raise LedgerError(f"gap_patience_s must be >= 0, not {gap_patience_s!r}")
        servers = [bootstrap] if isinstance(bootstrap, str) else list(bootstrap)
        options = dict(client_options or {})
        reads = PartitionReads(
            servers,
            topic,
            options,
            poll_ms=poll_ms,
            fill_gaps=gaps == "fill",
            gap_patience_s=gap_patience_s,
        )
        where = reads.where
        if read_only:
            create = False
        await ensure_topic(servers, topic, options, create, where)
        producer: Any = None
        if not read_only:
            producer = AIOKafkaProducer(
                bootstrap_servers=servers,
                **producer_settings(),
                request_timeout_ms=10_000,
                retry_backoff_ms=100,
                **options,
            )
            try:
                await producer.start()
            except KafkaError as exc:
                await stop_client(producer.stop())
                raise LedgerError(f"{where}: cannot connect: {exc}") from None
        ledger = cls(
            reads,
            producer,
            clock_ms=clock_ms,
            append_timeout_s=append_timeout_s,
            read_only=read_only,
        )
        try:
            first = await reads.first_record(retry_connect=False)
            if first is None:
                if not create:
                    raise LedgerError(f"{where}: the topic is empty, not a ledger (run init)")
                at = clock_ms() if opened_at_ms is None else opened_at_ms
                new_id = ledger_id if ledger_id is not None else uuid.uuid4().hex
                opened = LedgerOpened(ledger_id=new_id, at=ms_datetime(at))
                await ledger.append([Append(payload=encode_event(opened), ts=at)])
                first = await reads.first_record(retry_connect=False)
                if first is None:
                    raise LedgerError(f"{where}: LedgerOpened was acknowledged but cannot be read")
            found = opened_id(first, where)
            for wanted in (expect_ledger_id, ledger_id):
                if wanted is not None and wanted != found:
                    raise LedgerMismatch(
                        f"{where} has ledger_id {found!r}, expected {wanted!r}: "
                        "refusing to mix two histories"
                    )
            reads.ledger_id = found
            reads.remember(0, first.ts)
            if snapshots is not None and not (read_only and not os.path.exists(snapshots)):
                ledger._snapshots = SnapshotStore.open(snapshots, found, read_only=read_only)
        except BaseException:
            await ledger.close()
            raise
        return ledger

    async def __aenter__(self) -> KafkaLedger:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    @property
    def ledger_id(self) -> str:
        """The id in record 0's ``LedgerOpened``."""
        return self.reads.ledger_id

    @property
    def where(self) -> str:
        return self.reads.where

    @property
    def bootstrap(self) -> list[str]:
        """The brokers this handle was opened with."""
        return list(self.reads.bootstrap)

    @property
    def topic(self) -> str:
        return self.reads.topic

    @property
    def client_options(self) -> dict[str, Any]:
        """The TLS/SASL arguments every client of this ledger uses."""
        return dict(self.reads.client_options)

    @property
    def read_only(self) -> bool:
        """True when opened with ``read_only`` (nothing can be written)."""
        return self._read_only

    # ---------------------------------------------------------------- append

    async def append(self, batch: Sequence[Append]) -> list[int]:
        """Append ``batch`` (``acks=all``); return the offsets the broker assigned.

        A batch that fits one Kafka record batch is written atomically; a larger
        one is split, and another writer's records may land between the parts.
        ``ts`` None is the ledger clock; the record timestamp carries it.
        """
        self._check_open()
        self._check_writable("append to")
        items = batch if isinstance(batch, list) else list(batch)
        if not items:
            return []
        now = self._clock_ms()
        # Every record seen before sending existed before this append was
        # numbered: the broker must place it after them, unless its log was reset.
        floor = self.reads.max_offset
        offsets: list[int] = []
        start = 0
        while start < len(items):
            first, count = await self._send_part(items, start, now)
            offsets.extend(range(first, first + count))
            start += count
        if offsets[0] <= floor:
            raise LedgerMismatch(
                f"{self.where}: the broker assigned offset {offsets[0]} although offset "
                f"{floor} existed before: its log was reset; refusing to mix two histories"
            )
        self.reads.max_offset = max(self.reads.max_offset, offsets[-1])
        return offsets

    def _fill(self, items: Sequence[Append], start: int, now: int) -> tuple[Any, int]:
        """A record batch of ``items[start:]``, as many as fit; and how many."""
        batch = self._producer.create_batch()
        put = batch.append
        count = 0
        for item in items[start:] if start else items:
            if not isinstance(item, Append) or not isinstance(item.payload, bytes):
                raise TypeError("append() takes Append items with bytes payloads")
            ts = item.ts
            if ts is None:
                ts = now
            elif ts < 0:
                ts = 0
            if put(key=None, value=item.payload, timestamp=ts) is None:
                break
            count += 1
        if count == 0:
            raise LedgerError(
                f"{self.where}: a record of {len(items[start].payload)} bytes does not fit"
                f" a Kafka batch of {PRODUCER_BATCH_BYTES} bytes"
            )
        return batch, count

    async def _send_part(self, items: Sequence[Append], start: int, now: int) -> tuple[int, int]:
        """Send one record batch from ``items[start:]``: (first offset, count)."""
        deadline = time.monotonic() + self.append_timeout_s
        while True:
            batch, count = self._fill(items, start, now)
            try:
                future = await self._producer.send_batch(batch, self.topic, partition=0)
                # its outcome is read even when this append is given up (cancelled)
                future.add_done_callback(_outcome_read)
                metadata = await future
                return int(metadata.offset), count
            except KafkaError as exc:
                if time.monotonic() >= deadline:
                    raise LedgerError(
                        f"{self.where}: append failed for {self.append_timeout_s:.0f} s: {exc}"
                    ) from None
                self.append_retries += 1
                log.warning("%s: append failed (%s); retrying", self.where, exc)
                await asyncio.sleep(0.2)

    # ------------------------------------------------------------------ read

    def read(self, from_offset: int = 0, *, follow: bool = False) -> AsyncIterator[list[Record]]:
        """Yield records from ``from_offset`` in offset order, in batches.

        Without ``follow`` it ends at the tail (a fetch that returns nothing, or
        the high watermark of its first answer reached);
        with ``follow`` it waits for new records until the ledger is closed or
        the consuming task is cancelled. Raises ``LedgerGap`` /
        :class:`LedgerMismatch` as :mod:`.reader` says.
        """
        if from_offset < 0:
            raise ValueError(f"from_offset must be >= 0, not {from_offset}")
        self._check_open()
        return self.reads.read(from_offset, follow=follow, check_opened=True)

    async def last_offset(self) -> int:
        """Offset of the newest record (-1 for none), found by reading to the tail."""
        self._check_open()
        return await self.reads.last_offset()

    async def ts_at(self, offset: int) -> int:
        """The ledger ts of the record at ``offset``."""
        return await self.reads.ts_at(offset)

    # ------------------------------------------------------------- snapshots

    async def save_snapshot(self, snapshot: Snapshot) -> None:
        """Store ``snapshot`` in the ``--snapshots`` file (a no-op without one)."""
        self._check_open()
        self._check_writable("save a snapshot to")
        if self._snapshots is None:
            return
        await self._snapshots.save(snapshot, await self.ts_at(snapshot.offset))

    async def load_snapshot(self, at_most: int | None = None) -> Snapshot | None:
        """The newest snapshot of this ledger at or before ``at_most`` (None without a file)."""
        self._check_open()
        if self._snapshots is None:
            return None
        found = self._snapshots.load(at_most)
        if found is None:
            return None
        snapshot, ts = found
        self.reads.remember(snapshot.offset, ts)
        return snapshot

    @property
    def has_snapshot_store(self) -> bool:
        return self._snapshots is not None

    # ----------------------------------------------------------------- close

    async def close(self) -> None:
        """Stop the clients; follow readers end. Idempotent."""
        if self._closed:
            return
        self._closed = True
        await self.reads.close()
        # appends still unacknowledged get a moment to be delivered, no more: a stop is
        # bounded (DESIGN §9), and such an append's fate is unknown either way, as after a
        # crash (a reader finds it, or not: DECISIONS 201)
        if self._producer is not None and not await stop_client(
            self._producer.stop(), within_s=CLOSE_FLUSH_S
        ):
            log.warning(
                "%s: appends not acknowledged within %.1f s of closing were given up",
                self.where,
                CLOSE_FLUSH_S,
            )
        if self._snapshots is not None:
            self._snapshots.close()

    def _check_open(self) -> None:
        if self._closed:
            raise LedgerError(f"ledger {self.where} is closed")

    def _check_writable(self, what: str) -> None:
        if self._read_only:
            raise LedgerError(f"ledger {self.where} is open read-only: cannot {what} it")

    def __repr__(self) -> str:
        return f"<KafkaLedger {self.where} ledger_id={self.ledger_id}>"
