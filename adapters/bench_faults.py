"""``quotaledger bench faults``: a seeded, randomized fault harness (DESIGN §3, §6, §9, §10,
§12; docs/DECISIONS.md 220-229).

Each trial runs, on one ledger (a SQLite file, or a Kafka topic on tansu with ``s3://``
storage on a local moto server, so that a broker restart keeps the log):

* 2-3 engines, each a ``quotaledger run LEDGER --kubeconfig ... --executor kubernetes``
  process with shortened Lease timings, against the stand-in API server
  (:mod:`.kubernetes.standin`) holding nodes, pods, quotas (the quotas.quotaledger.io CRD) and
  the settings ConfigMap. The leader's watcher appends what the cluster does; its
  evictions are real HTTP POSTs, answered 201, 404, 409 (uid precondition), 429 or 500;
* a small controller in this process playing the rest of the cluster: a scheduler binding
  pending pods to nodes with room, pods arriving, finishing, and (StatefulSet-like) coming
  back under the same name with a new uid after an eviction; quota changes that cause
  quota-decrease, overuse and reclaim preemptions;
* 1-3 outside producers of facts with ids of their own (``quotaledger ingest``
  processes; on Kafka also a plain confluent-kafka producer);
* faults drawn at random (:data:`FAULT_KINDS`): SIGKILL of an engine (then a restart,
  under the same or a new instance name), SIGSTOP of the Lease holder past its Lease then
  SIGCONT, a TCP fault proxy (:mod:`.bench_fault_proxy`) on each engine's link to the API
  server and on every link to the broker (tansu advertises the proxy) that delays, stalls
  or cuts connections in the middle of a response, and broker restarts (SIGKILL or SIGTERM).

At quiescence (nothing running, nothing outstanding, no deadline to come, the cluster
reflected in the ledger, the tail still) the engines get SIGTERM, and the checks run on what
this process reads itself: the raw records (plain ``sqlite3``; on Kafka plain Fetch
requests, each record at its partition offset, not the ledger's reader), folded here with
:class:`quotaledger.projections.Projection` only to know which records were accepted and
which timers were armed; the stand-in server's own record of eviction POSTs and Lease
writes; the proxies' record of when each request left its engine. Never an engine's view.
:data:`CHECKS` names each check; a violation is printed as one line with the trial's seed.

``run_trial`` runs one trial; :func:`main` many (``bench faults``). A trial's seed decides
everything drawn (the scenario, the faults, their times and targets); the machine's timing
decides the rest, so a failing seed is re-run with ``--seed SEED --trials 1`` to look again.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import json
import logging
import os
import random
import re
import shlex
import shutil
import signal
import sqlite3
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
from aiohttp import web

from quotaledger.events.ledger import Record
from quotaledger.projections import Projection

from .bench_fault_proxy import FaultProxy
from .kubernetes.standin import ApiServer
from .ledger_url import open_ledger

BACKENDS = ("sqlite", "kafka")
#: Fault kinds per backend; ``bench faults`` counts how often each was drawn and applied.
FAULT_KINDS: dict[str, tuple[str, ...]] = {
    "sqlite": ("kill", "pause", "api-delay", "api-stall", "api-cut"),
    "kafka": (
        "kill",
        "pause",
        "api-delay",
        "api-stall",
        "api-cut",
        "broker-delay",
        "broker-stall",
        "broker-cut",
        "broker-restart",
    ),
}
#: What is checked (the docstring of :func:`check_trial` says how).
CHECKS = (
    "trigger-twice",
    "trigger-unjustified",
    "overlap",
    "eviction-twice",
    "post-without-decision",
    "zombie-post",
    "zombie-decision",
    "fact-lost",
    "fact-twice",
    "gap",
    "armed-deadline",
    "audit",
    "traceback",
    "unclean-stop",
    "process-exit",
    "no-quiescence",
    "harness-error",
)
LEASE = ("coordination.k8s.io", "leases", "quotaledger", "quotaledger")
NAMESPACE = "team"
QUOTA_LABEL = "quotaledger.io/quota"
BIG = 64_000  # a quota max that limits nothing (cpu millicores)
GAP_REASON = "holds no record"  # what a gaps=fill reader writes into its fillers
URL = "{ledger}"  # where a command line takes the ledger's URL
HOLE_REASON = "missing from the partition (read by bench faults)"
#: the error of a reader that stops at a missing offset (DESIGN §10)
MISSING = re.compile(r"offset (\d+) is missing")


# ------------------------------------------------------------------ options and results


@dataclass(frozen=True)
class Options:
    """Shortened timings (DESIGN §12 defaults are 15/10/2 s) and what runs as what."""

    backend: str = "sqlite"
    lease_duration_s: float = 1.0
    renew_deadline_s: float = 0.6
    retry_period_s: float = 0.2
    workload_s: float = 8.0
    settle_timeout_s: float = 90.0
    #: SIGTERM to exit (DESIGN §9): at most this much CPU time after the signal, and this
    #: much wall time less the time the process waited for a CPU (DECISIONS 180, 225)
    stop_bound_s: float = 2.0
    #: an armed quota-decrease deadline this far in the past at quiescence is left behind
    deadline_grace_ms: int = 3000
    engine_command: tuple[str, ...] = (sys.executable, "-m", "quotaledger.adapters.cli")
    tool_command: tuple[str, ...] = (sys.executable, "-m", "quotaledger.adapters.cli")
    keep_dir: Path | None = None  # the files of every trial with a violation are kept here
    keep_all: bool = False  # ... and of every other trial too
    parallel: int = 1  # trials at once
    fault_kinds: tuple[str, ...] = ()  # draw only these (default: every kind of the backend)
    #: share of eviction POSTs answered 429 (default: drawn per trial from 0, 0.2, 0.5)
    refuse_share: float | None = None
    #: how often a pause waits (up to 1.5 s) for the leader's next refused eviction, so that
    #: it stops the leader with a retry pending
    pause_when_refused: float = 0.5
    #: a pause lasts the Lease duration plus this much (uniform)
    pause_extra_s: tuple[float, float] = (0.3, 1.5)


@dataclass(frozen=True)
class Violation:
    seed: int
    check: str
    offsets: str
    detail: str

    def line(self) -> str:
        where = f" at offsets {self.offsets}" if self.offsets else ""
        return f"seed {self.seed}: {self.check}{where}: {self.detail}"


@dataclass
class TrialResult:
    seed: int
    backend: str
    violations: list[Violation] = field(default_factory=list)
    faults: Counter[str] = field(default_factory=Counter)
    stats: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0
    fault_log: list[str] = field(default_factory=list)


# ------------------------------------------------------------------ the raw ledger


@dataclass(frozen=True, slots=True)
class RawRecord:
    """One record as read here: ``ts`` as every reader derives it (DESIGN §3, §10),
    ``stamp`` what its writer stamped (the Kafka record timestamp; SQLite: ``ts``)."""

    offset: int
    ts: int
    stamp: int
    payload: bytes


def read_sqlite(path: Path) -> list[RawRecord]:
    """Every record of a SQLite ledger, by plain ``sqlite3`` (readers never block)."""
    if not path.exists():
        return []
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    try:
        rows = conn.execute("SELECT offset, ts, payload FROM records ORDER BY offset").fetchall()
    except sqlite3.OperationalError:
        return []
    finally:
        conn.close()
    return [
        RawRecord(o, ts, ts, p.encode() if isinstance(p, str) else bytes(p)) for o, ts, p in rows
    ]


class KafkaTap:
    """The raw records of a Kafka ledger's partition, by plain Fetch requests: each record
    at the offset the broker gives it, with the writer's timestamp; nothing filled, nothing
    skipped over (DESIGN §10's ts derived here). A missing offset is fetched again while
    it is young (a broker may make later offsets readable first); one missing for longer
    is left as a hole (a write the broker lost: tansu after a crash leaves some).

    :meth:`follow` runs while the harness waits; :meth:`read_all` reads everything again
    for the checks, on a new connection."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.bootstrap, self.topic = bootstrap, topic
        self.found: dict[int, tuple[int, bytes]] = {}  # offset -> (stamp, value)
        self.young_hole_s = 5.0

    @property
    def records(self) -> list[RawRecord]:
        """The records found so far in offset order, holes left out."""
        from .kafka_ledger import value_ts

        out = []
        prev_ts = 0
        for offset in sorted(self.found):
            stamp, value = self.found[offset]
            at = value_ts(value)
            ts = max(prev_ts, at if at is not None else stamp)
            prev_ts = ts
            out.append(RawRecord(offset, ts, stamp, value))
        return out

    async def follow(self, idle_s: float | None = None) -> None:
        """Fetch until cancelled (with ``idle_s``: until that long without news)."""
        from aiokafka.errors import KafkaError  # type: ignore[import-untyped]

        from quotaledger.events.ledger import LedgerError

        from .kafka_fetch import PartitionFetcher

        hole_seen: dict[int, float] = {}
        quiet_since = time.monotonic()

        def reading() -> bool:
            if idle_s is None:
                return True
            # a first answer may take long (a broker just restarted, slow storage)
            return time.monotonic() - quiet_since < (idle_s if self.found else 30.0)

        while reading():
            fetcher = PartitionFetcher([self.bootstrap], self.topic, self.topic, {})
            try:
                await fetcher.start()
                while reading():
                    position = self._next_position(hole_seen)
                    fetched = await fetcher.fetch(position, 200)
                    fresh = 0
                    for batch in fetched.batches:
                        for message in batch:
                            fresh += message.offset not in self.found
                            self.found[message.offset] = (message.timestamp, message.value or b"")
                    if fresh:
                        quiet_since = time.monotonic()
                    elif not fetched.batches:
                        await asyncio.sleep(0.1)
            except (KafkaError, LedgerError, OSError):
                await asyncio.sleep(0.3)  # the broker restarting, a link cut: fetch again
            finally:
                await fetcher.close()

    def _end(self) -> int:
        return max(self.found, default=-1) + 1

    def _next_position(self, hole_seen: dict[int, float]) -> int:
        """The first missing offset still young, else the end."""
        now = time.monotonic()
        end = self._end()
        for offset in range(end):
            if offset in self.found:
                continue
            first = hole_seen.setdefault(offset, now)
            if now - first < self.young_hole_s:
                return offset
        return end

    async def read_all(self, idle_s: float = 2.0) -> list[RawRecord]:
        """Every record, read again from offset 0 on a new connection."""
        again = KafkaTap(self.bootstrap, self.topic)
        again.young_hole_s = idle_s
        async with asyncio.timeout(180):
            await again.follow(idle_s=idle_s)
        return again.records


def decode_json(payload: bytes) -> dict[str, Any] | None:
    try:
        value = msgspec.json.decode(payload)
    except msgspec.DecodeError:
        return None
    return value if isinstance(value, dict) else None


# ------------------------------------------------------------------ the API server


@dataclass(frozen=True, slots=True)
class EvictionPost:
    """One eviction POST as the stand-in server answered it."""

    at_ms: int
    via: str  # the proxy (engine slot) it came through
    namespace: str
    name: str
    uid: str  # the uid precondition, else the pod's uid at the server
    status: int


class FaultApiServer(ApiServer):
    """The stand-in API server, keeping its own record of eviction POSTs (who sent them,
    what they answered) and Lease writes; evictions honour the uid precondition (409 on a
    mismatch, as the real API server does) and answer 429/500 as scripted per trial."""

    def __init__(self, rng: random.Random, registry: dict[int, str]) -> None:
        super().__init__()
        self.rng = rng
        self.registry = registry
        self.refuse_share = 0.0  # share of eviction POSTs answered 429
        self.error_share = 0.0  # ... 500
        self.retry_after: int | None = None
        self.posts: list[EvictionPost] = []
        self.lease_writes: list[tuple[int, str | None]] = []  # (ms, holder) in order
        self.refused: dict[str, asyncio.Event] = {}  # via -> set on each 429/500 answer
        self.on_evicted: Callable[[dict[str, Any]], None] | None = None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        parts = [p for p in request.path.split("/") if p]
        if (
            request.method == "POST"
            and len(parts) == 7
            and parts[:3] == ["api", "v1", "namespaces"]
            and parts[4] == "pods"
            and parts[6] == "eviction"
        ):
            return await self._eviction(request, parts[3], parts[5])
        response = await super()._handle(request)
        if (
            (parts[-2:-1] == ["leases"] or parts[-1:] == ["leases"])
            and request.method
            in (
                "POST",
                "PUT",
            )
            and response.status < 300
            and isinstance(response, web.Response)
        ):
            body = decode_json(response.body if isinstance(response.body, bytes) else b"")
            holder = (body or {}).get("spec", {}).get("holderIdentity")
            self.lease_writes.append((time.time_ns() // 1_000_000, holder or None))
        return response

    def _via(self, request: web.Request) -> str:
        peer = request.transport.get_extra_info("peername") if request.transport else None
        return self.registry.get(int(peer[1]), "?") if peer else "?"

    async def _eviction(self, request: web.Request, namespace: str, name: str) -> web.Response:
        body = decode_json(await request.read()) or {}
        options = body.get("deleteOptions") or body.get("delete_options") or {}
        wanted = ((options.get("preconditions") or {}) if isinstance(options, dict) else {}).get(
            "uid"
        )
        pod = self.get("pods", name, namespace)
        uid = str(wanted or (pod or {}).get("metadata", {}).get("uid", ""))
        via = self._via(request)
        roll = self.rng.random()
        if pod is None:
            status, message = 404, f'pods "{name}" not found'
        elif wanted is not None and pod["metadata"]["uid"] != wanted:
            status = 409
            message = (
                f"Precondition failed: UID in precondition: {wanted},"
                f" UID in object meta: {pod['metadata']['uid']}"
            )
        elif roll < self.refuse_share:
            status, message = (
                429,
                "Cannot evict pod as it would violate the pod's disruption budget.",
            )
        elif roll < self.refuse_share + self.error_share:
            status, message = 500, "scripted internal error"
        else:
            status, message = 201, "evicted"
        self.posts.append(
            EvictionPost(time.time_ns() // 1_000_000, via, namespace, name, uid, status)
        )
        if status == 201:
            self.delete("pods", name, namespace)
            if self.on_evicted is not None and pod is not None:
                self.on_evicted(pod)
            return web.json_response(
                {"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201},
                status=201,
            )
        if status in (429, 500):
            self.refused.setdefault(via, asyncio.Event()).set()
        headers = {}
        if status == 429 and self.retry_after is not None:
            headers["Retry-After"] = str(self.retry_after)
        reason = {404: "NotFound", 409: "Conflict", 429: "TooManyRequests"}.get(
            status, "InternalError"
        )
        document = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": reason,
            "code": status,
        }
        return web.json_response(document, status=status, headers=headers)

    def holder(self) -> str | None:
        lease = self.get(LEASE[1], LEASE[3], LEASE[2], group=LEASE[0])
        return (lease or {}).get("spec", {}).get("holderIdentity") or None

    def holder_at(self, at_ms: int) -> str | None:
        """The Lease holder by this server's record at ``at_ms``."""
        index = bisect.bisect_right(self.lease_writes, (at_ms, "\uffff")) - 1
        return self.lease_writes[index][1] if index >= 0 else None


# ------------------------------------------------------------------ the cluster


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def rfc3339(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class Cluster:
    """Plays the cluster around the engines: a scheduler binding pending pods where they
    fit, pods arriving and finishing, quota changes, evicted pods coming back."""

    server: FaultApiServer
    rng: random.Random
    seed: int
    nodes: dict[str, int] = field(default_factory=dict)  # name -> cpu millicores
    quotas: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> spec
    serial: int = 0
    recreate: bool = True
    stats: Counter[str] = field(default_factory=Counter)

    def pods(self) -> list[dict[str, Any]]:
        return self.server.items("pods")

    def add_node(self, name: str, cpu: int) -> None:
        self.nodes[name] = cpu
        self.server.put(
            "nodes",
            {
                "metadata": {"name": name, "labels": {}},
                "spec": {},
                "status": {"allocatable": {"cpu": f"{cpu}m", "memory": "64Gi", "pods": "110"}},
            },
        )

    def set_quota(self, name: str, spec: dict[str, Any]) -> None:
        self.quotas[name] = spec
        self.server.put(
            "quotas", {"metadata": {"name": name}, "spec": spec}, group="quotaledger.io"
        )

    def add_pod(self, quota: str, cpu: int, *, node: str | None = None, name: str = "") -> str:
        self.serial += 1
        name = name or f"{quota}-{self.serial}"
        uid = f"u{self.seed}-{self.serial}"
        self.server.put(
            "pods",
            {
                "metadata": {
                    "name": name,
                    "namespace": NAMESPACE,
                    "uid": uid,
                    "labels": {QUOTA_LABEL: quota},
                    "creationTimestamp": rfc3339(now_ms() - 1000 * self.rng.randint(0, 3600)),
                },
                "spec": {
                    "priority": self.rng.randint(0, 3),
                    "containers": [{"name": "main", "resources": {"requests": {"cpu": f"{cpu}m"}}}],
                    **({"nodeName": node} if node else {}),
                },
                "status": {"phase": "Running" if node else "Pending"},
            },
        )
        return uid

    def used(self, quota: str) -> int:
        """Cpu of the bound pods of ``quota`` (a parent: of its children's)."""
        children = {quota} | {q for q, spec in self.quotas.items() if spec.get("parent") == quota}
        total = 0
        for pod in self.pods():
            if pod["metadata"]["labels"].get(QUOTA_LABEL) in children and pod["spec"].get(
                "nodeName"
            ):
                total += _cpu(pod)
        return total

    def evicted(self, pod: dict[str, Any]) -> None:
        """A pod evicted (201): a StatefulSet brings some back under the same name."""
        if self.recreate and self.rng.random() < 0.4:
            quota = pod["metadata"]["labels"].get(QUOTA_LABEL, "c")
            name = pod["metadata"]["name"]
            loop = asyncio.get_running_loop()
            loop.call_later(
                self.rng.uniform(0.2, 1.0), lambda: self._recreate(quota, _cpu(pod), name)
            )

    def _recreate(self, quota: str, cpu: int, name: str) -> None:
        if self.recreate and self.server.get("pods", name, NAMESPACE) is None:
            self.add_pod(quota, cpu, name=name)
            self.stats["pods recreated"] += 1

    def schedule(self) -> None:
        """Bind pending pods (oldest first) to a node with room."""
        free = dict(self.nodes)
        pending = []
        for pod in self.pods():
            node = pod["spec"].get("nodeName")
            if node:
                free[node] = free.get(node, 0) - _cpu(pod)
            elif pod["status"].get("phase") == "Pending":
                pending.append(pod)
        pending.sort(key=lambda p: p["metadata"]["resourceVersion"])
        for pod in pending:
            need = _cpu(pod)
            for node, room in sorted(free.items()):
                if room >= need:
                    free[node] = room - need
                    pod["spec"]["nodeName"] = node
                    pod["status"]["phase"] = "Running"
                    self.server.put("pods", pod)
                    self.stats["pods bound"] += 1
                    break

    async def run_scheduler(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self.schedule()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.1):
                    await stop.wait()


def _cpu(pod: dict[str, Any]) -> int:
    text = pod["spec"]["containers"][0]["resources"]["requests"]["cpu"]
    return int(text[:-1]) if text.endswith("m") else int(float(text) * 1000)


@dataclass
class Scenario:
    """The cluster at the start and what happens to it (times in s from the start)."""

    settings: dict[str, str]
    events: list[tuple[float, str, dict[str, Any]]]
    eviction_refuse: float
    eviction_error: float
    retry_after: int | None
    eviction_retry_for: float


def draw_scenario(rng: random.Random, cluster: Cluster, window_s: float) -> Scenario:
    """Nodes, a quota tree (parent p with leaves a and b, leaf c under root), running pods
    borrowing beyond their mins, settings with short clocks; then events: decreases of a
    queue's max below its use (quota-decrease), bursts of pending pods that make others
    owe (overuse) and starve (reclaim), raises, arrivals and completions."""
    if rng.random() < 0.5:
        cluster.add_node("n1", 12_000)
    else:
        cluster.add_node("n1", 6_000)
        cluster.add_node("n2", 6_000)
    a_min, b_min = rng.choice([1000, 2000]), rng.choice([1000, 2000])
    p_min = a_min + b_min + rng.choice([0, 1000])
    c_min = rng.choice([2000, 3000, 4000])

    def delay() -> float:
        return round(rng.uniform(0.3, 1.2), 3)

    cluster.set_quota(
        "p",
        {
            "is_parent": True,
            "min": {"cpu": f"{p_min}m"},
            "max": {"cpu": f"{BIG}m"},
            "preemption_delay_s": delay(),
        },
    )
    cluster.set_quota(
        "a",
        {
            "parent": "p",
            "min": {"cpu": f"{a_min}m"},
            "max": {"cpu": f"{BIG}m"},
            "preemption_delay_s": delay(),
        },
    )
    cluster.set_quota(
        "b",
        {
            "parent": "p",
            "min": {"cpu": f"{b_min}m"},
            "max": {"cpu": f"{BIG}m"},
            "preemption_delay_s": delay(),
        },
    )
    cluster.set_quota(
        "c", {"min": {"cpu": f"{c_min}m"}, "max": {"cpu": f"{BIG}m"}, "preemption_delay_s": delay()}
    )
    nodes = sorted(cluster.nodes)
    room = dict(cluster.nodes)
    # a borrows most of the cluster; the cluster is (nearly) full from the start
    for quota, count in (
        ("b", rng.randint(1, 2)),
        ("c", rng.randint(1, 2)),
        ("a", 12),
    ):
        for _ in range(count):
            cpu = rng.choice([500, 1000, 1000, 1500])
            if sum(room.values()) - cpu < rng.choice([0, 500, 1000]):
                break
            node = next((n for n in nodes if room[n] >= cpu), None)
            if node is None:
                break
            room[node] -= cpu
            cluster.add_pod(quota, cpu, node=node)
    settings = {
        "quota_preemption_enabled": "true",
        "revoke_enabled": "true",
        "revoke_after_s": str(round(rng.uniform(0.5, 1.5), 2)),
        "reclaim_enabled": "true",
        "reclaim_after_s": str(round(rng.uniform(0.5, 1.5), 2)),
        "preemption_miss_percent": rng.choice(["0", "0", "10"]),
    }
    events: list[tuple[float, str, dict[str, Any]]] = []

    def at(share: float = 1.0) -> float:
        return round(rng.uniform(0.2, (window_s - 0.8) * share), 3)

    # the triggers early in the window, so that their preemptions run while faults come
    for _ in range(rng.randint(1, 2)):
        events.append((at(0.6), "decrease", {"quota": rng.choice(["a", "a", "p", "c"])}))
    if rng.random() < 0.5:
        events.append((at(), "raise", {"quota": rng.choice(["a", "p", "c"])}))
    events.append((at(0.4), "burst", {"quota": rng.choice(["b", "c"]), "count": rng.randint(3, 5)}))
    for _ in range(rng.randint(0, 1)):
        events.append((at(), "finish", {"count": 1}))
    for _ in range(rng.randint(2, 4)):
        events.append((at(), "arrive", {"quota": rng.choice(["a", "b", "c"])}))
    events.sort(key=lambda e: e[0])
    return Scenario(
        settings=settings,
        events=events,
        eviction_refuse=rng.choice([0.0, 0.2, 0.5]),
        eviction_error=rng.choice([0.0, 0.0, 0.05]),
        retry_after=rng.choice([None, 0, 1]),
        eviction_retry_for=rng.choice([3.0, 5.0, 8.0]),
    )


def apply_event(cluster: Cluster, rng: random.Random, action: str, params: dict[str, Any]) -> str:
    """One scenario event on the cluster; returns what it did (for the trial's log)."""
    if action == "decrease":
        quota = params["quota"]
        spec = dict(cluster.quotas[quota])
        floor = int(spec["min"]["cpu"][:-1]) + 500
        used = cluster.used(quota)
        if used - 500 < floor:
            return f"decrease {quota}: used {used}m leaves nothing to lower"
        new = rng.randrange(floor, used - 499, 250) if used - 499 > floor else floor
        spec["max"] = {"cpu": f"{new}m"}
        cluster.set_quota(quota, spec)
        cluster.stats["decreases"] += 1
        return f"decrease {quota} max to {new}m (used {used}m)"
    if action == "raise":
        quota = params["quota"]
        spec = dict(cluster.quotas[quota])
        spec["max"] = {"cpu": f"{BIG}m"}
        cluster.set_quota(quota, spec)
        return f"raise {quota} max"
    if action == "burst":
        for _ in range(params["count"]):
            cluster.add_pod(params["quota"], 1000)
        cluster.stats["bursts"] += 1
        return f"burst of {params['count']} pending pods in {params['quota']}"
    if action == "finish":
        running = [p for p in cluster.pods() if p["spec"].get("nodeName")]
        done = rng.sample(running, min(len(running), params["count"]))
        for pod in done:
            cluster.server.delete("pods", pod["metadata"]["name"], NAMESPACE)
        return f"{len(done)} pods finished"
    cluster.add_pod(params["quota"], rng.choice([500, 1000]))
    return f"a pod arrives in {params['quota']}"


# ------------------------------------------------------------------ processes


@dataclass
class Incarnation:
    instance: str
    pid: int
    started_ms: int
    stderr: Path
    ended_ms: int | None = None
    expected_end: bool = False


@dataclass
class EngineSlot:
    """One engine's place: its API-server proxy, kubeconfig and successive processes."""

    index: int
    proxy: FaultProxy
    kubeconfig: Path
    dir: Path
    command: list[str]  # the run command line without --instance; URL stands for the ledger
    urls: dict[str, str]  # the ledger URL per gaps mode
    gaps: str = "stop"
    proc: asyncio.subprocess.Process | None = None
    incarnations: list[Incarnation] = field(default_factory=list)
    paused: bool = False
    starts: int = 0

    @property
    def name(self) -> str:
        return f"e{self.index}"

    @property
    def instance(self) -> str | None:
        return self.incarnations[-1].instance if self.incarnations else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def start(self, instance: str) -> None:
        self.starts += 1
        stderr = self.dir / f"{self.name}-{self.starts}-{instance}.err"
        with stderr.open("wb") as err:
            self.proc = await asyncio.create_subprocess_exec(
                *[self.urls[self.gaps] if part == URL else part for part in self.command],
                "--instance",
                instance,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=err,
            )
        self.paused = False
        self.incarnations.append(Incarnation(instance, self.proc.pid, now_ms(), stderr))

    def instance_at(self, at_ms: int) -> str | None:
        for incarnation in reversed(self.incarnations):
            if incarnation.started_ms <= at_ms and (
                incarnation.ended_ms is None or at_ms <= incarnation.ended_ms
            ):
                return incarnation.instance
        return None

    def signal(self, signum: int) -> None:
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signum)

    async def kill(self) -> None:
        if self.proc is None:
            return
        self.incarnations[-1].expected_end = True
        self.signal(signal.SIGKILL)
        await self.proc.wait()
        self.incarnations[-1].ended_ms = now_ms()
        self.paused = False

    def pause(self) -> None:
        self.signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        self.signal(signal.SIGCONT)
        self.paused = False

    async def terminate(self, hang_s: float) -> Stopped:
        """SIGTERM, and how the process ended (SIGKILL after ``hang_s``)."""
        if self.proc is None or self.proc.returncode is not None:
            return Stopped(None if self.proc is None else self.proc.returncode, 0.0, 0.0, 0.0)
        if self.paused:
            self.resume()
        self.incarnations[-1].expected_end = True
        pid = self.proc.pid
        before, last = sched(pid), sched(pid)
        started = time.monotonic()
        self.signal(signal.SIGTERM)
        while time.monotonic() - started < hang_s and self.proc.returncode is None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.02):
                    await self.proc.wait()
            if self.proc.returncode is None:
                last = sched(pid) or last
        took = time.monotonic() - started
        code = self.proc.returncode
        if code is None:
            self.signal(signal.SIGKILL)
            await self.proc.wait()
        self.incarnations[-1].ended_ms = now_ms()
        cpu = waited = 0.0
        if before is not None and last is not None:
            cpu, waited = last[0] - before[0], last[1] - before[1]
        return Stopped(code, took, cpu, waited)


@dataclass(frozen=True)
class Stopped:
    """How a process met its SIGTERM: exit code (None: killed at the hang guard), wall
    seconds to its exit, CPU seconds it spent, and seconds its main thread waited for a
    CPU (``/proc/PID/schedstat``): the wall time less that wait is what the process
    itself took, whatever the load (DESIGN §9, DECISIONS 180)."""

    code: int | None
    wall_s: float
    cpu_s: float
    waited_s: float

    @property
    def own_s(self) -> float:
        return self.wall_s - self.waited_s


def sched(pid: int) -> tuple[float, float] | None:
    """(CPU seconds of all its threads, seconds its main thread waited on a run queue) of
    a live process; None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        waiting = int(Path(f"/proc/{pid}/schedstat").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return cpu, waiting / 1e9


def tracebacks(paths: Iterable[Path]) -> list[tuple[Path, str]]:
    """Files holding a Python traceback, with the lines around the first one."""
    found = []
    for path in paths:
        if not path.exists():
            continue
        text = path.read_text(errors="replace")
        at = text.find("Traceback (most recent call last)")
        if at >= 0:
            end = text.find("\n\n", at)
            found.append((path, text[at : end if end > 0 else at + 2000][-1500:]))
    return found


def term_starts_ms(path: Path) -> list[int]:
    """From an engine's log: ms from each Lease taken to its engine leading (its
    catch-up and election; the Lease is held, nothing decided yet)."""
    taken: datetime | None = None
    out: list[int] = []
    if not path.exists():
        return out
    for line in path.read_text(errors="replace").splitlines():
        if " taken by " not in line and " leads with epoch " not in line:
            continue
        try:
            moment = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
        except ValueError:
            continue
        if " taken by " in line:
            taken = moment
        elif taken is not None:
            out.append(round((moment - taken).total_seconds() * 1000))
            taken = None
    return out


def tail(path: Path, lines: int = 6) -> str:
    if not path.exists():
        return ""
    return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])


# ------------------------------------------------------------------ the environment


@dataclass(eq=False)
class Broker:
    """A tansu broker and the fault proxy it advertises (every client goes through it)."""

    storage: str
    tansu: Any
    proxy: FaultProxy
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    restarts: list[tuple[int, int]] = field(default_factory=list)  # (down ms, up ms)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.proxy.port}"

    async def restart(self, rng: random.Random) -> str:
        """SIGKILL or SIGTERM, a pause, then the same broker on the same storage."""
        async with self.lock:
            how = rng.choice(["SIGKILL", "SIGTERM"])
            down_s = rng.uniform(0.1, 1.0)
            down = now_ms()
            await asyncio.to_thread(self.tansu.kill if how == "SIGKILL" else self.tansu.stop)
            await asyncio.sleep(down_s)
            await asyncio.to_thread(self.tansu.start)
            self.restarts.append((down, now_ms()))
            return f"broker {how}, down {down_s:.2f} s"

    async def ensure_up(self) -> None:
        async with self.lock:
            if self.tansu.proc is None or self.tansu.proc.poll() is not None:
                await asyncio.to_thread(self.tansu.start)


class Environment:
    """What trials share: a work directory; on Kafka a moto server and two tansu brokers
    behind their fault proxies, one on ``s3://`` storage (a restart keeps its log: the
    trials that restart a broker use it, and some others) and one in memory (much faster
    to read: the other trials)."""

    def __init__(self, backend: str, options: Options) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, not {backend!r}")
        self.backend = backend
        self.options = options
        self.dir = Path(tempfile.mkdtemp(prefix=f"bench-faults-{backend}-"))
        self.moto: Any = None
        self.brokers: dict[str, Broker] = {}

    async def __aenter__(self) -> Environment:
        if self.backend == "kafka":
            from .bench_tansu import Moto, Tansu, free_port

            self.moto = await asyncio.to_thread(lambda: Moto().start())
            for storage, env in (("s3", self.moto.tansu_env()), ("memory", None)):
                port = free_port()
                tansu = Tansu(storage=f"{storage}://tansu/", env=env, advertise=port)
                await asyncio.to_thread(tansu.start)
                proxy = await FaultProxy("127.0.0.1", tansu.port, name="broker").start(port)
                self.brokers[storage] = Broker(storage, tansu, proxy)
        return self

    async def __aexit__(self, *exc: object) -> None:
        for broker in self.brokers.values():
            await broker.proxy.close()
            await asyncio.to_thread(broker.tansu.close)
        if self.moto is not None:
            await asyncio.to_thread(self.moto.stop)
        shutil.rmtree(self.dir, ignore_errors=True)


# ------------------------------------------------------------------ one trial


@dataclass
class Produced:
    """Facts an outside producer wrote, by id: acknowledged or not."""

    acked: dict[str, bool] = field(default_factory=dict)


class Trial:
    def __init__(self, env: Environment, seed: int) -> None:
        self.env = env
        self.options = env.options
        self.seed = seed
        self.rng = random.Random(seed)
        self.result = TrialResult(seed, env.backend)
        self.dir = env.dir / f"trial-{seed}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.registry: dict[int, str] = {}
        self.server = FaultApiServer(random.Random(self.rng.random()), self.registry)
        self.cluster = Cluster(self.server, random.Random(self.rng.random()), seed)
        self.slots: list[EngineSlot] = []
        self.produced = Produced()
        self.tool_errs: list[Path] = []
        self.pauses: list[tuple[str, str, int, int]] = []  # (slot, instance, stop ms, cont ms)
        self.stop_workload = asyncio.Event()
        self.topic = f"faults-{seed}-{self.rng.randrange(1 << 30):08x}"
        self.path = self.dir / "ledger.db"
        self.instances = 0
        self.stopped_at_holes: list[tuple[str, int, str]] = []
        self.tap_task: asyncio.Task[None] | None = None
        self.faults = self._draw_faults()
        self.broker: Broker | None = None
        if env.backend == "kafka":
            restarts = any(kind == "broker-restart" for _, kind in self.faults)
            s3 = restarts or self.rng.random() < 0.25
            self.broker = env.brokers["s3" if s3 else "memory"]
        self.tap = KafkaTap(self.bootstrap, self.topic)

    # ---------------------------------------------------------- urls and reads

    @property
    def bootstrap(self) -> str:
        return self.broker.bootstrap if self.broker is not None else ""

    def engine_url(self, gaps: str) -> str:
        if self.env.backend == "sqlite":
            return str(self.path)
        suffix = "?gaps=fill" if gaps == "fill" else ""
        return f"kafka://{self.bootstrap}/{self.topic}{suffix}"

    async def records(self) -> list[RawRecord]:
        """The records so far, for waiting (not for the checks: :meth:`final_records`)."""
        if self.env.backend == "sqlite":
            return await asyncio.to_thread(read_sqlite, self.path)
        return self.tap.records

    async def final_records(self) -> list[RawRecord]:
        """Every record, read again independently of quotaledger's readers (SQLite: plain
        ``sqlite3``; Kafka: raw fetches, :class:`KafkaTap`)."""
        if self.env.backend == "sqlite":
            return await asyncio.to_thread(read_sqlite, self.path)
        return await self.tap.read_all()

    def note(self, text: str, at: float | None = None) -> None:
        """A line of the trial's log, at ``at`` (monotonic; default now)."""
        at = time.monotonic() if at is None else at
        self.result.fault_log.append(f"{at - self.started:7.2f} {text}")

    def exited(self, who: str, code: int | None, text: str) -> None:
        """A process that ended by itself: a violation, unless it stopped at an offset the
        broker lost for good after a restart (DESIGN §10: a gap stops a reader with a
        clear error), which :meth:`_check` finds out at the end."""
        found = MISSING.search(text)
        if code == 2 and found is not None:
            self.stopped_at_holes.append((who, int(found.group(1)), text))
            return
        self.violate("process-exit", f"{who} exited {code}: {text}")

    def violate(self, check: str, detail: str, offsets: str = "") -> None:
        self.result.violations.append(Violation(self.seed, check, offsets, detail))

    # ---------------------------------------------------------- the run

    async def run(self) -> TrialResult:
        self.started = time.monotonic()
        self.started_ms = now_ms()
        await self.server.start()
        try:
            async with asyncio.TaskGroup() as group:
                self.group = group
                try:
                    async with asyncio.timeout(
                        self.options.workload_s + self.options.settle_timeout_s + 120
                    ):
                        await self._run()
                except TimeoutError:
                    self.violate("no-quiescence", "the trial did not end within its hang guard")
                except Exception as exc:  # a harness bug: said, never hidden
                    self.violate("harness-error", f"{type(exc).__name__}: {exc}")
                finally:
                    if self.tap_task is not None:
                        self.tap_task.cancel()
        finally:
            for slot in self.slots:
                if slot.alive():
                    slot.resume()
                    await slot.kill()
                await slot.proxy.close()
            await self.server.stop()
        self.result.seconds = time.monotonic() - self.started
        holder: str | None = "-"
        for ms, who in self.server.lease_writes:
            if who != holder:
                holder = who
                self.result.fault_log.append(
                    f"{(ms - self.started_ms) / 1000:7.2f} lease held by {who}"
                )
        self.result.fault_log.sort(key=lambda line: float(line.split()[0]))
        return self.result

    async def _run(self) -> None:
        rng = self.rng
        scenario = draw_scenario(rng, self.cluster, self.options.workload_s)
        self.server.put(
            "configmaps",
            {
                "metadata": {"name": "quotaledger-settings", "namespace": "quotaledger"},
                "data": scenario.settings,
            },
        )
        self.server.refuse_share = (
            scenario.eviction_refuse
            if self.options.refuse_share is None
            else self.options.refuse_share
        )
        self.server.error_share = scenario.eviction_error
        self.server.retry_after = scenario.retry_after
        self.server.on_evicted = self.cluster.evicted
        ledger = await open_ledger(
            str(self.path)
            if self.env.backend == "sqlite"
            else f"kafka://{self.bootstrap}/{self.topic}",
            create=True,
        )
        await ledger.close()
        if self.env.backend == "kafka":  # only now: a fetch of a missing topic creates it
            self.tap_task = self.group.create_task(self.tap.follow())
        engines = rng.choice([2, 2, 3])
        for index in range(engines):
            await self._add_slot(index, scenario, rng.choice(["stop", "fill"]))
        for slot in self.slots:
            await slot.start(self._instance_name(slot, new=True))
        if not await self._wait_ready():
            return
        self.note(f"ready: {engines} engines, lease held by {self.server.holder()}")
        faults = self.faults
        if self.broker is not None:
            self.note(f"broker storage: {self.broker.storage}")
        stop_scheduler = asyncio.Event()
        async with asyncio.TaskGroup() as group:
            group.create_task(self.cluster.run_scheduler(stop_scheduler))
            supervisor = group.create_task(self._supervise())
            group.create_task(self._workload(scenario))
            producers = [
                group.create_task(self._ingest_producer(i)) for i in range(rng.randint(1, 3))
            ]
            if self.env.backend == "kafka" and rng.random() < 0.7:
                producers.append(group.create_task(self._kafka_producer()))
            fault_task = group.create_task(self._faults(faults))
            await asyncio.sleep(self.options.workload_s)
            self.cluster.recreate = False
            await fault_task
            await asyncio.gather(*producers)
            await self._heal()
            settled = await self._settle()
            supervisor.cancel()
            stop_scheduler.set()
        await self._stop_engines()
        if settled is not None:
            await self._check(settled)

    def _instance_name(self, slot: EngineSlot, new: bool) -> str:
        if not new and slot.instance is not None:
            return slot.instance
        self.instances += 1
        return f"{slot.name}-{self.instances}"

    async def _add_slot(self, index: int, scenario: Scenario, gaps: str) -> None:
        proxy = await FaultProxy(
            "127.0.0.1",
            int(self.server.url.rsplit(":", 1)[1]),
            name=f"e{index}",
            http=True,
            registry=self.registry,
            rng=random.Random(self.rng.random()),
        ).start()
        standin_url = self.server.url
        self.server.url = f"http://127.0.0.1:{proxy.port}"
        kubeconfig = self.server.kubeconfig(self.dir / f"e{index}.kubeconfig")
        self.server.url = standin_url
        o = self.options
        command = [
            *o.engine_command,
            "run",
            URL,
            "--kubeconfig",
            str(kubeconfig),
            "--executor",
            "kubernetes",
            "--lease-duration",
            str(o.lease_duration_s),
            "--renew-deadline",
            str(o.renew_deadline_s),
            "--retry-period",
            str(o.retry_period_s),
            "--watch-timeout",
            "5",
            "--eviction-retry-for",
            str(scenario.eviction_retry_for),
            "--digest-every",
            str(self.rng.choice([25, 100, 10_000])),
            "--snapshot-every",
            str(self.rng.choice([40, 150, 50_000])),
        ]
        if self.env.backend == "kafka" and self.rng.random() < 0.5:
            command += ["--snapshots", str(self.dir / f"e{index}-snapshots.db")]
        urls = {mode: self.engine_url(mode) for mode in ("stop", "fill")}
        self.slots.append(EngineSlot(index, proxy, kubeconfig, self.dir, command, urls, gaps))

    async def _wait_ready(self) -> bool:
        """Until a Lease holder's watcher has put the cluster into the ledger."""
        pods = {p["metadata"]["uid"] for p in self.cluster.pods()}
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            await asyncio.sleep(0.3)
            if self.server.holder() is None:
                continue
            projection = fold(await self.records())
            state = projection.state
            if pods <= set(state.pods) and {"p", "a", "b", "c"} <= set(state.quotas):
                return True
            for slot in self.slots:
                if not slot.alive():
                    self.violate(
                        "process-exit",
                        f"engine {slot.instance} exited"
                        f" {slot.proc.returncode if slot.proc else '?'} while starting:"
                        f" {tail(slot.incarnations[-1].stderr)}",
                    )
                    return False
        self.violate("no-quiescence", "the engines did not put the cluster into the ledger in 90 s")
        return False

    # ---------------------------------------------------------- workload

    async def _workload(self, scenario: Scenario) -> None:
        start = time.monotonic()
        for at_s, action, params in scenario.events:
            await asyncio.sleep(max(0.0, at_s - (time.monotonic() - start)))
            self.note(apply_event(self.cluster, self.cluster.rng, action, params))

    async def _ingest_producer(self, index: int) -> None:
        """``quotaledger ingest`` runs of a few facts each, at random times."""
        rng = random.Random(self.rng.random())
        runs = rng.randint(1, 3)
        # early in the window: an ingest into a long Kafka ledger reads it (slow on s3)
        times = sorted(rng.uniform(0.0, self.options.workload_s * 0.6) for _ in range(runs))
        start = time.monotonic()
        for run, at_s in enumerate(times):
            await asyncio.sleep(max(0.0, at_s - (time.monotonic() - start)))
            lines = []
            ids = []
            for n in range(rng.randint(3, 25)):
                fact_id = f"f{self.seed}x{index}x{run}x{n}"
                ids.append(fact_id)
                weight = 0 if rng.random() < 0.05 else rng.randint(1, 9)  # 0: refused, kept raw
                lines.append(
                    json.dumps(
                        {"kind": "NamespaceWeighted", "namespace": fact_id, "weight": weight}
                    )
                )
            source = self.dir / f"ingest-{index}-{run}.jsonl"
            source.write_text("\n".join(lines) + "\n")
            err = self.dir / f"ingest-{index}-{run}.err"
            self.tool_errs.append(err)
            url = self.engine_url(rng.choice(["stop", "fill"]))
            with err.open("wb") as stderr:
                proc = await asyncio.create_subprocess_exec(
                    *self.options.tool_command,
                    "ingest",
                    str(source),
                    url,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.DEVNULL,
                    stderr=stderr,
                )
                try:
                    code = await proc.wait()
                finally:
                    if proc.returncode is None:  # cancelled: nothing outlives the trial
                        proc.kill()
                        await proc.wait()
            for fact_id in ids:
                self.produced.acked[fact_id] = code == 0
            self.result.stats["facts ingested"] += len(ids)
            if code == 2 and "cannot connect" in tail(err, 2):
                # a clear refusal at start (the broker restarting): nothing appended
                self.result.stats["ingest runs refused at connect"] += 1
            elif code != 0:
                self.exited("ingest", code, tail(err))

    async def _kafka_producer(self) -> None:
        """A plain confluent-kafka producer (acks=all), one fact every few tens of ms."""
        import confluent_kafka

        rng = random.Random(self.rng.random())
        producer = confluent_kafka.Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "acks": "all",
                "enable.idempotence": False,
                "linger.ms": 0,
                "message.timeout.ms": 120_000,
                "log_level": 0,
            }
        )
        acked = self.produced.acked
        lock = threading.Lock()

        def delivered(error: Any, message: Any) -> None:
            fact = decode_json(message.value() or b"") or {}
            with lock:
                acked[str(fact.get("namespace"))] = error is None

        stop_at = time.monotonic() + self.options.workload_s - 0.3
        n = 0
        while time.monotonic() < stop_at:
            fact_id = f"f{self.seed}xkx{n}"
            n += 1
            weight = 0 if rng.random() < 0.03 else rng.randint(1, 9)
            value = json.dumps(
                {"kind": "NamespaceWeighted", "namespace": fact_id, "weight": weight}
            )
            acked.setdefault(fact_id, False)
            producer.produce(self.topic, value.encode(), partition=0, on_delivery=delivered)
            producer.poll(0)
            await asyncio.sleep(rng.uniform(0.02, 0.15))
        left = len(producer)
        flush_until = time.monotonic() + 150
        while left and time.monotonic() < flush_until:  # in short steps: cancellable
            left = await asyncio.to_thread(producer.flush, 1.0)
        self.result.stats["facts produced"] += n
        if left:
            self.violate(
                "fact-lost", f"the confluent-kafka producer could not deliver {left} facts"
            )

    # ---------------------------------------------------------- engines

    async def _supervise(self) -> None:
        """An engine that exits by itself is a violation; it is started again."""
        while True:
            await asyncio.sleep(0.2)
            for slot in self.slots:
                proc = slot.proc
                if proc is None or proc.returncode is None or slot.incarnations[-1].expected_end:
                    continue
                incarnation = slot.incarnations[-1]
                incarnation.ended_ms = now_ms()
                text = tail(incarnation.stderr)
                self.exited(f"engine {incarnation.instance}", proc.returncode, text)
                if MISSING.search(text) is not None:
                    slot.gaps = "fill"  # as an operator would, once told of a lost write
                self.note(f"{incarnation.instance} exited {proc.returncode}; restarting")
                await slot.start(self._instance_name(slot, new=True))

    def _leader_slot(self) -> EngineSlot | None:
        holder = self.server.holder()
        for slot in self.slots:
            if slot.alive() and not slot.paused and slot.instance == holder:
                return slot
        return None

    # ---------------------------------------------------------- faults

    def _draw_faults(self) -> list[tuple[float, str]]:
        kinds = self.options.fault_kinds or FAULT_KINDS[self.env.backend]
        count = self.rng.randint(2, 4)
        window = self.options.workload_s
        return sorted(
            (round(self.rng.uniform(0.3, window - 0.5), 3), self.rng.choice(kinds))
            for _ in range(count)
        )

    async def _faults(self, plan: Sequence[tuple[float, str]]) -> None:
        start = time.monotonic()
        for at_s, kind in plan:
            await asyncio.sleep(max(0.0, at_s - (time.monotonic() - start)))
            self.result.faults[f"{kind} drawn"] += 1
            began = time.monotonic()
            what = await self._fault(kind)
            if what is not None:
                self.result.faults[kind] += 1
                self.note(f"fault {kind}: {what}", began)
            else:
                self.note(f"fault {kind}: not applicable now", began)

    async def _fault(self, kind: str) -> str | None:
        rng = self.rng
        live = [s for s in self.slots if s.alive() and not s.paused]
        if kind == "kill":
            leader = self._leader_slot()
            slot = (
                leader
                if leader is not None and rng.random() < 0.6
                else (rng.choice(live) if live else None)
            )
            if slot is None:
                return None
            victim = slot.instance
            await slot.kill()
            down_s = rng.uniform(0.0, 1.0)
            await asyncio.sleep(down_s)
            await slot.start(self._instance_name(slot, new=rng.random() < 0.5))
            return f"SIGKILL {victim}, restarted as {slot.instance} after {down_s:.2f} s"
        if kind == "pause":
            slot = self._leader_slot()
            if slot is None:
                await asyncio.sleep(1.0)
                slot = self._leader_slot()
            if slot is None:
                return None
            how = "at once"
            if rng.random() < self.options.pause_when_refused:  # with a retry pending
                event = self.server.refused.setdefault(slot.name, asyncio.Event())
                event.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(1.5):
                        await event.wait()
                        how = "after a refused eviction"
            if not slot.alive() or slot.instance != self.server.holder():
                return None
            pause_s = self.options.lease_duration_s + rng.uniform(*self.options.pause_extra_s)
            instance = slot.instance or "?"
            stopped = now_ms()
            slot.pause()
            await asyncio.sleep(pause_s)
            slot.resume()
            self.pauses.append((slot.name, instance, stopped, now_ms()))
            return (
                f"SIGSTOP {instance} ({how}) at {(stopped - self.started_ms) / 1000:.2f}"
                f" for {pause_s:.2f} s, then SIGCONT"
            )
        if kind.startswith("api-"):
            if not self.slots:
                return None
            slot = self._leader_slot() if rng.random() < 0.6 else None
            slot = slot or rng.choice(self.slots)
            return self._link_fault(kind[4:], slot.proxy, slot.instance or slot.name)
        if kind.startswith("broker-") and self.broker is not None:
            if kind == "broker-restart":
                return await self.broker.restart(rng)
            return self._link_fault(kind[7:], self.broker.proxy, "broker")
        return None

    def _link_fault(self, fault: str, proxy: FaultProxy, who: str) -> str:
        rng = self.rng
        if fault == "delay":
            low = rng.uniform(0.005, 0.05)
            high = low + rng.uniform(0.01, 0.3)
            for_s = rng.uniform(1.0, 3.0)
            proxy.delay(low, high, for_s)
            return f"{who} link: each chunk held {low:.3f}-{high:.3f} s for {for_s:.1f} s"
        if fault == "stall":
            for_s = rng.uniform(0.3, 2.5)
            proxy.stall(for_s)
            return f"{who} link stalled for {for_s:.2f} s"
        share = 1.0 if who != "broker" else rng.uniform(0.3, 1.0)
        cut = proxy.cut(share)
        return f"{who} link: {cut} connections cut mid-response"

    async def _heal(self) -> None:
        for slot in self.slots:
            slot.proxy.heal()
            if slot.paused:
                slot.resume()
        if self.broker is not None:
            self.broker.proxy.heal()
            await self.broker.ensure_up()

    # ---------------------------------------------------------- quiescence and stop

    async def _settle(self) -> list[RawRecord] | None:
        """Wait until nothing runs and nothing is to come; the records then."""
        deadline = time.monotonic() + self.options.settle_timeout_s
        grace = self.options.deadline_grace_ms
        last: tuple[int, int] = (-1, 0)
        why = "?"
        told = time.monotonic()
        while time.monotonic() < deadline:
            await asyncio.sleep(0.5)
            if time.monotonic() - told > 10:
                told = time.monotonic()
                self.note(f"not quiet yet: {why}")
            records = await self.records()
            state = fold(records).state
            now = now_ms()
            tail_offset = records[-1].offset if records else -1
            if tail_offset != last[0]:
                last = (tail_offset, now)
            cluster = {
                p["metadata"]["uid"]: (p["status"]["phase"], p["spec"].get("nodeName"))
                for p in self.cluster.pods()
            }
            mirrored = {
                uid: (pod.phase, pod.node)
                for uid, pod in state.pods.items()
                if pod.phase in ("Pending", "Running")
            }
            if state.preemptions:
                why = f"preemptions running: {sorted(state.preemptions)}"
            elif any(e.outcome is None for e in state.evictions.values()):
                outstanding = sorted(e for e, r in state.evictions.items() if r.outcome is None)
                why = f"evictions outstanding: {outstanding}"
            elif any(d > now - grace for d in state.decrease_deadlines.values()):
                why = f"deadlines to come: {state.decrease_deadlines}"
            elif cluster != mirrored:
                why = "the ledger does not mirror the cluster yet"
            elif self.server.holder() is None:
                why = "no Lease holder"
            elif now - last[1] < 1500:
                why = "the tail still moves"
            else:
                return records
        self.violate(
            "no-quiescence", f"not quiet after {self.options.settle_timeout_s:.0f} s: {why}"
        )
        return None

    async def _stop_engines(self) -> None:
        """SIGTERM each engine: it must exit 0 (or, stopped before its handlers were in
        place, by the signal itself or with 143 and ``stopped by SIGTERM``), spending less
        than the bound in CPU and in wall time less its waits for a CPU."""
        bound = self.options.stop_bound_s
        for slot in self.slots:
            instance = slot.instance
            stopped = await slot.terminate(60.0)
            text = tail(slot.incarnations[-1].stderr)
            self.note(
                f"{instance}: SIGTERM -> exit {stopped.code} in {stopped.wall_s:.2f} s"
                f" ({stopped.cpu_s:.2f} s CPU, {stopped.waited_s:.2f} s waiting for one)"
            )
            stats = self.result.stats
            stats["stops"] += 1
            for key, value in (
                ("stop ms max", stopped.wall_s),
                ("stop own ms max", stopped.own_s),
                ("stop cpu ms max", stopped.cpu_s),
            ):
                stats[key] = max(stats[key], round(value * 1000))
            clean = stopped.code in (0, -signal.SIGTERM) or (
                stopped.code == 128 + signal.SIGTERM and "stopped by SIGTERM" in text
            )
            slow = stopped.cpu_s >= bound or stopped.own_s >= bound + 0.5
            if not clean or slow:
                self.violate(
                    "unclean-stop",
                    f"engine {instance}: SIGTERM -> exit {stopped.code} after"
                    f" {stopped.wall_s:.2f} s ({stopped.cpu_s:.2f} s CPU,"
                    f" {stopped.waited_s:.2f} s waiting for a CPU): {text}",
                )

    # ---------------------------------------------------------- checks

    async def _check(self, settled: list[RawRecord]) -> None:
        records = await self.final_records()
        if len(records) < len(settled):
            self.violate(
                "gap",
                f"the final read found {len(records)} records, the follower saw {len(settled)}",
            )
        present = {r.offset for r in records}
        holes = set(range(max(present, default=-1) + 1)) - present
        # a ledger with a hole is audited as a gaps=fill engine reads it (DESIGN §10)
        audit = await self._audit(self.engine_url("fill" if holes else "stop"))
        ctx = CheckContext(
            seed=self.seed,
            backend=self.env.backend,
            produced=self.produced.acked,
            posts=self.server.posts,
            lease_writes=self.server.lease_writes,
            requests=[
                (slot.name, seen.at_ms, seen.path)
                for slot in self.slots
                for seen in slot.proxy.requests
                if seen.method == "POST" and seen.path.endswith("/eviction")
            ],
            instance_at={slot.name: slot.instance_at for slot in self.slots},
            now_ms=now_ms(),
            deadline_grace_ms=self.options.deadline_grace_ms,
            audit=audit,
        )
        restarted = self.broker is not None and any(
            up >= self.started_ms for _, up in self.broker.restarts
        )
        if holes and restarted:
            # the broker lost writes when it was restarted (tansu on s3 does): not the
            # engines' doing; what matters is that no acknowledged fact is among them
            self.result.stats["offsets lost by broker restarts"] += len(holes)
            ctx.broker_holes = set(holes)
        for who, offset, text in self.stopped_at_holes:
            if offset in ctx.broker_holes:
                self.result.stats["stops at a lost offset (gaps=stop)"] += 1
            else:
                self.violate("process-exit", f"{who} stopped at offset {offset}: {text}")
        violations, stats = check_trial(records, ctx)
        self.result.violations.extend(violations)
        self.result.stats.update(stats)
        errs = [i.stderr for s in self.slots for i in s.incarnations] + self.tool_errs
        starts = [ms for path in errs for ms in term_starts_ms(path)]
        self.result.stats["terms"] += len(starts)
        self.result.stats["term start ms max"] = max(starts, default=0)
        for path, text in tracebacks(errs):
            self.violate("traceback", f"{path.name}: {' | '.join(text.splitlines()[-4:])}")

    async def _audit(self, url: str) -> tuple[int, dict[str, Any] | None, str]:
        """``quotaledger audit URL --json`` (again, up to 3 times, while it cannot connect:
        a broker restart of a trial running beside this one)."""
        for _ in range(3):
            code, report, err = await self._audit_once(url)
            if not (code == 2 and "cannot connect" in err):
                break
            await asyncio.sleep(2.0)
        return code, report, err

    async def _audit_once(self, url: str) -> tuple[int, dict[str, Any] | None, str]:
        err = self.dir / "audit.err"
        self.tool_errs.append(err)
        with err.open("wb") as stderr:
            proc = await asyncio.create_subprocess_exec(
                *self.options.tool_command,
                "audit",
                url,
                "--json",
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=stderr,
            )
            try:
                out, _ = await proc.communicate()
            finally:
                if proc.returncode is None:
                    proc.kill()
                    await proc.wait()
        code = proc.returncode if proc.returncode is not None else -1
        return code, decode_json(out), tail(err)


