"""The one-preemption-per-queue guard with two live engines on one ledger (DESIGN §6).

Two engine processes (election off: both propose, the projection's guard
decides) serve the same 200+ SQLite ledgers, each a randomized quota-decrease
scenario whose deadlines collide on a parent and its leaves. Each ledger is
then checked *without* ``projections/guard.py``'s bookkeeping: the projection
only says which decision records were accepted, and a simple independent walk
over the records checks that no queue is ever held by two running preemptions,
no pod is evicted twice, every accepted eviction has exactly one outcome and
every preemption finished. ``LeaderElected`` fencing has its own tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pytest

from quotaledger.adapters.ledgers.sqlite.ledger import SqliteLedger
from quotaledger.engine.core import EngineCore
from quotaledger.engine.executors import SimulateExecutor
from quotaledger.engine.live import LiveEngine
from quotaledger.events.codec import decode_event, encode_event
from quotaledger.events.ledger import Append, Record
from quotaledger.events.model import (
    Event,
    EvictionFailed,
    EvictionRequested,
    EvictionSucceeded,
    LeaderElected,
    LedgerOpened,
    PodRemoved,
    PodUpserted,
    PreemptionFinished,
    PreemptionStarted,
)
from quotaledger.projections import Projection
from quotaledger.projections.state import EvictionRun, ProjectedState
from tests.paths import TESTS

WORKER = TESTS / "engine_worker.py"
Fact = dict[str, Any]

# ------------------------------------------------------------------ processes


def spawn_worker(
    ledgers: Sequence[Path], instance: str, out: Path, *args: str
) -> subprocess.Popen[bytes]:
    """Start tests/engine_worker.py; its stdout goes to ``out``, stderr next to it."""
    with out.open("wb") as stdout, out.with_suffix(".err").open("wb") as stderr:
        return subprocess.Popen(
            [sys.executable, str(WORKER), *map(str, ledgers), "--instance", instance, *args],
            stdout=stdout,
            stderr=stderr,
        )


def worker_err(out: Path) -> str:
    path = out.with_suffix(".err")
    return path.read_text(errors="replace") if path.exists() else ""


def wait_ready(proc: subprocess.Popen[bytes], out: Path, timeout: float = 30.0) -> int:
    """Wait for the worker's ``ready`` line (fail if it exits first); return the
    wall-clock ms at which it was seen (at most 20 ms after it was written)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if "ready\n" in out.read_text(errors="replace").splitlines(keepends=True):
            return time.time_ns() // 1_000_000
        if proc.poll() is not None:
            raise AssertionError(f"worker exited {proc.returncode}: {worker_err(out)}")
        time.sleep(0.02)
    raise AssertionError(f"worker not ready after {timeout} s: {worker_err(out)}")


def stop_worker(proc: subprocess.Popen[bytes], out: Path, timeout: float = 30.0) -> None:
    """SIGTERM drains the engines; the worker must exit 0."""
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError(f"worker ignored SIGTERM: {worker_err(out)}") from None
    assert code == 0, f"worker exited {code}: {worker_err(out)}"


@contextlib.contextmanager
def reaped(procs: list[subprocess.Popen[bytes]]) -> Iterator[list[subprocess.Popen[bytes]]]:
    """Whatever happens, no worker outlives the test."""
    try:
        yield procs
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


# ------------------------------------------------------------------ ledgers


def encode_fact(fact: Fact) -> bytes:
    return msgspec.json.encode(fact)


async def _append_all(jobs: Sequence[tuple[Path, Sequence[Fact]]]) -> list[list[int]]:
    out = []
    for path, facts in jobs:
        ledger = await SqliteLedger.open(path)
        try:
            out.append(await ledger.append([Append(encode_fact(f)) for f in facts]))
        finally:
            await ledger.close()
    return out


def append_facts(jobs: Sequence[tuple[Path, Sequence[Fact]]]) -> list[list[int]]:
    """Append each ledger's facts as one batch at the wall clock (creating the ledger)."""
    return asyncio.run(_append_all(jobs))


