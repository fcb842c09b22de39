"""Faults on a real Kafka-protocol broker (tansu), DESIGN §3, §6, §10.

(b) the broker on s3 storage (a local moto server) is SIGKILLed during appends and
    while the engine follows: the engine reconnects, no acknowledged fact is lost,
    records duplicated by retries change no state and no eviction runs twice;
(c) two engines on one Kafka ledger: never two preemptions on one queue, never one
    eviction executed twice.
(a), the memory-storage restart, is in test_kafka_ledger.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence

import msgspec
import pytest

from quotaledger.adapters.ledgers.kafka.ledger import KafkaLedger
from quotaledger.engine.executors import SimulateExecutor
from quotaledger.engine.live import LiveEngine
from quotaledger.events.codec import decode_event
from quotaledger.events.ledger import Append, Record
from quotaledger.events.model import (
    Event,
    EvictionRequested,
    NodeUpserted,
    PreemptionFinished,
    PreemptionStarted,
)
from quotaledger.projections import Projection
from quotaledger.projections.state import EvictionRun, ProjectedState
from tests.engine.test_engine_guard import check_ledger, guard_scenario, quiescent
from tests.tansu import Moto, Tansu

Fact = dict[str, object]


class CountingExecutor(SimulateExecutor):
    """The simulate executor, counting how often each eviction is executed."""

    def __init__(self, counts: Counter[str], ledger: str) -> None:
        self.counts = counts
        self.ledger = ledger

    async def evict(self, eviction: EvictionRun, state: ProjectedState) -> list[Event]:
        self.counts[f"{self.ledger}:{eviction.eviction_id}"] += 1
        return await super().evict(eviction, state)


#: How long a reader waits at a skip before it fills it (DECISIONS 200): the holes a
#: broker SIGKILL leaves are permanent, and waiting the default 60 s at each is slow.
PATIENCE_S = 10.0


async def read_records(bootstrap: str, topic: str) -> list[Record]:
    ledger = await KafkaLedger.open(
        bootstrap, topic, create=False, gaps="fill", gap_patience_s=PATIENCE_S
    )
    try:
        out: list[Record] = []
        async for batch in ledger.read(0):
            out.extend(batch)
        return out
    finally:
        await ledger.close()


def fold(records: Sequence[Record]) -> Projection:
    projection = Projection()
    for record in records:
        projection.apply_record(record)
    return projection


@contextlib.asynccontextmanager
async def engines_running(
    bootstrap: str, topic: str, names: Sequence[str], counts: Counter[str], election: bool
) -> AsyncIterator[list[LiveEngine]]:
    """Live engines (one ledger handle each) on ``topic`` until the block ends."""
    stop = asyncio.Event()
    handles = [
        await KafkaLedger.open(bootstrap, topic, poll_ms=50, gaps="fill", gap_patience_s=PATIENCE_S)
        for _ in names
    ]
    engines = [
        LiveEngine(
            handle,
            CountingExecutor(counts, topic),
            instance=name,
            election=election,
            idle_poll_s=0.05,
        )
        for handle, name in zip(handles, names, strict=True)
    ]
    ready = asyncio.Semaphore(0)

    async def announce() -> None:
        ready.release()

    tasks = [asyncio.create_task(e.run(stop, announce)) for e in engines]
    try:
        for _ in engines:
            async with asyncio.timeout(60):
                await ready.acquire()
        yield engines
    finally:
        stop.set()
        for task in tasks:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, 30)
        for handle in handles:
            await handle.close()
        for task in tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]


async def wait_until(check: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if await check():  # type: ignore[operator]
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


def encode(fact: Fact) -> bytes:
    return msgspec.json.encode(fact)


# ------------------------------------------------------------------ (c) two engines

SCENARIOS = 50
AT_ONCE = 10


async def one_guard_scenario(tansu: Tansu, seed: int, counts: Counter[str]) -> object:
    topic = f"guard-{seed}-{random.randrange(1 << 30)}"
    setup, decreases = guard_scenario(seed)
    writer = await KafkaLedger.open(tansu.bootstrap, topic, poll_ms=50)
    try:
        await writer.append([Append(encode(f)) for f in setup])
        async with engines_running(tansu.bootstrap, topic, ["engine-a", "engine-b"], counts, False):
            await writer.append([Append(encode(f)) for f in decreases])

            async def settled() -> bool:
                now = time.time_ns() // 1_000_000
                return quiescent(fold(await read_records(tansu.bootstrap, topic)).state, now)

            await wait_until(settled, 90, f"scenario {seed} to settle")
    finally:
        await writer.close()
    records = await read_records(tansu.bootstrap, topic)
    try:
        return check_ledger(records)
    except AssertionError as exc:
        raise AssertionError(f"scenario {seed}: {exc}") from exc


@pytest.mark.slow
async def test_two_engines_on_one_kafka_ledger(tansu: Tansu) -> None:
    counts: Counter[str] = Counter()
    started = evictions = 0
    by: Counter[str] = Counter()
    for first in range(0, SCENARIOS, AT_ONCE):
        results = await asyncio.gather(
            *(one_guard_scenario(tansu, 1000 + s, counts) for s in range(first, first + AT_ONCE))
        )
        for checked in results:
            started += checked.started  # type: ignore[attr-defined]
            evictions += checked.evictions  # type: ignore[attr-defined]
            by.update(checked.evictions_by)  # type: ignore[attr-defined]
    twice = {eid: n for eid, n in counts.items() if n != 1}
    assert not twice, f"evictions executed more than once: {twice}"
    assert started >= SCENARIOS and evictions >= SCENARIOS
    assert sum(counts.values()) == evictions
    assert set(by) == {"engine-a", "engine-b"}, by  # both engines really acted


# ------------------------------------------------------------------ (b) broker SIGKILL

TRIALS = 20
SETUP: list[Fact] = [
    {
        "kind": "SettingsChanged",
        "quota_preemption_enabled": True,
        "revoke_enabled": False,
        "reclaim_enabled": False,
    },
    {"kind": "NodeUpserted", "name": "node-1", "allocatable": {"cpu": "32"}},
    {
        "kind": "QuotaUpserted",
        "name": "q",
        "min": {"cpu": "1"},
        "max": {"cpu": "30"},
        "preemption_delay_s": 0.05,
    },
    *(
        {
            "kind": "PodUpserted",
            "uid": f"p{i}",
            "name": f"p{i}",
            "namespace": "q",
            "requests": {"cpu": "2"},
            "phase": "Running",
            "node": "node-1",
            "created_at": f"2026-01-01T00:00:{i:02d}Z",
        }
        for i in range(6)
    ),
]
LOWER: Fact = {
    "kind": "QuotaUpserted",
    "name": "q",
    "min": {"cpu": "1"},
    "max": {"cpu": "7"},
    "preemption_delay_s": 0.05,
}


@pytest.fixture(scope="module")
def s3_tansu() -> object:
    moto = Moto().start()
    broker = Tansu(storage="s3://tansu/", env=moto.tansu_env()).start()
    try:
        yield broker
    finally:
        broker.close()
        moto.stop()


async def one_kill_trial(broker: Tansu, trial: int) -> tuple[int, int]:
    """One topic: facts appended in a loop while the broker is killed and restarted;
    a quota decrease lands around the kill. Returns (retries, duplicate records)."""
    rng = random.Random(trial)
    topic = f"kill-{trial}-{rng.randrange(1 << 30)}"
    counts: Counter[str] = Counter()
    writer = await KafkaLedger.open(
        broker.bootstrap, topic, poll_ms=50, gaps="fill", gap_patience_s=PATIENCE_S
    )
    acked: list[str] = []
    try:
        await writer.append([Append(encode(f)) for f in SETUP])
        async with engines_running(broker.bootstrap, topic, ["engine"], counts, True) as engines:
            engine = engines[0]

            async def produce(first: int, n: int) -> None:
                for i in range(first, first + n):
                    name = f"extra-{i}"
                    await writer.append(
                        [
                            Append(
                                encode(
                                    {
                                        "kind": "NodeUpserted",
                                        "name": name,
                                        "allocatable": {"cpu": "0"},
                                    }
                                )
                            )
                        ]
                    )
                    acked.append(name)  # acknowledged: must be in the ledger

            during_follow = trial % 2 == 1
            if during_follow:
                await writer.append([Append(encode(LOWER))])
                await wait_until(
                    lambda: _true(bool(engine.state.finished_preemptions)), 60, "preemption"
                )
                await asyncio.sleep(rng.uniform(0.0, 0.3))
                broker.kill()  # the engine is idle, following
                await asyncio.sleep(rng.uniform(0.05, 0.3))
                broker.start()
                await produce(0, 20)
            else:
                producing = asyncio.create_task(produce(0, 40))
                await asyncio.sleep(rng.uniform(0.0, 0.2))
                await writer.append([Append(encode(LOWER))])
                await asyncio.sleep(rng.uniform(0.0, 0.2))
                broker.kill()  # appends (facts, the engine's decisions) in flight
                await asyncio.sleep(rng.uniform(0.05, 0.3))
                broker.start()
                await producing

            async def caught_up() -> bool:
                state = engine.state
                return (
                    bool(state.finished_preemptions)
                    and not state.preemptions
                    and all(f"extra-{i}" in state.nodes for i in range(len(acked)))
                )

            # a hang guard: every request the kill cut off waits out its 10 s request
            # timeout before it is retried, several in a row on a loaded machine (one
            # trial took 35 s with two busy loops on its core, 2 s on an idle one)
            await wait_until(caught_up, 300, f"trial {trial}: the engine to catch up")
        retries = writer.append_retries
    finally:
        await writer.close()
    records = await read_records(broker.bootstrap, topic)
    events = [decode_event(r.payload) for r in records]
    names = Counter(e.name for e in events if isinstance(e, NodeUpserted))
    lost = [n for n in acked if names[n] == 0]
    assert not lost, f"trial {trial}: acknowledged facts lost: {lost}"
    twice = {eid: n for eid, n in counts.items() if n != 1}
    assert not twice, f"trial {trial}: evictions executed twice: {twice}"
    # every accepted decision is unique; copies were refused and changed nothing
    projection = Projection()
    accepted: Counter[str] = Counter()
    for record, event in zip(records, events, strict=True):
        if projection.apply_record(record) is not None and isinstance(
            event, PreemptionStarted | EvictionRequested | PreemptionFinished
        ):
            key = getattr(event, "eviction_id", None) or event.preemption_id
            accepted[f"{type(event).__name__}:{key}"] += 1
    assert all(n == 1 for n in accepted.values()), accepted
    state = projection.state
    assert not state.preemptions and state.finished_preemptions
    duplicates = sum(n - 1 for n in names.values() if n > 1)
    holes = sum(1 for r in records if r.payload.startswith(b'{"kind":"FactRejected"'))
    return retries + holes * 1000, duplicates


async def _true(value: bool) -> bool:
    return value


@pytest.mark.slow
async def test_broker_sigkill_on_s3_storage(s3_tansu: Tansu) -> None:
    retries = duplicates = holes = 0
    for trial in range(TRIALS):
        r, d = await one_kill_trial(s3_tansu, trial)
        retries += r % 1000
        holes += r // 1000
        duplicates += d
    print(
        f"\n{TRIALS} kills: {retries} appends retried by the ledger, {duplicates} duplicated"
        f" fact records, {holes} offsets left without a record (filled)"
    )
    # the kills really hit appends in flight: aiokafka or the ledger resent them
    assert duplicates + holes + retries > 0