def contiguous(records: Sequence[RawRecord]) -> list[RawRecord]:
    """``records`` with a placeholder (a ``FactRejected`` the projection keeps as such) at
    every missing offset, as a gaps=fill reader folds a hole."""
    out: list[RawRecord] = []
    for record in records:
        while len(out) < record.offset:
            ts = out[-1].ts if out else 0
            placeholder = msgspec.json.encode(
                {"kind": "FactRejected", "offset": len(out), "reason": HOLE_REASON}
            )
            out.append(RawRecord(len(out), ts, -1, placeholder))
        if record.offset == len(out):
            out.append(record)
    return out


def fold(records: Sequence[RawRecord]) -> Projection:
    """The records folded from offset 0, holes taken as placeholders."""
    projection = Projection()
    for record in contiguous(records):
        projection.apply_record(Record(record.offset, record.ts, record.payload))
    return projection


# ------------------------------------------------------------------ the checks


@dataclass
class CheckContext:
    seed: int
    backend: str
    produced: dict[str, bool]  # fact id -> acknowledged
    posts: Sequence[EvictionPost]
    lease_writes: Sequence[tuple[int, str | None]]
    requests: Sequence[tuple[str, int, str]]  # (slot, sent ms, path) of eviction POSTs
    instance_at: dict[str, Callable[[int], str | None]]
    now_ms: int
    deadline_grace_ms: int
    audit: tuple[int, dict[str, Any] | None, str] | None = None
    broker_holes: set[int] = field(default_factory=set)  # offsets a broker restart lost


