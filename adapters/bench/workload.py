"""A deterministic cluster workload for the benchmarks (DESIGN §1: tooling, not the engine).

:func:`generate` (``random.Random(seed)``) writes a workload in the wire form
(JSON payloads with quantity strings, DESIGN §4): a 5-level quota tree, nodes,
pods, then a stream of churn (pods going Pending -> Running, request changes,
completions, removals and re-adds, leaf quota edits). Every event carries an
``at`` time; the whole stream is spread over one day.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from quotaledger.events.ledger import Record

#: The workload's first event: 2026-11-21T00:00:00Z, in ms since the epoch.
BASE_TS = 1_795_219_200_000
DAY_MS = 86_400_000
LEVELS = 5

_CPU_REQUESTS = ("100m", "250m", "500m", "750m", "1", "1500m", "2", "4")
_MEMORY_REQUESTS = ("256Mi", "512Mi", "1Gi", "2Gi", "4Gi", "8Gi")
_PRIORITIES = (0, 0, 0, 100, 1000)
_GIB = 2**30

_ENCODE = msgspec.json.Encoder().encode


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


class Clock:
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
    clock = Clock()
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
