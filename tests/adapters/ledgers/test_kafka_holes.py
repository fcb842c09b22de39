"""A hole is a hole only when proven (DESIGN §3, §10; DECISIONS 200, 201).

tansu with concurrent producers sometimes makes a later batch readable before an
earlier one. A reader must never fill or skip offsets that may still become
readable: it fetches again from the first missing offset until the records come,
the broker proves them gone, or its patience ends (then ``gaps=stop`` stops with
``LedgerGap`` and ``gaps=fill`` fills, with a warning). An engine's wait for its
own append is satisfied only by its own records.

The exact reproduction goes through :class:`tests.kafka_hiding_proxy.HidingProxy`
(a real broker whose Fetch responses leave out chosen batches); the soak runs
three concurrent producers of two client libraries on a plain tansu.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import signal
import time
from collections.abc import AsyncIterator, Iterator

import msgspec
import pytest

from quotaledger.adapters.ledgers.kafka import reader as kafka_reader
from quotaledger.adapters.ledgers.kafka.ledger import KafkaLedger
from quotaledger.engine.executors import SimulateExecutor
from quotaledger.engine.live import LiveEngine
from quotaledger.engine.readback import ReadBackError
from quotaledger.events.ledger import Append, LedgerError, LedgerGap, Record
from tests.cli_process import cli
from tests.kafka_batches import batch_bytes, publish_raw
from tests.kafka_hiding_proxy import HidingProxy, ProxiedTansu, hiding_bytes, hiding_offsets
from tests.tansu import Tansu

FILLER = b'{"kind":"FactRejected"'
#: The value of a transaction marker's record (a control batch's: version, commit).
MARKER = b"\x00\x00\x00\x00\x00\x00"


def fact(name: str) -> bytes:
    return msgspec.json.encode({"kind": "NodeRemoved", "name": name})


@pytest.fixture(scope="module")
def proxied() -> Iterator[ProxiedTansu]:
    """A tansu broker reached only through a hiding proxy (started per test)."""
    broker = ProxiedTansu()
    broker.start()
    try:
        yield broker
    finally:
        broker.close()


@contextlib.asynccontextmanager
async def proxy_for(broker: ProxiedTansu) -> AsyncIterator[HidingProxy]:
    proxy = await HidingProxy(broker.port, broker.proxy_port).start()
    try:
        yield proxy
    finally:
        await proxy.close()


class Follower:
    """A ledger handle following from offset 0, keeping every record it yields."""

    def __init__(self, ledger: KafkaLedger) -> None:
        self.ledger = ledger
        self.records: list[Record] = []
        self.error: BaseException | None = None
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        try:
            async for batch in self.ledger.read(0, follow=True):
                self.records.extend(batch)
        except Exception as exc:  # kept for the test to judge
            self.error = exc

    @property
    def offset(self) -> int:
        return self.records[-1].offset if self.records else -1

    async def until(self, offset: int, timeout: float = 60) -> None:
        async with asyncio.timeout(timeout):
            while self.offset < offset and self.error is None and not self.task.done():
                await asyncio.sleep(0.01)
        assert self.error is None, self.error
        assert self.offset >= offset

    async def close(self) -> None:
        await self.ledger.close()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.task, 10)


async def read_all(bootstrap: str, topic: str, **options: object) -> list[Record]:
    ledger = await KafkaLedger.open(bootstrap, topic, create=False, **options)  # type: ignore[arg-type]
    try:
        out: list[Record] = []
        async for batch in ledger.read(0):
            out.extend(batch)
        return out
    finally:
        await ledger.close()


async def read_to_error(
    ledger: KafkaLedger, start: int = 0, *, follow: bool = False
) -> tuple[list[Record], LedgerError | None]:
    """Every record a read hands out, and the error it stops with (None: the tail)."""
    out: list[Record] = []
    try:
        async with asyncio.timeout(60):
            async for batch in ledger.read(start, follow=follow):
                out.extend(batch)
    except LedgerError as exc:
        return out, exc
    return out, None


async def until(check: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


# ------------------------------------------------------------------ exact reproduction


async def test_a_later_batch_readable_first_is_waited_for(
    proxied: ProxiedTansu, topic: str
) -> None:
    """Offsets 6..9 unreadable while 10..13 are (as tansu does with concurrent
    producers): neither a gaps=fill nor a gaps=stop reader fills, skips or stops
    there; both wait, then read 6..13 in order once the broker shows them."""
    async with proxy_for(proxied) as proxy:
        writer = await KafkaLedger.open(proxied.bootstrap, topic, opened_at_ms=0)
        followers = [
            Follower(
                await KafkaLedger.open(
                    proxied.bootstrap, topic, create=False, poll_ms=20, gaps=gaps
                )
            )
            for gaps in ("stop", "fill")
        ]
        try:
            await writer.append([Append(fact(f"a{i}")) for i in range(1, 6)])
            for follower in followers:
                await follower.until(5)
            proxy.hide = hiding_offsets(6, 10)
            assert await writer.append([Append(fact(f"b{i}")) for i in range(4)]) == [6, 7, 8, 9]
            assert await writer.append([Append(fact(f"c{i}")) for i in range(4)]) == list(
                range(10, 14)
            )
            await until(
                lambda: all(
                    f.ledger.reads.hole_waits or f.error or f.offset > 5 for f in followers
                ),
                30,
                "a wait at offset 6",
            )
            await asyncio.sleep(1.0)  # many fetches from offset 6 see 10..13 only
            for follower in followers:
                assert follower.error is None, follower.error
                assert follower.offset == 5, [r.offset for r in follower.records]
                assert follower.ledger.reads.hole_waits == 1
            proxy.hide = None
            for follower in followers:
                await follower.until(13)
            fresh = await read_all(proxied.bootstrap, topic)
            assert [r.offset for r in fresh] == list(range(14))
            assert not [r for r in fresh if r.payload.startswith(FILLER)]
            for follower in followers:
                assert follower.records == fresh
        finally:
            for follower in followers:
                await follower.close()
            await writer.close()


async def test_the_wait_ends_in_a_gap_or_a_logged_fill(
    proxied: ProxiedTansu, topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A skip that outlasts ``gap_patience_s`` (tansu's lost unacknowledged write,
    DECISIONS 78): gaps=stop stops with LedgerGap naming the offsets; gaps=fill
    fills them with a warning, and the same handle does not wait there again."""
    async with proxy_for(proxied) as proxy:
        writer = await KafkaLedger.open(proxied.bootstrap, topic, opened_at_ms=0)
        try:
            await writer.append([Append(fact(f"a{i}")) for i in range(1, 4)])
            proxy.hide = hiding_offsets(4, 6)
            await writer.append([Append(fact("lost-1")), Append(fact("lost-2"))])  # 4, 5
            await writer.append([Append(fact("after"))])  # 6
            started = time.monotonic()
            stopping = await KafkaLedger.open(
                proxied.bootstrap, topic, create=False, gap_patience_s=0.5
            )
            try:
                records, error = await read_to_error(stopping)
            finally:
                await stopping.close()
            # every record before the hole handed out, then the gap (DESIGN §10)
            assert [r.offset for r in records] == [0, 1, 2, 3]
            assert isinstance(error, LedgerGap), error
            assert "offset 4 is missing: offsets 4..5 held no record" in str(error)
            assert time.monotonic() - started >= 0.5
            caplog.set_level(logging.WARNING, logger="quotaledger.kafka")
            filling = await KafkaLedger.open(
                proxied.bootstrap, topic, create=False, gaps="fill", gap_patience_s=0.5
            )
            try:
                records: list[Record] = []
                async for batch in filling.read(0):
                    records.extend(batch)
                assert [r.offset for r in records] == list(range(7))
                assert [r.offset for r in records if r.payload.startswith(FILLER)] == [4, 5]
                assert records[6].payload == fact("after")
                assert "offsets 4..5 held no record for" in caplog.text
                assert "while offset 6 was readable" in caplog.text
                # judged once per handle: a second read fills at once
                started, waits = time.monotonic(), filling.reads.hole_waits
                again: list[Record] = []
                async for batch in filling.read(0):
                    again.extend(batch)
                assert again == records and time.monotonic() - started < 0.5
                assert filling.reads.hole_waits == waits
            finally:
                await filling.close()
        finally:
            await writer.close()