def read_records(path: Path) -> list[Record]:
    """Every record of a SQLite ledger, read with plain ``sqlite3`` (readers never block)."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        rows = conn.execute("SELECT offset, ts, payload FROM records ORDER BY offset").fetchall()
    finally:
        conn.close()
    return [
        Record(offset, ts, payload.encode() if isinstance(payload, str) else payload)
        for offset, ts, payload in rows
    ]


def fold(records: Sequence[Record]) -> Projection:
    projection = Projection()
    for record in records:
        projection.apply_record(record)
    return projection


def quiescent(state: ProjectedState, now_ms: int, margin_ms: int = 300) -> bool:
    """No preemption running, no eviction outstanding, no deadline armed.

    A passed quota-decrease deadline is either answered (a preemption started)
    or, with an empty target, disarmed by the fold at a record the engine
    appends after it (§8 rule 21, DECISIONS 210): one still armed is work an
    engine failed to do, so it keeps the ledger busy (and the test times out
    naming it). So ``now_ms`` and ``margin_ms`` (a deadline's grace before it
    counted as missed) no longer matter: every armed deadline is work left.
    """
    del now_ms, margin_ms
    if state.preemptions or any(e.outcome is None for e in state.evictions.values()):
        return False
    return not state.decrease_deadlines


def wait_quiescent(
    paths: Sequence[Path],
    procs: Sequence[subprocess.Popen[bytes]],
    outs: Sequence[Path],
    timeout: float,
) -> None:
    busy = list(paths)
    deadline = time.monotonic() + timeout
    while busy:
        now = time.time_ns() // 1_000_000
        busy = [p for p in busy if not quiescent(fold(read_records(p)).state, now)]
        if not busy:
            return
        for proc, out in zip(procs, outs, strict=True):
            if proc.poll() is not None:
                raise AssertionError(f"worker exited {proc.returncode}: {worker_err(out)}")
        if time.monotonic() > deadline:
            details = []
            for path in busy[:5]:
                state = fold(read_records(path)).state
                details.append(
                    f"{path.name}: running={sorted(state.preemptions)} "
                    f"deadlines={state.decrease_deadlines} occupied={state.occupied}"
                )
            raise AssertionError(f"{len(busy)} ledgers never settled:\n" + "\n".join(details))
        time.sleep(0.3)


# ------------------------------------------------------------------ the check


@dataclass
class Checked:
    """What one ledger's independent check counted."""

    started: int = 0
    evictions: int = 0
    rejected: Counter[str] = field(default_factory=Counter)  # "Kind: reason head"
    evictions_by: Counter[str] = field(default_factory=Counter)  # accepted, per instance
    not_helpful: int = 0
    refused_all: int = 0  # finished not-helpful: the guard refused all its evictions
    stale_basis: int = 0  # started from a basis older than the queue's last release


