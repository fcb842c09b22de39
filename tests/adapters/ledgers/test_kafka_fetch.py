"""The Kafka ledger's read path by Fetch requests (adapters/ledgers/kafka/fetch.py, DESIGN §10).

Record batches are real Kafka bytes built by aiokafka's own batch builder; the
end-to-end tests publish to a real tansu broker, control batches included (tansu
stores what a client sends, so a transaction marker can be put in a ledger).
"""

from __future__ import annotations

import asyncio
import inspect
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quotaledger.adapters.ledgers.kafka.fetch import Fetched, PartitionFetcher, record_batches
from quotaledger.adapters.ledgers.kafka.ledger import KafkaLedger
from quotaledger.adapters.ledgers.kafka.walk import GapJudge, sequence
from quotaledger.events.codec import decode_event
from quotaledger.events.ledger import (
    Append,
    LedgerError,
    LedgerGap,
    LedgerMismatch,
    Record,
    Snapshot,
)
from quotaledger.events.model import FactRejected
from tests.kafka_batches import batch_bytes, publish_raw
from tests.tansu import Tansu


def value(offset: int) -> bytes:
    return b'{"kind":"NodeRemoved","name":"n%d"}' % offset


def data_batch(base: int, count: int) -> bytes:
    return batch_bytes(base, [value(base + i) for i in range(count)])


def walk(data: bytes, position: int) -> tuple[list[tuple[int, bytes | None]], int]:
    batches, after = record_batches("k", data, position)
    return [(m.offset, m.value) for batch in batches for m in batch], after


# ------------------------------------------------------------------ record batches


def test_a_fetch_inside_a_batch_starts_at_the_position() -> None:
    data = data_batch(0, 4) + data_batch(4, 3) + data_batch(7, 5)
    got, after = walk(data, 5)
    assert [offset for offset, _ in got] == [5, 6, 7, 8, 9, 10, 11]
    assert got[0][1] == value(5) and after == 12
    got, after = walk(data, 0)
    assert [offset for offset, _ in got] == list(range(12)) and after == 12
    # batches wholly before the position (a broker may send them) are dropped
    assert walk(data, 7) == ([(o, value(o)) for o in range(7, 12)], 12)
    assert walk(data, 12) == ([], 12)


def test_control_batches_are_skipped_and_the_position_moves_past_them() -> None:
    marker = batch_bytes(3, [b"\x00\x00\x00\x00\x00\x00"], control=True)
    data = data_batch(0, 3) + marker + data_batch(4, 2)
    got, after = walk(data, 0)
    assert [offset for offset, _ in got] == [0, 1, 2, 4, 5] and after == 6
    # a trailing marker: no record, but the next fetch starts after it
    got, after = walk(data_batch(0, 3) + marker, 0)
    assert [offset for offset, _ in got] == [0, 1, 2] and after == 4
    assert walk(marker, 3) == ([], 4)
    # the marker proves offset 3 holds no record, ever: the ledger sees a gap
    # there (§10), or fills it (gaps=fill), at once (DECISIONS 200)
    markers: list[tuple[int, int]] = []
    batches, _ = record_batches("k", data, 0, markers)
    assert markers == [(3, 4)]
    stopping = GapJudge("k", False, {})
    stopping.saw(Fetched(batches, 6, markers=markers), 0)
    # gaps=stop: the walk hands out the records before the marker and stops there;
    # the judge holds the LedgerGap the reader raises after them (DESIGN §10)
    records, expected, _, hole = sequence("k", batches, 0, 0, 0, stopping)
    assert [r.offset for r in records] == [0, 1, 2] and (expected, hole) == (3, 4)
    assert isinstance(stopping.gap, LedgerGap)
    assert "offset 3 is missing (the next record is at offset 4)" in str(stopping.gap)
    batches, _ = record_batches("k", data, 0)
    filling = GapJudge("k", True, {})
    filling.saw(Fetched(batches, 6, markers=markers), 0)
    batches, _ = record_batches("k", data, 0)
    records, expected, _, hole = sequence("k", batches, 0, 0, 0, filling)
    assert [r.offset for r in records] == [0, 1, 2, 3, 4, 5] and (expected, hole) == (6, -1)
    filler = decode_event(records[3].payload)
    assert isinstance(filler, FactRejected) and filler.offset == 3
    # without the marker, the same skip proves nothing: the walk stops before it
    batches, _ = record_batches("k", data_batch(0, 3) + data_batch(4, 2), 0)
    records, expected, _, hole = sequence("k", batches, 0, 0, 0, GapJudge("k", True, {}))
    assert [r.offset for r in records] == [0, 1, 2] and (expected, hole) == (3, 4)


