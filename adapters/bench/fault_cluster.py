"""The cluster around the engines of ``quotaledger bench faults``: the stand-in API server
with its own record of eviction POSTs and Lease writes, and a controller playing the rest
of a cluster (a scheduler, pods arriving and finishing and coming back, quota changes) in
scenarios that cause quota-decrease, overuse and reclaim preemptions (DESIGN §6, §12)."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from aiohttp import web

from .fault_checks import EvictionPost
from .fault_records import decode_json
from .standin import ApiServer
from .standin_store import status_answer

LEASE = ("coordination.k8s.io", "leases", "quotaledger", "quotaledger")
NAMESPACE = "team"
QUOTA_LABEL = "quotaledger.io/quota"
BIG = 64_000  # a quota max that limits nothing (cpu millicores)


# ------------------------------------------------------------------ the API server


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
        return status_answer(status, reason, message, **headers)

    def holder(self) -> str | None:
        lease = self.get(LEASE[1], LEASE[3], LEASE[2], group=LEASE[0])
        return (lease or {}).get("spec", {}).get("holderIdentity") or None


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