def check_ledger(records: Sequence[Record]) -> Checked:
    """Walk the records with our own bookkeeping (not guard.py's) and assert:

    1. no queue is held by two running preemptions at once — a preemption holds
       its queue from its accepted ``PreemptionStarted``, and the queue of every
       pod it evicts from its accepted ``EvictionRequested``, until its accepted
       ``PreemptionFinished``;
    2. no pod gets two accepted evictions; every accepted eviction has exactly
       one outcome record (``EvictionSucceeded``/``EvictionFailed``), no outcome
       names an eviction that was never accepted, and each evicted pod has
       exactly one ``PodRemoved`` (the simulate executor's action);
    3. a preemption finishes only after all its evictions have an outcome, and
       every accepted ``PreemptionStarted`` has its ``PreemptionFinished``.

    The projection is used only to know which decision records it accepted.
    """
    projection = Projection()
    checked = Checked()
    pod_queue: dict[str, str] = {}
    holder: dict[str, str] = {}  # queue -> running preemption
    running: dict[str, list[str]] = {}  # preemption -> its accepted evictions
    accepted_evictions: dict[str, str] = {}  # eviction_id -> pod
    evicted_pods: set[str] = set()
    outcomes: Counter[str] = Counter()
    removed: Counter[str] = Counter()
    released: dict[str, int] = {}  # queue -> offset of the last PreemptionFinished freeing it
    for record in records:
        event: Event = decode_event(record.payload)
        accepted = projection.apply_record(record) is not None
        where = f"offset {record.offset}"
        if not accepted and not isinstance(event, LedgerOpened):
            reason = projection.state.rejected[-1].reason
            checked.rejected[f"{type(event).__name__}: {reason.split(':')[0]}"] += 1
        if isinstance(event, PodUpserted):
            assert event.quota is not None
            pod_queue[event.uid] = event.quota
        elif isinstance(event, PodRemoved):
            removed[event.uid] += 1
        elif isinstance(event, EvictionSucceeded | EvictionFailed):
            assert event.eviction_id in accepted_evictions, f"{where}: outcome of no eviction"
            outcomes[event.eviction_id] += 1
            assert outcomes[event.eviction_id] == 1, f"{where}: second outcome"
        elif isinstance(event, PreemptionStarted) and accepted:
            assert event.queue not in holder, (
                f"{where}: {event.preemption_id} starts on {event.queue!r} "
                f"held by {holder.get(event.queue)}"
            )
            holder[event.queue] = event.preemption_id
            running[event.preemption_id] = []
            checked.started += 1
            checked.stale_basis += event.basis < released.get(event.queue, -1)
        elif isinstance(event, EvictionRequested) and accepted:
            pid = event.preemption_id
            assert pid in running, f"{where}: eviction for {pid}, which is not running"
            queue = pod_queue[event.pod_uid]
            assert event.queue == queue, f"{where}: pod {event.pod_uid} is in {queue}"
            assert holder.get(queue, pid) == pid, (
                f"{where}: {pid} evicts from {queue!r} held by {holder[queue]}"
            )
            holder[queue] = pid
            assert event.pod_uid not in evicted_pods, f"{where}: {event.pod_uid} evicted twice"
            evicted_pods.add(event.pod_uid)
            assert event.eviction_id not in accepted_evictions
            accepted_evictions[event.eviction_id] = event.pod_uid
            running[pid].append(event.eviction_id)
            checked.evictions += 1
            checked.evictions_by[event.instance] += 1
        elif isinstance(event, PreemptionFinished) and accepted:
            pid = event.preemption_id
            assert pid in running, f"{where}: {pid} finishes but is not running"
            evictions = running.pop(pid)
            assert all(outcomes[e] == 1 for e in evictions), f"{where}: {pid} finished early"
            for queue in [q for q, p in holder.items() if p == pid]:
                del holder[queue]
                released[queue] = record.offset
            checked.not_helpful += event.outcome == "not-helpful"
            checked.refused_all += "refused by the guard" in event.reason
    assert not running, f"preemptions never finished: {sorted(running)}"
    assert not holder
    for eviction_id, uid in accepted_evictions.items():
        assert outcomes[eviction_id] == 1, f"{eviction_id}: {outcomes[eviction_id]} outcomes"
        assert removed[uid] == 1, f"pod {uid}: {removed[uid]} PodRemoved"
    return checked


# ------------------------------------------------------------------ scenarios

SETTINGS: Fact = {
    "kind": "SettingsChanged",
    "quota_preemption_enabled": True,
    "revoke_enabled": False,
    "reclaim_enabled": False,
}
NODE: Fact = {"kind": "NodeUpserted", "name": "n1", "allocatable": {"cpu": 1000}}


def cpu(milli: int) -> dict[str, str]:
    return {"cpu": f"{milli}m"} if milli else {}


def guard_scenario(seed: int) -> tuple[list[Fact], list[Fact]]:
    """(setup facts, decrease facts) of one randomized ledger.

    A parent ``p`` with 2-3 leaves (random mins), 3-10 running pods spread over
    the leaves; then one batch lowering the max of some leaves and/or the
    parent with nearly equal small delays, so the deadlines collide and the
    preemptions contend for the same queues.
    """
    rng = random.Random(seed)
    leaves = [f"l{k}" for k in range(rng.randint(2, 3))]
    mins = {leaf: rng.choice([0, 0, 1000, 2000]) for leaf in leaves}
    parent_min = sum(mins.values()) + rng.choice([0, 1000])
    delay = round(rng.uniform(0.05, 0.3), 3)
    configs: dict[str, Fact] = {
        "p": {
            "kind": "QuotaUpserted",
            "name": "p",
            "is_parent": True,
            "min": cpu(parent_min),
            "preemption_delay_s": delay,
        }
    }
    for leaf in leaves:
        configs[leaf] = {
            "kind": "QuotaUpserted",
            "name": leaf,
            "parent": "p",
            "min": cpu(mins[leaf]),
            "max": cpu(100_000),
            "preemption_delay_s": delay,
        }
    used = Counter[str]()
    pods = []
    for j in range(rng.randint(3, 10)):
        leaf = rng.choice(leaves)
        milli = rng.choice([500, 1000, 1500, 2000])
        used[leaf] += milli
        pods.append(
            {
                "kind": "PodUpserted",
                "uid": f"pod{j}",
                "name": f"pod{j}",
                "namespace": "team",
                "quota": leaf,
                "requests": cpu(milli),
                "priority": rng.randint(0, 3),
                "phase": "Running",
                "node": "n1",
                "created_at": rng.choice([None, f"2026-01-01T00:00:{rng.randint(0, 59):02d}Z"]),
            }
        )
    used["p"] = sum(used[leaf] for leaf in leaves)
    minimum = {"p": parent_min, **mins}
    lowered = rng.sample(["p", *leaves], rng.randint(1, len(leaves) + 1))
    if rng.random() < 0.6 and "p" not in lowered:
        lowered.append("p")  # the parent's split contends with its leaves
    decreases = []
    for name in lowered:
        low = minimum[name] + 1
        new_max = rng.randint(low, max(low, used[name] - 1))
        jitter = rng.choice([0.0, 0.0, 0.01, 0.03, 0.06, 0.1])
        decreases.append(
            {**configs[name], "max": cpu(new_max), "preemption_delay_s": delay + jitter}
        )
    return [SETTINGS, NODE, *configs.values(), *pods], decreases