def test_a_later_batch_fetched_first_is_not_a_hole() -> None:
    """tansu may answer a fetch from offset 50 with the batch at 54 while 50..53 are
    not readable yet: the walk hands out 0..49 and stops at 50 (even with gaps=fill,
    nothing proves 50..53 gone); the next fetch, from 50, brings them, and the
    records are exactly those of a reader that never saw the skip (DECISIONS 200)."""
    early, late, after = data_batch(0, 50), data_batch(50, 4), data_batch(54, 4)
    judge = GapJudge("k", True, {})
    markers: list[tuple[int, int]] = []
    batches, position = record_batches("k", early + after, 0, markers)
    judge.saw(Fetched(batches, position, markers=markers), 0)
    first, expected, ts, hole = sequence("k", batches, 0, 0, 0, judge)
    assert [r.offset for r in first] == list(range(50)) and (expected, hole) == (50, 54)
    batches, position = record_batches("k", late + after, expected)
    judge.saw(Fetched(batches, position), expected)
    rest, expected, _, hole = sequence("k", batches, expected, ts, 0, judge)
    assert [r.offset for r in rest] == list(range(50, 58)) and (expected, hole) == (58, -1)
    batches, _ = record_batches("k", early + late + after, 0)
    assert first + rest == sequence("k", batches, 0, 0)[0]


def test_a_cut_batch_is_left_for_the_next_fetch() -> None:
    whole = data_batch(0, 3) + data_batch(3, 3)
    for cut in range(len(whole) - 1, len(data_batch(0, 3)) - 1, -7):
        got, after = walk(whole[:cut], 0)
        assert [offset for offset, _ in got] == [0, 1, 2] and after == 3
    assert walk(whole[:10], 0) == ([], 0)


def damaged(base: int, count: int) -> bytes:
    data = bytearray(data_batch(base, count))
    data[-5] ^= 0x01  # one bit of the last record's value
    return bytes(data)


def test_a_damaged_batch_is_refused() -> None:
    """A batch failing its CRC is never read; the batches before it in the same
    response are, and the next fetch starts at it and meets it first: a reader
    hands out every record before the damage, then stops naming it."""
    data = data_batch(0, 3) + damaged(3, 3)
    assert walk(data, 0) == ([(o, value(o)) for o in range(3)], 3)
    with pytest.raises(LedgerError, match="the record batch at offset 3 fails its CRC check"):
        record_batches("k", damaged(3, 3), 3)
    # a marker before it is no record to hand out first
    marker = batch_bytes(3, [b"\x00\x00\x00\x00\x00\x00"], control=True)
    with pytest.raises(LedgerError, match="the record batch at offset 4 fails its CRC check"):
        record_batches("k", marker + damaged(4, 2), 3)


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 6), min_size=1, max_size=6),
    markers=st.lists(st.booleans(), min_size=6, max_size=6),
    position=st.integers(0, 40),
    cut=st.integers(0, 200),
)
def test_record_batches_keep_exactly_the_complete_records_from_the_position(
    sizes: list[int], markers: list[bool], position: int, cut: int
) -> None:
    """Whatever the batches, markers, start and cut: the records are those of the
    complete data batches at or after the position, in order, and the next
    position is the end of the last complete batch (or the position)."""
    parts: list[tuple[bytes, int, int, bool]] = []
    base = 0
    for size, marker in zip(sizes, markers, strict=False):
        if marker:
            parts.append(
                (batch_bytes(base, [b"\x00\x00\x00\x00\x00\x00"], control=True), base, 1, True)
            )
            base += 1
        parts.append((data_batch(base, size), base, size, False))
        base += size
    data = b"".join(p[0] for p in parts)
    data = data[: max(0, len(data) - cut)]
    complete: list[tuple[int, int, bool]] = []
    used = 0
    for raw, start, count, marker in parts:
        if used + len(raw) > len(data):
            break
        used += len(raw)
        complete.append((start, count, marker))
    want = [
        (o, value(o))
        for start, count, marker in complete
        if not marker
        for o in range(start, start + count)
        if o >= position
    ]
    end = max([position] + [start + count for start, count, _ in complete])
    assert walk(data, position) == (want, end)


