"""Helpers for the Kubernetes adapter tests: objects, a watcher over a real SQLite ledger
and the stand-in API server (tests/k8s_api_server.py)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quotaledger.adapters.kubernetes.client import Cluster, connect
from quotaledger.adapters.kubernetes.watcher import (
    Baseline,
    ClusterWatcher,
    LedgerSink,
    WatchOptions,
)
from quotaledger.adapters.ledgers.sqlite.ledger import SqliteLedger
from quotaledger.events.ledger import Record
from quotaledger.projections import Projection
from quotaledger.projections.state import ProjectedState

from .k8s_api_server import ApiServer


def pod(
    name: str,
    *,
    namespace: str = "default",
    uid: str | None = None,
    cpu: str = "100m",
    memory: str | None = None,
    node: str | None = None,
    phase: str = "Pending",
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    requests: dict[str, str] = {"cpu": cpu}
    if memory is not None:
        requests["memory"] = memory
    meta: dict[str, Any] = {"name": name, "namespace": namespace, "labels": labels or {}}
    if uid is not None:
        meta["uid"] = uid
    if annotations:
        meta["annotations"] = annotations
    body: dict[str, Any] = {
        "containers": [{"name": "main", "resources": {"requests": requests}}],
        **spec,
    }
    if node is not None:
        body["nodeName"] = node
    return {"metadata": meta, "spec": body, "status": {"phase": phase}}


def node(name: str, cpu: str = "8", memory: str = "32Gi", **labels: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {},
        "status": {"allocatable": {"cpu": cpu, "memory": memory, "pods": "110"}},
    }


async def records(ledger: SqliteLedger) -> list[Record]:
    out: list[Record] = []
    async for batch in ledger.read(0):
        out.extend(batch)
    return out


async def fold(ledger: SqliteLedger) -> ProjectedState:
    projection = Projection()
    for record in await records(ledger):
        projection.apply_record(record)
    return projection.state


async def eventually(
    check: Callable[[], Awaitable[bool]], *, limit_s: float = 30.0, what: str = "condition"
) -> None:
    """Poll ``check`` until true; a generous limit only guards against a hang,
    a check that itself never returns included."""
    try:
        async with asyncio.timeout(limit_s):
            while not await check():
                await asyncio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


@dataclass
class Rig:
    server: ApiServer
    cluster: Cluster
    ledger: SqliteLedger
    kubeconfig: Path
    ledger_path: Path


@contextlib.asynccontextmanager
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    server = ApiServer()
    await server.start()
    kubeconfig = server.kubeconfig(tmp_path / "kubeconfig")
    cluster = await connect(str(kubeconfig), False)
    ledger = await SqliteLedger.open(tmp_path / "ledger.db")
    try:
        yield Rig(server, cluster, ledger, kubeconfig, tmp_path / "ledger.db")
    finally:
        await cluster.close()
        await ledger.close()
        await server.stop()


@contextlib.asynccontextmanager
async def running_watcher(
    r: Rig, options: WatchOptions | None = None, baseline: Baseline | None = None
) -> AsyncIterator[ClusterWatcher]:
    watcher = ClusterWatcher(
        r.cluster.core,
        r.cluster.custom,
        LedgerSink(r.ledger),
        options or WatchOptions(watch_timeout_s=5),
        baseline or Baseline(),
    )
    task = asyncio.create_task(watcher.run())
    try:
        yield watcher
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


IMPORT_DATA = Path(__file__).resolve().parent / "data" / "import"


def load_source_samples(server: ApiServer, source: str, files: list[Path]) -> int:
    """Put a scheduler's sample objects (tests/data/import) into the stand-in as that
    scheduler's own collections (``quotaledger.adapters.kubernetes.sources``): each
    document of a watched kind, in its collection; a raw YuniKorn ``queues.yaml`` as the
    ConfigMap YuniKorn reads. Returns how many objects were put."""
    import yaml

    from quotaledger.adapters.kubernetes.sources import COLLECTIONS

    by_kind = {collection.name: collection for collection in COLLECTIONS[source]}
    put = 0
    for path in files:
        text = path.read_text()
        for doc in yaml.safe_load_all(text):
            if not isinstance(doc, dict):
                continue
            if source == "yunikorn" and "partitions" in doc:
                doc = {"kind": "ConfigMap", "data": {"queues.yaml": text}}
            collection = by_kind.get(str(doc.get("kind")))
            if collection is None:
                continue
            obj = dict(doc)
            meta = dict(obj.get("metadata") or {})
            if collection.object_name is not None:
                meta["name"] = collection.object_name
            if collection.namespace is not None:
                meta["namespace"] = collection.namespace
            elif collection.scope == "all-namespaces":
                meta.setdefault("namespace", "default")
            obj["metadata"] = meta
            server.put(collection.plural, obj, group=collection.group)
            put += 1
    return put