# ------------------------------------------------------------------ the tests

SCENARIOS = 200
GUARD_WORKER_ARGS = ("--no-election", "--poll", "0.02", "--append-delay-ms", "0", "200")


@pytest.mark.slow
def test_two_engines_one_ledger_never_overlap_preemptions(tmp_path: Path) -> None:
    """(a) two engine processes, 200 ledgers: the guard keeps one preemption per queue."""
    paths = [tmp_path / f"g{i:03d}.db" for i in range(SCENARIOS)]
    scenarios = [guard_scenario(i) for i in range(SCENARIOS)]
    append_facts([(p, setup) for p, (setup, _) in zip(paths, scenarios, strict=True)])
    outs = [tmp_path / "engine-a.out", tmp_path / "engine-b.out"]
    with reaped([]) as procs:
        # each decision lands 0-200 ms after the state it was computed from, so
        # the engines often decide on states missing each other's latest writes
        for name, out in zip(("engine-a", "engine-b"), outs, strict=True):
            procs.append(spawn_worker(paths, name, out, *GUARD_WORKER_ARGS))
        for proc, out in zip(procs, outs, strict=True):
            wait_ready(proc, out, timeout=60)
        # both engines are following every ledger when the decreases land
        append_facts([(p, dec) for p, (_, dec) in zip(paths, scenarios, strict=True)])
        wait_quiescent(paths, procs, outs, timeout=90)
        for proc, out in zip(procs, outs, strict=True):
            stop_worker(proc, out)

    total = Checked()
    for path in paths:
        records = read_records(path)
        try:
            checked = check_ledger(records)
        except AssertionError as exc:
            raise AssertionError(f"{path.name}: {exc}") from exc
        assert quiescent(fold(records).state, time.time_ns() // 1_000_000, margin_ms=0)
        total.started += checked.started
        total.evictions += checked.evictions
        total.not_helpful += checked.not_helpful
        total.refused_all += checked.refused_all
        total.stale_basis += checked.stale_basis
        total.rejected.update(checked.rejected)
        total.evictions_by.update(checked.evictions_by)
    print(
        f"\n{SCENARIOS} ledgers: {total.started} preemptions ({total.not_helpful} not-helpful, "
        f"{total.refused_all} of them with every eviction refused; {total.stale_basis} "
        "started from a basis older than their queue's last release), "
        f"{total.evictions} evictions {dict(total.evictions_by)}; "
        f"refused by the guard: {dict(total.rejected)}"
    )
    # not trivial: hundreds of preemptions, and the two engines really raced
    assert total.started >= SCENARIOS
    assert total.evictions >= SCENARIOS
    assert set(total.evictions_by) == {"engine-a", "engine-b"}
    # (identical proposals collide on their id; different ones on an occupied queue)
    assert total.rejected["PreemptionStarted: preemption_id"] > 0, total.rejected
    assert total.rejected["PreemptionStarted: queue"] > 0, total.rejected


# ------------------------------------------------------------------ fencing

T0 = 1_767_225_600_000


def fenced_projection() -> tuple[Projection, int]:
    """One leaf ``q`` over its lowered max (deadline armed) and a free leaf ``r``."""
    facts: list[Fact] = [
        SETTINGS,
        NODE,
        {"kind": "QuotaUpserted", "name": "q", "max": cpu(10_000), "preemption_delay_s": 1},
        {"kind": "QuotaUpserted", "name": "r", "max": cpu(10_000), "preemption_delay_s": 1},
    ]
    for j, queue in enumerate(["q", "q", "q", "r", "r"]):
        facts.append(
            {
                "kind": "PodUpserted",
                "uid": f"{queue}{j}",
                "name": f"{queue}{j}",
                "namespace": "team",
                "quota": queue,
                "requests": cpu(3000),
                "phase": "Running",
                "node": "n1",
            }
        )
    facts.append({"kind": "QuotaUpserted", "name": "q", "max": cpu(5000), "preemption_delay_s": 1})
    projection = Projection()
    projection.apply(0, T0, LedgerOpened(ledger_id="fence"))
    for offset, fact in enumerate(facts, start=1):
        assert projection.apply(offset, T0, decode_event(encode_fact(fact)))
    return projection, T0 + 1000


def test_leader_epochs_fence_a_stale_writer() -> None:
    projection, deadline = fenced_projection()
    state = projection.state

    def apply(event: Event) -> bool:
        return projection.apply(state.offset + 1, deadline, event)

    assert apply(LeaderElected(epoch=1, instance="A"))
    a = EngineCore(projection, instance="A", epoch=1)
    [timer] = a.due(deadline)
    proposal = a.propose(timer)
    assert [type(e) for e in proposal] == [PreemptionStarted, EvictionRequested, EvictionRequested]
    assert all(apply(e) for e in proposal)
    a_evictions = sorted(e.eviction_id for e in proposal if isinstance(e, EvictionRequested))

    assert apply(LeaderElected(epoch=2, instance="B"))
    assert not apply(LeaderElected(epoch=2, instance="C"))  # an epoch must be newer
    assert "not newer" in state.rejected[-1].reason
    b = EngineCore(projection, instance="B", epoch=2)

    # A, fenced, writes on under epoch 1: refused, whatever the queue's state
    stale_start = PreemptionStarted(
        preemption_id="quota-decrease/r/99", queue="r", cause="quota-decrease",
        target={"cpu": 1000}, basis=state.offset, epoch=1,
    )  # fmt: skip
    assert not apply(stale_start)
    assert "stale leader epoch 1 < 2" in state.rejected[-1].reason
    running = proposal[0]
    assert isinstance(running, PreemptionStarted)
    stale_eviction = EvictionRequested(
        eviction_id=f"{running.preemption_id}/q2",
        preemption_id=running.preemption_id,
        pod_uid="q2",
        queue="q",
        epoch=1,
        instance="A",
    )
    assert not apply(stale_eviction)
    assert "stale leader epoch" in state.rejected[-1].reason
    assert "r" not in state.occupied and "q2" not in state.evicting_pods

    # B, the leader, takes over A's outstanding epoch-1 evictions; A is no leader
    assert sorted(e.eviction_id for e in b.outstanding(mine_only=True)) == a_evictions
    assert a.epoch != state.leader_epoch
    # a third instance under an older epoch than the newest takes over nothing
    assert EngineCore(projection, instance="C", epoch=1).outstanding(mine_only=True) == []
    # B drives them and finishes A's preemption under its own epoch
    for eviction in b.outstanding(mine_only=True):
        assert apply(EvictionSucceeded(eviction_id=eviction.eviction_id))
        assert apply(PodRemoved(uid=eviction.pod_uid))
    [finished] = b.finished()
    assert finished.epoch == 2 and finished.preemption_id == running.preemption_id
    assert apply(finished)
    assert state.preemptions == {} and state.occupied == {}


class StuckExecutor:
    """Never answers: its evictions stay outstanding until another engine drives them."""

    def __init__(self) -> None:
        self.called = asyncio.Event()
        self.evictions: list[str] = []

    async def evict(self, eviction: EvictionRun, state: ProjectedState) -> list[Event]:
        self.evictions.append(eviction.eviction_id)
        self.called.set()
        await asyncio.Event().wait()
        return []


async def _wait_for(predicate: Any, timeout: float = 30.0) -> None:
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.01)


