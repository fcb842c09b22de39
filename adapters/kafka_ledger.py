"""The Kafka ledger: one topic, one partition, read and written with aiokafka (DESIGN §3, §10).

Rules this backend keeps, whatever the broker:

* **the partition offset is the ledger offset.** A reader checks that every
  message follows the previous one. A skip is a hole only when proven
  (DECISIONS 200): a broker may make a later batch readable before an earlier
  one, so the reader fetches again from the first missing offset, never past
  it, until the records come, the broker proves them gone (the log start moved
  past them, transaction markers cover them) or ``gap_patience_s`` ends; then
  it stops with :class:`LedgerGap` naming the offsets, or with ``gaps=fill``
  reads them as fillers (:class:`GapJudge`). An offset going back (a broker
  that lost its log and started again) stops it with :class:`LedgerMismatch`.
  Record 0 must be ``LedgerOpened`` with this ledger's id, or the reader stops
  too (a reset topic re-initialised by someone else is another history);
* **ts** of a message is its value's ``at`` when present (and within the bounds
  of §9), else the Kafka record timestamp; then clamped up to the previous
  record's ts. Every reader computes the same ts: it depends only on the values
  and timestamps of the records before it. A reader starting in the middle
  needs the ts of the record before its start: it knows it from records it read
  or from a loaded snapshot (whose ts is stored with it), and otherwise rescans
  the timestamps from the nearest point it knows (at worst offset 0);
* **reads are Fetch requests** sent through aiokafka's client, their record
  batches walked straight into records (:mod:`.kafka_fetch`, DECISIONS 140): a
  transaction marker (control batch) holds offsets but no record, so it is a
  gap, a proven one;
* **the tail is found by reading**: a read without ``follow`` ends at the first
  fetch that returns nothing, or once it has read up to the high watermark of
  its first answer (so it ends while others keep appending, DECISIONS 203).
  ``end_offsets``, ``offsets_for_times``, idempotent producers and transactions
  are never used (tansu reports end offsets wrongly and has neither of the
  others);
* **appends** go with ``acks=all``, one Kafka record batch per call when it fits
  (``max_batch_size``), and are retried on broker errors until
  ``append_timeout_s``. A retried append may land twice: the projection ignores
  a duplicate decision (decisions are idempotent by id).

Snapshots live in a local SQLite file (``snapshots=PATH``), keyed by ledger_id
(:mod:`quotaledger.adapters.snapshot_store`); without one, ``save_snapshot`` is
a no-op and ``load_snapshot`` finds nothing.

A handle opened ``read_only`` (the read-only commands, DESIGN §9) writes
nothing anywhere: it creates no topic, has no producer, refuses ``append`` and
``save_snapshot`` with a :class:`LedgerError` saying it is read-only, and reads
the snapshot file through a query-only connection (none when the file does not
exist). Whether the credentials may write is the broker's ACLs' business (§10;
DECISIONS 205).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable, Mapping, Sequence
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

__all__ = [
    "FETCH_BYTES",
    "GAP_PATIENCE_S",
    "GapJudge",
    "KafkaLedger",
    "LedgerGap",
    "sequence",
    "wall_clock_ms",
]

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
#: How long offsets a fetch skipped may stay unreadable while later ones are
#: readable before a reader gives up on them (``gap_patience_s``, DECISIONS 200).
GAP_PATIENCE_S = 60.0
#: The first and the longest pause between fetches at a skip not yet proven (s).
#: How long closing waits for appends still unacknowledged (then gives them up).
CLOSE_FLUSH_S = 1.0
HOLE_RETRY_S = 0.002
HOLE_RETRY_MAX_S = 0.2
#: A skip not seen for longer than this (no answer, a paused process) counts its patience
#: again from its next sighting: the patience is time the broker was seen serving reads.
HOLE_SEEN_GAP_S = 10.0


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
        gap_patience_s: float = GAP_PATIENCE_S,
        read_only: bool = False,
    ) -> None:
        """Internal: use :meth:`open` (``producer`` is None when ``read_only``)."""
        self._read_only = read_only
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
        #: How long offsets a fetch skipped may stay unreadable, while later ones are
        #: readable, before the reader stops (gaps=stop) or fills them (gaps=fill).
        self.gap_patience_s = gap_patience_s
        #: Skips this handle waited at (a later batch readable before an earlier one).
        self.hole_waits = 0
        self._judged: dict[int, int] = {}

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
        then it stops with :class:`LedgerGap`, or with ``gaps="fill"`` reads
        them as filler records (:class:`GapJudge`, DECISIONS 200).
        """
        if gaps not in ("stop", "fill"):
            raise LedgerError(f"gaps must be 'stop' or 'fill', not {gaps!r}")
        if not gap_patience_s >= 0:
            raise LedgerError(f"gap_patience_s must be >= 0, not {gap_patience_s!r}")
        servers = [bootstrap] if isinstance(bootstrap, str) else list(bootstrap)
        options = dict(client_options or {})
        where = f"kafka://{','.join(servers)}/{topic}"
        if read_only:
            create = False
        await _ensure_topic(servers, topic, options, create, where)
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
            gap_patience_s=gap_patience_s,
            read_only=read_only,
        )
        try:
            first = await ledger._first_record(where, retry_connect=False)
            if first is None:
                if not create:
                    raise LedgerError(f"{where}: the topic is empty, not a ledger (run init)")
                at = clock_ms() if opened_at_ms is None else opened_at_ms
                new_id = ledger_id if ledger_id is not None else uuid.uuid4().hex
                opened = LedgerOpened(ledger_id=new_id, at=ms_datetime(at))
                await ledger.append([Append(payload=encode_event(opened), ts=at)])
                first = await ledger._first_record(where, retry_connect=False)
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
            if snapshots is not None and not (read_only and not os.path.exists(snapshots)):
                ledger._snapshots = SnapshotStore.open(snapshots, found, read_only=read_only)
        except BaseException:
            await ledger.close()
            raise
        return ledger

    async def _first_record(self, where: str, *, retry_connect: bool = True) -> Record | None:
        """Record 0, or None when the partition is empty. Only record 0 is looked at:
        whatever follows it in the first fetch (a hole, a marker, a bad record) is the
        business of the reads that hand it out, after the records before it (§10), so
        a ledger with a hole can still be opened to show the records before it."""
        reads = self._read(
            0, follow=False, check_opened=False, head_only=True, retry_connect=retry_connect
        )
        async with contextlib.aclosing(reads) as batches:
            async for batch in batches:
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
        head_only: bool = False,
        retry_connect: bool = True,
    ) -> AsyncGenerator[list[Record], None]:
        """Records from ``from_offset`` by Fetch requests (:mod:`.kafka_fetch`).

        While the records of one response are walked and handed out, the fetch
        of the next is already on its way (one prefetch, sent as soon as a
        response's end is known), so the broker works while the caller folds.
        ``head_only`` (a look at record 0: open, the idle follower's check) asks
        for :data:`HEAD_FETCH_BYTES` and walks only the first record fetched.
        ``retry_connect`` False (opening): a broker that cannot be reached is an error
        at once.
        """
        start, prev_ts = self._resume_point(from_offset)
        reader = await self._start_reader(
            HEAD_FETCH_BYTES if head_only else self.fetch_bytes,
            self.read_timeout_s if retry_connect else 0.0,
        )
        try:
            # ``position``: where the next fetch starts; ``expected``: the next
            # ledger offset. They differ after a control batch (a gap, §10).
            position = expected = start
            fetch_wait = self._poll_ms if follow else TAIL_WAIT_MS
            checked = silent_since = answered = time.monotonic()
            failing = False
            pending: asyncio.Future[Fetched] | None = None
            asked = time.monotonic()  # when the fetch now awaited was sent
            judge = GapJudge(self.where, self.fill_gaps, self._judged)
            # a skip being waited on: its first offset, since when, when last seen, and
            # the next retry's pause
            hole_at, hole_seen, hole_last, hole_delay = -1, 0.0, 0.0, HOLE_RETRY_S
            # without follow: the high watermark of the first answer, where the read ends
            until = -1
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
                if until < 0 and not follow and fetched.highwater is not None:
                    until = fetched.highwater
                if head_only:
                    head = _first_message(fetched.batches)
                    fetched.batches = [] if head is None else [[head]]
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
                if fetched.position > position and not head_only:
                    asked = time.monotonic()
                    pending = reader.prefetch(fetched.position, fetch_wait)
                if expected == 0 and check_opened:
                    head = _first_message(fetched.batches)
                    if head is not None and head.offset == 0:
                        self._check_opened(head.value or b"")
                judge.saw(fetched, expected)
                walked_from = expected
                records, expected, prev_ts, nxt = sequence(
                    self.where, fetched.batches, expected, prev_ts, from_offset, judge
                )
                if expected > walked_from:
                    self._remember(expected - 1, prev_ts)
                    if expected - 1 > self._max_offset:
                        self._max_offset = expected - 1
                if nxt < 0:
                    position = fetched.position
                    if hole_at >= 0:
                        self._hole_closed(hole_at, expected, now - hole_seen)
                        hole_at = -1
                elif judge.gap is not None:
                    # A proven gap: the reader stops at it (below), after the records
                    # before it (§10).
                    if pending is not None:
                        pending.cancel()
                        pending = None
                else:
                    # A skip not proven permanent: fetch again from its first offset,
                    # never past it, until it is readable or judged (DECISIONS 200).
                    if pending is not None:
                        pending.cancel()
                        pending = None
                    position = expected
                    if hole_at != expected:
                        hole_at, hole_seen, hole_delay = expected, now, HOLE_RETRY_S
                        self.hole_waits += 1
                        log.debug(
                            "%s: offsets %d..%d not readable yet; waiting",
                            self.where,
                            expected,
                            nxt - 1,
                        )
                    elif now - hole_last > HOLE_SEEN_GAP_S:
                        # not seen for a while (the broker, or this reader, stopped or
                        # restarted): the patience counts again from now
                        hole_seen = now
                    elif now - hole_seen >= self.gap_patience_s:
                        judge.gap = self._give_up(expected, nxt, now - hole_seen)
                        hole_at, hole_delay = -1, 0.0  # judged: the next walk fills
                    hole_last = now
                if records:
                    yield records
                if judge.gap is not None:
                    # Every record before the gap has been handed out: stop at it
                    # with the error naming it (§10).
                    raise judge.gap
                if 0 <= until <= expected:
                    # every record that existed when the read began has been read:
                    # the tail, even if others keep appending (DECISIONS 203)
                    return
                if nxt >= 0 and hole_delay > 0:
                    await asyncio.sleep(hole_delay)
                    hole_delay = min(hole_delay * 2, HOLE_RETRY_MAX_S)
        finally:
            self._readers.discard(reader)
            await reader.close()

    async def _start_reader(self, fetch_bytes: int, patience_s: float) -> PartitionFetcher:
        """A connected reader. The ledger is open, so a broker that cannot be reached now
        is one restarting or a link cut for a moment: connecting is tried again, as a
        failed fetch is, for up to ``patience_s`` (``read_timeout_s``), then the read
        fails with ``cannot connect`` (DECISIONS 227). Opening the ledger does not wait
        (``patience_s`` 0): a command whose broker is not there at start says so at once."""
        began = time.monotonic()
        while True:
            reader = PartitionFetcher(
                self.bootstrap, self.topic, self.where, self._options, fetch_bytes=fetch_bytes
            )
            self._readers.add(reader)
            try:
                await reader.start()
                return reader
            except LedgerError:
                self._readers.discard(reader)
                await reader.close()
                if self._closed or time.monotonic() - began >= patience_s:
                    raise
                log.warning("%s: cannot connect to read; trying again", self.where)
                await asyncio.sleep(0.5)
            except BaseException:
                self._readers.discard(reader)
                await reader.close()
                raise

    def _give_up(self, first: int, nxt: int, waited: float) -> LedgerGap | None:
        """The bounded wait at offsets ``first..nxt-1`` has ended (DECISIONS 200):
        the :class:`LedgerGap` naming them, for the reader to raise once it has
        handed out the records before them; with ``gaps=fill`` (never at offset 0)
        None: they are judged gone, with a warning, and filled by the next walk."""
        if not self.fill_gaps or first == 0:
            return LedgerGap(
                f"{self.where}: offset {first} is missing: offsets {first}..{nxt - 1} held no"
                f" record for {waited:.1f} s while offset {nxt} was readable (a write the"
                " broker lost, or records deleted by retention or compaction); a ledger"
                " must be gap-free"
            )
        log.warning(
            "%s: offsets %d..%d held no record for %.1f s while offset %d was readable:"
            " a write the broker lost before acknowledging it; filling them (gaps=fill)",
            self.where,
            first,
            nxt - 1,
            waited,
            nxt,
        )
        self._judged[first] = nxt
        return None

    def _hole_closed(self, first: int, expected: int, waited: float) -> None:
        """Offsets a skip had left out were read after all: the wait was right."""
        level = logging.INFO if waited >= 1.0 else logging.DEBUG
        log.log(
            level,
            "%s: offset %d became readable after %.3f s (read through offset %d)",
            self.where,
            first,
            waited,
            expected - 1,
        )

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
        if self._producer is not None:
            # appends still unacknowledged get a moment to be delivered, no more: a stop
            # is bounded (DESIGN §9), and such an append's fate is unknown either way,
            # as after a crash (a reader finds it, or not: DECISIONS 201)
            stopping = asyncio.ensure_future(self._producer.stop())
            done, _ = await asyncio.wait({stopping}, timeout=CLOSE_FLUSH_S)
            if not done:
                log.warning(
                    "%s: appends not acknowledged within %.1f s of closing were given up",
                    self.where,
                    CLOSE_FLUSH_S,
                )
                stopping.cancel()
            with contextlib.suppress(BaseException):
                await stopping
        if self._snapshots is not None:
            self._snapshots.close()

    def _check_open(self) -> None:
        if self._closed:
            raise LedgerError(f"ledger {self.where} is closed")

    def _check_writable(self, what: str) -> None:
        if self._read_only:
            raise LedgerError(f"ledger {self.where} is open read-only: cannot {what} it")

    def __repr__(self) -> str:
        return f"<KafkaLedger {self.where} ledger_id={self._ledger_id}>"


