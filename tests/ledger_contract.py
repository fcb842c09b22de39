"""The ledger contract (DESIGN §3), one test class for every backend.

A backend's test class subclasses :class:`LedgerContract` and says how to open
a new ledger, a second handle on the same ledger (another process, another
engine) and a handle that expects another ledger id. Every test here must hold
for SQLite, Kafka and the in-memory ledger alike.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import msgspec
import pytest

from quotaledger.events.codec import decode_event, encode_event
from quotaledger.events.ledger import Append, Ledger, LedgerMismatch, Record, Snapshot
from quotaledger.events.model import LedgerOpened, NodeRemoved
from quotaledger.projections import Projection


def payload(i: int) -> bytes:
    return encode_event(NodeRemoved(name=f"n{i}"))


async def read_all(ledger: Ledger, start: int = 0) -> list[Record]:
    out: list[Record] = []
    async for batch in ledger.read(start):
        out.extend(batch)
    return out


class LedgerContract:
    """Tests every Ledger backend passes. Subclasses implement the three openers."""

    async def new_ledger(self, **options: Any) -> Ledger:
        raise NotImplementedError

    async def same_ledger(self, ledger: Ledger) -> Ledger:
        """Another handle on ``ledger`` (as a second process would open it)."""
        raise NotImplementedError

    async def expecting(self, ledger: Ledger, ledger_id: str) -> Ledger:
        """Open ``ledger`` again, insisting its id is ``ledger_id``."""
        raise NotImplementedError

    # ------------------------------------------------------------------ tests

    async def test_starts_with_ledger_opened(self) -> None:
        ledger = await self.new_ledger()
        try:
            records = await read_all(ledger)
            assert [r.offset for r in records] == [0]
            event = decode_event(records[0].payload)
            assert isinstance(event, LedgerOpened)
            assert event.ledger_id == ledger.ledger_id
            assert await ledger.last_offset() == 0
        finally:
            await ledger.close()

    async def test_offsets_are_gap_free_and_payloads_exact(self) -> None:
        ledger = await self.new_ledger()
        try:
            sizes = [1, 5, 1, 30, 2]
            got: list[int] = []
            n = 0
            for size in sizes:
                offsets = await ledger.append([Append(payload(n + i)) for i in range(size)])
                assert offsets == list(range(offsets[0], offsets[0] + size))
                got.extend(offsets)
                n += size
            assert got == list(range(1, n + 1))
            records = await read_all(ledger)
            assert [r.offset for r in records] == list(range(n + 1))
            assert [r.payload for r in records[1:]] == [payload(i) for i in range(n)]
            assert await ledger.last_offset() == n
            tail = await read_all(ledger, 7)
            assert [r.offset for r in tail] == list(range(7, n + 1))
            assert await ledger.append([]) == []
        finally:
            await ledger.close()

    async def test_bytes_kept_as_appended(self) -> None:
        """A producer's message that is not JSON stays in the ledger byte for byte,
        and the fold lists it as rejected at its own offset (DESIGN §10)."""
        ledger = await self.new_ledger()
        odd = [b"{not json", '{"kind": "NodeRemoved", "name": "\u00e9"}'.encode(), b"\xff\x00"]
        try:
            offsets = await ledger.append([Append(p, ts=10) for p in odd])
            records = await read_all(ledger)
            assert [r.payload for r in records[1:]] == odd
            projection = Projection()
            for record in records:
                projection.apply_record(record)
            rejected = {r.offset for r in projection.state.rejected}
            assert rejected == {offsets[0], offsets[2]}
        finally:
            await ledger.close()

    async def test_ts_is_clamped_up_to_the_previous(self) -> None:
        ledger = await self.new_ledger(opened_at_ms=1_000)
        rng = random.Random(7)
        stamps = [rng.randrange(0, 50_000) for _ in range(60)]
        try:
            for start in range(0, len(stamps), 7):
                chunk = stamps[start : start + 7]
                await ledger.append(
                    [Append(payload(start + i), ts=ts) for i, ts in enumerate(chunk)]
                )
            records = await read_all(ledger)
            expected = []
            last = records[0].ts
            assert last == 1_000
            for ts in stamps:
                last = max(last, ts)
                expected.append(last)
            assert [r.ts for r in records[1:]] == expected
            # a reader starting in the middle derives the same ts
            middle = await read_all(ledger, 31)
            assert [r.ts for r in middle] == expected[30:]
            fresh = await self.same_ledger(ledger)  # knows nothing of the ts before 31
            try:
                assert [r.ts for r in await read_all(fresh, 31)] == expected[30:]
            finally:
                await fresh.close()
        finally:
            await ledger.close()

    async def test_ts_none_takes_the_ledger_clock(self) -> None:
        ledger = await self.new_ledger(clock_ms=lambda: 77_000, opened_at_ms=5)
        try:
            await ledger.append([Append(payload(0)), Append(payload(1), ts=80_000)])
            await ledger.append([Append(payload(2))])
            records = await read_all(ledger)
            assert [r.ts for r in records] == [5, 77_000, 80_000, 80_000]
        finally:
            await ledger.close()

    async def test_follow_sees_new_records(self) -> None:
        ledger = await self.new_ledger()
        writer = await self.same_ledger(ledger)
        seen: list[Record] = []
        done = asyncio.Event()

        async def follow() -> None:
            async for batch in ledger.read(1, follow=True):
                seen.extend(batch)
                if len(seen) >= 6:
                    done.set()
                    return

        try:
            task = asyncio.create_task(follow())
            await writer.append([Append(payload(i)) for i in range(3)])
            await asyncio.sleep(0.05)
            await writer.append([Append(payload(i)) for i in range(3, 6)])
            async with asyncio.timeout(30):
                await done.wait()
            await task
            assert [r.offset for r in seen] == [1, 2, 3, 4, 5, 6]
            assert [r.payload for r in seen] == [payload(i) for i in range(6)]
        finally:
            await writer.close()
            await ledger.close()

    async def test_follow_is_cancellable(self) -> None:
        ledger = await self.new_ledger()

        async def follow() -> None:
            async for _batch in ledger.read(0, follow=True):
                pass

        try:
            task = asyncio.create_task(follow())
            await asyncio.sleep(0.1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        finally:
            await ledger.close()

    async def test_other_ledger_id_is_refused(self) -> None:
        ledger = await self.new_ledger()
        try:
            with pytest.raises(LedgerMismatch):
                await self.expecting(ledger, "some-other-ledger")
            same = await self.expecting(ledger, ledger.ledger_id)
            await same.close()
        finally:
            await ledger.close()

    async def test_snapshots(self) -> None:
        ledger = await self.new_ledger(opened_at_ms=0)
        try:
            assert await ledger.load_snapshot() is None
            await ledger.append([Append(payload(i), ts=100 + i) for i in range(10)])
            await ledger.save_snapshot(Snapshot(offset=3, blob=b"three"))
            await ledger.save_snapshot(Snapshot(offset=8, blob=b"eight"))
            newest = await ledger.load_snapshot()
            assert newest is not None and (newest.offset, newest.blob) == (8, b"eight")
            older = await ledger.load_snapshot(7)
            assert older is not None and (older.offset, older.blob) == (3, b"three")
            assert await ledger.load_snapshot(2) is None
            # a second handle (a restart) finds them and reads on with the right ts
            again = await self.same_ledger(ledger)
            try:
                found = await again.load_snapshot()
                assert found is not None and found.offset == 8
                tail = await read_all(again, found.offset + 1)
                assert [(r.offset, r.ts) for r in tail] == [(9, 108), (10, 109)]
            finally:
                await again.close()
        finally:
            await ledger.close()

    async def test_concurrent_appenders_interleave_whole_batches(self) -> None:
        ledger = await self.new_ledger()
        other = await self.same_ledger(ledger)

        async def writer(handle: Ledger, name: str) -> list[list[int]]:
            out = []
            for i in range(15):
                items = [
                    Append(encode_event(NodeRemoved(name=f"{name}-{i}-{j}"))) for j in range(3)
                ]
                out.append(await handle.append(items))
            return out

        try:
            a, b = await asyncio.gather(writer(ledger, "a"), writer(other, "b"))
            for offsets in a + b:
                assert offsets == list(range(offsets[0], offsets[0] + 3))
            everything = sorted(o for offsets in a + b for o in offsets)
            assert everything == list(range(1, 91))
            records = await read_all(other)
            assert [r.offset for r in records] == list(range(91))
            by_offset = {r.offset: msgspec.json.decode(r.payload)["name"] for r in records[1:]}
            for offsets, name in [(o, "a") for o in a] + [(o, "b") for o in b]:
                assert all(by_offset[x].startswith(name + "-") for x in offsets)
        finally:
            await other.close()
            await ledger.close()