def _span(offsets: Sequence[int]) -> str:
    if not offsets:
        return ""
    low, high = min(offsets), max(offsets)
    return str(low) if low == high else f"{low}..{high}"


def _holder_at(writes: Sequence[tuple[int, str | None]], at_ms: int) -> str | None:
    holder: str | None = None
    for ms, who in writes:
        if ms > at_ms:
            break
        holder = who
    return holder


def _retried(copies: Sequence[RawRecord], backend: str) -> bool:
    """Copies of one record a retried Kafka append left: the same bytes stamped at the same
    ms by the writer (DESIGN §10: a retried append may duplicate a record). SQLite never
    retries a commit: two copies there were written twice."""
    return backend == "kafka" and len({(c.payload, c.stamp) for c in copies}) == 1


@dataclass
class _History:
    """Values a dict of the state took, per key, from which offset on."""

    changes: dict[str, list[tuple[int, Any]]] = field(default_factory=dict)
    last: dict[str, Any] = field(default_factory=dict)

    def observe(self, offset: int, current: dict[str, Any]) -> list[str]:
        changed = []
        if current != self.last:
            for key in set(current) | set(self.last):
                if current.get(key) != self.last.get(key):
                    self.changes.setdefault(key, []).append((offset, current.get(key)))
                    changed.append(key)
            self.last = dict(current)
        return changed

    def at(self, key: str, offset: int) -> tuple[int, Any] | None:
        """(offset it was set at, value) in force after record ``offset``."""
        found = None
        for since, value in self.changes.get(key, []):
            if since > offset:
                break
            found = (since, value)
        return found if found is not None and found[1] is not None else None


