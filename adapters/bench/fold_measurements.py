"""The measurements of ``quotaledger bench fold`` (the figures, their meaning and their
targets are in :mod:`.fold`): decoding and folding the workload's records, the settle and
the full recompute, one pod change and the read of its leaf's runtime, memory per pod
(tracemalloc), the SQLite ledger's append and read with a live engine leaving its
checkpoints (DECISIONS 160), ``replay`` and ``audit`` through the CLI in new processes, the
digest chain alone (DESIGN §9, DECISIONS 172) and the state hash (DESIGN §5 "State hash",
DECISIONS 232). They return raw figures (seconds, bytes); the report makes rates and rounds.
"""

from __future__ import annotations

import asyncio
import gc
import random
import statistics
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from quotaledger.engine.executors import SimulateExecutor
from quotaledger.engine.live import LiveEngine
from quotaledger.events.codec import decode_event
from quotaledger.events.ledger import Record
from quotaledger.projections import Projection, recompute_all
from quotaledger.projections.snapshot import dump
from quotaledger.projections.state_digest import forget, full_state_hash, state_hash

from ..ledgers.sqlite.ledger import SqliteLedger
from .workload import BASE_TS, Clock, Workload

_ENCODE = msgspec.json.Encoder().encode


def measure_decode(
    payloads: Sequence[bytes], runs: int = 3, decode: Callable[[bytes], Any] = decode_event
) -> float:
    """Seconds of the best run decoding every payload (no fold)."""
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        for payload in payloads:
            decode(payload)
        best = min(best, time.perf_counter() - start)
    return best


def fold_records(projection: Projection, records: Sequence[Record]) -> float:
    """Seconds to apply ``records`` in order."""
    apply_record = projection.apply_record
    start = time.perf_counter()
    for record in records:
        apply_record(record)
    return time.perf_counter() - start


def measure_fold(
    work: Workload, max_runs: int = 3, budget_s: float = 60.0
) -> tuple[float, float, int, Projection]:
    """Fold setup then churn, again while a run is cheap (the runs so far took
    less than ``budget_s`` in all). The first run folds the setup pods under
    tracemalloc (see :func:`fold_pods_traced`). Returns (best churn seconds,
    bytes per pod, runs, the projection of the last run)."""
    best = float("inf")
    bytes_per_pod = 0.0
    spent = 0.0
    runs = 0
    projection = Projection()
    while runs < max_runs and (runs == 0 or spent < budget_s):
        projection = Projection()
        start = time.perf_counter()
        fold_records(projection, work.config)
        if runs == 0:
            bytes_per_pod = fold_pods_traced(projection, work.pods)
        else:
            fold_records(projection, work.pods)
        churn_s = fold_records(projection, work.churn)
        best = min(best, churn_s)
        spent += time.perf_counter() - start
        runs += 1
    return best, bytes_per_pod, runs, projection


def measure_full_recompute(projection: Projection, runs: int = 5) -> float:
    """Median ms of ``recompute_all`` over the whole tree."""
    state = projection.settled()
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        recompute_all(state)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1000


