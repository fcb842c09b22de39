"""The Kafka ledger's own rules (DESIGN §10) on a real tansu broker, and the CLI on Kafka URLs.

What every backend keeps (DESIGN §3) is the ledger contract's: tests/ledger_contract.py,
run for Kafka by tests/test_ledger_contract.py.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from aiokafka import AIOKafkaProducer  # type: ignore[import-untyped]

from quotaledger.adapters.ledgers.kafka.ledger import KafkaLedger
from quotaledger.adapters.ledgers.kafka.walk import GapJudge, value_ts
from quotaledger.adapters.ledgers.kafka.walk import sequence as sequence_messages
from quotaledger.adapters.ledgers.url import LedgerUrlError, open_ledger, parse_ledger_url
from quotaledger.events.ledger import Append, LedgerError, LedgerGap, LedgerMismatch, Record
from quotaledger.projections import Projection, state_json
from tests.cli_process import cli
from tests.tansu import Tansu

EXAMPLES = Path(__file__).parent.parent / "examples"


# ------------------------------------------------------------------ URLs


def test_urls() -> None:
    assert parse_ledger_url("ledger.db").path == "ledger.db"
    assert parse_ledger_url("sqlite:///tmp/x.db").path == "/tmp/x.db"
    url = parse_ledger_url(
        "kafka://a:9092,b:9093/quota-ledger?security_protocol=SASL_SSL"
        "&sasl_mechanism=SCRAM-SHA-512&sasl_plain_username=u"
    )
    assert url.bootstrap == ("a:9092", "b:9093") and url.topic == "quota-ledger"
    assert url.client_options() == {
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "u",
    }
    bad = {
        "kafka://a:9092/t?acks=0": "unknown Kafka option 'acks'",
        "kafka://a:9092/t?security_protocol=TLS": "security_protocol='TLS'",
        "kafka:///t": "no broker",
        "kafka://a/t": "not HOST:PORT",
        "kafka://a:1/": "one topic name",
        "kafka://a:1/x/y": "one topic name",
        "sqlite://rel.db": "three slashes",
        "postgres://x/y": "unknown ledger scheme 'postgres'",
    }
    for text, message in bad.items():
        with pytest.raises(LedgerUrlError, match=message):
            parse_ledger_url(text)


# ------------------------------------------------------------------ reading rules


class Msg(NamedTuple):
    offset: int
    value: bytes | None
    timestamp: int


def sequence(
    where: str, messages: list[tuple[int, bytes | None, int]], *args: Any
) -> tuple[list[Record], int, int]:
    """The walk of one batch of ``messages``; a skip it stops at is raised as
    ``LedgerGap`` (the judge's, when it proved the gap), as a reader that has
    handed out the records before it and given up on it would."""
    records, nxt, ts, hole = sequence_messages(where, [[Msg(*m) for m in messages]], *args)
    judge = next((a for a in args if isinstance(a, GapJudge)), None)
    if judge is not None and judge.gap is not None:
        raise judge.gap
    if hole >= 0:
        raise LedgerGap(f"offset {nxt} is missing (next record at {hole})")
    return records, nxt, ts


def test_sequence_stops_at_a_skip_and_at_a_reset() -> None:
    ok, nxt, ts = sequence("k", [(5, b"{}", 10), (6, None, 3)], 5, 7)
    assert [(r.offset, r.ts, r.payload) for r in ok] == [(5, 10, b"{}"), (6, 10, b"")]
    assert (nxt, ts) == (7, 10)
    # a skip ends the walk where it is, with the records before it: the reader
    # fetches again from the first missing offset (DECISIONS 200)
    walked = sequence_messages("k", [[Msg(5, b"{}", 1), Msg(7, b"{}", 1)]], 5, 0)
    assert [r.offset for r in walked[0]] == [5] and walked[1:] == (6, 1, 7)
    with pytest.raises(LedgerMismatch, match="expected offset 5 but the broker returned offset 0"):
        sequence("k", [(0, b"{}", 1)], 5, 0)


def test_gaps_fill_reads_a_judged_hole_as_a_rejected_record() -> None:
    """tansu on s3 storage leaves an offset without a record when it is killed with
    a write in flight; with gaps=fill every reader that has waited it out sees the
    same filler there (DECISIONS 78, 200)."""
    judge = GapJudge("k", True, {})
    # not judged yet: the walk stops at the skip, nothing is filled
    with pytest.raises(LedgerGap, match="offset 6 is missing"):
        sequence("k", [(5, b"{}", 10), (8, b"{}", 20)], 5, 0, 0, judge)
    judge.judged[6] = 8
    records, nxt, _ = sequence("k", [(5, b"{}", 10), (8, b"{}", 20)], 5, 0, 0, judge)
    assert [(r.offset, r.ts) for r in records] == [(5, 10), (6, 10), (7, 10), (8, 20)]
    assert nxt == 9
    projection = Projection()
    projection.state.offset = 5
    for record in records[1:3]:
        projection.apply_record(record)
    reasons = [r.reason for r in projection.state.rejected]
    assert [r.offset for r in projection.state.rejected] == [6, 7]
    assert all("holds no record" in reason for reason in reasons)
    # a judgment covers the offsets judged, no more
    with pytest.raises(LedgerGap, match="offset 6 is missing"):
        sequence("k", [(5, b"{}", 10), (9, b"{}", 20)], 5, 0, 0, judge)
    # a ledger whose start is missing is never filled: it is not this ledger any more
    judge.judged[0] = 3
    with pytest.raises(LedgerGap):
        sequence("k", [(3, b"{}", 1)], 0, 0, 0, judge)
    # gaps=stop fills nothing, even judged
    with pytest.raises(LedgerGap, match="offset 6 is missing"):
        sequence("k", [(5, b"{}", 10), (8, b"{}", 20)], 5, 0, 0, GapJudge("k", False, {6: 8}))
    assert parse_ledger_url("kafka://a:1/t?gaps=fill").gaps == "fill"
    with pytest.raises(LedgerUrlError, match="gaps='maybe'"):
        parse_ledger_url("kafka://a:1/t?gaps=maybe")
    assert parse_ledger_url("kafka://a:1/t?gap_patience_s=2.5").gap_patience_s == 2.5
    assert parse_ledger_url("kafka://a:1/t").gap_patience_s is None
    for bad in ("-1", "soon", "nan", "1e9"):
        with pytest.raises(LedgerUrlError, match="gap_patience_s="):
            parse_ledger_url(f"kafka://a:1/t?gap_patience_s={bad}")


def test_a_proven_gap_needs_no_wait() -> None:
    """Offsets the broker proves gone: below the log start (deleted: a gap for
    every reader, filled by none), or covered by transaction markers (the same
    for every reader: filled with gaps=fill at once, a gap otherwise)."""
    for fill in (False, True):
        judge = GapJudge("k", fill, {})
        judge.log_start = 9
        # a proven gap stops the walk; the judge keeps the error for the reader to
        # raise once it has handed out the records before it (DESIGN §10)
        assert not judge(4, 10)
        assert isinstance(judge.gap, LedgerGap)
        assert "offsets 4..9 hold no record and the log now starts at offset 9" in str(judge.gap)
        judge = GapJudge("k", fill, {})
        judge.markers = [(3, 4), (4, 6)]
        assert judge.covered(3, 6) and judge.covered(4, 5)
        assert not judge.covered(2, 6) and not judge.covered(3, 7)
        if fill:
            assert judge(3, 6) and not judge(3, 7)
            assert judge.gap is None
        else:
            assert not judge(3, 7) and judge.gap is None  # not covered: not proven
            assert not judge(3, 6)
            assert isinstance(judge.gap, LedgerGap)
            assert "offsets 3..5 are transaction markers" in str(judge.gap)


def test_ts_prefers_at_then_the_record_timestamp() -> None:
    records, _, _ = sequence(
        "k",
        [
            (1, b'{"kind":"NodeRemoved","name":"a","at":"1970-01-01T00:00:02Z"}', 9_000),
            (2, b'{"kind":"NodeRemoved","name":"a"}', 5_000),  # timestamp, clamped up
            (3, b'{"kind":"NodeRemoved","name":"a","at":null}', 12_000),
            (4, b'{"kind":"x","at":"9999-01-01T00:00:00Z"}', 13_000),  # out of bounds: ignored
            (5, b'{"at":"not a time"}', 14_000),
            (6, b'{"at":"1970-01-01T00:00:01"}', 1),  # no offset = UTC; clamped
        ],
        1,
        0,
    )
    assert [r.ts for r in records] == [2_000, 5_000, 12_000, 13_000, 14_000, 14_000]
    assert value_ts(b'{"at":"1970-01-01T00:00:01.5+01:00"}') is None  # before the epoch
    assert value_ts(b'{"at":"2026-01-01T00:00:00.250Z"}') == 1767225600250


async def test_first_record_must_be_ledger_opened(tansu: Tansu, topic: str) -> None:
    # a fresh one-partition topic whose record 0 is a fact
    raw = topic + "-fact"
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic  # type: ignore[import-untyped]

    admin = AIOKafkaAdminClient(bootstrap_servers=tansu.bootstrap)
    await admin.start()
    await admin.create_topics([NewTopic(raw, 1, 1)])
    await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=tansu.bootstrap)
    await producer.start()
    await producer.send_and_wait(raw, b'{"kind":"NodeRemoved","name":"n"}', partition=0)
    await producer.stop()
    with pytest.raises(LedgerError, match="offset 0 is NodeRemoved, not LedgerOpened"):
        await KafkaLedger.open(tansu.bootstrap, raw, create=False)


async def test_missing_topic_and_many_partitions(tansu: Tansu, topic: str) -> None:
    with pytest.raises(LedgerError, match="no such topic"):
        await KafkaLedger.open(tansu.bootstrap, topic, create=False)
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    admin = AIOKafkaAdminClient(bootstrap_servers=tansu.bootstrap)
    await admin.start()
    await admin.create_topics([NewTopic(topic + "-4", 4, 1)])
    await admin.close()
    with pytest.raises(LedgerError, match="has 4 partitions"):
        await KafkaLedger.open(tansu.bootstrap, topic + "-4")


async def test_malformed_producer_messages_become_rejections(tansu: Tansu, topic: str) -> None:
    """A producer's value that does not decode is a record; the fold rejects it (§10)."""
    ledger = await KafkaLedger.open(tansu.bootstrap, topic, opened_at_ms=0)
    producer = AIOKafkaProducer(bootstrap_servers=tansu.bootstrap)
    await producer.start()
    try:
        for value in [
            b'{"kind":"NodeUpserted","name":"n1","allocatable":{"cpu":"4"}}',
            b"garbage",
            b'{"kind":"PodUpserted","uid":"p"}',
            b'{"kind":"NodeUpserted","name":"n2","allocatable":{"cpu":-1}}',
            None,  # a tombstone (key only)
        ]:
            await producer.send_and_wait(topic, value, key=b"k", partition=0, timestamp_ms=1_000)
        projection = Projection()
        async for batch in ledger.read(0):
            for record in batch:
                projection.apply_record(record)
        state = state_json(projection.state)
        assert state["offset"] == 5
        assert [r["offset"] for r in state["rejected"]] == [2, 3, 4, 5]
        assert state["cluster"]["allocatable"] == {"cpu": 4000}
    finally:
        await producer.stop()
        await ledger.close()


async def test_memory_broker_restart_is_a_mismatch(topic: str) -> None:
    """Fault (a): a broker on memory storage restarts with an empty log. A follower
    stops with a clear error; an appender too; nobody re-reads another history."""
    broker = Tansu().start()
    try:
        ledger = await KafkaLedger.open(broker.bootstrap, topic)
        ledger.reads.reset_check_s = 0.2
        await ledger.append([Append(b'{"kind":"NodeRemoved","name":"a"}')] * 3)

        seen: list[int] = []

        async def follow() -> None:
            async for batch in ledger.read(0, follow=True):
                seen.extend(record.offset for record in batch)

        task = asyncio.create_task(follow())
        async with asyncio.timeout(60):  # following the tail (not still opening) when it dies
            while len(seen) < 4:
                await asyncio.sleep(0.01)
        broker.restart()
        with pytest.raises(LedgerMismatch, match=r"record 0|reset"):
            async with asyncio.timeout(60):
                await task
        with pytest.raises(LedgerError):
            await ledger.append([Append(b'{"kind":"NodeRemoved","name":"b"}')])
        await ledger.close()
        # re-opening finds no ledger there (tansu re-created the topic empty, with
        # its default 4 partitions, on the clients' metadata requests)
        with pytest.raises(LedgerError):
            await KafkaLedger.open(broker.bootstrap, topic, expect_ledger_id=ledger.ledger_id)
    finally:
        broker.close()


# ------------------------------------------------------------------ CLI


def test_cli_init_ingest_replay_snapshot(tansu: Tansu, topic: str, tmp_path: Path) -> None:
    url = tansu.url(topic)
    source = EXAMPLES / "koordinator.jsonl"
    done = cli("init", url, "--at", "1970-01-01T00:00:00Z")
    assert done.returncode == 0, done.stderr
    assert "last offset 0" in done.stdout
    done = cli("ingest", str(source), url)
    assert done.returncode == 0, done.stderr
    from_kafka = json.loads(cli("replay", url, "--json").stdout)
    from_file = json.loads(cli("replay", str(source), "--json").stdout)
    assert from_kafka["hash"] == from_file["hash"]
    assert from_kafka["offset"] == from_file["offset"]
    # snapshots of a Kafka ledger need a local file
    done = cli("snapshot", url)
    assert done.returncode == 2 and "--snapshots PATH" in done.stderr
    snaps = str(tmp_path / "snaps.db")
    done = cli("snapshot", url, "--snapshots", snaps)
    assert done.returncode == 0, done.stderr
    again = json.loads(cli("replay", url, "--json", "--snapshots", snaps).stdout)
    assert again["hash"] == from_file["hash"]
    done = cli("tree", url)
    assert done.returncode == 0 and done.stdout, done.stderr
    done = cli("replay", url + "?bogus=1")
    assert done.returncode == 2 and "unknown Kafka option 'bogus'" in done.stderr
    done = cli("replay", tansu.url(topic + "-none"))
    assert done.returncode == 2 and "no such topic" in done.stderr
    # a SQLite ledger refuses --snapshots
    done = cli("replay", str(tmp_path / "x.db"), "--snapshots", snaps)
    assert done.returncode == 2


async def test_open_ledger_kafka_keeps_snapshots_per_ledger(
    tansu: Tansu, topic: str, tmp_path: Path
) -> None:
    from quotaledger.events.ledger import Snapshot

    snaps = str(tmp_path / "shared.db")
    a = await open_ledger(tansu.url(topic + "-a"), create=True, snapshots=snaps)
    b = await open_ledger(tansu.url(topic + "-b"), create=True, snapshots=snaps)
    try:
        await a.save_snapshot(Snapshot(offset=0, blob=b"of a"))
        assert await b.load_snapshot() is None
        loaded = await a.load_snapshot()
        assert loaded is not None and loaded.blob == b"of a"
    finally:
        await a.close()
        await b.close()


def test_engine_stops_when_a_memory_broker_restarts(topic: str) -> None:
    """Fault (a) at the engine: `run` exits 2 with a clear error, no traceback."""
    broker = Tansu().start()
    try:
        url = broker.url(topic)
        assert cli("init", url).returncode == 0
        engine = subprocess.Popen(
            [sys.executable, "-m", "quotaledger.adapters.cli", "run", url, "--instance", "e"],
            stderr=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            text=True,
        )
        try:
            assert engine.stderr is not None
            for line in engine.stderr:  # pragma: no branch
                if "engine e running" in line:
                    break
            broker.restart()
            assert engine.wait(timeout=60) == 2
            err = engine.stderr.read()
        finally:
            if engine.poll() is None:
                engine.kill()
                engine.wait()
        assert "quotaledger: error:" in err and "refusing to" in err, err
        assert "Traceback" not in err
    finally:
        broker.close()


# ------------------------------------------------------------------ read-only


def _files(directory: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(directory.iterdir())}


async def _topics(tansu: Tansu) -> list[str]:
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=tansu.bootstrap)
    await admin.start()
    try:
        return list(await admin.list_topics())
    finally:
        await admin.close()


