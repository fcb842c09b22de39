"""The ledger contract of DESIGN §3 run against every backend: in-memory, SQLite, Kafka (tansu)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest

from quotaledger.adapters.kafka_ledger import KafkaLedger
from quotaledger.adapters.ledger_url import open_ledger
from quotaledger.events.ledger import Ledger
from quotaledger.events.memory_ledger import MemoryLedger, MemoryLog
from tests.ledger_contract import LedgerContract
from tests.tansu import Tansu

_NAMES = itertools.count()


class TestMemoryLedger(LedgerContract):
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


class TestSqliteLedger(LedgerContract):
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
        from quotaledger.adapters.sqlite_ledger import SqliteLedger

        return await SqliteLedger.open(self.path, create=False, expect_ledger_id=ledger_id)


class TestKafkaLedger(LedgerContract):
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
