"""The ledger contract (DESIGN §3), one test class for every backend.

A backend's test class subclasses :class:`LedgerContract` and says how to open
a new ledger, a second handle on the same ledger (another process, another
engine), a handle that expects another ledger id and a read-only handle, and
how its medium is damaged (a skip in the offsets, a snapshot rewritten). Every
test here must hold for SQLite, Kafka and the in-memory ledger alike; where a
backend lacks a mode (read-only), its class says so and why.

What every reader relies on, whatever the backend:

* records read are gap-free from offset 0, byte for byte as appended, with
  ``ts`` clamped up; a reader never reads past a skip in the offsets as if the
  ledger were whole: it stops with ``LedgerGap`` naming the offsets (Kafka's
  reader itself; for SQLite and the in-memory ledger the digest chain every
  reader folds, DESIGN §9, because ``audit`` reads on to report the damage):
  one class, :class:`~quotaledger.events.ledger.LedgerGap`, whoever finds it;
* ``load_snapshot`` returns a snapshot exactly as saved, or as the medium now
  holds it: a backend does not judge snapshots. ``engine.restore`` verifies
  them (checksum, state hash, ``LedgerDigest`` anchors) for every backend and
  replays from offset 0 instead of using a damaged or forged one.
"""

from __future__ import annotations

import asyncio
import random
import re
from typing import Any

import msgspec
import pytest

from quotaledger.engine.restore import restore
from quotaledger.events.codec import decode_event, encode_event
from quotaledger.events.digest import DigestChain
from quotaledger.events.ledger import (
    Append,
    Ledger,
    LedgerError,
    LedgerGap,
    LedgerMismatch,
    Record,
    Snapshot,
)
from quotaledger.events.model import LedgerDigest, LedgerOpened, NodeRemoved
from quotaledger.projections import Projection, state_hash
from quotaledger.projections.snapshot import dump

#: Facts whose fold a snapshot holds (offsets 1..3).
FACTS = [
    b'{"kind":"NodeUpserted","name":"n1","allocatable":{"cpu":4}}',
    b'{"kind":"QuotaUpserted","name":"q","min":{"cpu":2}}',
    b'{"kind":"NodeUpserted","name":"n2","allocatable":{"cpu":8}}',
]
#: Another history's fact at offset 3 (a forged snapshot's state).
FORGED_FACT = b'{"kind":"NodeUpserted","name":"n2","allocatable":{"cpu":16}}'


def payload(i: int) -> bytes:
    return encode_event(NodeRemoved(name=f"n{i}"))


def no_warning(message: str) -> None:
    raise AssertionError(f"unexpected warning: {message}")


