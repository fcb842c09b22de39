"""``quotaledger bench fold``: how fast the fold, the settle and the ledger are.

A deterministic generator (``random.Random(seed)``) writes a workload in the
wire form (JSON payloads with quantity strings, DESIGN §4): a 5-level quota
tree, nodes, pods, then a stream of churn (pods going Pending -> Running,
request changes, completions, removals and re-adds, leaf quota edits). Every
event carries an ``at`` time; the whole stream is spread over one day.

Figures (``time.perf_counter``; the garbage collector as in production: run through the
CLI, which sets ``adapters.cli.GC_THRESHOLDS``):

* ``decode_events_per_s``: ``decode_event`` of the churn payloads (msgspec and the
  canonical amounts), no fold: the ceiling; ``msgspec_decode_events_per_s`` is
  the msgspec decoder alone, for reference;
* ``fold_events_per_s``: ``Projection.apply_record`` of the churn, after the setup was folded;
* ``full_recompute_ms``: ``recompute_all`` of the final state (median of 5);
* ``incremental_recompute_us``: one ``PodUpserted`` changing a pod's request,
  then ``settled().quotas[leaf].runtime`` (median of 1000);
* ``append_events_per_s`` / ``read_events_per_s``: the SQLite ledger, batches of 1000;
* ``bytes_per_pod``: tracemalloc of folding the setup pods, divided by their number;
* ``replay_10m_estimate_s``: an *estimate*, 10M / fold_events_per_s + the final settle.

Progress goes to stderr; ``--json`` prints exactly one JSON object on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from quotaledger.events.codec import decode_event
from quotaledger.events.ledger import Record
from quotaledger.events.model import Event
from quotaledger.projections import Projection, recompute_all

#: The workload's first event: 2026-11-21T00:00:00Z, in ms since the epoch.
BASE_TS = 1_795_219_200_000
DAY_MS = 86_400_000
LEVELS = 5
REPLAY_EVENTS = 10_000_000

#: Issue targets (one core, default sizes).
TARGET_FOLD_VS_DECODE = 0.3
TARGET_FOLD_EVENTS_PER_S = 300_000
TARGET_FULL_RECOMPUTE_MS = 20.0
TARGET_INCREMENTAL_US = 500.0
TARGET_BYTES_PER_POD = 1024
TARGET_REPLAY_10M_S = 60.0

_CPU_REQUESTS = ("100m", "250m", "500m", "750m", "1", "1500m", "2", "4")
_MEMORY_REQUESTS = ("256Mi", "512Mi", "1Gi", "2Gi", "4Gi", "8Gi")
_PRIORITIES = (0, 0, 0, 100, 1000)
_GIB = 2**30

_ENCODE = msgspec.json.Encoder().encode


# ------------------------------------------------------------------ workload


@dataclass
class Workload:
    """A generated ledger: ``config`` (LedgerOpened, nodes, quotas), then the
    setup ``pods``, then the ``churn``; offsets are 0, 1, 2, ... across all three."""

    config: list[Record]
    pods: list[Record]
    churn: list[Record]
    #: quota name -> its level (1 = a child of root, 5 = the deepest).
    levels: dict[str, int]
    parents: dict[str, str]
    leaves: list[str]
    node_names: list[str]
    #: churn events by kind (plus "PodRemoved+re-add" pairs as their two kinds).
    mix: dict[str, int] = field(default_factory=dict)

    @property
    def records(self) -> list[Record]:
        return [*self.config, *self.pods, *self.churn]

    @property
    def depth(self) -> int:
        return max(self.levels.values(), default=0)


class _Clock:
    """RFC 3339 ``at`` strings with milliseconds, for increasing ms times."""

    def __init__(self) -> None:
        self._second = -1
        self._prefix = ""

    def at(self, ts: int) -> str:
        second, ms = divmod(ts, 1000)
        if second != self._second:
            self._second = second
            self._prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
        return f"{self._prefix}.{ms:03d}Z"


def _fanout(quotas: int) -> int:
    """The largest b with b + b² + … + b⁵ ≤ quotas (at least 1)."""
    b = 1
    while sum((b + 1) ** k for k in range(1, LEVELS + 1)) <= quotas:
        b += 1
    return b


def _level_sizes(quotas: int) -> list[int]:
    """Quotas per level 1..5: b^k parents on levels 1-4, all the rest leaves on 5."""
    if quotas < LEVELS:
        raise ValueError(f"--quotas must be at least {LEVELS} for a {LEVELS}-level tree")
    b = _fanout(quotas)
    sizes = [b**k for k in range(1, LEVELS)]
    sizes.append(quotas - sum(sizes))
    return sizes


class _Pod:
    __slots__ = ("cpu", "gpu", "memory", "name", "namespace", "node", "phase", "priority", "uid")

    def __init__(self, uid: str, namespace: str, priority: int) -> None:
        self.uid = uid
        self.priority = priority
        self.name = uid
        self.namespace = namespace
        self.phase = "Pending"
        self.node: str | None = None
        self.cpu = ""
        self.memory = ""
        self.gpu = 0


def generate(
    quotas: int = 10_000,
    pods: int = 100_000,
    nodes: int = 1_000,
    events: int = 1_000_000,
    seed: int = 1,
    progress: Callable[[str], None] | None = None,
) -> Workload:
    """The benchmark workload; the same arguments give the same bytes."""
    if pods < 1 or nodes < 1 or events < 0:
        raise ValueError("--pods and --nodes must be positive, --events not negative")
    rng = random.Random(seed)
    clock = _Clock()
    sizes = _level_sizes(quotas)
    total = 1 + nodes + quotas + pods + events
    offset = 0

    def record(doc: dict[str, Any]) -> Record:
        nonlocal offset
        ts = BASE_TS + offset * DAY_MS // total
        doc["at"] = clock.at(ts)
        rec = Record(offset=offset, ts=ts, payload=_ENCODE(doc))
        offset += 1
        return rec

    config = [record({"kind": "LedgerOpened", "ledger_id": f"bench-{seed}"})]

    # Nodes: 64 cores / 256Gi; a quarter carry 8 GPUs.
    node_names = [f"node-{i:05d}" for i in range(nodes)]
    for i, name in enumerate(node_names):
        allocatable: dict[str, Any] = {"cpu": "64", "memory": "256Gi", "pods": 110}
        labels = {"zone": f"zone-{i % 3}"}
        if i % 4 == 0:
            allocatable["nvidia.com/gpu"] = 8
            labels["accelerator"] = "gpu"
        config.append(
            record(
                {"kind": "NodeUpserted", "name": name, "allocatable": allocatable, "labels": labels}
            )
        )

    # The tree, built bottom-up in memory (a parent's min covers its children's)
    # and written top-down (parents first).
    names: list[list[str]] = [
        [f"l{level}-{i:05d}" for i in range(size)] for level, size in enumerate(sizes[:-1], 1)
    ]
    names.append([f"ns-{i:05d}" for i in range(sizes[-1])])
    parents: dict[str, str] = {}
    levels: dict[str, int] = {}
    for level, level_names in enumerate(names, 1):
        above = names[level - 2] if level > 1 else None
        for i, name in enumerate(level_names):
            parents[name] = above[i % len(above)] if above else "root"
            levels[name] = level
    leaves = names[-1]
    gpu_leaves = set(leaves[::5])
    extra_ns: dict[str, str] = {}  # claimed namespace -> leaf
    leaf_docs: dict[str, dict[str, Any]] = {}
    mins: dict[str, list[int]] = {}  # name -> [cpu cores, memory Gi, gpu]
    for name in leaves:
        cpu, mem = rng.randint(1, 8), rng.choice((4, 8, 16, 32))
        gpu = rng.randint(1, 4) if name in gpu_leaves else 0
        mins[name] = [cpu, mem, gpu]
        doc: dict[str, Any] = {"kind": "QuotaUpserted", "name": name, "parent": parents[name]}
        doc.update(_leaf_limits(rng, cpu, mem, gpu))
        if rng.random() < 0.1:
            ns = f"{name}-batch"
            doc["namespaces"] = [ns]
            extra_ns[ns] = name
        roll = rng.random()
        if roll < 0.05:
            doc["allow_lent"] = False
        elif roll < 0.10:
            doc["lending_limit"] = {"cpu": max(0, cpu - 1)}
        elif roll < 0.15:
            doc["borrowing_limit"] = {"cpu": cpu * 2}
        if rng.random() < 0.1 and doc.get("max") is not None:
            doc["preemption_delay_s"] = 30
        leaf_docs[name] = doc
    parent_docs: dict[str, dict[str, Any]] = {}
    for level in range(LEVELS - 1, 0, -1):
        for name in names[level - 1]:
            mins[name] = [0, 0, 0]
        for child in names[level]:
            sums = mins[parents[child]]
            for k, value in enumerate(mins[child]):
                sums[k] += value
        for name in names[level - 1]:
            cpu, mem, gpu = mins[name]
            cpu += rng.randint(0, max(1, cpu // 10))
            mins[name] = [cpu, mem, gpu]
            low: dict[str, Any] = {"cpu": str(cpu), "memory": f"{mem}Gi"}
            if gpu:
                low["nvidia.com/gpu"] = gpu
            doc = {
                "kind": "QuotaUpserted",
                "name": name,
                "parent": parents[name],
                "is_parent": True,
                "min": low,
            }
            if rng.random() < 0.5:
                high: dict[str, Any] = {"cpu": str(cpu * 2), "memory": f"{mem * 2}Gi"}
                if gpu:
                    high["nvidia.com/gpu"] = gpu * 2
                doc["max"] = high
            parent_docs[name] = doc
    for level_names in names[:-1]:
        config.extend(record(parent_docs[name]) for name in level_names)
    config.extend(record(leaf_docs[name]) for name in leaves)
    if progress:
        progress(f"generated {len(config)} config records (tree levels {sizes})")

    # Pods: namespace == a leaf's name (or a namespace it claims); a few land
    # in kube-system (system) and in unclaimed namespaces (default).
    claimed = sorted(extra_ns)
    slots: list[_Pod] = []
    serial = 0

    def new_pod() -> _Pod:
        nonlocal serial
        roll = rng.random()
        if roll < 0.005:
            ns = "kube-system"
        elif roll < 0.01:
            ns = f"misc-{rng.randrange(50)}"
        elif roll < 0.05 and claimed:
            ns = rng.choice(claimed)
        else:
            ns = rng.choice(leaves)
        pod = _Pod(f"pod-{serial:08d}", ns, rng.choice(_PRIORITIES))
        serial += 1
        _new_requests(rng, pod, extra_ns.get(ns, ns) in gpu_leaves)
        return pod

    def pod_doc(pod: _Pod, created: bool) -> dict[str, Any]:
        requests: dict[str, Any] = {"cpu": pod.cpu, "memory": pod.memory}
        if pod.gpu:
            requests["nvidia.com/gpu"] = pod.gpu
        doc: dict[str, Any] = {
            "kind": "PodUpserted",
            "uid": pod.uid,
            "name": pod.name,
            "namespace": pod.namespace,
            "requests": requests,
            "priority": pod.priority,
            "phase": pod.phase,
            "node": pod.node,
            "labels": {"app": pod.namespace},
        }
        if created:
            doc["created_at"] = clock.at(BASE_TS + offset * DAY_MS // total)
        return doc

    pod_records: list[Record] = []
    for _ in range(pods):
        pod = new_pod()
        if rng.random() < 0.7:
            pod.phase, pod.node = "Running", rng.choice(node_names)
        slots.append(pod)
        pod_records.append(record(pod_doc(pod, True)))
    if progress:
        progress(f"generated {len(pod_records)} pods")

    mix: dict[str, int] = {}
    churn: list[Record] = []
    readd: int | None = None  # slot to refill with a new pod on the next event
    for _ in range(events):
        if readd is not None:
            pod = slots[readd] = new_pod()
            readd = None
            kind = "PodUpserted(re-add)"
            doc = pod_doc(pod, True)
        else:
            roll = rng.random()
            if roll < 0.03:
                kind = "QuotaUpserted"
                doc = dict(leaf_docs[rng.choice(leaves)])
                cpu, mem, gpu = mins[doc["name"]]
                doc.update(_leaf_limits(rng, cpu, mem, gpu))
            else:
                index = rng.randrange(len(slots))
                pod = slots[index]
                if roll < 0.045 or pod.phase in ("Succeeded", "Failed"):
                    kind = "PodRemoved"
                    doc = {"kind": "PodRemoved", "uid": pod.uid}
                    readd = index
                else:
                    step = rng.random()
                    if pod.phase == "Pending" and step < 0.65:
                        kind = "PodUpserted(scheduled)"
                        pod.phase, pod.node = "Running", rng.choice(node_names)
                    elif pod.phase == "Running" and step < 0.03:
                        kind = "PodUpserted(finished)"
                        pod.phase = "Succeeded" if step < 0.025 else "Failed"
                    else:
                        kind = "PodUpserted(resized)"
                        _new_requests(
                            rng, pod, extra_ns.get(pod.namespace, pod.namespace) in gpu_leaves
                        )
                    doc = pod_doc(pod, False)
        mix[kind] = mix.get(kind, 0) + 1
        churn.append(record(doc))
        if progress and len(churn) % 250_000 == 0:
            progress(f"generated {len(churn)} churn events")
    return Workload(
        config=config,
        pods=pod_records,
        churn=churn,
        levels=levels,
        parents=parents,
        leaves=leaves,
        node_names=node_names,
        mix=dict(sorted(mix.items())),
    )


def _leaf_limits(rng: random.Random, cpu: int, mem: int, gpu: int) -> dict[str, Any]:
    """``min``, ``max`` (above min in every resource, or unlimited) and ``shared_weight``."""
    low: dict[str, Any] = {"cpu": str(cpu), "memory": f"{mem}Gi"}
    if gpu:
        low["nvidia.com/gpu"] = gpu
    out: dict[str, Any] = {"min": low}
    if rng.random() < 0.8:
        high: dict[str, Any] = {
            "cpu": str(cpu + rng.randint(1, 3 * cpu)),
            "memory": f"{mem + rng.randint(1, 3 * mem)}Gi",
        }
        if gpu:
            high["nvidia.com/gpu"] = gpu + rng.randint(1, 4)
        out["max"] = high
    else:
        out["max"] = None
    out["shared_weight"] = {"cpu": str(rng.randint(1, 16))} if rng.random() < 0.3 else None
    return out


def _new_requests(rng: random.Random, pod: _Pod, gpu_leaf: bool) -> None:
    pod.cpu = rng.choice(_CPU_REQUESTS)
    pod.memory = rng.choice(_MEMORY_REQUESTS)
    pod.gpu = rng.choice((1, 1, 2)) if gpu_leaf and rng.random() < 0.3 else 0


# -------------------------------------------------------------- measurements


def _log(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


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
    clock = _Clock()
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


async def _sqlite(
    payloads: Sequence[tuple[bytes, int]], directory: str
) -> tuple[float, float, int]:
    from quotaledger.adapters.sqlite_ledger import SqliteLedger  # type: ignore[import-untyped]
    from quotaledger.events.ledger import Append

    batches = [
        [Append(payload=payload, ts=ts) for payload, ts in payloads[i : i + 1000]]
        for i in range(0, len(payloads), 1000)
    ]
    path = os.path.join(directory, "bench.db")
    ledger = await SqliteLedger.open(path, ledger_id="bench", clock_ms=lambda: BASE_TS)
    try:
        start = time.perf_counter()
        for batch in batches:
            await ledger.append(batch)
        append_s = time.perf_counter() - start
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
    return append_s, read_s, count


def measure_sqlite(records: Sequence[Record]) -> tuple[float, float, int]:
    """(append seconds, read seconds, records read) through a temporary SQLite ledger."""
    payloads = [(record.payload, record.ts) for record in records[1:]]  # open writes record 0
    with tempfile.TemporaryDirectory(prefix="quotaledger-bench-") as directory:
        return asyncio.run(_sqlite(payloads, directory))


# -------------------------------------------------------------------- report


def run(
    quotas: int = 10_000,
    pods: int = 100_000,
    nodes: int = 1_000,
    events: int = 1_000_000,
    seed: int = 1,
    progress: Callable[[str], None] | None = _log,
) -> dict[str, Any]:
    """Generate the workload, take every measurement, return the report."""
    say = progress or (lambda message: None)
    start = time.perf_counter()
    work = generate(quotas, pods, nodes, events, seed, progress=say)
    say(f"workload generated in {time.perf_counter() - start:.1f} s")
    churn = work.churn or work.pods
    payloads = [record.payload for record in churn]

    decode_s = measure_decode(payloads)
    decode_rate = len(payloads) / decode_s
    raw_rate = len(payloads) / measure_decode(payloads, decode=msgspec.json.Decoder(Event).decode)
    say(f"decode: {decode_rate:,.0f} events/s (msgspec alone: {raw_rate:,.0f} events/s)")

    if work.churn:
        fold_s, bytes_per_pod, runs, projection = measure_fold(work)
    else:  # no churn: time the pods instead
        traced, projection, runs = Projection(), Projection(), 1
        fold_records(traced, work.config)
        bytes_per_pod = fold_pods_traced(traced, work.pods)
        fold_records(projection, work.config)
        fold_s = fold_records(projection, work.pods)
    fold_rate = len(churn) / fold_s
    say(f"fold: {fold_rate:,.0f} events/s (best of {runs})")
    say(f"memory: {bytes_per_pod:,.0f} bytes per pod")
    settle_start = time.perf_counter()
    projection.settled()
    settle_ms = (time.perf_counter() - settle_start) * 1000
    rejected = len(projection.state.rejected)
    say(f"settle after the fold: {settle_ms:.1f} ms; rejected: {rejected}")

    recompute_ms = measure_full_recompute(projection)
    say(f"full recompute: {recompute_ms:.2f} ms")
    incremental = measure_incremental(projection, work, seed=seed)
    incremental_us = statistics.median(incremental) * 1e6
    p99_us = sorted(incremental)[int(len(incremental) * 0.99) - 1] * 1e6
    say(f"incremental: median {incremental_us:.1f} us, p99 {p99_us:.1f} us")

    append_s, read_s, read_count = measure_sqlite(work.records)
    append_rate = (read_count - 1) / append_s
    read_rate = read_count / read_s
    say(f"sqlite: append {append_rate:,.0f} events/s, read {read_rate:,.0f} events/s")

    replay_s = REPLAY_EVENTS / fold_rate + settle_ms / 1000
    state = projection.state
    report: dict[str, Any] = {
        "decode_events_per_s": round(decode_rate),
        "msgspec_decode_events_per_s": round(raw_rate),
        "fold_events_per_s": round(fold_rate),
        "fold_vs_decode": round(fold_rate / decode_rate, 3),
        "full_recompute_ms": round(recompute_ms, 3),
        "incremental_recompute_us": round(incremental_us, 1),
        "incremental_recompute_p99_us": round(p99_us, 1),
        "settle_after_fold_ms": round(settle_ms, 3),
        "append_events_per_s": round(append_rate),
        "read_events_per_s": round(read_rate),
        "bytes_per_pod": round(bytes_per_pod),
        "replay_10m_estimate_s": round(replay_s, 1),
        "quotas": quotas,
        "pods": pods,
        "nodes": nodes,
        "events": events,
        "seed": seed,
        "tree_levels": work.depth,
        "records": len(work.config) + len(work.pods) + len(work.churn),
        "rejected": rejected,
        "active_pods": len(state.pod_quota),
        "fold_runs": runs,
        "mix": work.mix,
        "python": platform.python_version(),
        "msgspec": msgspec.__version__,
    }
    report["targets_met"] = targets_met(report)
    return report


def targets_met(report: dict[str, Any]) -> dict[str, bool]:
    """The issue's targets, each met or not."""
    return {
        "fold_events_per_s": report["fold_events_per_s"] >= TARGET_FOLD_EVENTS_PER_S,
        "fold_vs_decode": report["fold_vs_decode"] >= TARGET_FOLD_VS_DECODE,
        "full_recompute_ms": report["full_recompute_ms"] <= TARGET_FULL_RECOMPUTE_MS,
        "incremental_recompute_us": report["incremental_recompute_us"] <= TARGET_INCREMENTAL_US,
        "bytes_per_pod": report["bytes_per_pod"] <= TARGET_BYTES_PER_POD,
        "replay_10m_estimate_s": report["replay_10m_estimate_s"] <= TARGET_REPLAY_10M_S,
    }