class Engines:
    """Runs live engines as tasks; on exit sets their stop events and fails (rather
    than hangs) if one of them does not return within 30 s (a hang guard: how fast
    a stop is, is measured by the shutdown tests)."""

    def __init__(self) -> None:
        self.stops: list[asyncio.Event] = []
        self.tasks: list[asyncio.Task[None]] = []

    def start(self, engine: LiveEngine, ready: Any = None) -> asyncio.Event:
        stop = asyncio.Event()
        self.stops.append(stop)
        self.tasks.append(asyncio.create_task(engine.run(stop, ready)))
        return stop

    async def __aenter__(self) -> Engines:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        for stop in self.stops:
            stop.set()
        done, pending = await asyncio.wait(self.tasks, timeout=30)
        if pending:
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()
            raise AssertionError("an engine did not stop within 30 s of its stop event")
        for task in done:
            task.result()  # an engine's failure


async def test_new_leader_takes_over_a_stale_engines_evictions(tmp_path: Path) -> None:
    """Live: A (epoch 1) hangs in its executor; B elected with epoch 2 drives A's
    evictions once, finishes the preemption, and A's epoch-1 writes are refused."""
    path = tmp_path / "fence.db"
    setup: list[Fact] = [
        SETTINGS,
        NODE,
        {"kind": "QuotaUpserted", "name": "q", "max": cpu(10_000), "preemption_delay_s": 0.1},
        *(
            {
                "kind": "PodUpserted",
                "uid": uid,
                "name": uid,
                "namespace": "team",
                "quota": "q",
                "requests": cpu(3000),
                "phase": "Running",
                "node": "n1",
            }
            for uid in ("q0", "q1", "q2")
        ),
    ]
    ledger_a = await SqliteLedger.open(path, poll_interval=0.01)
    ledger_b = await SqliteLedger.open(path, poll_interval=0.01)
    stuck = StuckExecutor()
    a = LiveEngine(ledger_a, stuck, instance="A", idle_poll_s=0.05)
    b = LiveEngine(ledger_b, SimulateExecutor(), instance="B", idle_poll_s=0.05)
    try:
        await ledger_a.append([Append(encode_fact(f)) for f in setup])
        async with Engines() as engines:
            engines.start(a)
            await _wait_for(lambda: a.core.epoch == 1)
            lowered = {**setup[2], "max": cpu(5000)}
            await ledger_a.append([Append(encode_fact(lowered))])
            await asyncio.wait_for(stuck.called.wait(), 30)
            await _wait_for(lambda: len(stuck.evictions) == 2)
            assert len(a.state.preemptions) == 1

            engines.start(b)
            await _wait_for(lambda: b.core.epoch == 2 and not b.state.preemptions)
            await _wait_for(lambda: not a.state.preemptions)
            assert not a.is_leader() and b.is_leader()
            # the fenced engine's late proposal is refused
            stale = PreemptionStarted(
                preemption_id="quota-decrease/q/late", queue="q", cause="quota-decrease",
                target={"cpu": 1000}, basis=a.state.offset, epoch=1,
            )  # fmt: skip
            [offset] = await ledger_a.append([Append(encode_event(stale))])
            await a.applied_through(offset)
            assert a.state.rejected[-1].offset == offset
            assert "stale leader epoch 1 < 2" in a.state.rejected[-1].reason
    finally:
        await ledger_a.close()
        await ledger_b.close()
    records = read_records(path)
    checked = check_ledger(records)
    assert checked.started == 1 and checked.evictions_by == Counter({"A": 2})
    events = [decode_event(r.payload) for r in records]
    [finished] = [e for e in events if isinstance(e, PreemptionFinished)]
    assert finished.epoch == 2 and finished.outcome == "complete"
    assert sorted(stuck.evictions) == sorted(
        e.eviction_id for e in events if isinstance(e, EvictionSucceeded)
    )