def _wire_requests(requests: dict[str, int], cpu_delta: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in requests.items():
        if key == "cpu":
            out[key] = f"{max(1, value + cpu_delta)}m"
        else:
            out[key] = value
    if "cpu" not in out:
        out["cpu"] = f"{max(1, cpu_delta)}m"
    return out


def measure_incremental(
    projection: Projection, work: Workload, samples: int = 1000, seed: int = 1
) -> list[float]:
    """Seconds of each sample: apply one request change, then read the leaf's runtime."""
    state = projection.settled()
    leaves = set(work.leaves)
    candidates = sorted(uid for uid, quota in state.pod_quota.items() if quota in leaves)
    if not candidates:
        raise ValueError("no active pod in a leaf quota to change")
    rng = random.Random(seed)
    clock = Clock()
    times = []
    apply_record = projection.apply_record
    for i in range(samples):
        uid = rng.choice(candidates)
        pod = state.pods[uid]
        leaf = state.pod_quota[uid]
        ts = state.ts + 1
        doc = {
            "kind": "PodUpserted",
            "uid": uid,
            "name": pod.name,
            "namespace": pod.namespace,
            "requests": _wire_requests(pod.requests, 100 if i % 2 == 0 else -100),
            "priority": pod.priority,
            "phase": pod.phase,
            "node": pod.node,
            "labels": pod.labels,
            "at": clock.at(ts),
        }
        record = Record(offset=state.offset + 1, ts=ts, payload=_ENCODE(doc))
        start = time.perf_counter()
        apply_record(record)
        projection.settled().quotas[leaf].runtime  # noqa: B018 - the read being timed
        times.append(time.perf_counter() - start)
    return times


def fold_pods_traced(projection: Projection, pods: Sequence[Record]) -> float:
    """Fold ``pods`` into a projection under tracemalloc; the bytes the state
    holds afterwards (settled, after a collection), per pod."""
    projection.settled()
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        fold_records(projection, pods)
        projection.settled()
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    return (after - before) / max(1, len(pods))


@dataclass(slots=True)
class EngineCheckpoints:
    """A live engine following the bench ledger as it is written, with election
    off (so it may append) and the engine's intervals: after each batch it
    folds, a ``LedgerDigest`` every ``digest_every`` records and a snapshot
    (with its ``LedgerDigest``) every ``snapshot_every``, by the engine's own
    :meth:`~quotaledger.engine.live.LiveEngine.checkpoint` (DECISIONS 160: an
    audit of the bench ledger meets the snapshots a running engine leaves)."""

    engine: LiveEngine
    since_snapshot: int = 0
    since_digest: int = 0
    digests: int = 0
    snapshots: int = 0

    async def follow(self, ledger: SqliteLedger) -> None:
        """Fold what was appended since the last call, then checkpoint as the
        engine's follower does after a batch (``LiveEngine._follow``)."""
        engine = self.engine
        for batch in ledger.iter_batches(engine.state.offset + 1):
            apply = engine.fold.apply
            for record in batch:
                apply(record)
            self.since_snapshot += len(batch)
            self.since_digest += len(batch)
            if self.since_snapshot >= engine.snapshot_every:
                self.since_snapshot = self.since_digest = 0
                self.snapshots += 1
                self.digests += 1
                await engine.checkpoint(snapshot=True)
            elif self.since_digest >= engine.digest_every:
                self.since_digest = 0
                self.digests += 1
                await engine.checkpoint(snapshot=False)


async def _sqlite(
    payloads: Sequence[tuple[bytes, int]],
    path: str,
    snapshot_every: int | None = None,
    digest_every: int = 10_000,
) -> tuple[float, float, int, EngineCheckpoints | None]:
    from quotaledger.events.ledger import Append

    batches = [
        [Append(payload=payload, ts=ts) for payload, ts in payloads[i : i + 1000]]
        for i in range(0, len(payloads), 1000)
    ]
    ledger = await SqliteLedger.open(path, ledger_id="bench", clock_ms=lambda: BASE_TS)
    checkpoints: EngineCheckpoints | None = None
    if snapshot_every is not None:
        engine = LiveEngine(
            ledger,
            SimulateExecutor(),
            instance="bench",
            election=False,
            snapshot_every=snapshot_every,
            digest_every=digest_every,
            clock_ms=lambda: BASE_TS,
        )
        checkpoints = EngineCheckpoints(engine)
    try:
        append_s = 0.0
        for batch in batches:
            start = time.perf_counter()
            await ledger.append(batch)
            append_s += time.perf_counter() - start
            if checkpoints is not None:  # not timed: the engine's work, not the ledger's
                await checkpoints.follow(ledger)
        read_s = float("inf")
        count = 0
        for _ in range(2):
            count = 0
            start = time.perf_counter()
            for records in ledger.iter_batches(0):
                count += len(records)
            read_s = min(read_s, time.perf_counter() - start)
    finally:
        await ledger.close()
    return append_s, read_s, count, checkpoints


def measure_sqlite(
    records: Sequence[Record],
    path: str,
    snapshot_every: int | None = None,
    digest_every: int = 10_000,
) -> tuple[float, float, int, EngineCheckpoints | None]:
    """(append seconds, read seconds, records read, the engine's checkpoints) through
    a new SQLite ledger at ``path``; with ``snapshot_every`` an engine follows the
    writes and leaves its digests and snapshots (:class:`EngineCheckpoints`; their
    appends are not timed)."""
    payloads = [(record.payload, record.ts) for record in records[1:]]  # open writes record 0
    return asyncio.run(_sqlite(payloads, path, snapshot_every, digest_every))


def time_cli(*argv: str) -> float:
    """Wall seconds of one ``quotaledger`` command in a new process (start included);
    its output is discarded, a failure raises :class:`ValueError`."""
    command = [
        sys.executable,
        "-c",
        "import sys; from quotaledger.adapters.cli import main; sys.exit(main())",
        *argv,
    ]
    start = time.perf_counter()
    done = subprocess.run(command, check=False, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        error = done.stderr.decode(errors="replace").strip().splitlines()[-1:]
        raise ValueError(f"quotaledger {' '.join(argv[:-1])} failed: {' '.join(error)}")
    return elapsed


def measure_cli(path: str, runs: int = 2) -> dict[str, float]:
    """Best-of-``runs`` wall seconds of replay, audit and ``audit --jobs 2`` of the
    ledger at ``path``, the three run in turn (interleaved, so load hits them alike)."""
    commands = {
        "replay_1m_s": ("replay", "--no-snapshot", "--json", path),
        "audit_1m_s": ("audit", path),
        "audit_1m_jobs2_s": ("audit", "--jobs", "2", path),
    }
    best = dict.fromkeys(commands, float("inf"))
    for _ in range(runs):
        for name, argv in commands.items():
            best[name] = min(best[name], time_cli(*argv))
    return best


def measure_chain(records: Sequence[Record], runs: int = 3) -> float:
    """Seconds of the best run of the digest chain alone over ``records``."""
    from quotaledger.events.digest import DigestChain

    best = float("inf")
    for _ in range(runs):
        chain = DigestChain(through=records[0].offset - 1 if records else -1)
        start = time.perf_counter()
        for record in records:
            chain.update(record)
        best = min(best, time.perf_counter() - start)
    return best


def measure_state_hash(work: Workload, window: int = 10_000, windows: int = 3) -> dict[str, float]:
    """The state hash on a second fold of the workload: kept from the start of the
    last ``windows`` windows of ``window`` churn records, timed after each window
    (settle, then the hash); then its memory, the hash from nothing and the
    adversarial map shape on the final state (module docstring)."""
    churn = work.churn or work.pods
    cut = max(0, len(churn) - window * windows)
    projection = Projection()
    fold_records(projection, [*work.config, *(work.pods if work.churn else []), *churn[:cut]])
    state = projection.state
    state_hash(state)
    settles: list[float] = []
    hashes: list[float] = []
    for start in range(cut, len(churn), window):
        fold_records(projection, churn[start : start + window])
        began = time.perf_counter()
        projection.settled()
        settles.append(time.perf_counter() - began)
        began = time.perf_counter()
        state_hash(state)
        hashes.append(time.perf_counter() - began)
    forget(state)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = state_hash(state)
        gc.collect()
        memo_bytes = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    full = []
    for _ in range(3):
        began = time.perf_counter()
        again = full_state_hash(state)
        full.append(time.perf_counter() - began)
    assert again == kept, "the kept state hash differs from the one computed from nothing"
    # two keys appended out of order at the tail of a sorted 100k-entry map
    pods = state.pods
    keys = sorted(pods)
    moved = [keys[0], keys[len(keys) // 2]] if len(keys) > 2 else []
    state.pods = {key: pods[key] for key in [*(k for k in keys if k not in moved), *moved]}
    forget(state)
    began = time.perf_counter()
    tail_hash = full_state_hash(state)
    tail_hash_s = time.perf_counter() - began
    began = time.perf_counter()
    dump(state)
    tail_dump_s = time.perf_counter() - began
    assert tail_hash == kept, "the order of the pods map changed the state hash"
    state.pods = pods
    forget(state)
    return {
        "state_hash_ms": statistics.median(full) * 1000,
        "state_hash_incremental_us": statistics.median(hashes) * 1e6,
        "digest_settle_ms": statistics.median(settles) * 1000,
        "state_hash_bytes_per_pod": memo_bytes / max(1, len(pods)),
        "tail_state_hash_ms": tail_hash_s * 1000,
        "tail_snapshot_dump_ms": tail_dump_s * 1000,
        "hash_windows": len(hashes),
    }
