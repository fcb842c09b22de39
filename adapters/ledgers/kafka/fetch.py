"""Reading one Kafka partition by Fetch requests: the Kafka ledger's read path (DESIGN §3, §10).

aiokafka's consumer wraps every record it reads in a ``ConsumerRecord`` built in
Python, which is most of the cost of a ledger read (docs/PERFORMANCE.md). Here the
Fetch requests go out through aiokafka's own client (connections, TLS/SASL, API
versions, cluster metadata) and each response's record batches are read by
aiokafka's record-batch readers (C): the ledger walks the records in one loop
(:func:`quotaledger.adapters.ledgers.kafka.walk.sequence`).

Rules, the same as aiokafka's fetcher keeps:

* the fetch **position** is where the next fetch starts. It moves past every
  batch of a response, control batches included. It is not the ledger's next
  offset: a control batch (a transaction marker) takes offsets but holds no
  record, so the ledger sees a gap there (§10) when the next record comes. The
  offsets of each control batch are reported (:attr:`Fetched.markers`): they
  are the broker's proof that those offsets will never hold a record
  (DECISIONS 200); a skip between two data batches proves nothing;
* a fetch inside a batch returns the whole batch: its records before the
  position are dropped, as are batches that end before it;
* every batch's CRC is checked; a batch that fails it is an error naming its
  offset, never records. The batches before it in the same response are
  returned first, with the position at the damaged batch: the next fetch starts
  there and meets it first, so a reader hands out every record before the damage
  and then stops with the error (DESIGN §9, §10; DECISIONS 204);
* a response with bytes but no complete batch (a batch larger than the fetch
  size, from a broker that does not return a first batch whole) is fetched again
  with four times the size, up to :data:`MAX_FETCH_BYTES`, then an error;
* a retriable broker error (leader moved or unknown, topic unknown for now, a
  timeout) asks for new metadata and is raised as aiokafka's error (a
  ``KafkaError``), as are lost connections: the caller waits and fetches again.
  ``OFFSET_OUT_OF_RANGE`` is returned (:attr:`Fetched.out_of_range`) for the
  caller to judge. Any other error is a :class:`LedgerError` naming it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from aiokafka import TopicPartition  # type: ignore[import-untyped]
from aiokafka import errors as kafka_errors
from aiokafka.client import AIOKafkaClient  # type: ignore[import-untyped]
from aiokafka.errors import KafkaError  # type: ignore[import-untyped]
from aiokafka.protocol.fetch import FetchRequest  # type: ignore[import-untyped]
from aiokafka.record.default_records import DefaultRecordBatch  # type: ignore[import-untyped]
from aiokafka.record.memory_records import MemoryRecords  # type: ignore[import-untyped]

from quotaledger.events.ledger import LedgerError

from .stopping import stop_client

__all__ = [
    "FETCH_BYTES",
    "MAX_FETCH_BYTES",
    "Fetched",
    "Message",
    "PartitionFetcher",
    "record_batches",
]

#: Bytes asked for per fetch: a ledger is read in bulk.
FETCH_BYTES = 16 * 1024 * 1024
#: The largest fetch size tried for a batch that does not fit :data:`FETCH_BYTES`.
MAX_FETCH_BYTES = 256 * 1024 * 1024
_READ_UNCOMMITTED = 0
_OFFSET_OUT_OF_RANGE = 1


class Message(Protocol):
    """What the ledger reads of a Kafka record (aiokafka's ``DefaultRecord`` is one)."""

    @property
    def offset(self) -> int: ...
    @property
    def value(self) -> bytes | None: ...
    @property
    def timestamp(self) -> int: ...


class _OldRecord(NamedTuple):
    """A record of message format v0/v1 (a broker's old topic), with a timestamp
    always (v0 has none: 0, which the ts clamp lifts to the previous record's)."""

    offset: int
    value: bytes | None
    timestamp: int


@dataclass(slots=True)
class Fetched:
    """One Fetch response for the partition."""

    #: Record batches in offset order (control batches left out); each yields Messages.
    batches: list[Iterable[Message]] = field(default_factory=list)
    #: Where the next fetch starts.
    position: int = 0
    #: The broker's high watermark; None when its answer did not cover the partition.
    highwater: int | None = None
    #: The log start offset the broker reported (-1: not reported).
    log_start: int = -1
    #: The broker answered OFFSET_OUT_OF_RANGE for the position.
    out_of_range: bool = False
    #: ``(first, end)`` of each control batch in the response: offsets that hold no record, ever.
    markers: list[tuple[int, int]] = field(default_factory=list)


def record_batches(
    where: str,
    data: bytes,
    position: int,
    markers: list[tuple[int, int]] | None = None,
) -> tuple[list[Iterable[Message]], int]:
    """The record batches of a fetched message set, and the next fetch position.

    Drops control batches and whatever lies before ``position``; checks each
    batch's CRC. A batch that fails its CRC ends the batches returned, the
    position at it; with no data batch before it, :class:`LedgerError`. An
    incomplete batch at the end of ``data`` (the fetch size cut it) is left for
    the next fetch: the position stops before it. ``markers`` receives the
    ``(first, end)`` offsets of each control batch dropped.
    """
    records = MemoryRecords(data)
    batches: list[Iterable[Message]] = []
    while records.has_next():
        batch = records.next_batch()
        if not batch.validate_crc():
            if batches:
                break  # the records before it first; the next fetch meets it first
            raise LedgerError(
                f"{where}: the record batch at offset {batch.base_offset} fails its CRC"
                " check: the broker sent damaged data; refusing to read it"
            )
        end = batch.next_offset
        if end <= position:
            continue
        if batch.is_control_batch:
            if markers is not None:  # control batches exist in message format v2 only
                markers.append((max(batch.base_offset, position), end))
            position = end
            continue
        if type(batch) is not DefaultRecordBatch:
            batches.append(
                [
                    _OldRecord(r.offset, r.value, r.timestamp or 0)
                    for r in batch
                    if r.offset >= position
                ]
            )
        elif batch.base_offset < position:
            # the fetch started inside this batch (a reader resuming mid-batch)
            batches.append([r for r in batch if r.offset >= position])
        else:
            batches.append(batch)
        position = end
    return batches, position


def _settled(task: asyncio.Task[Fetched]) -> None:
    """Mark a finished prefetch's error as seen (the reader that dropped it has its own)."""
    if not task.cancelled():
        task.exception()


def _incomplete(data: bytes) -> bool:
    """``data`` holds bytes but not one complete batch."""
    return bool(data) and not MemoryRecords(data).has_next()


class PartitionFetcher:
    """Fetch requests for one partition through one aiokafka client of its own."""

    def __init__(
        self,
        bootstrap: Sequence[str],
        topic: str,
        where: str,
        options: Mapping[str, Any],
        partition: int = 0,
        fetch_bytes: int = FETCH_BYTES,
    ) -> None:
        self.where = where
        #: Bytes asked for per fetch (a broker returns at least one whole batch).
        self.fetch_bytes = fetch_bytes
        self._tp = TopicPartition(topic, partition)
        self._client = AIOKafkaClient(
            bootstrap_servers=list(bootstrap), request_timeout_ms=10_000, **options
        )
        self._pending: set[asyncio.Task[Fetched]] = set()
        self._closed = False

    async def start(self) -> None:
        """Connect and learn the partition's leader; :class:`LedgerError` when unreachable."""
        try:
            await self._client.bootstrap()
        except KafkaError as exc:
            raise LedgerError(f"{self.where}: cannot connect: {exc}") from None
        await self._client.add_topic(self._tp.topic)

    async def fetch(self, position: int, wait_ms: int) -> Fetched:
        """Fetch from ``position``; the broker waits up to ``wait_ms`` for a first record."""
        size = self.fetch_bytes
        while True:
            leader = self._client.cluster.leader_for_partition(self._tp)
            if leader is None or leader == -1:
                self._client.force_metadata_update()
                raise kafka_errors.LeaderNotAvailableError(f"no leader known for {self._tp}")
            request = FetchRequest(
                wait_ms,
                1,
                size,
                _READ_UNCOMMITTED,
                [(self._tp.topic, [(self._tp.partition, position, size)])],
            )
            response = await self._client.send(leader, request)
            fetched = self._parse(response, position)
            if fetched is not None:
                return fetched
            if size >= MAX_FETCH_BYTES:
                raise LedgerError(
                    f"{self.where}: the record batch at offset {position} is larger than"
                    f" {MAX_FETCH_BYTES} bytes; it cannot be read"
                )
            size *= 4

    def prefetch(self, position: int, wait_ms: int) -> asyncio.Task[Fetched]:
        """Start :meth:`fetch` now (the broker prepares the next response while the
        caller works); :meth:`close` cancels it when unused."""
        task = asyncio.ensure_future(self.fetch(position, wait_ms))
        self._pending.add(task)
        task.add_done_callback(_settled)
        task.add_done_callback(self._pending.discard)
        return task

    def _parse(self, response: Any, position: int) -> Fetched | None:
        """The response's part for our partition; None when it must be fetched bigger."""
        for topic, partitions in response.topics:
            if topic != self._tp.topic:
                continue
            for partition, error_code, highwater, *rest in partitions:
                if partition != self._tp.partition:
                    continue
                # rest: [last_stable_offset, log_start_offset (v5+), aborted,
                # preferred_read_replica (v11+), message_set]
                log_start = rest[1] if response.API_VERSION >= 5 else -1
                if error_code == _OFFSET_OUT_OF_RANGE:
                    return Fetched([], position, None, log_start, True)
                if error_code:
                    self._fail(error_code, position)
                data = rest[-1]
                markers: list[tuple[int, int]] = []
                batches, after = record_batches(self.where, data, position, markers)
                if not batches and after == position and _incomplete(data):
                    return None
                return Fetched(batches, after, highwater, log_start, markers=markers)
        return Fetched([], position)  # the broker said nothing of the partition

    def _fail(self, error_code: int, position: int) -> None:
        error = kafka_errors.for_code(error_code)
        if error.retriable:
            self._client.force_metadata_update()
            raise error(f"fetch at offset {position}")
        raise LedgerError(
            f"{self.where}: the broker refused the fetch at offset {position}:"
            f" {error.__name__} (error code {error_code})"
        )

    async def close(self) -> None:
        """Cancel a prefetch and close the connections. Idempotent. A cancellation of the
        caller during the close is raised (:func:`.stopping.stop_client`)."""
        if self._closed:
            return
        self._closed = True
        pending = list(self._pending)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending, timeout=5)
        # not awaited directly: aiokafka's close would swallow a cancellation of this task
        await stop_client(self._client.close())
