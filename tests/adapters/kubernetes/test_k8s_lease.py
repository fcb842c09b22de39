"""Leader election with a coordination.k8s.io/v1 Lease (DESIGN §12) against the stand-in
API server: optimistic concurrency, expiry as observed, and many failovers in one process
with every replica appending to one SQLite ledger only while it holds the Lease."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio.client import ApiClient, Configuration, CoordinationV1Api

from quotaledger.adapters.kubernetes.lease import LeaseElector
from quotaledger.adapters.kubernetes.watcher import LedgerSink, NotLeader
from quotaledger.events.codec import decode_event
from tests.k8s_support import Rig, records, rig

LEASE = ("coordination.k8s.io", "leases")


def elector(r: Rig, identity: str, **timing: float) -> LeaseElector:
    timing = {"lease_duration_s": 1.0, "renew_deadline_s": 0.6, "retry_period_s": 0.1} | timing
    return LeaseElector(r.cluster.coordination, "quotaledger", "quotaledger", identity, **timing)


async def test_one_holder_renews_others_wait_then_take_over(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        a, b = elector(r, "a"), elector(r, "b")
        assert await a.try_acquire_or_renew()
        assert not await b.try_acquire_or_renew()
        assert await a.try_acquire_or_renew()  # renew
        lease = r.server.get("leases", "quotaledger", "quotaledger", group="coordination.k8s.io")
        assert lease["spec"]["holderIdentity"] == "a"
        assert lease["spec"]["leaseTransitions"] == 0
        # a stops renewing (crashed): b takes over only after the lease duration it observed
        await asyncio.wait_for(b.acquire(), 10)
        # a did not renew: by now it counts itself no holder (renew deadline < duration)
        assert b.holding() and not a.holding()
        lease = r.server.get("leases", "quotaledger", "quotaledger", group="coordination.k8s.io")
        assert lease["spec"]["holderIdentity"] == "b"
        assert lease["spec"]["leaseTransitions"] == 1
        # a sees the new holder and steps down at once
        assert not await a.try_acquire_or_renew()
        assert not a.holding()


async def test_stale_resource_version_gets_409(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        a = elector(r, "a")
        assert await a.try_acquire_or_renew()
        stale = r.server.get("leases", "quotaledger", "quotaledger", group="coordination.k8s.io")
        assert await a.try_acquire_or_renew()
        stale["spec"]["holderIdentity"] = "intruder"
        with pytest.raises(Exception) as caught:
            await r.cluster.coordination.replace_namespaced_lease(
                "quotaledger", "quotaledger", stale
            )
        assert getattr(caught.value, "status", None) == 409
        conflicts = [c for c in r.server.calls if c.resource == "leases" and c.verb == "update"]
        assert len(conflicts) == 2


async def test_release_lets_a_successor_in_without_waiting(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        a, b = elector(r, "a", lease_duration_s=30, renew_deadline_s=20), elector(r, "b")
        assert await a.try_acquire_or_renew()
        assert not await b.try_acquire_or_renew()
        await a.release()
        assert await b.try_acquire_or_renew()


def test_timings_must_be_ordered() -> None:
    with pytest.raises(ValueError, match="retry-period"):
        LeaseElector(None, "ns", "l", "a", 10, 10, 2)


async def _replica(
    r: Rig, name: str, crash: asyncio.Event, stop: asyncio.Event, partition: Any
) -> int:
    """Wait for the lease; while holding it append a marker record every few ms through a
    sink gated by the lease. On ``crash``: every other time vanish without releasing (as
    SIGKILL); otherwise lose the API server (a network partition: renewals fail) while still
    trying to append, until the sink refuses. Then come back as a new process (a new
    identity, as a new pod has a new name)."""
    incarnation = 0
    terms = 0
    while not stop.is_set():
        incarnation += 1
        identity = f"{name}-{incarnation}"
        candidate = elector(r, identity)
        sink = LedgerSink(r.ledger, candidate.holding)
        await candidate.acquire()
        terms += 1
        keeper = asyncio.create_task(candidate.keep())
        try:
            n = 0
            while not keeper.done():
                if crash.is_set():
                    if incarnation % 2:
                        break
                    candidate.coordination = partition  # renewals now fail
                marker = f"{identity}.{terms}.{n}"
                try:
                    await sink.append(
                        [
                            f'{{"kind":"NamespaceWeighted","namespace":"{marker}","weight":1}}'.encode()
                        ]
                    )
                except NotLeader:
                    break
                n += 1
                await asyncio.sleep(0.01)
        finally:
            keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keeper
        crash.clear()
    return terms


def _holder(r: Rig) -> str | None:
    lease = r.server.get("leases", "quotaledger", "quotaledger", group="coordination.k8s.io")
    return lease["spec"].get("holderIdentity") if lease else None


@pytest.mark.slow
async def test_fifty_failovers_never_two_holders_appending(tmp_path: Path) -> None:
    """≥ 50 crashes of the holder, 3 replicas, a 1 s lease: each takeover waits for the
    lease to expire, and no holder appends after its successor started appending."""
    async with rig(tmp_path) as r:
        names = ["r1", "r2", "r3"]
        crashes = {name: asyncio.Event() for name in names}
        stop = asyncio.Event()
        dead = ApiClient(Configuration(host="http://127.0.0.1:9"))  # nothing listens there
        partition = CoordinationV1Api(dead)
        tasks = [asyncio.create_task(_replica(r, n, crashes[n], stop, partition)) for n in names]
        crashed: list[str] = []
        try:
            for _ in range(50):
                async with asyncio.timeout(60):  # a hang guard: fail, do not hang
                    while True:  # a holder that has appended
                        await asyncio.sleep(0.02)
                        holder = _holder(r)
                        if holder is None or holder in crashed:
                            continue
                        last = (await records(r.ledger))[-1].payload.decode()
                        if f'"{holder}.' in last:
                            break
                crashed.append(holder)
                crashes[holder.split("-")[0]].set()
        finally:
            stop.set()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await dead.close()
        terms: list[str] = []
        for rec in (await records(r.ledger))[1:]:
            event = decode_event(rec.payload)
            owner = event.namespace.split(".")[0]  # type: ignore[union-attr]
            if not terms or terms[-1] != owner:
                terms.append(owner)
        # each holder's appends are contiguous: none appends after its successor began
        assert len(terms) == len(set(terms))
        assert len(terms) >= 50


async def test_a_candidate_counts_the_lease_from_when_it_saw_it(tmp_path: Path) -> None:
    """A candidate judges the holder's record expired only once it has seen it unchanged
    for the lease duration, counted from when the record *reached* it, not from when it
    asked: found by ``bench faults`` (a candidate whose link had stalled for 1.3 s got the
    holder's fresh record late, counted it as 1.3 s old, took the Lease 0.44 s after the
    holder had acquired it, and both drove one eviction: two outcome records)."""
    from quotaledger.adapters.bench.fault_proxy import FaultProxy
    from quotaledger.adapters.kubernetes.client import connect

    async with rig(tmp_path) as r:
        upstream = int(r.server.url.rsplit(":", 1)[1])
        proxy = await FaultProxy("127.0.0.1", upstream, http=True).start()
        direct, r.server.url = r.server.url, f"http://127.0.0.1:{proxy.port}"
        kubeconfig = r.server.kubeconfig(tmp_path / "b.kubeconfig")
        r.server.url = direct
        b_cluster = await connect(str(kubeconfig), False)
        try:
            a = elector(r, "a")
            timing = {"lease_duration_s": 1.0, "renew_deadline_s": 0.6, "retry_period_s": 0.1}
            b = LeaseElector(b_cluster.coordination, "quotaledger", "quotaledger", "b", **timing)
            assert await a.try_acquire_or_renew()  # a holds it, then renews no more (paused)
            proxy.stall(1.3)
            assert not await b.try_acquire_or_renew()  # a's record reached b 1.3 s late
            assert not await b.try_acquire_or_renew()  # seen a moment ago: not expired
            lease = r.server.get(
                "leases", "quotaledger", "quotaledger", group="coordination.k8s.io"
            )
            assert lease["spec"]["holderIdentity"] == "a"
            await asyncio.sleep(1.1)
            assert await b.try_acquire_or_renew()  # unchanged for its duration since b saw it
        finally:
            await b_cluster.close()
            await proxy.close()