def check_trial(
    records: Sequence[RawRecord], ctx: CheckContext
) -> tuple[list[Violation], Counter[str]]:
    """Every check of :data:`CHECKS` that reads the ledger, the API server's record and
    the audit; returns the violations and counts of what was seen.

    * **gap**: offsets 0..N follow each other, no record is a gaps=fill filler;
    * **fact-lost / fact-twice**: every acknowledged outside fact (by its id) is in the
      ledger, and no fact is there twice (on Kafka a copy left by a retried append, the
      same bytes with the same writer stamp, is not a second write);
    * **trigger-unjustified / trigger-twice**: an accepted ``PreemptionStarted`` answers a
      trigger armed at its basis (quota-decrease: the queue's deadline, armed at some offset;
      overuse: the queue's owing clock; reclaim: the pod's starving clock); a quota-decrease
      one lands where its queue's deadline is still armed and passed (DESIGN §6); no trigger
      is answered by two accepted preemptions, no ``preemption_id`` starts twice;
    * **overlap**: a preemption holds its queue and every queue it evicts from from its
      accepted start to its accepted finish; no other accepted start or eviction there;
    * **eviction-twice**: one outcome record per eviction (a retried append's copy aside),
      no two outcomes that differ, at most one POST answered 201 per pod;
    * **post-without-decision**: every eviction POST names (by uid) a pod of an accepted
      ``EvictionRequested``;
    * **zombie-post / zombie-decision**: no eviction POST left an engine while the server's
      Lease named another holder; no accepted decision was stamped by its epoch's engine
      while the Lease named another holder, and none carries an epoch older than the newest
      accepted ``LeaderElected`` before it;
    * **armed-deadline**: at quiescence no quota-decrease deadline is armed in the past;
    * **audit**: ``quotaledger audit`` exits 0 and flags nothing, finds nothing changed and
      no preemption unfinished.
    """
    out: list[Violation] = []
    stats: Counter[str] = Counter()

    def violate(check: str, detail: str, offsets: Sequence[int] = ()) -> None:
        out.append(Violation(ctx.seed, check, _span(offsets), detail))

    # gap
    expected = 0
    for record in records:
        missing = [o for o in range(expected, record.offset) if o not in ctx.broker_holes]
        if missing:
            violate(
                "gap",
                f"offsets {_span(missing)} missing, next record at {record.offset}",
                [missing[0], record.offset],
            )
        expected = record.offset + 1
    records = contiguous(records)
    stats["records"] = len(records)
    docs = [decode_json(r.payload) for r in records]
    for record, doc in zip(records, docs, strict=True):
        if doc and doc.get("kind") == "FactRejected" and GAP_REASON in str(doc.get("reason", "")):
            violate(
                "gap",
                f"offset {record.offset} holds a gaps=fill filler: {doc.get('reason')}",
                [record.offset],
            )

    # facts of the outside producers
    copies: dict[str, list[RawRecord]] = {}
    for record, doc in zip(records, docs, strict=True):
        fact = doc
        if doc and doc.get("kind") == "FactRejected" and isinstance(doc.get("raw"), str):
            fact = decode_json(doc["raw"].encode())
        if fact and fact.get("kind") == "NamespaceWeighted":
            name = str(fact.get("namespace"))
            if name in ctx.produced:
                copies.setdefault(name, []).append(record)
    for fact_id, acked in ctx.produced.items():
        found = copies.get(fact_id, [])
        if acked and not found:
            violate("fact-lost", f"acknowledged fact {fact_id} is not in the ledger")
        if len(found) > 1:
            if _retried(found, ctx.backend):
                stats["fact copies left by retried appends"] += len(found) - 1
            else:
                violate(
                    "fact-twice",
                    f"fact {fact_id} written {len(found)} times",
                    [r.offset for r in found],
                )
    stats["facts found"] = len(copies)

    # the fold: what was accepted, what was armed when
    projection = Projection()
    deadlines, owing, starving = _History(), _History(), _History()
    holders: dict[str, str] = {}  # queue -> running preemption
    holding: dict[str, set[str]] = {}  # preemption -> queues it holds
    started_at: dict[str, list[RawRecord]] = {}
    triggers: dict[tuple[str, ...], list[int]] = {}
    requested: dict[str, tuple[str, int]] = {}  # eviction id -> (pod uid, offset)
    outcomes: dict[str, list[RawRecord]] = {}
    removed: set[str] = set()
    newest_epoch = 0
    epoch_instance: dict[int, str] = {}
    for record, doc in zip(records, docs, strict=True):
        kind = doc.get("kind") if doc else None
        state = projection.state
        armed_before = (
            state.decrease_deadlines.get(str(doc.get("queue")))
            if kind == "PreemptionStarted" and doc
            else None
        )
        accepted = (
            projection.apply_record(Record(record.offset, record.ts, record.payload)) is not None
        )
        state = projection.state
        deadlines.observe(record.offset, state.decrease_deadlines)
        owing.observe(record.offset, state.owing_since)
        starving.observe(record.offset, state.starving_since)
        if doc is None or not isinstance(kind, str):
            continue
        where = [record.offset]
        if kind == "LeaderElected" and accepted:
            newest_epoch = max(newest_epoch, int(doc.get("epoch", 0)))
            epoch_instance[int(doc.get("epoch", 0))] = str(doc.get("instance"))
        if (
            kind
            in ("PreemptionStarted", "EvictionRequested", "PreemptionFinished", "ClocksObserved")
            and accepted
        ):
            epoch = int(doc.get("epoch", 0))
            if epoch < newest_epoch:
                violate(
                    "zombie-decision",
                    f"{kind} of epoch {epoch} accepted after epoch {newest_epoch} was elected",
                    where,
                )
            decider = epoch_instance.get(epoch)
            holder = _holder_at(ctx.lease_writes, record.stamp)
            if decider is not None and ctx.lease_writes and holder != decider:
                violate(
                    "zombie-decision",
                    f"{kind} of {decider} (epoch {epoch}) stamped {record.stamp} while the Lease"
                    f" named {holder}",
                    where,
                )
        if kind == "PreemptionStarted" and accepted:
            pid, queue, cause = str(doc["preemption_id"]), str(doc["queue"]), str(doc["cause"])
            basis = int(doc.get("basis", -1))
            stats[f"preemptions {cause}"] += 1
            if pid in started_at:
                violate(
                    "trigger-twice",
                    f"{pid} started twice (offsets {started_at[pid][0].offset}, {record.offset})",
                    [started_at[pid][0].offset, record.offset],
                )
            started_at.setdefault(pid, []).append(record)
            if cause == "quota-decrease":
                arm = deadlines.at(queue, basis)
                if armed_before is None or armed_before > record.ts:
                    violate(
                        "trigger-unjustified",
                        f"{pid}: no passed quota-decrease deadline armed for {queue} where it lands"
                        f" (deadline {armed_before}, ts {record.ts})",
                        where,
                    )
                key: tuple[str, ...] = (cause, queue, str(arm[0]) if arm else "none")
            elif cause == "overuse":
                clock = owing.at(queue, basis)
                key = (cause, queue, str(clock[1]) if clock else "none")
            else:
                uid = str(doc.get("pod_uid"))
                clock = starving.at(uid, basis)
                key = (cause, uid, str(clock[1]) if clock else "none")
            if key[-1] == "none":
                violate(
                    "trigger-unjustified",
                    f"{pid}: no {cause} timer armed at its basis {basis}",
                    where,
                )
            else:
                triggers.setdefault(key, []).append(record.offset)
                if len(triggers[key]) > 1:
                    violate(
                        "trigger-twice",
                        f"one {cause} trigger of {key[1]} (armed {key[2]}) answered by"
                        f" {len(triggers[key])} preemptions",
                        triggers[key],
                    )
            if queue in holders:
                violate("overlap", f"{pid} starts on {queue}, held by {holders[queue]}", where)
            holders[queue] = pid
            holding[pid] = {queue}
        elif kind == "EvictionRequested" and accepted:
            eid, pid, queue = str(doc["eviction_id"]), str(doc["preemption_id"]), str(doc["queue"])
            stats["evictions"] += 1
            if holders.get(queue, pid) != pid:
                violate("overlap", f"{pid} evicts from {queue}, held by {holders[queue]}", where)
            holders[queue] = pid
            holding.setdefault(pid, set()).add(queue)
            if eid in requested:
                violate(
                    "eviction-twice", f"{eid} requested twice", [requested[eid][1], record.offset]
                )
            requested[eid] = (str(doc["pod_uid"]), record.offset)
        elif kind == "PreemptionFinished" and accepted:
            for queue in holding.pop(str(doc["preemption_id"]), set()):
                if holders.get(queue) == doc["preemption_id"]:
                    del holders[queue]
        elif kind in ("EvictionSucceeded", "EvictionFailed"):
            outcomes.setdefault(str(doc.get("eviction_id")), []).append(record)
        elif kind == "PodRemoved":
            removed.add(str(doc.get("uid")))
    for eid, found in outcomes.items():
        if eid not in requested:
            violate(
                "eviction-twice",
                f"outcome of {eid}, which was never requested",
                [r.offset for r in found],
            )
        elif len(found) > 1:
            if _retried(found, ctx.backend):
                stats["outcome copies left by retried appends"] += len(found) - 1
            else:
                kinds = [decode_json(r.payload) or {} for r in found]
                violate(
                    "eviction-twice",
                    f"{eid} has {len(found)} outcome records"
                    f" ({', '.join(str(k.get('kind')) for k in kinds)})",
                    [r.offset for r in found],
                )
    state = projection.state

    # the API server's record
    by_uid: dict[str, list[str]] = {}
    for eid, (uid, _) in requested.items():
        by_uid.setdefault(uid, []).append(eid)
    evicted = Counter(post.uid for post in ctx.posts if post.status == 201)
    stats["eviction POSTs"] = len(ctx.posts)
    stats["eviction POSTs answered 201"] = sum(evicted.values())
    for uid, count in evicted.items():
        if count > 1:
            violate("eviction-twice", f"pod {uid} evicted (201) {count} times")
    for post in ctx.posts:
        if post.uid not in by_uid:
            violate(
                "post-without-decision",
                f"POST evicting {post.namespace}/{post.name} (uid {post.uid}, answered"
                f" {post.status}) via {post.via}: no accepted EvictionRequested names it",
            )
    for slot, sent_ms, path in ctx.requests:
        instance = ctx.instance_at[slot](sent_ms) if slot in ctx.instance_at else None
        holder = _holder_at(ctx.lease_writes, sent_ms)
        if instance is not None and holder != instance:
            violate(
                "zombie-post",
                f"{instance} sent POST {path} at {sent_ms} while the Lease named {holder}",
            )

    # at quiescence
    if state.settings.quota_preemption_enabled:
        for queue, deadline in sorted(state.decrease_deadlines.items()):
            if deadline < ctx.now_ms - ctx.deadline_grace_ms:
                violate(
                    "armed-deadline",
                    f"{queue}: deadline {deadline} armed, {ctx.now_ms - deadline} ms in the past,"
                    " at the end of the ledger",
                )
    if ctx.audit is not None:
        code, report, err = ctx.audit
        if report is None:
            violate("audit", f"audit exited {code} without a report: {err}")
        else:
            flagged = [
                d
                for d in report.get("decisions", [])
                if d.get("problems") and d.get("refused") is None
            ]
            for decision in flagged[:5]:
                violate(
                    "audit",
                    f"flagged {decision.get('kind')} {decision.get('preemption_id')}:"
                    f" {'; '.join(decision.get('problems', []))[:300]}",
                    [int(decision.get("offset", -1))],
                )
            if report.get("tampered"):
                violate(
                    "audit", f"{report.get('tampered')} digest mismatch(es): {report.get('damage')}"
                )
            if report.get("unfinished"):
                violate("audit", f"preemptions unfinished: {report.get('unfinished')}")
            if code != 0 and not flagged and not report.get("tampered"):
                violate("audit", f"audit exited {code} with nothing flagged: {err}")
            if code == 0 and (flagged or report.get("tampered")):
                violate("audit", f"audit exited 0 although it flagged {len(flagged)} decision(s)")
            stats["decisions audited"] += len(report.get("decisions", []))
            stats["refused by the guard"] += int(report.get("refused", 0))
    return out, stats