# ------------------------------------------------------------------ races, one by one


def contended_projection() -> tuple[Projection, int]:
    """Parent ``p`` with leaf ``l0`` (three 2-cpu pods) and an empty leaf ``l1``; the
    maxes of ``p`` and ``l0`` are lowered at once, so both deadlines fall at ``now``."""
    delay = {"preemption_delay_s": 1}
    facts: list[Fact] = [
        SETTINGS,
        NODE,
        {"kind": "QuotaUpserted", "name": "p", "is_parent": True, **delay},
        {"kind": "QuotaUpserted", "name": "l0", "parent": "p", "max": cpu(100_000), **delay},
        {"kind": "QuotaUpserted", "name": "l1", "parent": "p", "max": cpu(100_000), **delay},
    ]
    for uid in ("x", "y", "z"):
        facts.append(
            {
                "kind": "PodUpserted",
                "uid": uid,
                "name": uid,
                "namespace": "team",
                "quota": "l0",
                "requests": cpu(2000),
                "phase": "Running",
                "node": "n1",
            }
        )
    facts += [
        {**facts[3], "max": cpu(3000)},  # l0: target 3 cpu, two victims
        {**facts[2], "max": cpu(1000)},  # p: target 5 cpu, all three pods of l0
    ]
    projection = Projection()
    projection.apply(0, T0, LedgerOpened(ledger_id="race"))
    for offset, fact in enumerate(facts, start=1):
        assert projection.apply(offset, T0, decode_event(encode_fact(fact)))
    return projection, T0 + 1000


