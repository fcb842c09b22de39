"""The Kafka ledger: one topic, one partition, read and written with aiokafka (DESIGN §3, §10).

Rules this backend keeps, whatever the broker:

* **the partition offset is the ledger offset.** A reader checks that every
  message follows the previous one: a gap (retention, compaction, transaction
  markers) stops it with :class:`LedgerGap` naming the offset; an offset going
  back (a broker that lost its log and started again) stops it with
  :class:`LedgerMismatch`. Record 0 must be ``LedgerOpened`` with this ledger's
  id, or the reader stops too (a reset topic re-initialised by someone else is
  another history);
* **ts** of a message is its value's ``at`` when present (and within the bounds
  of §9), else the Kafka record timestamp; then clamped up to the previous
  record's ts. Every reader computes the same ts: it depends only on the values
  and timestamps of the records before it. A reader starting in the middle
  needs the ts of the record before its start: it knows it from records it read
  or from a loaded snapshot (whose ts is stored with it), and otherwise rescans
  the timestamps from the nearest point it knows (at worst offset 0);
* **reads are Fetch requests** sent through aiokafka's client, their record
  batches walked straight into records (:mod:`.kafka_fetch`, DECISIONS 140): a
  transaction marker (control batch) holds offsets but no record, so it is a gap;
* **the tail is found by reading**: a read without ``follow`` ends at the first
  fetch that returns nothing. ``end_offsets``, ``offsets_for_times``,
  idempotent producers and transactions are never used (tansu reports end
  offsets wrongly and has neither of the others);
* **appends** go with ``acks=all``, one Kafka record batch per call when it fits
  (``max_batch_size``), and are retried on broker errors until
  ``append_timeout_s``. A retried append may land twice: the projection ignores
  a duplicate decision (decisions are idempotent by id).

Snapshots live in a local SQLite file (``snapshots=PATH``), keyed by ledger_id
(:mod:`quotaledger.adapters.snapshot_store`); without one, ``save_snapshot`` is
a no-op and ``load_snapshot`` finds nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from types import TracebackType
from typing import Any

import msgspec
from aiokafka import AIOKafkaProducer  # type: ignore[import-untyped]
from aiokafka.admin import AIOKafkaAdminClient, NewTopic  # type: ignore[import-untyped]
from aiokafka.errors import KafkaError  # type: ignore[import-untyped]

from quotaledger.events.codec import EventError, decode_event, encode_event
from quotaledger.events.ledger import Append, LedgerError, LedgerMismatch, Record, Snapshot
from quotaledger.events.model import FactRejected, LedgerOpened

from .kafka_fetch import FETCH_BYTES, Fetched, Message, PartitionFetcher
from .snapshot_store import SnapshotStore

__all__ = ["FETCH_BYTES", "KafkaLedger", "LedgerGap", "wall_clock_ms"]

log = logging.getLogger("quotaledger.kafka")

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: §9: times lie in 1970-01-01 .. 9000-01-01; an `at` outside is not a ts.
_MAX_TS = (datetime(9000, 1, 1, tzinfo=UTC) - _EPOCH) // timedelta(milliseconds=1)
#: Topic settings of a new ledger (§10): kept forever, never compacted.
TOPIC_CONFIG = {"retention.ms": "-1", "cleanup.policy": "delete"}
#: Bigger batches than aiokafka's defaults: a ledger is read and written in bulk.
PRODUCER_BATCH_BYTES = 1_000_000


def producer_settings() -> dict[str, Any]:
    """The producer settings of a ledger's appends (DESIGN §3, §10: ``acks=all``; tansu has
    no idempotent producer): one record batch of up to ``PRODUCER_BATCH_BYTES`` per request,
    sent at once. ``bench kafka`` gives plain aiokafka the same settings."""
    return {
        "acks": "all",
        "enable_idempotence": False,
        "max_batch_size": PRODUCER_BATCH_BYTES,
        "max_request_size": PRODUCER_BATCH_BYTES + 65536,
        "linger_ms": 0,
    }


#: How long the broker may wait for a first record on a read without follow (ms).
TAIL_WAIT_MS = 50
#: Fetch size of a look at record 0 (open, the idle follower's check every 2 s): a
#: broker returns a first batch whole even when it is bigger.
HEAD_FETCH_BYTES = 64 * 1024
_KNOWN_TS_LIMIT = 4096


class LedgerGap(LedgerError):
    """The partition skips offsets: records were deleted, compacted or are markers."""


class _AtOnly(msgspec.Struct, gc=False):
    at: datetime | None = None


_AT_DECODER = msgspec.json.Decoder(_AtOnly)
_MS = timedelta(milliseconds=1)


def wall_clock_ms() -> int:
    """Milliseconds since the epoch by the wall clock."""
    return time.time_ns() // 1_000_000


def value_ts(value: bytes) -> int | None:
    """The ms of a message value's ``at``, or None when absent or unusable."""
    try:
        moment = _AT_DECODER.decode(value).at
    except msgspec.DecodeError:  # not JSON, or `at` not a time: the record timestamp
        return None
    if moment is None:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    ms = (moment - _EPOCH) // _MS
    return ms if 0 <= ms <= _MAX_TS else None