# ------------------------------------------------------------------ many trials


async def run_trial(env: Environment, seed: int) -> TrialResult:
    trial = Trial(env, seed)
    result = await trial.run()
    keep = env.options.keep_dir
    if keep is not None and (result.violations or env.options.keep_all):
        target = keep / f"{env.backend}-trial-{seed}"
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(trial.dir, target)
        (target / "faults.log").write_text("\n".join(result.fault_log) + "\n")
    shutil.rmtree(trial.dir, ignore_errors=True)
    return result


async def run_trials(
    backend: str,
    seeds: Sequence[int],
    options: Options,
    on_result: Callable[[TrialResult], None] | None = None,
) -> list[TrialResult]:
    """The trials of ``seeds`` on one environment, ``options.parallel`` at a time."""
    # the stand-in server logs every watch a proxy cut as an error with a traceback:
    # expected here (the harness cuts them), and not a process under test
    logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)
    # the raw Kafka reads reconnect through broker restarts and cuts: not news either
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    results: dict[int, TrialResult] = {}
    gate = asyncio.Semaphore(options.parallel)

    async def one(env: Environment, seed: int) -> None:
        async with gate:
            result = await run_trial(env, seed)
        results[seed] = result
        if on_result is not None:
            on_result(result)

    # SIGTERM cancels the trials as SIGINT does, so that every process they started is
    # stopped (by pid) on the way out
    main = asyncio.current_task()
    loop = asyncio.get_running_loop()
    if main is not None:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signal.SIGTERM, main.cancel)
    try:
        async with Environment(backend, options) as env, asyncio.TaskGroup() as group:
            for seed in seeds:
                group.create_task(one(env, seed))
    finally:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.remove_signal_handler(signal.SIGTERM)
    return [results[seed] for seed in seeds]