# ------------------------------------------------------------------ on tansu


async def read_all(ledger: KafkaLedger, start: int = 0) -> list[Record]:
    out: list[Record] = []
    async for batch in ledger.read(start):
        out.extend(batch)
    return out


async def test_a_transaction_marker_in_the_partition_is_a_gap(tansu: Tansu, topic: str) -> None:
    ledger = await KafkaLedger.open(tansu.bootstrap, topic, opened_at_ms=0)
    try:
        await ledger.append([Append(value(1), ts=5), Append(value(2), ts=6)])
        marker = batch_bytes(0, [b"\x00\x00\x00\x00\x00\x00"] * 2, control=True)
        await publish_raw(tansu.bootstrap, topic, marker)  # offsets 3, 4
        # a marker at the tail holds no record: reading ends before it, no error
        assert [r.offset for r in await read_all(ledger)] == [0, 1, 2]
        assert await ledger.last_offset() == 2
        await ledger.append([Append(value(5), ts=7)])
        with pytest.raises(LedgerGap, match="offset 3 is missing"):
            await read_all(ledger)
        filling = await KafkaLedger.open(tansu.bootstrap, topic, create=False, gaps="fill")
        try:
            records = await read_all(filling)
            assert [(r.offset, r.ts) for r in records] == [
                (0, 0),
                (1, 5),
                (2, 6),
                (3, 6),
                (4, 6),
                (5, 7),
            ]
            assert records[5].payload == value(5)
        finally:
            await filling.close()
    finally:
        await ledger.close()


async def test_a_damaged_batch_after_record_0_stops_reads_not_the_opening(
    tansu: Tansu, topic: str
) -> None:
    """A batch failing its CRC at offset 3, in the first fetch of record 0 (tansu
    stores what a client sends): the ledger opens, since opening looks at record
    0 only, and a read hands out records 0..2, then stops with an error naming
    offset 3, from offset 0 as from offset 1 (DESIGN §9: audit and replay can
    show the ledger up to the damage)."""
    writer = await KafkaLedger.open(tansu.bootstrap, topic, opened_at_ms=0)
    try:
        assert await writer.append([Append(value(1)), Append(value(2))]) == [1, 2]
        await publish_raw(tansu.bootstrap, topic, damaged(0, 2))  # offsets 3, 4
        assert await writer.append([Append(value(5))]) == [5]
    finally:
        await writer.close()
    reader = await KafkaLedger.open(tansu.bootstrap, topic, create=False)
    try:
        assert reader.ledger_id == writer.ledger_id
        for start in (0, 1):
            seen: list[Record] = []
            with pytest.raises(LedgerError, match="record batch at offset 3 fails its CRC"):
                async with asyncio.timeout(60):
                    async for batch in reader.read(start):
                        seen.extend(batch)
            assert [r.offset for r in seen] == list(range(start, 3))
    finally:
        await reader.close()