async def test_read_only_writes_nothing_anywhere(tansu: Tansu, topic: str, tmp_path: Path) -> None:
    """``open_ledger(kafka_url, read_only=True)`` (the read-only commands, DESIGN §9)
    creates no topic, refuses appends and snapshot saves with a clear error, reads
    an existing ``--snapshots`` file without changing a byte of it, and creates none
    when it is missing."""
    from quotaledger.events.ledger import Snapshot

    url = tansu.url(topic)
    for create in (False, True):
        with pytest.raises(LedgerError, match="no such topic"):
            await open_ledger(url, create=create, read_only=True)
    assert topic not in await _topics(tansu)

    snaps = tmp_path / "snaps" / "snapshots.db"
    snaps.parent.mkdir()
    writer = await open_ledger(url, create=True, snapshots=str(snaps), opened_at_ms=0)
    try:
        await writer.append([Append(b'{"kind":"NodeRemoved","name":"a"}', ts=5)] * 3)
        await writer.save_snapshot(Snapshot(offset=2, blob=b"two"))
    finally:
        await writer.close()
    before = _files(snaps.parent)
    reader = await open_ledger(url, create=True, read_only=True, snapshots=str(snaps))
    try:
        assert reader.ledger_id == writer.ledger_id
        assert await reader.load_snapshot() == Snapshot(offset=2, blob=b"two")
        with pytest.raises(LedgerError, match=r"is open read-only: cannot append to it"):
            await reader.append([Append(b'{"kind":"NodeRemoved","name":"b"}')])
        with pytest.raises(LedgerError, match=r"is open read-only: cannot save a snapshot"):
            await reader.save_snapshot(Snapshot(offset=3, blob=b"three"))
        assert [r.offset for r in await _read(reader)] == [0, 1, 2, 3]
    finally:
        await reader.close()
    after = _files(snaps.parent)
    assert after["snapshots.db"] == before["snapshots.db"]
    # SQLite's read-only mode may add the WAL index (-shm) and an empty -wal beside
    # it, as for a SQLite ledger read read-only; never data
    assert set(after) - set(before) <= {"snapshots.db-shm", "snapshots.db-wal"}
    assert after.get("snapshots.db-wal", b"") == before.get("snapshots.db-wal", b"")
    again = await open_ledger(url, create=False, snapshots=str(snaps))
    try:
        assert await again.last_offset() == 3
        assert await again.load_snapshot() == Snapshot(offset=2, blob=b"two")
    finally:
        await again.close()

    missing = tmp_path / "none" / "snapshots.db"
    missing.parent.mkdir()
    reader = await open_ledger(url, create=False, read_only=True, snapshots=str(missing))
    try:
        assert await reader.load_snapshot() is None
        with pytest.raises(LedgerError, match="read-only"):
            await reader.save_snapshot(Snapshot(offset=3, blob=b"three"))
    finally:
        await reader.close()
    assert list(missing.parent.iterdir()) == []
    # a file no snapshot was saved to yet holds none; a file that is not SQLite is named
    empty = tmp_path / "none" / "empty.db"
    empty.touch()
    reader = await open_ledger(url, create=False, read_only=True, snapshots=str(empty))
    try:
        assert await reader.load_snapshot() is None
    finally:
        await reader.close()
    assert empty.read_bytes() == b""
    junk = tmp_path / "none" / "junk.db"
    junk.write_bytes(b"not a database, " * 100)
    with pytest.raises(LedgerError, match=f"--snapshots {junk}: not a snapshot file"):
        await open_ledger(url, create=False, read_only=True, snapshots=str(junk))
    assert junk.read_bytes() == b"not a database, " * 100


async def _read(ledger: Any) -> list[Record]:
    out: list[Record] = []
    async for batch in ledger.read(0):
        out.extend(batch)
    return out