_ROWS = (
    ("decode_events_per_s", "decode (ceiling)", "events/s", None),
    ("msgspec_decode_events_per_s", "msgspec alone", "events/s", None),
    ("fold_events_per_s", "fold", "events/s", f">= {TARGET_FOLD_EVENTS_PER_S:,}"),
    ("fold_vs_decode", "fold / decode", "", f">= {TARGET_FOLD_VS_DECODE}"),
    ("full_recompute_ms", "full recompute", "ms", f"<= {TARGET_FULL_RECOMPUTE_MS:g}"),
    ("incremental_recompute_us", "incremental (median)", "us", f"<= {TARGET_INCREMENTAL_US:g}"),
    ("incremental_recompute_p99_us", "incremental (p99)", "us", None),
    ("settle_after_fold_ms", "settle after the fold", "ms", None),
    ("append_events_per_s", "SQLite append", "events/s", None),
    ("read_events_per_s", "SQLite read", "events/s", None),
    ("bytes_per_pod", "memory per pod", "bytes", f"<= {TARGET_BYTES_PER_POD}"),
    ("replay_10m_estimate_s", "10M replay (estimate)", "s", f"<= {TARGET_REPLAY_10M_S:g}"),
)


def render(report: dict[str, Any]) -> str:
    """The report as a readable table."""
    lines = [
        f"quotaledger bench fold: {report['quotas']:,} quotas ({report['tree_levels']} levels), "
        f"{report['pods']:,} pods, {report['nodes']:,} nodes, {report['events']:,} events "
        f"(seed {report['seed']}, Python {report['python']})",
        "",
        f"{'figure':<24}{'value':>16}  {'unit':<9}{'target':<12}met",
    ]
    met = report["targets_met"]
    for key, label, unit, target in _ROWS:
        value = report[key]
        text = f"{value:,.0f}" if isinstance(value, int) or value >= 1000 else f"{value:,.3g}"
        verdict = ("yes" if met[key] else "NO") if key in met else ""
        lines.append(f"{label:<24}{text:>16}  {unit:<9}{target or '':<12}{verdict}")
    lines.append("")
    lines.append(
        f"rejected by the projection: {report['rejected']} of {report['records']:,} records; "
        f"active pods at the end: {report['active_pods']:,}"
    )
    lines.append("churn mix: " + ", ".join(f"{k} {v:,}" for k, v in report["mix"].items()))
    lines.append("(the 10M replay figure is an estimate: 10M / fold rate + the final settle)")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    """Entry point of ``quotaledger bench`` (wired in the CLI)."""
    if args.suite != "fold":
        print(f"quotaledger: error: unknown bench suite {args.suite!r}", file=sys.stderr)
        return 2
    try:
        report = run(args.quotas, args.pods, args.nodes, args.events, args.seed)
    except ValueError as exc:
        print(f"quotaledger: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report))
    else:
        print(render(report))
    return 0