async def test_reads_resume_inside_a_batch_with_the_same_ts(
    tansu: Tansu, topic: str, tmp_path: Path
) -> None:
    """One Kafka batch of 40 records: a reader restarting at any of them (from a
    snapshot there, so its fetch starts inside the batch, or knowing nothing and
    rescanning) reads the same records with the same ts, with small fetches (one
    batch per response) or big ones."""
    snapshots = str(tmp_path / "snapshots.db")
    ledger = await KafkaLedger.open(tansu.bootstrap, topic, opened_at_ms=0, snapshots=snapshots)
    try:
        stamps = [(7 * i) % 23 * 100 for i in range(40)]
        await ledger.append([Append(value(i), ts=ts) for i, ts in enumerate(stamps)])
        await ledger.append([Append(value(40 + i), ts=3_000) for i in range(5)])
        whole = await read_all(ledger)
        assert [r.offset for r in whole] == list(range(46))
        for start in (2, 17, 40, 41, 45):
            await ledger.save_snapshot(Snapshot(offset=start - 1, blob=b"state"))
            for fetch_bytes in (64, 1 << 20):
                fresh = await KafkaLedger.open(tansu.bootstrap, topic, create=False)
                restarted = await KafkaLedger.open(
                    tansu.bootstrap, topic, create=False, snapshots=snapshots
                )
                try:
                    fresh.reads.fetch_bytes = restarted.reads.fetch_bytes = fetch_bytes
                    assert await read_all(fresh, start) == whole[start:]
                    snapshot = await restarted.load_snapshot()
                    assert snapshot is not None and snapshot.offset == start - 1
                    assert await read_all(restarted, start) == whole[start:]
                finally:
                    await fresh.close()
                    await restarted.close()
    finally:
        await ledger.close()


async def test_many_small_fetches_and_an_abandoned_read(tansu: Tansu, topic: str) -> None:
    """Fetches of one batch each (a prefetch always in flight, sent before the
    records are handed out): the records come whole and in order; a read left
    after its first batch leaves nothing running."""
    ledger = await KafkaLedger.open(tansu.bootstrap, topic, opened_at_ms=0)
    ledger.reads.fetch_bytes = 64
    try:
        for first in range(1, 61, 6):
            await ledger.append([Append(value(first + i)) for i in range(6)])
        seen: list[list[int]] = []
        async for batch in ledger.read(0):
            seen.append([r.offset for r in batch])
        assert [o for offsets in seen for o in offsets] == list(range(61))
        assert len(seen) == 11  # LedgerOpened's batch and ten of six
        before = asyncio.all_tasks()
        reading = ledger.read(0)
        first = await anext(reading)
        assert [r.offset for r in first] == [0]
        # the next response's fetch is already sent while the caller holds
        # these records (not only created: it would wait for the caller's fold)
        [prefetch] = [
            task
            for task in asyncio.all_tasks() - before
            if task.get_coro().__qualname__ == PartitionFetcher.fetch.__qualname__
        ]
        assert inspect.getcoroutinestate(prefetch.get_coro()) != inspect.CORO_CREATED
        await reading.aclose()  # the prefetch of the next response is ended with it
        assert asyncio.all_tasks() <= before
    finally:
        await ledger.close()


async def test_a_read_without_broker_ends_with_a_clear_error(topic: str) -> None:
    broker = Tansu().start()
    try:
        ledger = await KafkaLedger.open(broker.bootstrap, topic, opened_at_ms=0)
        ledger.reads.read_timeout_s = 1.0
        broker.stop()
        with pytest.raises(LedgerError, match=r"cannot connect|no answer from the broker"):
            await read_all(ledger)
        await ledger.close()
    finally:
        broker.close()


async def test_a_broker_lost_mid_read_ends_the_read_with_a_clear_error(topic: str) -> None:
    """A read without follow whose broker goes away after the first batch retries
    for ``read_timeout_s`` and then says so; it never ends as if at the tail."""
    broker = Tansu().start()
    try:
        ledger = await KafkaLedger.open(broker.bootstrap, topic, opened_at_ms=0)
        for first in range(1, 31, 10):
            await ledger.append([Append(value(first + i)) for i in range(10)])
        ledger.reads.fetch_bytes = 64  # one batch per fetch
        ledger.reads.read_timeout_s = 5.0  # longer than stopping the broker takes: it retries
        seen: list[int] = []
        with pytest.raises(LedgerError, match="no answer from the broker for 5 s"):
            async for batch in ledger.read(0):
                seen.extend(r.offset for r in batch)
                if len(seen) == 1:
                    broker.stop()
        assert seen[0] == 0 and seen == list(range(len(seen))) and len(seen) < 31
        await ledger.close()
    finally:
        broker.close()