def summarize(backend: str, results: Sequence[TrialResult], seconds: float) -> dict[str, Any]:
    faults: Counter[str] = Counter()
    stats: Counter[str] = Counter()
    by_check: Counter[str] = Counter()
    violations = []
    for result in results:
        faults.update(result.faults)
        for key, value in result.stats.items():
            stats[key] = max(stats[key], value) if key.endswith(" max") else stats[key] + value
        for violation in result.violations:
            by_check[violation.check] += 1
            violations.append(violation)
    return {
        "backend": backend,
        "trials": len(results),
        "violations": [
            {"seed": v.seed, "check": v.check, "offsets": v.offsets, "detail": v.detail}
            for v in violations
        ],
        "by_check": dict(sorted(by_check.items())),
        "faults_applied": {k: faults[k] for k in FAULT_KINDS[backend]},
        "faults_drawn": {k: faults[f"{k} drawn"] for k in FAULT_KINDS[backend]},
        "seen": dict(sorted(stats.items())),
        "seconds": round(seconds, 1),
        "load": [round(x, 2) for x in os.getloadavg()],
    }


def summary_text(summary: dict[str, Any]) -> str:
    applied = ", ".join(f"{k} {v}" for k, v in summary["faults_applied"].items())
    drawn = ", ".join(f"{k} {v}" for k, v in summary["faults_drawn"].items())
    checks = ", ".join(f"{k} {v}" for k, v in summary["by_check"].items()) or "none"
    seen = ", ".join(f"{k} {v}" for k, v in summary["seen"].items())
    return (
        f"bench faults ({summary['backend']}): {summary['trials']} trials,"
        f" {len(summary['violations'])} violations ({checks}) in {summary['seconds']} s,"
        f" load {summary['load']}\n"
        f"  faults applied: {applied}\n  faults drawn: {drawn}\n  seen: {seen}"
    )