def ms_datetime(ms: int) -> datetime:
    """The UTC datetime of ``ms`` since the epoch (exact)."""
    return _EPOCH + timedelta(milliseconds=ms)


class KafkaLedger:
    """A :class:`quotaledger.events.Ledger` in one Kafka partition (DESIGN §10).

    Create with ``await KafkaLedger.open(bootstrap, topic)``.
    """

    def __init__(
        self,
        bootstrap: Sequence[str],
        topic: str,
        ledger_id: str,
        producer: Any,
        *,
        client_options: Mapping[str, Any],
        clock_ms: Callable[[], int],
        snapshots: SnapshotStore | None,
        poll_ms: int,
        append_timeout_s: float,
        fill_gaps: bool = False,
    ) -> None:
        """Internal: use :meth:`open`."""
        #: Read a skip inside the log as filler records instead of stopping (gaps=fill).
        self.fill_gaps = fill_gaps
        self.bootstrap = list(bootstrap)
        self.topic = topic
        self._ledger_id = ledger_id
        self._producer = producer
        self._options = dict(client_options)
        self._clock_ms = clock_ms
        self._snapshots = snapshots
        self._poll_ms = poll_ms
        self.append_timeout_s = append_timeout_s
        self._known_ts: dict[int, int] = {}
        self._max_offset = -1
        self._closed = False
        self._readers: set[PartitionFetcher] = set()
        #: Appends that were sent again after a broker error (each may have duplicated).
        self.append_retries = 0
        #: How often an idle follower checks that record 0 is still there (seconds).
        self.reset_check_s = 2.0
        #: How long a read without follow waits for a first answer from the broker.
        self.read_timeout_s = 30.0
        #: How long a read without follow waits for records the high watermark promises.
        self.tail_patience_s = 30.0
        #: Bytes asked for per fetch.
        self.fetch_bytes = FETCH_BYTES

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
    ) -> KafkaLedger:
        """Open the ledger in ``topic``; with ``create``, make the topic (one
        partition, kept forever) and write its ``LedgerOpened`` when missing.

        ``LedgerOpened`` carries ``at`` = ``opened_at_ms`` (default: the wall
        clock), so later facts with an older ``at`` are clamped up to it (§10).
        Raises :class:`LedgerError` when the topic is missing or empty without
        ``create``, has more than one partition, or does not start with
        ``LedgerOpened``; :class:`LedgerMismatch` when its id is not
        ``expect_ledger_id``. ``gaps="fill"`` reads a skip inside the log as
        filler records (see :func:`sequence`) instead of stopping.
        """
        if gaps not in ("stop", "fill"):
            raise LedgerError(f"gaps must be 'stop' or 'fill', not {gaps!r}")
        servers = [bootstrap] if isinstance(bootstrap, str) else list(bootstrap)
        options = dict(client_options or {})
        where = f"kafka://{','.join(servers)}/{topic}"
        await _ensure_topic(servers, topic, options, create, where)
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
            await producer.stop()
            raise LedgerError(f"{where}: cannot connect: {exc}") from None
        ledger = cls(
            servers,
            topic,
            "",
            producer,
            client_options=options,
            clock_ms=clock_ms,
            snapshots=None,
            poll_ms=poll_ms,
            append_timeout_s=append_timeout_s,
            fill_gaps=gaps == "fill",
        )
        try:
            first = await ledger._first_record(where)
            if first is None:
                if not create:
                    raise LedgerError(f"{where}: the topic is empty, not a ledger (run init)")
                at = clock_ms() if opened_at_ms is None else opened_at_ms
                new_id = ledger_id if ledger_id is not None else uuid.uuid4().hex
                opened = LedgerOpened(ledger_id=new_id, at=ms_datetime(at))
                await ledger.append([Append(payload=encode_event(opened), ts=at)])
                first = await ledger._first_record(where)
                if first is None:
                    raise LedgerError(f"{where}: LedgerOpened was acknowledged but cannot be read")
            found = _opened_id(first, where)
            for wanted in (expect_ledger_id, ledger_id):
                if wanted is not None and wanted != found:
                    raise LedgerMismatch(
                        f"{where} has ledger_id {found!r}, expected {wanted!r}: "
                        "refusing to mix two histories"
                    )
            ledger._ledger_id = found
            ledger._remember(0, first.ts)
            if snapshots is not None:
                ledger._snapshots = SnapshotStore.open(snapshots, found)
        except BaseException:
            await ledger.close()
            raise
        return ledger

    async def _first_record(self, where: str) -> Record | None:
        async for batch in self._read(
            0, follow=False, check_opened=False, fetch_bytes=HEAD_FETCH_BYTES
        ):
            return batch[0]
        return None

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
        return self._ledger_id

    @property
    def where(self) -> str:
        return f"kafka://{','.join(self.bootstrap)}/{self.topic}"

    @property
    def client_options(self) -> dict[str, Any]:
        """The TLS/SASL arguments every client of this ledger uses."""
        return dict(self._options)

    # ---------------------------------------------------------------- append

    async def append(self, batch: Sequence[Append]) -> list[int]:
        """Append ``batch`` (``acks=all``); return the offsets the broker assigned.

        A batch that fits one Kafka record batch is written atomically; a larger
        one is split, and another writer's records may land between the parts.
        ``ts`` None is the ledger clock; the record timestamp carries it.
        """
        self._check_open()
        items = batch if isinstance(batch, list) else list(batch)
        if not items:
            return []
        now = self._clock_ms()
        # Every record seen before sending existed before this append was
        # numbered: the broker must place it after them, unless its log was reset.
        floor = self._max_offset
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
        self._max_offset = max(self._max_offset, offsets[-1])
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

        Without ``follow`` it ends at the tail (a fetch that returns nothing);
        with ``follow`` it waits for new records until the ledger is closed or
        the consuming task is cancelled. Raises :class:`LedgerGap` /
        :class:`LedgerMismatch` as the module docstring says.
        """
        if from_offset < 0:
            raise ValueError(f"from_offset must be >= 0, not {from_offset}")
        self._check_open()
        return self._read(from_offset, follow=follow, check_opened=True)

    async def _read(
        self,
        from_offset: int,
        *,
        follow: bool,
        check_opened: bool,
        fetch_bytes: int | None = None,
    ) -> AsyncIterator[list[Record]]:
        """Records from ``from_offset`` by Fetch requests (:mod:`.kafka_fetch`).

        While the records of one response are walked and handed out, the fetch
        of the next is already on its way (one prefetch, sent as soon as a
        response's end is known), so the broker works while the caller folds.
        """
        start, prev_ts = self._resume_point(from_offset)
        reader = PartitionFetcher(
            self.bootstrap,
            self.topic,
            self.where,
            self._options,
            fetch_bytes=self.fetch_bytes if fetch_bytes is None else fetch_bytes,
        )
        self._readers.add(reader)
        try:
            await reader.start()
            # ``position``: where the next fetch starts; ``expected``: the next
            # ledger offset. They differ after a control batch (a gap, §10).
            position = expected = start
            fetch_wait = self._poll_ms if follow else TAIL_WAIT_MS
            checked = silent_since = answered = time.monotonic()
            failing = False
            pending: asyncio.Future[Fetched] | None = None
            asked = time.monotonic()  # when the fetch now awaited was sent
            while not self._closed:
                try:
                    if pending is None:
                        asked = time.monotonic()
                        fetched = await reader.fetch(position, fetch_wait)
                    else:
                        try:
                            fetched = await pending
                        except asyncio.CancelledError:
                            # close() cancels the fetch sent ahead: the read ends,
                            # as it does when close() cuts a fetch awaited directly
                            task = asyncio.current_task()
                            if self._closed and (task is None or not task.cancelling()):
                                return
                            raise
                        pending = None
                except KafkaError as exc:
                    # connection lost, leader moved, topic unknown for now: wait, ask again
                    pending = None
                    if self._closed:
                        return
                    if not follow and time.monotonic() - answered > self.read_timeout_s:
                        raise LedgerError(
                            f"{self.where}: no answer from the broker for"
                            f" {self.read_timeout_s:.0f} s ({exc})"
                        ) from None
                    if not failing:
                        log.warning("%s: read failed (%s); retrying", self.where, exc)
                        failing = True
                    await asyncio.sleep(0.2)
                    continue
                now = answered = time.monotonic()
                if failing:
                    log.info("%s: reading again", self.where)
                    failing = False
                if fetched.out_of_range:
                    fetched = self._out_of_range(fetched, position)
                if not fetched.batches:
                    position = fetched.position  # past control batches, if any
                    # A broker that answers at once with nothing must not make
                    # this a busy loop: at least the fetch wait between asks.
                    idle = fetch_wait / 1000 - (now - asked)
                    if idle > 0:
                        await asyncio.sleep(idle)
                        now = time.monotonic()
                    if follow:
                        if now - checked >= self.reset_check_s:
                            checked = now
                            await self._verify_head()
                        continue
                    high = fetched.highwater
                    if high is None:
                        # The answer did not cover the partition: not the tail.
                        if now - silent_since > self.read_timeout_s:
                            raise LedgerError(
                                f"{self.where}: no answer from the broker for"
                                f" {self.read_timeout_s:.0f} s"
                            )
                        continue
                    if high > position and fetch_wait < 2000:
                        # Records are promised but the fetch came back empty: a broker
                        # reading slow storage (tansu on s3) answers at the fetch wait.
                        # Ask again with a longer one (DECISIONS 79).
                        fetch_wait = min(fetch_wait * 4, 2000)
                        continue
                    if high > position and now - silent_since <= self.tail_patience_s:
                        continue  # the broker says more is there: fetch again
                    if high > position:
                        # tansu after a crash may report a high watermark past the
                        # records it kept: what exists has been read.
                        log.warning(
                            "%s: high watermark %d but no record after offset %d for %.0f s;"
                            " reading ends there",
                            self.where,
                            high,
                            expected - 1,
                            self.tail_patience_s,
                        )
                    return
                silent_since = now
                if fetched.position > position:
                    asked = time.monotonic()
                    pending = reader.prefetch(fetched.position, fetch_wait)
                if expected == 0 and check_opened:
                    head = _first_message(fetched.batches)
                    if head.offset == 0:
                        self._check_opened(head.value or b"")
                position = fetched.position
                records, expected, prev_ts = sequence(
                    self.where,
                    fetched.batches,
                    expected,
                    prev_ts,
                    from_offset,
                    self.fill_gaps,
                )
                self._remember(expected - 1, prev_ts)
                if expected - 1 > self._max_offset:
                    self._max_offset = expected - 1
                if records:
                    yield records
        finally:
            self._readers.discard(reader)
            await reader.close()

    def _out_of_range(self, fetched: Fetched, position: int) -> Fetched:
        """Judge the broker's OFFSET_OUT_OF_RANGE at ``position`` (tansu never
        answers it; Apache Kafka does): before the log's start, records were
        deleted; beyond its end after this handle saw a record there, the log
        was reset; beyond its end otherwise, the tail (nothing is there yet)."""
        if 0 <= position < fetched.log_start or (position == 0 and fetched.log_start < 0):
            raise LedgerGap(
                f"{self.where}: offset {position} is no longer in the partition (its log"
                f" starts at offset {fetched.log_start}): records were deleted by retention"
                " or compaction; a ledger must be gap-free"
            )
        if position <= self._max_offset + 1 and position > 0 and self._max_offset >= 0:
            raise LedgerMismatch(
                f"{self.where}: offset {position - 1} was read before, but the broker now"
                f" says offset {position} is out of range: the log was reset (a broker that"
                " lost its data?); refusing to mix two histories"
            )
        return Fetched([], position, position, fetched.log_start)

    async def _verify_head(self) -> None:
        """A follower idle at the tail checks record 0 is still this ledger's:
        a broker that lost its log (memory storage restarted) is detected even
        when nobody appends. An unreachable broker is not a verdict."""
        try:
            first = await self._first_record(self.where)
        except LedgerMismatch:
            raise
        except (LedgerError, KafkaError) as exc:
            log.warning("%s: cannot check record 0 (%s)", self.where, exc)
            return
        if first is None:
            raise LedgerMismatch(
                f"{self.where}: record 0 (LedgerOpened {self._ledger_id}) is gone: the"
                " broker lost its log; refusing to follow another history"
            )
        self._check_opened(first.payload)

    def _check_opened(self, value: bytes) -> None:
        found = _opened_id(Record(0, 0, value), self.where)
        if found != self._ledger_id:
            raise LedgerMismatch(
                f"{self.where}: offset 0 holds ledger_id {found!r}, not {self._ledger_id!r}:"
                " the topic was reset and re-initialised; refusing to mix two histories"
            )

    def _resume_point(self, from_offset: int) -> tuple[int, int]:
        """Where to start reading to know the ts before ``from_offset``: the
        offset to fetch from and the ts of the record before it."""
        if from_offset == 0:
            return 0, 0
        if from_offset - 1 in self._known_ts:
            return from_offset, self._known_ts[from_offset - 1]
        below = [offset for offset in self._known_ts if offset < from_offset]
        if not below:
            return 0, 0
        best = max(below)
        return best + 1, self._known_ts[best]

    def _remember(self, offset: int, ts: int) -> None:
        known = self._known_ts
        known[offset] = ts
        if len(known) > _KNOWN_TS_LIMIT:
            for old in list(known)[: _KNOWN_TS_LIMIT // 4]:
                del known[old]

    async def last_offset(self) -> int:
        """Offset of the newest record (-1 for none), found by reading to the tail."""
        self._check_open()
        last = max(self._max_offset, -1)
        async for batch in self._read(max(0, last), follow=False, check_opened=True):
            last = batch[-1].offset
        return last

    async def ts_at(self, offset: int) -> int:
        """The ledger ts of the record at ``offset``."""
        if offset in self._known_ts:
            return self._known_ts[offset]
        async for batch in self._read(offset, follow=False, check_opened=True):
            return batch[0].ts
        raise LedgerError(f"{self.where}: there is no record at offset {offset}")

    # ------------------------------------------------------------- snapshots

    async def save_snapshot(self, snapshot: Snapshot) -> None:
        """Store ``snapshot`` in the ``--snapshots`` file (a no-op without one)."""
        self._check_open()
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
        self._remember(snapshot.offset, ts)
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
        for reader in list(self._readers):
            await reader.close()
        with contextlib.suppress(Exception):
            await self._producer.stop()
        if self._snapshots is not None:
            self._snapshots.close()

    def _check_open(self) -> None:
        if self._closed:
            raise LedgerError(f"ledger {self.where} is closed")

    def __repr__(self) -> str:
        return f"<KafkaLedger {self.where} ledger_id={self._ledger_id}>"


def gap_filler(offset: int) -> bytes:
    """The record a ``gaps="fill"`` reader puts where the partition has none."""
    return encode_event(
        FactRejected(
            offset=offset,
            reason=f"partition offset {offset} holds no record (a write the broker lost"
            " before acknowledging it; read with gaps=fill)",
        )
    )


def sequence(
    where: str,
    batches: Iterable[Iterable[Message]],
    expected: int,
    prev_ts: int,
    from_offset: int = 0,
    fill_gaps: bool = False,
) -> tuple[list[Record], int, int]:
    """Kafka record batches (messages with ``offset``, ``value``, ``timestamp``)
    as ledger records (§10).

    ``expected`` is the next offset, ``prev_ts`` the ts of the record before it.
    Offsets must follow each other (:class:`LedgerGap` on a skip,
    :class:`LedgerMismatch` when they go back); ts is the value's ``at`` or the
    Kafka timestamp, clamped up to the previous ts. Records before
    ``from_offset`` only advance the ts. With ``fill_gaps`` a skip inside the log
    is filled, offset by offset, with a ``FactRejected`` saying so (at the
    previous ts), so every reader still sees the same gap-free ledger. Returns
    the records, the next expected offset and the last ts.
    """
    records: list[Record] = []
    append = records.append
    decode = _AT_DECODER.decode
    for batch in batches:
        for message in batch:
            offset = message.offset
            if offset != expected:
                if not (fill_gaps and offset > expected > 0):
                    _broken(where, offset, expected)
                log.warning(
                    "%s: offsets %d..%d hold no record; filled", where, expected, offset - 1
                )
                for missing in range(expected, offset):
                    if missing >= from_offset:
                        append(Record(missing, prev_ts, gap_filler(missing)))
            value = message.value
            if value is None:
                value = b""
            # value_ts(), inlined: this loop runs for every record read
            ts = message.timestamp
            try:
                moment = decode(value).at
            except msgspec.DecodeError:
                moment = None
            if moment is not None:
                if moment.tzinfo is None:
                    moment = moment.replace(tzinfo=UTC)
                at_ms = (moment - _EPOCH) // _MS
                if 0 <= at_ms <= _MAX_TS:
                    ts = at_ms
            if ts < prev_ts:
                ts = prev_ts
            prev_ts = ts
            expected = offset + 1
            if offset >= from_offset:
                append(Record(offset, ts, value))
    return records, expected, prev_ts


def _first_message(batches: list[Iterable[Message]]) -> Message:
    """The first record of fetched batches. aiokafka's batch readers iterate
    once: the first batch becomes a list, so the walk still sees all of it."""
    first = batches[0] = list(batches[0])
    return first[0]


def _broken(where: str, offset: int, expected: int) -> None:
    if offset > expected:
        raise LedgerGap(
            f"{where}: offset {expected} is missing (the next record is at offset"
            f" {offset}): records were deleted by retention or compaction, or are"
            " transaction markers; a ledger must be gap-free"
        )
    raise LedgerMismatch(
        f"{where}: expected offset {expected} but the broker returned offset"
        f" {offset}: the log was reset (a broker that lost its data?); refusing to mix"
        " two histories"
    )


def _opened_id(record: Record, where: str) -> str:
    """The ledger id of a record 0, or a clear error when it is no ``LedgerOpened``."""
    if record.offset != 0:
        raise LedgerGap(
            f"{where}: the first record is at offset {record.offset}, not 0: records were"
            " deleted (retention?); a ledger must start with LedgerOpened at offset 0"
        )
    try:
        event = decode_event(record.payload)
    except EventError as exc:
        raise LedgerError(
            f"{where}: offset 0 is not LedgerOpened ({exc}); not a quotaledger ledger"
        ) from None
    if not isinstance(event, LedgerOpened):
        raise LedgerError(
            f"{where}: offset 0 is {type(event).__name__}, not LedgerOpened; not a"
            " quotaledger ledger (run `quotaledger init` on a new topic)"
        )
    return event.ledger_id


async def _ensure_topic(
    servers: list[str], topic: str, options: dict[str, Any], create: bool, where: str
) -> None:
    """Check the topic has one partition; create it (§10 settings) when missing."""
    admin = AIOKafkaAdminClient(bootstrap_servers=servers, request_timeout_ms=10_000, **options)
    try:
        try:
            await admin.start()
        except KafkaError as exc:
            raise LedgerError(f"{where}: cannot connect: {exc}") from None
        # Existence from the topic list: tansu creates a topic (with 4 partitions)
        # on a metadata request naming it, which describe_topics sends.
        exists = topic in await admin.list_topics()
        partitions = await _partitions(admin, topic) if exists else None
        if partitions is None:
            if not create:
                raise LedgerError(f"{where}: no such topic (create it with `quotaledger init`)")
            response = await admin.create_topics(
                [NewTopic(topic, 1, 1, topic_configs=dict(TOPIC_CONFIG))]
            )
            for _name, code, message in _topic_errors(response):
                if code not in (0, 36):  # 36: created meanwhile by someone else
                    raise LedgerError(f"{where}: cannot create the topic: {message} ({code})")
            partitions = await _partitions(admin, topic)
        if partitions is not None and partitions != 1:
            raise LedgerError(
                f"{where}: the topic has {partitions} partitions; a ledger is one partition"
                " (total order)"
            )
    finally:
        with contextlib.suppress(Exception):
            await admin.close()


async def _partitions(admin: Any, topic: str) -> int | None:
    described = await admin.describe_topics([topic])
    for entry in described:
        if entry.get("topic") != topic:
            continue
        if entry.get("error_code", 0) != 0:
            return None
        return len(entry.get("partitions", []))
    return None


def _topic_errors(response: Any) -> Iterable[tuple[str, int, str | None]]:
    for entry in getattr(response, "topic_errors", []):
        yield entry[0], entry[1], entry[2] if len(entry) > 2 else None