def apply_all(projection: Projection, now: int, events: Sequence[Event]) -> list[bool]:
    state = projection.state
    return [projection.apply(state.offset + 1, now, event) for event in events]


def timer_of(core: EngineCore, now: int, queue: str) -> Any:
    [timer] = [t for t in core.due(now) if t.queue == queue]
    return timer


def test_preemption_whose_evictions_were_all_refused_finishes_not_helpful() -> None:
    """A and B decide on the same state: B preempts leaf l0, A the parent p, whose
    victims are all in l0. B's batch lands first; A's PreemptionStarted is accepted
    (p is free) but the guard refuses each of its evictions. The preemption must
    still finish, once A's whole batch is known to be applied."""
    projection, now = contended_projection()
    state = projection.state
    a, b = EngineCore(projection, instance="A"), EngineCore(projection, instance="B")
    leaf = b.propose(timer_of(b, now, "l0"))
    parent = a.propose(timer_of(a, now, "p"))
    assert [e.pod_uid for e in parent if isinstance(e, EvictionRequested)] == ["x", "y", "z"]
    assert all(apply_all(projection, now, leaf))
    assert apply_all(projection, now, parent) == [True, False, False, False]
    reasons = [r.reason for r in state.rejected[-3:]]
    assert all("already being evicted" in r or "occupied" in r for r in reasons), reasons
    started = parent[0]
    assert isinstance(started, PreemptionStarted)
    pid = started.preemption_id
    assert state.preemptions[pid].evictions == []

    # until the proposer's batch is known to be whole, more evictions could follow
    assert [f.preemption_id for f in a.finished()] == []
    a.sealed_through = state.offset
    [finished] = a.finished()
    assert finished.preemption_id == pid and finished.outcome == "not-helpful"
    assert finished.reason == "every eviction was refused by the guard"
    assert apply_all(projection, now, [finished]) == [True]
    assert isinstance(leaf[0], PreemptionStarted)
    assert state.occupied == {"l0": leaf[0].preemption_id}


def test_timer_of_an_occupied_queue_waits_instead_of_being_dropped() -> None:
    """§8 rule 34: a timer found due while its queue is occupied (a due list
    computed before the last decision) is not spent; it fires once the queue is free."""
    projection, now = contended_projection()
    a = EngineCore(projection, instance="A")
    due = a.due(now)
    assert [t.queue for t in due] == ["l0", "p"] or [t.queue for t in due] == ["p", "l0"]
    leaf_timer = timer_of(a, now, "l0")
    parent = a.propose(timer_of(a, now, "p"))
    assert all(apply_all(projection, now, parent))  # p evicts from l0: l0 is occupied
    assert a.propose(leaf_timer) == []
    assert a.due(now) == []  # waiting, not handled
    # the parent's evictions fail: p finishes and l0's timer fires on today's state
    outcomes = [
        EvictionFailed(eviction_id=e.eviction_id, error="PDB")
        for e in parent
        if isinstance(e, EvictionRequested)
    ]
    assert all(apply_all(projection, now, outcomes))
    assert all(apply_all(projection, now, a.finished()))
    assert a.due(now) == [leaf_timer]
    started = a.propose(leaf_timer)
    assert isinstance(started[0], PreemptionStarted) and started[0].queue == "l0"