def _outcome_read(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def gap_filler(offset: int) -> bytes:
    """The record a ``gaps="fill"`` reader puts where the partition has none."""
    return encode_event(
        FactRejected(
            offset=offset,
            reason=f"partition offset {offset} holds no record (a write the broker lost"
            " before acknowledging it; read with gaps=fill)",
        )
    )


class GapJudge:
    """Whether offsets a fetch skipped are gone for good (DECISIONS 200).

    A skip in the offsets proves nothing by itself: a broker may make a later
    batch readable before an earlier one (tansu with concurrent producers). The
    offsets ``first..nxt-1`` a reader found no record for are gone only when

    * the log starts after them (the broker's log start offset): deleted, a
      :class:`LedgerGap` whatever ``gaps`` says;
    * control batches (transaction markers) cover them: a marker is written
      with its offsets and never changes, so every reader sees the same
      thing there: filled with ``gaps=fill``, a :class:`LedgerGap` otherwise;
    * with ``gaps=fill``, the reader has seen them stay unreadable for
      ``gap_patience_s`` while later records were readable, and recorded that
      in ``judged`` (``first -> nxt``): filled.

    Otherwise the reader fetches again from ``first``. Offset 0 is never filled.

    A proven gap the reader must stop at is not raised mid-walk: the judge keeps
    it in :attr:`gap` and answers False, so the walk ends at the gap with the
    records before it; the reader hands those out and then raises the gap (DESIGN
    §10: a gap stops the reader with a clear error naming the offset, after the
    ledger up to it, which ``replay`` and ``audit`` show; DECISIONS 204).
    """

    __slots__ = ("fill", "gap", "judged", "log_start", "markers", "where")

    def __init__(self, where: str, fill: bool, judged: dict[int, int]) -> None:
        self.where = where
        self.fill = fill
        #: Holes this ledger handle has judged gone after waiting (``first -> nxt``).
        self.judged = judged
        #: ``(first, end)`` of control batches seen and not yet passed.
        self.markers: list[tuple[int, int]] = []
        self.log_start = -1
        #: The proven gap the last walk stopped at, for the reader to raise (None: none).
        self.gap: LedgerGap | None = None

    def saw(self, fetched: Fetched, expected: int) -> None:
        """Take in what a fetch response proves (before its records are walked)."""
        if fetched.log_start > self.log_start:
            self.log_start = fetched.log_start
        if fetched.markers or self.markers:
            self.markers = sorted(m for m in self.markers + fetched.markers if m[1] > expected)

    def __call__(self, first: int, nxt: int) -> bool:
        """True: fill ``first..nxt-1``; False: stop the walk there, either not
        proven (fetch again) or a proven gap the reader must stop at, then kept
        in :attr:`gap`."""
        if 0 <= first < self.log_start:
            self.gap = LedgerGap(
                f"{self.where}: offsets {first}..{nxt - 1} hold no record and the log now"
                f" starts at offset {self.log_start}: records were deleted (retention?);"
                " a ledger must be gap-free"
            )
            return False
        if self.covered(first, nxt):
            if self.fill and first > 0:
                return True
            self.gap = LedgerGap(
                f"{self.where}: offset {first} is missing (the next record is at offset"
                f" {nxt}): offsets {first}..{nxt - 1} are transaction markers; a ledger"
                " must be gap-free (read with gaps=fill to fill them)"
            )
            return False
        return self.fill and first > 0 and self.judged.get(first, -1) >= nxt

    def covered(self, first: int, nxt: int) -> bool:
        """Do the control batches seen cover every offset of ``first..nxt-1``?"""
        at = first
        for start, end in self.markers:
            if start <= at < end:
                at = end
            if at >= nxt:
                return True
        return at >= nxt


def sequence(
    where: str,
    batches: Iterable[Iterable[Message]],
    expected: int,
    prev_ts: int,
    from_offset: int = 0,
    gone: Callable[[int, int], bool] | None = None,
) -> tuple[list[Record], int, int, int]:
    """Kafka record batches (messages with ``offset``, ``value``, ``timestamp``)
    as ledger records (§10).

    ``expected`` is the next offset, ``prev_ts`` the ts of the record before it.
    Offsets must follow each other; when they go back, :class:`LedgerMismatch`.
    ts is the value's ``at`` or the Kafka timestamp, clamped up to the previous
    ts. Records before ``from_offset`` only advance the ts.

    At a skip (the next record at ``nxt`` > ``expected``) the walk asks
    ``gone(expected, nxt)`` (a :class:`GapJudge`): True fills the missing
    offsets, one by one, with a ``FactRejected`` saying so (at the previous
    ts), so every reader still sees the same gap-free ledger; False (or no
    ``gone``) stops the walk there: the offsets may still become readable
    (DECISIONS 200), or the judge proved them gone (its ``gap``). Returns the
    records, the next expected offset, the last ts, and ``nxt`` when the walk
    stopped at a skip (else -1). It never raises at a skip: the records before
    it are always returned (only offsets going back raise).
    """
    records: list[Record] = []
    append = records.append
    decode = _AT_DECODER.decode
    for batch in batches:
        for message in batch:
            offset = message.offset
            if offset != expected:
                if offset < expected:
                    _broken(where, offset, expected)
                if gone is None or not gone(expected, offset):
                    return records, expected, prev_ts, offset
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
    return records, expected, prev_ts, -1


def _first_message(batches: list[Iterable[Message]]) -> Message | None:
    """The first record of fetched batches (None when they hold none). aiokafka's
    batch readers iterate once: a batch looked into becomes a list, so the walk
    still sees all of it."""
    for index, batch in enumerate(batches):
        messages = batches[index] = list(batch)
        if messages:
            return messages[0]
    return None


def _broken(where: str, offset: int, expected: int) -> None:
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
        try:
            partitions = await _partitions_or_create(admin, topic, create, where)
        except KafkaError as exc:  # the link lost after connecting: a clear refusal too
            raise LedgerError(f"{where}: cannot connect: {exc}") from None
        if partitions is not None and partitions != 1:
            raise LedgerError(
                f"{where}: the topic has {partitions} partitions; a ledger is one partition"
                " (total order)"
            )
    finally:
        with contextlib.suppress(Exception):
            await admin.close()


async def _partitions_or_create(admin: Any, topic: str, create: bool, where: str) -> int | None:
    """The topic's partition count, after creating it (with §10's settings) when missing
    and ``create``; None when it exists without partitions the broker describes."""
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
    return partitions


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
