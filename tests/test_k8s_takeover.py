"""A leader takeover appends only real changes (DESIGN §12 "an update whose translated fact
equals the last one appended for that object appends nothing"; DECISIONS 260).

Two replicas of ``run --kubeconfig`` in one process, on one SQLite ledger and the stand-in
API server: the first leads and appends the cluster (labelled and cordoned nodes, pods in
every phase, quotas, a weighted namespace, settings), snapshots its state and steps down;
the second restores from that snapshot, takes the Lease, lists everything again and must
append no fact at all, until the cluster really changes."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from quotaledger.adapters.cli import build_parser
from quotaledger.adapters.kubernetes.cluster import run_on_cluster
from quotaledger.adapters.kubernetes.options import ClusterOptions
from quotaledger.adapters.ledgers.sqlite.ledger import SqliteLedger
from quotaledger.events.codec import decode_event
from quotaledger.events.model import (
    LeaderElected,
    LedgerDigest,
    NodeUpserted,
    PodUpserted,
    QuotaUpserted,
    is_fact,
)

from .k8s_support import IMPORT_DATA, Rig, eventually, load_source_samples, node, pod, records, rig

TIMING = ["--lease-duration", "1", "--renew-deadline", "0.6", "--retry-period", "0.2"]


def populate(r: Rig, source: str) -> None:
    """A cluster whose facts are not all defaults: what DECISIONS 101 re-appended."""
    r.server.put("nodes", node("gpu-1", cpu="64", **{"nvidia.com/gpu.product": "A100"}))
    cordoned = node("gpu-2", cpu="64", zone="b", pool="gpu")
    cordoned["spec"]["unschedulable"] = True
    r.server.put("nodes", cordoned)
    plain = node("cpu-1")
    plain["metadata"]["labels"] = {}
    r.server.put("nodes", plain)
    bare_cordoned = node("cpu-2")
    bare_cordoned["metadata"]["labels"] = {}
    bare_cordoned["spec"]["unschedulable"] = True
    r.server.put("nodes", bare_cordoned)
    quota = {"quotaledger.io/quota": "team-a"} if source == "quotaledger" else {}
    phases = [("Running", "gpu-1"), ("Pending", None), ("Succeeded", "gpu-2"), ("Failed", "cpu-1")]
    for index, (phase, where) in enumerate(phases):
        r.server.put(
            "pods",
            pod(
                f"p{index}",
                uid=f"u{index}",
                namespace="team-a",
                node=where,
                phase=phase,
                memory="1Gi",
                labels={"app": "train", **quota},
                annotations={"quotaledger.io/preemptible": "false"} if index == 0 else None,
                priority=100 * index,
            ),
        )
    r.server.put(
        "namespaces",
        {"metadata": {"name": "team-a", "annotations": {"quotaledger.io/weight": "3"}}},
    )
    r.server.put(
        "configmaps",
        {
            "metadata": {"name": "quotaledger-settings", "namespace": "quotaledger"},
            "data": {"revoke_after_s": "60", "reclaim_enabled": "false"},
        },
    )
    if source == "quotaledger":
        for name, spec in (
            ("org", {"is_parent": True, "min": {"cpu": "8"}}),
            ("team-a", {"parent": "org", "min": {"cpu": "4"}, "max": {"cpu": "16"}}),
        ):
            r.server.put("quotas", {"metadata": {"name": name}, "spec": spec}, "quotaledger.io")
    else:
        samples = {
            "kueue": ["kueue/cohort-tree.yaml", "kueue/cohort-borrowing-limit.yaml"],
            "yunikorn": ["yunikorn/resource-limits-configmap.yaml"],
        }[source]
        assert load_source_samples(r.server, source, [IMPORT_DATA / f for f in samples])


def args(r: Rig, instance: str, source: str) -> ClusterOptions:
    parsed = build_parser().parse_args(
        [
            "run", str(r.ledger_path), "--kubeconfig", str(r.kubeconfig), "--instance", instance,
            "--executor", "log", "--quota-source", source, "--snapshot-every", "5",
            "--watch-timeout", "5", *TIMING,
        ]
    )  # fmt: skip
    return ClusterOptions.from_args(parsed, snapshot_every=parsed.snapshot_every)


@contextlib.asynccontextmanager
async def replica(r: Rig, instance: str, source: str) -> AsyncIterator[SqliteLedger]:
    """``run --kubeconfig`` as ``instance`` on its own connection to the ledger file."""
    ledger = await SqliteLedger.open(r.ledger_path)
    stop = asyncio.Event()
    task = asyncio.create_task(run_on_cluster(args(r, instance, source), ledger, stop))
    try:
        yield ledger
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
        await ledger.close()


async def leader_offset(r: Rig, instance: str) -> int | None:
    for record in await records(r.ledger):
        event = decode_event(record.payload)
        if isinstance(event, LeaderElected) and event.instance == instance:
            return record.offset
    return None


async def facts_after(r: Rig, offset: int) -> list[object]:
    out = []
    for record in await records(r.ledger):
        if record.offset > offset:
            event = decode_event(record.payload)
            if is_fact(event) and not isinstance(event, LedgerDigest):
                out.append(event)
    return out


async def watching_since(r: Rig, since: int) -> bool:
    """Every collection listed and then watched again after call ``since``."""
    calls = r.server.calls[since:]
    lists = {(c.group, c.resource, c.namespace) for c in calls if c.verb == "list"}
    watches = {(c.group, c.resource, c.namespace) for c in calls if c.verb == "watch"}
    wanted = {"nodes", "pods", "namespaces", "configmaps"}
    return wanted <= {c[1] for c in lists} and lists <= watches and len(lists) >= 5


@pytest.mark.parametrize("source", ["quotaledger", "kueue", "yunikorn"])
async def test_takeover_appends_no_fact_when_nothing_changed(tmp_path: Path, source: str) -> None:
    async with rig(tmp_path) as r:
        populate(r, source)
        async with replica(r, "first", source):

            async def first_done() -> bool:
                start = await leader_offset(r, "first")
                if start is None:
                    return False
                facts = await facts_after(r, start)
                quotas = [f for f in facts if isinstance(f, QuotaUpserted)]
                return len([f for f in facts if isinstance(f, NodeUpserted)]) == 4 and (
                    len([f for f in facts if isinstance(f, PodUpserted)]) == 4 and len(quotas) >= 2
                )

            await eventually(first_done, what="the first leader's facts")
            await asyncio.sleep(0.5)  # its watches settle; nothing more to append
        first = await leader_offset(r, "first")
        assert first is not None
        appended = await facts_after(r, first)
        labelled = {f.name: f for f in appended if isinstance(f, NodeUpserted)}
        assert labelled["gpu-2"].unschedulable and labelled["gpu-2"].labels["zone"] == "b"
        assert labelled["cpu-2"].unschedulable and not labelled["cpu-2"].labels
        snapshots = await r.ledger.load_snapshot(None)
        assert snapshots is not None and snapshots.offset > 0, "the successor restores from one"

        since = len(r.server.calls)
        async with replica(r, "second", source):
            await eventually(lambda: _leads(r, "second"), what="the takeover")
            await eventually(lambda: watching_since(r, since), what="every collection re-listed")
            # a real change now: appended after anything the re-list produced (one writer)
            r.server.put("pods", pod("late", uid="u-late", namespace="team-a"))

            async def late() -> bool:
                return any(
                    isinstance(f, PodUpserted) and f.uid == "u-late"
                    for f in await facts_after(r, first)
                )

            await eventually(late, what="the late pod's fact")
            second = await leader_offset(r, "second")
            assert second is not None
            after = await facts_after(r, second)
        assert [(type(f).__name__, getattr(f, "uid", None)) for f in after] == [
            ("PodUpserted", "u-late")
        ], after


async def _leads(r: Rig, instance: str) -> bool:
    return await leader_offset(r, instance) is not None


def test_node_labels_and_cordon_are_kept_in_snapshots_outside_the_hash() -> None:
    """The fold keeps a node's labels and ``unschedulable`` (only when not the defaults);
    a snapshot round-trips them; they leave the state hash as it was (DECISIONS 260); a
    snapshot written before the field existed still loads, with no node meta."""
    import json

    from quotaledger.projections import Projection, state_hash
    from quotaledger.projections.snapshot import dump, load
    from quotaledger.projections.state import NodeMeta

    def fold(*events: NodeUpserted) -> Projection:
        projection = Projection()
        for offset, event in enumerate(events):
            projection.apply(offset, 0, event)
        return projection

    plain = NodeUpserted(name="n1", allocatable={"cpu": 4000})
    labelled = NodeUpserted(
        name="n1", allocatable={"cpu": 4000}, labels={"zone": "a"}, unschedulable=True
    )
    one = fold(plain).settled()
    two = fold(labelled).settled()
    assert one.node_meta == {} and two.node_meta == {"n1": NodeMeta({"zone": "a"}, True)}
    assert state_hash(one) == state_hash(two)
    assert fold(labelled, plain).state.node_meta == {}
    restored = load(dump(two))
    assert restored.node_meta == two.node_meta and state_hash(restored) == state_hash(two)
    older = json.loads(dump(two))
    del older["state"]["node_meta"]
    assert load(json.dumps(older).encode()).node_meta == {}