async def test_a_paused_broker_does_not_count_as_patience(
    proxied: ProxiedTansu, topic: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The patience is time the broker was seen serving reads with the skip: a
    broker paused (SIGSTOP, a long GC pause) with a write in flight resumes and
    stores it; the pause must not count, or the first fetch after it would fill
    offsets that are about to be readable (DECISIONS 200)."""
    monkeypatch.setattr(kafka_reader, "HOLE_SEEN_GAP_S", 0.5)
    async with proxy_for(proxied) as proxy:
        writer = await KafkaLedger.open(proxied.bootstrap, topic, opened_at_ms=0)
        follower = Follower(
            await KafkaLedger.open(
                proxied.bootstrap, topic, create=False, poll_ms=20, gaps="fill", gap_patience_s=1.5
            )
        )
        try:
            await writer.append([Append(fact("a"))])
            await follower.until(1)
            proxy.hide = hiding_offsets(2, 3)
            await writer.append([Append(fact("late"))])  # 2
            await writer.append([Append(fact("after"))])  # 3
            await until(lambda: follower.ledger.reads.hole_waits, 30, "a wait at offset 2")
            assert proxied.proc is not None
            os.kill(proxied.proc.pid, signal.SIGSTOP)
            try:
                await asyncio.sleep(2.0)  # longer than the patience
            finally:
                os.kill(proxied.proc.pid, signal.SIGCONT)
            await asyncio.sleep(0.5)  # seen again, well within a fresh patience
            assert follower.offset == 1 and follower.error is None
            proxy.hide = None
            await follower.until(3)
            assert [r.payload for r in follower.records[2:4]] == [fact("late"), fact("after")]
        finally:
            await follower.close()
            await writer.close()


async def test_an_engine_read_back_satisfied_by_fillers_is_caught(
    proxied: ProxiedTansu, topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The engine's own LeaderElected is hidden until its gaps=fill reader judges
    the offset lost and fills it: the engine's read-back finds a filler, not its
    record, and the engine stops with ReadBackError instead of going on with a
    state that lacks its own decision (DECISIONS 201)."""
    async with proxy_for(proxied) as proxy:
        writer = await KafkaLedger.open(proxied.bootstrap, topic, opened_at_ms=0)
        handle = await KafkaLedger.open(
            proxied.bootstrap, topic, create=False, poll_ms=20, gaps="fill", gap_patience_s=0.3
        )
        stop = asyncio.Event()
        running: asyncio.Task[None] | None = None
        try:
            await writer.append([Append(fact("setup"))])
            proxy.hide = hiding_bytes(b'"LeaderElected"')
            engine = LiveEngine(handle, SimulateExecutor(), instance="e1", idle_poll_s=0.05)
            running = asyncio.create_task(engine.run(stop))
            deadline = time.monotonic() + 30
            while not running.done():  # later records, so the reader sees a skip
                assert time.monotonic() < deadline, "the engine went on with fillers for its own"
                await writer.append([Append(fact(f"tick-{time.monotonic()}"))])
                await asyncio.sleep(0.05)
            with pytest.raises(ExceptionGroup) as caught:
                await running
            assert caught.group_contains(ReadBackError, match="applied another record")
            assert "this engine's state lacks its own decision" in caplog.text
            assert engine.core.epoch == 0  # it never led on that state
        finally:
            stop.set()
            if running is not None and not running.done():
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(running, 10)
            await handle.close()
            await writer.close()


async def test_opening_looks_at_record_0_only(proxied: ProxiedTansu, topic: str) -> None:
    """Opening a handle needs record 0 only (DESIGN §3): offsets 2..3 not readable
    yet while 4 is (in the first fetch of record 0) do not hold up the opening for
    the patience; the read waits there, and reads on once they come."""
    async with proxy_for(proxied) as proxy:
        writer = await KafkaLedger.open(proxied.bootstrap, topic, opened_at_ms=0)
        try:
            await writer.append([Append(fact("a"))])  # 1
            proxy.hide = hiding_offsets(2, 4)
            assert await writer.append([Append(fact("b")), Append(fact("c"))]) == [2, 3]
            assert await writer.append([Append(fact("d"))]) == [4]
            async with asyncio.timeout(30):  # the patience is an hour
                reader = await KafkaLedger.open(
                    proxied.bootstrap, topic, create=False, poll_ms=20, gap_patience_s=3600
                )
            # the opening did not even see the skip (it walks record 0 only)
            assert reader.reads.hole_waits == 0
            follower = Follower(reader)
            try:
                assert reader.ledger_id == writer.ledger_id
                await follower.until(1)
                await until(lambda: reader.reads.hole_waits, 30, "a wait at offset 2")
                assert follower.offset == 1
                proxy.hide = None
                await follower.until(4)
                assert [r.payload for r in follower.records[1:]] == [fact(name) for name in "abcd"]
            finally:
                await follower.close()
        finally:
            await writer.close()


async def test_a_follower_stops_when_record_0_is_deleted(
    proxied: ProxiedTansu, topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Retention (or DeleteRecords) deletes record 0 while a follower idles at
    the tail: its check of record 0 (DECISIONS 76) finds the log starting at
    offset 1, and the follower stops with LedgerGap saying so (DECISIONS 271),
    after every record it had read, instead of warning at every check."""
    async with proxy_for(proxied) as proxy:
        writer = await KafkaLedger.open(proxied.bootstrap, topic, opened_at_ms=0)
        try:
            assert await writer.append([Append(fact("a")), Append(fact("b"))]) == [1, 2]
            reader = await KafkaLedger.open(proxied.bootstrap, topic, create=False, poll_ms=20)
            reader.reads.reset_check_s = 0.1
            follower = Follower(reader)
            try:
                await follower.until(2)
                proxy.log_start = 1
                async with asyncio.timeout(20):
                    await follower.task
                assert isinstance(follower.error, LedgerGap), follower.error
                assert "record 0 (LedgerOpened" in str(follower.error)
                assert "the log now starts at offset 1" in str(follower.error)
                assert [r.offset for r in follower.records] == [0, 1, 2]
                assert "cannot check record 0" not in caplog.text
            finally:
                await follower.close()
        finally:
            await writer.close()


# ------------------------------------------------------------------ proven holes


async def test_a_ledger_with_a_proven_hole_opens_and_reads_up_to_it(
    tansu: Tansu, topic: str
) -> None:
    """Transaction markers at offsets 4..5, in the first fetch of record 0 (DESIGN
    §10): the ledger opens (opening looks at record 0 only), so ``replay`` and
    ``audit`` can show it; a gaps=stop read hands out records 0..3 and then stops
    with LedgerGap naming offsets 4 and 6, from offset 0 or 2; a gaps=fill read
    fills 4..5 at once and reads on (DECISIONS 78, 200)."""
    writer = await KafkaLedger.open(tansu.bootstrap, topic, opened_at_ms=0)
    try:
        assert await writer.append([Append(fact(f"a{i}")) for i in range(1, 4)]) == [1, 2, 3]
        await publish_raw(tansu.bootstrap, topic, batch_bytes(0, [MARKER] * 2, control=True))
        assert await writer.append([Append(fact("after"))]) == [6]
    finally:
        await writer.close()
    stopping = await KafkaLedger.open(tansu.bootstrap, topic, create=False)
    try:
        assert stopping.ledger_id == writer.ledger_id
        for start in (0, 2):
            records, error = await read_to_error(stopping, start)
            assert [r.offset for r in records] == list(range(start, 4))
            assert [r.payload for r in records if r.offset >= 1] == [
                fact(f"a{i}") for i in range(max(start, 1), 4)
            ]
            assert isinstance(error, LedgerGap), error
            assert "offset 4 is missing (the next record is at offset 6)" in str(error)
            assert "offsets 4..5 are transaction markers" in str(error)
    finally:
        await stopping.close()
    filled = await read_all(tansu.bootstrap, topic, gaps="fill")
    assert [r.offset for r in filled] == list(range(7))
    assert [r.offset for r in filled if r.payload.startswith(FILLER)] == [4, 5]
    assert filled[6].payload == fact("after")


async def test_audit_of_a_kafka_ledger_with_a_hole_reports_it_as_a_sqlite_gap(
    tansu: Tansu, topic: str
) -> None:
    """``audit`` of a Kafka ledger whose reader stops at a proven hole (markers at
    4..5): the records before it are audited, and the hole is reported as a
    SQLite ledger's missing records are (TAMPERED gap, exit 1), with the
    reader's reason on stderr; not an error that hides the records' audit."""
    writer = await KafkaLedger.open(tansu.bootstrap, topic, opened_at_ms=0)
    try:
        assert await writer.append([Append(fact(f"a{i}")) for i in range(1, 4)]) == [1, 2, 3]
        await publish_raw(tansu.bootstrap, topic, batch_bytes(0, [MARKER] * 2, control=True))
        assert await writer.append([Append(fact("after"))]) == [6]
    finally:
        await writer.close()
    url = tansu.url(topic)
    done = await asyncio.to_thread(cli, "audit", url, "--json")
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    assert report["records"] == 4, report
    assert "offsets 4..5 are transaction markers" in done.stderr
    text = await asyncio.to_thread(cli, "audit", url)
    assert text.returncode == 1, text.stderr
    assert "TAMPERED record 4 is missing: the next record read is 6" in text.stdout


async def test_every_record_before_a_proven_hole_is_handed_out(tansu: Tansu, topic: str) -> None:
    """1,000 records in one batch, transaction markers after them, one record
    after those: a read whose fetch holds all of it hands out records 0..1000
    before it stops with LedgerGap naming offset 1001 (the walk dropped the
    whole fetch), without and with follow (DESIGN §10: the ledger up to the gap,
    then a clear error naming the offset)."""
    writer = await KafkaLedger.open(tansu.bootstrap, topic, opened_at_ms=0)
    payloads = [fact(f"n{i}-" + "x" * 200) for i in range(1000)]
    try:
        assert await writer.append([Append(p) for p in payloads]) == list(range(1, 1001))
        await publish_raw(tansu.bootstrap, topic, batch_bytes(0, [MARKER] * 3, control=True))
        assert await writer.append([Append(fact("after"))]) == [1004]
    finally:
        await writer.close()
    reader = await KafkaLedger.open(tansu.bootstrap, topic, create=False, poll_ms=20)
    try:
        for follow in (False, True):
            records, error = await read_to_error(reader, follow=follow)
            assert [r.offset for r in records] == list(range(1001)), (follow, len(records))
            assert [r.payload for r in records[1:]] == payloads
            assert isinstance(error, LedgerGap), error
            assert "offset 1001 is missing (the next record is at offset 1004)" in str(error)
        records, error = await read_to_error(reader, 990)
        assert [r.offset for r in records] == list(range(990, 1001))
        assert isinstance(error, LedgerGap), error
    finally:
        await reader.close()


# ------------------------------------------------------------------ concurrent producers


PRODUCERS = 3
PER_PRODUCER = 4000
ROUNDS = 4


def confluent_produce(bootstrap: str, topic: str, name: str, count: int) -> list[tuple[int, bytes]]:
    """Produce ``count`` facts in small batches, in bursts; the acknowledged offsets."""
    from confluent_kafka import Producer

    acked: list[tuple[int, bytes]] = []
    errors: list[str] = []

    def delivered(err: object, message: object) -> None:
        if err is not None:
            errors.append(str(err))
        else:
            acked.append((message.offset(), message.value()))  # type: ignore[attr-defined]

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "enable.idempotence": False,
            "linger.ms": 0,
            "batch.num.messages": 8,
            "max.in.flight.requests.per.connection": 5,
        }
    )
    rng = random.Random(name)
    for i in range(count):
        producer.produce(topic, fact(f"{name}-{i}"), partition=0, on_delivery=delivered)
        producer.poll(0)
        if rng.random() < 0.02:  # bursts and pauses: the readers keep up with the tail
            time.sleep(0.002)
    producer.flush(60)
    assert not errors, errors[:3]
    return acked


async def aiokafka_produce(
    bootstrap: str, topic: str, name: str, count: int
) -> list[tuple[int, bytes]]:
    from aiokafka import AIOKafkaProducer  # type: ignore[import-untyped]

    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks="all", enable_idempotence=False, linger_ms=0
    )
    await producer.start()
    acked: list[tuple[int, bytes]] = []
    try:
        for first in range(0, count, 50):
            values = [fact(f"{name}-{i}") for i in range(first, min(count, first + 50))]
            futures = [await producer.send(topic, v, partition=0) for v in values]
            for value, future in zip(values, futures, strict=True):
                acked.append(((await future).offset, value))
            await asyncio.sleep(0.002)
    finally:
        await producer.stop()
    return acked


async def test_readers_follow_three_concurrent_producers_identically(
    tansu: Tansu, topic: str
) -> None:
    """Three producers (two confluent-kafka, one aiokafka) write at once while a
    gaps=fill and a gaps=stop reader follow: no filler ever appears, every
    acknowledged record is at its offset, and every reader saw the same records."""
    writer = await KafkaLedger.open(tansu.bootstrap, topic, opened_at_ms=0)
    await writer.close()
    followers = [
        Follower(await KafkaLedger.open(tansu.bootstrap, topic, create=False, poll_ms=20, gaps=g))
        for g in ("fill", "stop")
    ]
    try:
        acked: dict[int, bytes] = {}
        for round_ in range(ROUNDS):
            produced = await asyncio.gather(
                asyncio.to_thread(
                    confluent_produce, tansu.bootstrap, topic, f"ck1-{round_}", PER_PRODUCER
                ),
                asyncio.to_thread(
                    confluent_produce, tansu.bootstrap, topic, f"ck2-{round_}", PER_PRODUCER
                ),
                aiokafka_produce(tansu.bootstrap, topic, f"aio-{round_}", PER_PRODUCER),
            )
            acked.update(pair for one in produced for pair in one)
        assert len(acked) == ROUNDS * PRODUCERS * PER_PRODUCER
        last = max(acked)
        for follower in followers:
            await follower.until(last, timeout=120)
        fresh = await read_all(tansu.bootstrap, topic)
        assert [r.offset for r in fresh] == list(range(last + 1))
        assert not [r.offset for r in fresh if r.payload.startswith(FILLER)]
        for offset, value in acked.items():
            assert fresh[offset].payload == value, offset
        for follower in followers:
            assert follower.records[: last + 1] == fresh
        waits = [f.ledger.reads.hole_waits for f in followers]
        print(f"\n{len(acked)} records from {PRODUCERS} producers; reader waits at skips: {waits}")
    finally:
        for follower in followers:
            await follower.close()


async def test_a_read_to_the_tail_ends_while_others_keep_appending(
    tansu: Tansu, topic: str
) -> None:
    """A read without follow (``last_offset``, a restore, ``replay``, ``ingest``) ends
    although a producer appends more often than the tail fetch waits: it reads at
    least every record that existed when it began (DECISIONS 203)."""
    writer = await KafkaLedger.open(tansu.bootstrap, topic, opened_at_ms=0)
    reader = await KafkaLedger.open(tansu.bootstrap, topic, create=False)
    stop = asyncio.Event()
    written: list[int] = []

    async def write(name: str) -> None:
        n = 0
        while not stop.is_set():
            written.extend(await writer.append([Append(fact(f"{name}{n}"))]))
            n += 1
            await asyncio.sleep(0.001)

    tasks = [asyncio.create_task(write(name)) for name in "ab"]
    try:
        await until(lambda: len(written) >= 20, 30, "the writer")
        for _ in range(3):
            before = max(written)
            async with asyncio.timeout(30):
                last = await reader.last_offset()
            assert last >= before
            async with asyncio.timeout(30):
                records = await read_all(tansu.bootstrap, topic)
            assert [r.offset for r in records] == list(range(len(records)))
            assert records[-1].offset >= last
    finally:
        stop.set()
        await asyncio.gather(*tasks)
        await reader.close()
        await writer.close()
