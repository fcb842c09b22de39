"""The ledger contract of DESIGN §3 run against every backend: in-memory, SQLite, Kafka (tansu).

Each class also says how its medium is damaged for the contract's gap and
snapshot tests, and what read-only means for it.
"""

from __future__ import annotations

import itertools
import sqlite3
from pathlib import Path
from typing import Any

import msgspec
import pytest

from quotaledger.adapters.ledgers.kafka.ledger import KafkaLedger
from quotaledger.adapters.ledgers.memory import MemoryLedger, MemoryLog
from quotaledger.adapters.ledgers.url import open_ledger
from quotaledger.events.ledger import Append, Ledger, Snapshot
from tests.kafka_batches import batch_bytes, publish_raw
from tests.ledger_contract import LedgerContract
from tests.tansu import Tansu

_NAMES = itertools.count()


class TestMemoryLedger(LedgerContract):
    read_only_note = (
        "an in-memory ledger has no medium and no read-only opening: every handle"
        " on a MemoryLog may append"
    )

    async def new_ledger(self, **options: Any) -> Ledger:
        clock = options.get("clock_ms", lambda: 0)
        opened = options.get("opened_at_ms")
        log = MemoryLog(opened_ts=clock() if opened is None else opened)
        return MemoryLedger(log, clock_ms=clock)

    async def same_ledger(self, ledger: Ledger) -> Ledger:
        assert isinstance(ledger, MemoryLedger)
        return MemoryLedger(ledger.log)

    async def expecting(self, ledger: Ledger, ledger_id: str) -> Ledger:
        assert isinstance(ledger, MemoryLedger)
        return MemoryLedger(ledger.log, expect_ledger_id=ledger_id)

    async def read_only(self, ledger: Ledger) -> Ledger | None:
        return None

    async def append_after_gap(
        self, ledger: Ledger, missing: int, payloads: list[bytes]
    ) -> list[int]:
        """Records after the tail, then the ``missing`` first ones taken out of the list."""
        assert isinstance(ledger, MemoryLedger)
        tail = await ledger.last_offset()
        await ledger.append([Append(b"lost")] * missing)
        offsets = await ledger.append([Append(p) for p in payloads])
        del ledger.log.records[tail + 1 : tail + 1 + missing]
        return offsets

    async def rewrite_snapshot(self, ledger: Ledger, snapshot: Snapshot) -> None:
        assert isinstance(ledger, MemoryLedger)
        assert snapshot.offset in ledger.log.snapshots
        ledger.log.snapshots[snapshot.offset] = snapshot


class TestSqliteLedger(LedgerContract):
    read_only_refuses_writes = True  # open_ledger(read_only=True): no writer connection

    @pytest.fixture(autouse=True)
    def _dir(self, tmp_path: Path) -> None:
        self.dir = tmp_path

    async def new_ledger(self, **options: Any) -> Ledger:
        self.path = str(self.dir / f"ledger-{next(_NAMES)}.db")
        return await open_ledger(
            self.path,
            create=True,
            opened_at_ms=options.get("opened_at_ms"),
            clock_ms=options.get("clock_ms"),
        )

    async def same_ledger(self, ledger: Ledger) -> Ledger:
        return await open_ledger(self.path, create=False)

    async def expecting(self, ledger: Ledger, ledger_id: str) -> Ledger:
        from quotaledger.adapters.ledgers.sqlite.ledger import SqliteLedger

        return await SqliteLedger.open(self.path, create=False, expect_ledger_id=ledger_id)

    async def read_only(self, ledger: Ledger) -> Ledger | None:
        return await open_ledger(self.path, create=False, read_only=True)

    async def append_after_gap(
        self, ledger: Ledger, missing: int, payloads: list[bytes]
    ) -> list[int]:
        """A damaged file: the rows of the ``missing`` offsets deleted."""
        tail = await ledger.last_offset()
        await ledger.append([Append(b"lost")] * missing)
        offsets = await ledger.append([Append(p) for p in payloads])
        with sqlite3.connect(self.path) as conn:
            deleted = conn.execute(
                "DELETE FROM records WHERE offset > ? AND offset <= ?", (tail, tail + missing)
            ).rowcount
        assert deleted == missing
        return offsets

    async def rewrite_snapshot(self, ledger: Ledger, snapshot: Snapshot) -> None:
        """The snapshot's row rewritten in the file."""
        with sqlite3.connect(self.path) as conn:
            changed = conn.execute(
                "UPDATE snapshots SET blob = ?, digest = ?, state_hash = ?, checksum = ?"
                " WHERE offset = ?",
                (
                    snapshot.blob,
                    snapshot.digest,
                    snapshot.state_hash,
                    snapshot.checksum,
                    snapshot.offset,
                ),
            ).rowcount
        assert changed == 1


class TestKafkaLedger(LedgerContract):
    # open_ledger(read_only=True): no producer, no topic created, the --snapshots
    # file read query-only (what the credentials may write is the broker's ACLs')
    read_only_refuses_writes = True
    read_stops_at_gaps = True  # a proven hole stops the read (DESIGN §10, DECISIONS 200)

    @pytest.fixture(autouse=True)
    def _broker(self, tansu: Tansu, topic: str, tmp_path: Path) -> None:
        self.broker = tansu
        self.topic = topic
        self.snapshots = str(tmp_path / "snapshots.db")

    async def new_ledger(self, **options: Any) -> Ledger:
        return await open_ledger(
            self.broker.url(self.topic),
            create=True,
            snapshots=self.snapshots,
            opened_at_ms=options.get("opened_at_ms"),
            clock_ms=options.get("clock_ms"),
        )

    async def same_ledger(self, ledger: Ledger) -> Ledger:
        return await open_ledger(
            self.broker.url(self.topic), create=False, snapshots=self.snapshots
        )

    async def expecting(self, ledger: Ledger, ledger_id: str) -> Ledger:
        return await KafkaLedger.open(
            self.broker.bootstrap, self.topic, create=False, expect_ledger_id=ledger_id
        )

    async def read_only(self, ledger: Ledger) -> Ledger | None:
        return await open_ledger(
            self.broker.url(self.topic), create=False, read_only=True, snapshots=self.snapshots
        )

    async def append_after_gap(
        self, ledger: Ledger, missing: int, payloads: list[bytes]
    ) -> list[int]:
        """A control batch (transaction markers) of ``missing`` offsets, then the records:
        a hole the broker proves (DECISIONS 200)."""
        marker = batch_bytes(0, [b"\x00\x00\x00\x00\x00\x00"] * missing, control=True)
        await publish_raw(self.broker.bootstrap, self.topic, marker)
        return await ledger.append([Append(p) for p in payloads])

    async def rewrite_snapshot(self, ledger: Ledger, snapshot: Snapshot) -> None:
        """The snapshot's row rewritten in the ``--snapshots`` file."""
        with sqlite3.connect(self.snapshots) as conn:
            changed = conn.execute(
                "UPDATE ledger_snapshots SET snapshot = ? WHERE ledger_id = ? AND offset = ?",
                (msgspec.msgpack.encode(snapshot), ledger.ledger_id, snapshot.offset),
            ).rowcount
        assert changed == 1
