"""The raw records of a ``quotaledger bench faults`` trial's ledger (DECISIONS 220, 222),
read without quotaledger's readers: a SQLite ledger by plain ``sqlite3``, a Kafka ledger by
plain Fetch requests (:class:`KafkaTap`), each record at the offset its store gave it, with
the ts every reader derives (DESIGN §3, §10). Nothing is filled or skipped over: a hole is
left as one, and :func:`fold` takes it as a placeholder only to know what the projection
accepted around it.

The checks on these records are in :mod:`.fault_checks`.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from quotaledger.events.ledger import Record
from quotaledger.projections import Projection

HOLE_REASON = "missing from the partition (read by bench faults)"


@dataclass(frozen=True, slots=True)
class RawRecord:
    """One record as read here: ``ts`` as every reader derives it (DESIGN §3, §10),
    ``stamp`` what its writer stamped (the Kafka record timestamp; SQLite: ``ts``)."""

    offset: int
    ts: int
    stamp: int
    payload: bytes


def read_sqlite(path: Path) -> list[RawRecord]:
    """Every record of a SQLite ledger, by plain ``sqlite3`` (readers never block)."""
    if not path.exists():
        return []
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    try:
        rows = conn.execute("SELECT offset, ts, payload FROM records ORDER BY offset").fetchall()
    except sqlite3.OperationalError:
        return []
    finally:
        conn.close()
    return [
        RawRecord(o, ts, ts, p.encode() if isinstance(p, str) else bytes(p)) for o, ts, p in rows
    ]


class KafkaTap:
    """The raw records of a Kafka ledger's partition, by plain Fetch requests: each record
    at the offset the broker gives it, with the writer's timestamp; nothing filled, nothing
    skipped over (DESIGN §10's ts derived here). A missing offset is fetched again while
    it is young (a broker may make later offsets readable first); one missing for longer
    is left as a hole (a write the broker lost: tansu after a crash leaves some).

    :meth:`follow` runs while the harness waits; :meth:`read_all` reads everything again
    for the checks, on a new connection."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.bootstrap, self.topic = bootstrap, topic
        self.found: dict[int, tuple[int, bytes]] = {}  # offset -> (stamp, value)
        self.young_hole_s = 5.0
        #: offsets found after a later one had been (a later batch readable first)
        self.late = 0
        #: the broker's high watermark in its last answer (-1: none yet)
        self.highwater = -1

    @property
    def caught_up(self) -> bool:
        """Has every offset below the broker's last high watermark been found or left
        as a hole? (A raw read that lags - slow storage, a loaded machine - is not the
        ledger's tail.)"""
        return self._end() >= self.highwater

    @property
    def records(self) -> list[RawRecord]:
        """The records found so far in offset order, holes left out."""
        from ..ledgers.kafka.walk import value_ts

        out = []
        prev_ts = 0
        for offset in sorted(self.found):
            stamp, value = self.found[offset]
            at = value_ts(value)
            ts = max(prev_ts, at if at is not None else stamp)
            prev_ts = ts
            out.append(RawRecord(offset, ts, stamp, value))
        return out

    async def follow(self, idle_s: float | None = None) -> None:
        """Fetch until cancelled (with ``idle_s``: until that long without news)."""
        from aiokafka.errors import KafkaError  # type: ignore[import-untyped]

        from quotaledger.events.ledger import LedgerError

        from ..ledgers.kafka.fetch import PartitionFetcher

        hole_seen: dict[int, float] = {}
        quiet_since = time.monotonic()

        def reading() -> bool:
            if idle_s is None:
                return True
            # a first answer may take long (a broker just restarted, slow storage), and
            # so may the rest of a log the broker says it holds
            quiet = time.monotonic() - quiet_since
            return quiet < (idle_s if self.found and self.caught_up else 30.0)

        while reading():
            fetcher = PartitionFetcher([self.bootstrap], self.topic, self.topic, {})
            try:
                await fetcher.start()
                while reading():
                    position = self._next_position(hole_seen)
                    fetched = await fetcher.fetch(position, 200)
                    if fetched.highwater is not None:
                        self.highwater = fetched.highwater
                    fresh = 0
                    for batch in fetched.batches:
                        for message in batch:
                            new = message.offset not in self.found
                            fresh += new
                            # readable only after a later offset was: the race of DECISIONS 200
                            self.late += new and message.offset < self._end()
                            self.found[message.offset] = (message.timestamp, message.value or b"")
                    if fresh:
                        quiet_since = time.monotonic()
                    elif not fetched.batches:
                        await asyncio.sleep(0.1)
            except (KafkaError, LedgerError, OSError):
                await asyncio.sleep(0.3)  # the broker restarting, a link cut: fetch again
            finally:
                await fetcher.close()

    def _end(self) -> int:
        return max(self.found, default=-1) + 1

    def _next_position(self, hole_seen: dict[int, float]) -> int:
        """The first missing offset still young, else the end."""
        now = time.monotonic()
        end = self._end()
        for offset in range(end):
            if offset in self.found:
                continue
            first = hole_seen.setdefault(offset, now)
            if now - first < self.young_hole_s:
                return offset
        return end

    async def read_all(self, idle_s: float = 2.0) -> list[RawRecord]:
        """Every record, read again from offset 0 on a new connection."""
        again = KafkaTap(self.bootstrap, self.topic)
        again.young_hole_s = idle_s
        async with asyncio.timeout(180):
            await again.follow(idle_s=idle_s)
        return again.records


def decode_json(payload: bytes) -> dict[str, Any] | None:
    try:
        value = msgspec.json.decode(payload)
    except msgspec.DecodeError:
        return None
    return value if isinstance(value, dict) else None


def contiguous(records: Sequence[RawRecord]) -> list[RawRecord]:
    """``records`` with a placeholder (a ``FactRejected`` the projection keeps as such) at
    every missing offset, as a gaps=fill reader folds a hole."""
    out: list[RawRecord] = []
    for record in records:
        while len(out) < record.offset:
            ts = out[-1].ts if out else 0
            placeholder = msgspec.json.encode(
                {"kind": "FactRejected", "offset": len(out), "reason": HOLE_REASON}
            )
            out.append(RawRecord(len(out), ts, -1, placeholder))
        if record.offset == len(out):
            out.append(record)
    return out


def fold(records: Sequence[RawRecord]) -> Projection:
    """The records folded from offset 0, holes taken as placeholders."""
    projection = Projection()
    for record in contiguous(records):
        projection.apply_record(Record(record.offset, record.ts, record.payload))
    return projection