def names_the_gap(message: str, last: int, resumes: int) -> bool:
    """Does ``message`` name where the records stop (the last offset read or the
    first one missing) and where they resume?"""
    numbers = set(re.findall(r"\d+", message))
    return str(resumes) in numbers and bool({str(last), str(last + 1)} & numbers)


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

    #: True when the handle :meth:`read_only` opens refuses appends and snapshot
    #: saves with a :class:`LedgerError`; a backend where it does not (or that has
    #: no read-only opening) says why in :attr:`read_only_note`.
    read_only_refuses_writes = False
    read_only_note = ""

    async def read_only(self, ledger: Ledger) -> Ledger | None:
        """``ledger`` opened read-only, as the read-only commands open it (DESIGN §9);
        None when the backend has no read-only opening (:attr:`read_only_note`)."""
        raise NotImplementedError

    #: True when the backend's ``read`` itself stops at a skip in the offsets
    #: (Kafka); False when it hands out the records as stored, so that ``audit``
    #: can name the damage, and the digest chain stops the reader (SQLite).
    read_stops_at_gaps = False

    async def append_after_gap(
        self, ledger: Ledger, missing: int, payloads: list[bytes]
    ) -> list[int]:
        """Put ``payloads`` in ``ledger`` so that the ``missing`` offsets after its
        tail hold no record, as damage or the broker leaves them; their offsets."""
        raise NotImplementedError

    async def rewrite_snapshot(self, ledger: Ledger, snapshot: Snapshot) -> None:
        """Replace the stored snapshot at ``snapshot.offset`` by ``snapshot`` on the
        medium itself, as damage or a forger would (not through ``save_snapshot``)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ tests

    async def test_starts_with_ledger_opened(self) -> None:
        ledger = await self.new_ledger(opened_at_ms=1_234)
        try:
            records = await read_all(ledger)
            assert [r.offset for r in records] == [0]
            assert records[0].ts == 1_234
            event = decode_event(records[0].payload)
            assert isinstance(event, LedgerOpened)
            assert event.ledger_id == ledger.ledger_id
            assert await ledger.last_offset() == 0
            again = await self.same_ledger(ledger)  # a reopen finds the same ledger
            try:
                assert again.ledger_id == ledger.ledger_id
                assert await read_all(again) == records
                assert await again.last_offset() == 0
            finally:
                await again.close()
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
            await ledger.append([Append(payload(2))])  # the clock behind the last ts
            await ledger.append(
                [Append(payload(3)), Append(payload(4), ts=90_000), Append(payload(5))]
            )
            records = await read_all(ledger)
            assert [r.ts for r in records] == [5, 77_000, 80_000, 80_000, 80_000, 90_000, 90_000]
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
            with pytest.raises(LedgerMismatch) as info:
                await self.expecting(ledger, "some-other-ledger")
            # the error names both histories
            assert "some-other-ledger" in str(info.value)
            assert ledger.ledger_id in str(info.value)
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
            # a snapshot covers records that exist
            with pytest.raises(LedgerError) as info:
                await ledger.save_snapshot(Snapshot(offset=11, blob=b"future"))
            assert "11" in str(info.value)
            # one snapshot per offset: a new one replaces it; offset 0 is a record too
            await ledger.save_snapshot(Snapshot(offset=3, blob=b"three again"))
            await ledger.save_snapshot(Snapshot(offset=0, blob=b"zero"))
            older = await ledger.load_snapshot(7)
            assert older is not None and (older.offset, older.blob) == (3, b"three again")
            oldest = await ledger.load_snapshot(2)
            assert oldest is not None and (oldest.offset, oldest.blob) == (0, b"zero")
            assert await ledger.load_snapshot(-1) is None
            # a second handle (a restart) finds them and reads on with the right ts
            again = await self.same_ledger(ledger)
            try:
                found = await again.load_snapshot()
                assert found is not None and found.offset == 8
                older = await again.load_snapshot(7)
                assert older is not None and (older.offset, older.blob) == (3, b"three again")
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

    async def test_close_ends_follow_readers(self) -> None:
        """Closing a handle ends the follow readers of that handle cleanly."""
        ledger = await self.new_ledger()
        writer = await self.same_ledger(ledger)
        seen: list[int] = []

        async def follow() -> None:
            async for batch in ledger.read(0, follow=True):
                seen.extend(record.offset for record in batch)

        task = asyncio.create_task(follow())
        try:
            await writer.append([Append(payload(0))])
            async with asyncio.timeout(30):
                while len(seen) < 2:
                    await asyncio.sleep(0.005)
            await ledger.close()
            async with asyncio.timeout(30):
                await task  # ends, without an error
            assert seen == [0, 1]
        finally:
            task.cancel()
            await writer.close()
            await ledger.close()

    # ------------------------------------------------------------ read-only

    async def test_read_only_reads_everything_and_writes_nothing(self) -> None:
        """A handle opened read-only (DESIGN §9 read-only media; ``serve --read-only``)
        reads every record and snapshot as the writer sees them, follows what the
        writer appends after it opened, and, where the backend has the mode,
        refuses appends and snapshot saves with a clear error, writing nothing."""
        assert self.read_only_refuses_writes or self.read_only_note
        ledger = await self.new_ledger(opened_at_ms=0)
        try:
            await ledger.append([Append(payload(i), ts=10 + i) for i in range(5)])
            await ledger.save_snapshot(Snapshot(offset=3, blob=b"three"))
            reader = await self.read_only(ledger)
            if reader is None:
                pytest.skip(self.read_only_note)
            try:
                assert reader.ledger_id == ledger.ledger_id
                assert await read_all(reader) == await read_all(ledger)
                assert await reader.last_offset() == 5
                assert await reader.load_snapshot() == Snapshot(offset=3, blob=b"three")
                seen: list[Record] = []
                await ledger.append([Append(payload(5), ts=20)])
                async with asyncio.timeout(30):
                    async for batch in reader.read(6, follow=True):
                        seen.extend(batch)
                        break
                assert [(r.offset, r.ts, r.payload) for r in seen] == [(6, 20, payload(5))]
                if self.read_only_refuses_writes:
                    with pytest.raises(LedgerError, match="read-only"):
                        await reader.append([Append(payload(9))])
                    with pytest.raises(LedgerError, match="read-only"):
                        await reader.save_snapshot(Snapshot(offset=6, blob=b"six"))
                    assert await ledger.last_offset() == 6
                    assert await ledger.load_snapshot() == Snapshot(offset=3, blob=b"three")
                    assert await read_all(reader) == await read_all(ledger)
            finally:
                await reader.close()
        finally:
            await ledger.close()

    # ------------------------------------------------------------ gaps

    async def test_a_gap_in_the_offsets_stops_the_reader(self) -> None:
        """DESIGN §3: offsets are gap-free. Records that skip offsets (a damaged
        file, deleted records, transaction markers) are never read as a whole
        ledger: a reader folding the digest chain stops with ``LedgerGap`` naming
        the offsets, having handed out every record before the skip (so ``replay``
        and ``audit`` show the ledger up to it, DESIGN §10) and nothing at or after
        it. Opening a handle needs record 0 only: it does not stop at the gap."""
        ledger = await self.new_ledger(opened_at_ms=0)
        try:
            await ledger.append([Append(payload(i), ts=10 + i) for i in range(3)])  # 1..3
            after = await self.append_after_gap(ledger, 2, [payload(10), payload(11)])
            assert after == [6, 7]  # offsets 4 and 5 hold no record
            seen: list[int] = []
            chain = DigestChain()
            found_by_chain = False
            # a fresh handle, knowing nothing of the writes
            async with asyncio.timeout(60):
                reader = await self.same_ledger(ledger)
            try:
                assert reader.ledger_id == ledger.ledger_id
                with pytest.raises(LedgerError) as info:
                    async with asyncio.timeout(60):
                        async for batch in reader.read(0):
                            for record in batch:
                                try:
                                    chain.update(record)
                                except LedgerGap:
                                    found_by_chain = True
                                    raise
                                seen.append(record.offset)
            finally:
                await reader.close()
            assert isinstance(info.value, LedgerGap), repr(info.value)
            assert names_the_gap(str(info.value), 3, 6), str(info.value)
            assert seen == [0, 1, 2, 3], seen
            # Kafka: the reader itself stops; else the records as stored, then the chain
            assert found_by_chain is not self.read_stops_at_gaps
        finally:
            await ledger.close()

    # ------------------------------------------------------------ snapshots

    async def test_a_snapshot_is_returned_exactly(self) -> None:
        """Every field of a snapshot comes back as saved, to the same handle and
        after a restart: the blob byte for byte (any bytes), the digest, the state
        hash and the checksum, or their absence (an older format)."""
        ledger = await self.new_ledger(opened_at_ms=0)
        blob = b'{"state": "\x00\xff\xfe not text"}' * 50
        verified = Snapshot(
            offset=2,
            blob=blob,
            digest="ab" * 32,
            state_hash="cd" * 32,
            checksum=Snapshot.checksum_of(blob),
        )
        older = Snapshot(offset=4, blob=b"an older format: no digest, hash or checksum")
        try:
            await ledger.append([Append(payload(i), ts=10 + i) for i in range(4)])
            await ledger.save_snapshot(verified)
            await ledger.save_snapshot(older)
            assert await ledger.load_snapshot(3) == verified
            assert await ledger.load_snapshot() == older
            again = await self.same_ledger(ledger)
            try:
                assert await again.load_snapshot(3) == verified
                assert await again.load_snapshot() == older
            finally:
                await again.close()
        finally:
            await ledger.close()

    async def test_a_damaged_or_forged_snapshot_is_not_used(self) -> None:
        """DESIGN §9, snapshots are a cache, never evidence: a restart loads what the
        medium holds, exactly, and ``restore`` uses it only when it verifies. A
        damaged blob (checksum), another history's state (state hash), a forger who
        also rewrote the checksum and the state hash, or the digest (the
        ``LedgerDigest`` anchoring the snapshot), and an unverifiable older format
        are each named in a warning, and the state is the full replay's."""
        ledger = await self.new_ledger(opened_at_ms=0)
        try:
            await ledger.append([Append(f, ts=1_000 * (i + 1)) for i, f in enumerate(FACTS)])
            full = await restore(ledger, use_snapshot=False, warn=no_warning)
            state = full.projection.state
            at, digest, hashed, blob = state.offset, full.digest, state_hash(state), dump(state)
            assert at == 3
            genuine = Snapshot(at, blob, digest, hashed, Snapshot.checksum_of(blob))
            # anchored as `quotaledger snapshot` and the engine anchor one (offset 4)
            anchor = LedgerDigest(through=at, digest=digest, state_hash=hashed)
            await ledger.append([Append(encode_event(anchor))])
            await ledger.save_snapshot(genuine)
            await ledger.append([Append(payload(0))])  # a tail after the snapshot
            replayed = await restore(ledger, use_snapshot=False, warn=no_warning)
            expected = (state_hash(replayed.projection.state), replayed.digest)

            # another history, same ledger, offsets and times: its state at offset 3
            records = await read_all(ledger)
            other = Projection()
            for record in records[:4]:
                forged_payload = FORGED_FACT if record.offset == 3 else record.payload
                other.apply_record(Record(record.offset, record.ts, forged_payload))
            forged = dump(other.state)
            forged_hash = state_hash(other.state)
            assert forged_hash != hashed

            async def restart(stored: Snapshot) -> tuple[int | None, list[str]]:
                if stored != genuine:
                    await self.rewrite_snapshot(ledger, stored)
                reader = await self.same_ledger(ledger)
                try:
                    assert await reader.load_snapshot() == stored  # as the medium holds it
                    warnings: list[str] = []
                    restored = await restore(reader, warn=warnings.append)
                finally:
                    await reader.close()
                assert (state_hash(restored.projection.state), restored.digest) == expected
                return restored.snapshot, warnings

            assert await restart(genuine) == (at, [])
            damaged = blob[:20] + bytes([blob[20] ^ 1]) + blob[21:]
            cases = [
                (
                    msgspec.structs.replace(genuine, blob=damaged),
                    "its blob does not match its checksum",
                ),
                (
                    msgspec.structs.replace(
                        genuine, blob=forged, checksum=Snapshot.checksum_of(forged)
                    ),
                    f"its state hashes to {forged_hash}, but it stores {hashed}",
                ),
                (
                    Snapshot(at, forged, digest, forged_hash, Snapshot.checksum_of(forged)),
                    f"LedgerDigest at offset 4 says the state hash at 3 is {hashed},"
                    f" not {forged_hash}",
                ),
                (
                    msgspec.structs.replace(genuine, digest="00" * 32),
                    f"LedgerDigest at offset 4 says d(3) is {digest}",
                ),
                (
                    Snapshot(at, blob),
                    "it stores no digest or state hash",
                ),
            ]
            for stored, reason in cases:
                used, warnings = await restart(stored)
                assert used is None, reason
                assert len(warnings) == 1, warnings
                assert warnings[0].startswith(f"snapshot at offset {at} not used: "), warnings
                assert reason in warnings[0], warnings
                assert warnings[0].endswith("; replaying from offset 0"), warnings
        finally:
            await ledger.close()
