"""An in-memory ledger: the Ledger contract kept in a list (DESIGN §3).

For tests, simulations and tools that need a ledger without a file or a broker.
It keeps every invariant of a real backend: offsets 0, 1, 2, ... without gaps,
``ts`` clamped up to the previous record's, record 0 = ``LedgerOpened``,
atomic appends (a batch is consecutive), follow readers woken by appends, and
snapshots at offsets that exist. Several :class:`MemoryLedger` objects may share
one :class:`MemoryLog` (two engines on one ledger); each object can be closed
on its own, as a process would close its connection.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable, Sequence

from quotaledger.events.codec import encode_event
from quotaledger.events.ledger import Append, LedgerError, LedgerMismatch, Record, Snapshot
from quotaledger.events.model import LedgerOpened
from quotaledger.events.times import wall_clock_ms

__all__ = ["MemoryLedger", "MemoryLog"]


class MemoryLog:
    """The records and snapshots of one in-memory ledger, shareable by several handles."""

    def __init__(self, ledger_id: str | None = None, opened_ts: int = 0) -> None:
        self.ledger_id = ledger_id if ledger_id is not None else uuid.uuid4().hex
        opened = encode_event(LedgerOpened(ledger_id=self.ledger_id))
        self.records: list[Record] = [Record(0, opened_ts, opened)]
        self.snapshots: dict[int, Snapshot] = {}
        self._changed = asyncio.Condition()

    def commit(self, items: Sequence[Append], now: int) -> list[int]:
        """Number and store ``items`` after the tail (one atomic step)."""
        first = len(self.records)
        last_ts = self.records[-1].ts
        for item in items:
            ts = now if item.ts is None else item.ts
            last_ts = max(last_ts, ts)
            self.records.append(Record(len(self.records), last_ts, item.payload))
        return list(range(first, len(self.records)))

    async def notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    async def wait_beyond(self, offset: int, timeout: float) -> None:
        """Wait until a record after ``offset`` exists (or ``timeout`` seconds)."""
        try:
            async with asyncio.timeout(timeout), self._changed:
                await self._changed.wait_for(lambda: len(self.records) > offset + 1)
        except TimeoutError:
            pass


class MemoryLedger:
    """A :class:`~quotaledger.events.ledger.Ledger` over a :class:`MemoryLog`."""

    def __init__(
        self,
        log: MemoryLog | None = None,
        *,
        expect_ledger_id: str | None = None,
        clock_ms: Callable[[], int] = wall_clock_ms,
        batch: int = 1000,
    ) -> None:
        self.log = log if log is not None else MemoryLog()
        if expect_ledger_id is not None and expect_ledger_id != self.log.ledger_id:
            raise LedgerMismatch(
                f"in-memory ledger has ledger_id {self.log.ledger_id!r}, expected"
                f" {expect_ledger_id!r}: refusing to mix two histories"
            )
        self._clock_ms = clock_ms
        self._batch = batch
        self._closed = False

    @property
    def ledger_id(self) -> str:
        return self.log.ledger_id

    async def append(self, batch: Sequence[Append]) -> list[int]:
        """Append atomically; ``ts`` None is the clock, a smaller ts is clamped."""
        self._check_open()
        items = list(batch)
        for item in items:
            if not isinstance(item, Append) or not isinstance(item.payload, bytes):
                raise TypeError("append() takes Append items with bytes payloads")
        if not items:
            return []
        offsets = self.log.commit(items, self._clock_ms())
        await self.log.notify()
        return offsets

    async def read(
        self, from_offset: int = 0, *, follow: bool = False
    ) -> AsyncIterator[list[Record]]:
        """Yield records from ``from_offset``; with ``follow``, wait at the tail."""
        if from_offset < 0:
            raise ValueError(f"from_offset must be >= 0, not {from_offset}")
        self._check_open()
        offset = from_offset
        while not self._closed:
            records = self.log.records[offset : offset + self._batch]
            if records:
                offset += len(records)
                yield records
                continue
            if not follow:
                return
            await self.log.wait_beyond(offset - 1, 0.05)

    async def last_offset(self) -> int:
        self._check_open()
        return len(self.log.records) - 1

    async def save_snapshot(self, snapshot: Snapshot) -> None:
        """Store ``snapshot``; its offset must name an existing record."""
        self._check_open()
        if not 0 <= snapshot.offset < len(self.log.records):
            raise LedgerError(
                f"snapshot offset {snapshot.offset} is outside the ledger"
                f" (last offset {len(self.log.records) - 1})"
            )
        self.log.snapshots[snapshot.offset] = snapshot

    async def load_snapshot(self, at_most: int | None = None) -> Snapshot | None:
        self._check_open()
        offsets = [o for o in self.log.snapshots if at_most is None or o <= at_most]
        return self.log.snapshots[max(offsets)] if offsets else None

    async def close(self) -> None:
        self._closed = True

    def _check_open(self) -> None:
        if self._closed:
            raise LedgerError("in-memory ledger is closed")