def test_proposal_refused_for_an_occupied_queue_reopens_its_timer() -> None:
    """B decides for l0 while A's parent preemption, not yet visible to B, takes
    l0's pods: B's PreemptionStarted is refused and its timer waits for the queue."""
    projection, now = contended_projection()
    state = projection.state
    a, b = EngineCore(projection, instance="A"), EngineCore(projection, instance="B")
    leaf_timer = timer_of(b, now, "l0")
    leaf = b.propose(leaf_timer)
    parent = a.propose(timer_of(a, now, "p"))
    assert all(apply_all(projection, now, parent))
    assert not any(apply_all(projection, now, leaf))
    assert "occupied" in state.rejected[-len(leaf)].reason
    b.reopen_if_refused(leaf_timer, leaf)
    assert b.due(now) == []  # waits for p
    failed = [
        EvictionFailed(eviction_id=e.eviction_id, error="PDB")
        for e in parent
        if isinstance(e, EvictionRequested)
    ]
    assert all(apply_all(projection, now, failed))
    assert all(apply_all(projection, now, b.finished()))
    assert b.due(now) == [leaf_timer]

    # an identical proposal refused as a duplicate stays spent: the deadline was answered
    again = b.propose(leaf_timer)
    twin = a.propose(timer_of(a, now, "l0"))
    assert twin[0] == again[0]  # same basis, same preemption id
    assert all(apply_all(projection, now, twin))
    assert not any(apply_all(projection, now, again))
    b.reopen_if_refused(leaf_timer, again)
    assert "l0" not in state.decrease_deadlines and b.due(now) == []


class CountingRounds(LiveEngine):
    """A live engine that counts its reconciler's rounds (each asks, twice, whether it
    leads: once to choose its wait, once after it) and notes, for every step it
    completed, the offset of the state the step started from."""

    checks: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        self.steps: list[int] = []

    def _check_leading(self) -> bool:
        self.checks += 1
        return super()._check_leading()

    async def step(self, group: asyncio.TaskGroup) -> None:
        started_at = self.state.offset
        await super().step(group)
        self.steps.append(started_at)


async def test_a_follower_does_not_spin_on_a_due_timer(tmp_path: Path) -> None:
    """An engine that lost the election fires no timer, so it must not wake for one:
    with a due deadline it would otherwise loop without sleeping. Counted in rounds,
    not CPU time: a round sleeps up to the idle poll (0.1 s) unless woken by a batch
    read, so an interval of ``t`` seconds holds at most ``t / 0.1`` rounds plus the
    wake-ups, however loaded the machine; a spinning loop makes thousands."""
    path = tmp_path / "follower.db"
    queue: Fact = {"kind": "QuotaUpserted", "name": "q", "max": cpu(10_000)}
    pod: Fact = {
        "kind": "PodUpserted",
        "uid": "p0",
        "name": "p0",
        "namespace": "team",
        "quota": "q",
        "requests": cpu(3000),
        "phase": "Running",
        "node": "n1",
    }
    lowered = {**queue, "max": cpu(1000), "preemption_delay_s": 0.2}
    ledger = await SqliteLedger.open(path, poll_interval=0.01)
    engine = CountingRounds(ledger, SimulateExecutor(), instance="A", idle_poll_s=0.1)

    async def lose_the_election() -> None:
        [offset] = await ledger.append([Append(encode_event(LeaderElected(2, "B")))])
        await engine.applied_through(offset)

    try:
        await ledger.append([Append(encode_fact(f)) for f in (SETTINGS, NODE, queue, pod)])
        async with Engines() as engines:
            engines.start(engine, lose_the_election)
            await _wait_for(lambda: engine.state.leader_epoch == 2)
            [offset_of_lowered] = await ledger.append([Append(encode_fact(lowered))])
            await _wait_for(lambda: engine.state.decrease_deadlines != {})
            await asyncio.sleep(0.3)  # the deadline is due now
            assert engine.core.pending() != []
            checks_before, wall_before = engine.checks, time.monotonic()
            await asyncio.sleep(0.5)
            rounds = (engine.checks - checks_before) / 2
            elapsed = time.monotonic() - wall_before
            assert engine.state.offset == offset_of_lowered  # no batch woke it meanwhile
        assert rounds <= elapsed / 0.1 + 2, f"{rounds:.0f} reconciler rounds in {elapsed:.2f} s"
        assert not engine.state.preemptions and engine.state.decrease_deadlines
    finally:
        await ledger.close()