async def test_out_of_range_answers_are_judged(tansu: Tansu, topic: str) -> None:
    """OFFSET_OUT_OF_RANGE (Apache Kafka sends it, tansu does not): before the
    log start, a gap; beyond the end after this handle saw records there, a reset;
    beyond the end otherwise, the tail."""
    ledger = await KafkaLedger.open(tansu.bootstrap, topic, opened_at_ms=0)
    try:
        await ledger.append([Append(value(i)) for i in range(1, 6)])

        def judge(position: int, log_start: int) -> Any:
            return ledger.reads.out_of_range(Fetched([], position, None, log_start, True), position)

        with pytest.raises(LedgerGap, match="offset 0 is no longer in the partition"):
            judge(0, 3)
        with pytest.raises(LedgerGap, match="offset 2 is no longer"):
            judge(2, 3)
        with pytest.raises(LedgerMismatch, match="offset 5 was read before"):
            judge(6, 0)
        with pytest.raises(LedgerMismatch, match="offset 2 was read before"):
            judge(3, 0)
        tail = judge(9, 0)
        assert (tail.batches, tail.position, tail.highwater) == ([], 9, 9)
    finally:
        await ledger.close()


async def test_closing_the_ledger_ends_a_follower_cleanly(tansu: Tansu, topic: str) -> None:
    """A follower whose ledger is closed while its next fetch is in flight (sent
    ahead while it handled a batch, waiting at the broker for new records) ends
    its loop without an error; so does one closed between two batches."""
    ledger = await KafkaLedger.open(tansu.bootstrap, topic, opened_at_ms=0, poll_ms=3000)
    ledger.reads.fetch_bytes = 64  # one batch per response: a fetch sent ahead after each
    await ledger.append([Append(value(1))])
    await ledger.append([Append(value(2))])
    seen: list[int] = []
    got_all = asyncio.Event()

    async def follow() -> None:
        async for batch in ledger.read(0, follow=True):
            seen.extend(r.offset for r in batch)
            if len(seen) == 3:
                got_all.set()

    task = asyncio.create_task(follow())
    async with asyncio.timeout(30):
        await got_all.wait()
    await asyncio.sleep(0.2)  # the follower waits on the fetch sent ahead
    await ledger.close()
    async with asyncio.timeout(10):
        await task  # ends, no CancelledError, no LedgerError
    assert seen == [0, 1, 2]

    again = await KafkaLedger.open(tansu.bootstrap, topic, create=False)
    again.reads.fetch_bytes = 64
    offsets: list[int] = []
    async for batch in again.read(0, follow=True):
        offsets.extend(r.offset for r in batch)
        if len(offsets) == 1:
            await again.close()
    assert offsets == [0]


async def test_an_answer_without_the_partition_is_not_the_tail(tansu: Tansu, topic: str) -> None:
    """tansu answers a fetch with no wait by an empty topic list: no high watermark,
    so no reader takes it for the tail (it asks again); with a wait it answers."""
    ledger = await KafkaLedger.open(tansu.bootstrap, topic, opened_at_ms=0)
    fetcher = PartitionFetcher([tansu.bootstrap], topic, "k", {})
    try:
        await fetcher.start()
        silent = await fetcher.fetch(0, 0)
        assert (silent.batches, silent.highwater, silent.position) == ([], None, 0)
        answered = await fetcher.fetch(0, 10)
        assert answered.highwater == 1 and answered.position == 1
        assert [m.offset for batch in answered.batches for m in batch] == [0]
    finally:
        await fetcher.close()
        await ledger.close()


async def test_a_cancellation_during_a_fetcher_close_is_not_swallowed(
    tansu: Tansu, topic: str
) -> None:
    """aiokafka's client close cancels its metadata task and awaits it with CancelledError
    suppressed: a cancellation of the closing task that arrives then must still end that
    task (DECISIONS 300; a serve replica's follower once went on following after it was
    cancelled at that moment, and its term never began)."""
    ledger = await KafkaLedger.open(tansu.bootstrap, topic, opened_at_ms=0)
    try:
        fetcher = PartitionFetcher([tansu.bootstrap], topic, "k", {})
        await fetcher.start()
        closing = asyncio.create_task(fetcher.close())
        await asyncio.sleep(0)  # the close runs to its first wait: the client's own close
        closing.cancel()
        async with asyncio.timeout(10):
            await asyncio.wait({closing})
        assert closing.cancelled()
    finally:
        await ledger.close()