def main(args: argparse.Namespace) -> int:
    """``quotaledger bench faults``: one line per violation, then the summary; exit 1 when
    any check failed."""
    backends = list(BACKENDS) if args.backend == "all" else [args.backend]
    engine = (
        tuple(shlex.split(args.engine_command)) if args.engine_command else Options.engine_command
    )
    keep = Path(args.keep) if args.keep else None
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
    failed = False
    summaries = []
    for backend in backends:
        kinds = tuple(k for k in (args.faults or "").split(",") if k)
        unknown = sorted(set(kinds) - set(FAULT_KINDS[backend]))
        if unknown:
            raise SystemExit(
                f"quotaledger: error: --faults: {', '.join(unknown)} not a fault kind of"
                f" {backend} ({', '.join(FAULT_KINDS[backend])})"
            )
        options = Options(
            backend=backend,
            fault_kinds=kinds,
            engine_command=engine,
            keep_dir=keep,
            keep_all=args.keep_all,
            parallel=args.parallel,
        )
        seeds = [args.seed + i for i in range(args.trials)]

        def show(result: TrialResult) -> None:
            for violation in result.violations:  # with --json, the object holds them
                print(violation.line(), file=sys.stderr if args.json else sys.stdout, flush=True)
            if args.verbose:
                print(
                    f"trial {result.seed} ({result.backend}): {len(result.violations)} violations,"
                    f" {result.seconds:.1f} s, faults {dict(result.faults)}",
                    file=sys.stderr,
                    flush=True,
                )
                for line in result.fault_log:
                    print(f"  {line}", file=sys.stderr, flush=True)

        started = time.monotonic()
        try:
            results = asyncio.run(run_trials(backend, seeds, options, show))
        except (asyncio.CancelledError, KeyboardInterrupt):
            print("quotaledger: bench faults stopped; every process it started is stopped")
            return 130
        summary = summarize(backend, results, time.monotonic() - started)
        summaries.append(summary)
        failed = failed or bool(summary["violations"])
        if not args.json:
            print(summary_text(summary), flush=True)
    if args.json:
        print(json.dumps(summaries[0] if len(summaries) == 1 else summaries, indent=2))
    return 1 if failed else 0
