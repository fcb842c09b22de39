"""``run``/``serve`` on a cluster with a Kafka ledger (DESIGN §10, §12): the real CLI as a
process, a tansu broker and the stand-in API server; pods created on the stand-in become
``PodUpserted`` records on the topic, appended by the Lease holder."""

from __future__ import annotations

import asyncio
import signal
import sys
import time
from pathlib import Path

import pytest

from quotaledger.adapters.bench.fault_proxy import FaultProxy
from quotaledger.adapters.ledgers.url import open_ledger
from quotaledger.events.codec import decode_event
from quotaledger.events.ledger import Ledger, Record
from quotaledger.events.model import LeaderElected, PodUpserted
from tests.k8s_api_server import ApiServer
from tests.k8s_support import eventually, node, pod
from tests.kafka_hiding_proxy import HidingProxy, ProxiedTansu, hiding_bytes
from tests.tansu import Tansu

#: One replica, so the Lease is free at once whatever its duration; a duration that outlives
#: scheduling delays keeps the one term: with 1 s, a replica starved for 0.6 s on a loaded
#: machine missed its renew deadline and claimed four epochs (as in test_k8s_serve).
LEASE = ["--lease-duration", "6", "--renew-deadline", "4", "--retry-period", "0.5"]


async def topic_records(ledger: Ledger) -> list[Record]:
    tail = await ledger.last_offset()
    out: list[Record] = []
    if tail < 0:
        return out
    async for batch in ledger.read(0):
        out.extend(batch)
        if batch[-1].offset >= tail:
            break
    return out


@pytest.mark.parametrize("command", [["run"], ["serve", "--listen", "127.0.0.1:0"]])
async def test_pods_on_the_cluster_become_records_on_the_kafka_topic(
    tansu: Tansu, topic: str, tmp_path: Path, command: list[str]
) -> None:
    server = ApiServer()
    await server.start()
    kubeconfig = server.kubeconfig(tmp_path / "kubeconfig")
    server.put("nodes", node("n1"))
    server.put("pods", pod("before", uid="uid-before", node="n1", phase="Running"))
    url = tansu.url(topic)
    log = tmp_path / "engine.log"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "quotaledger.adapters.cli",
        command[0],
        url,
        *command[1:],
        "--kubeconfig",
        str(kubeconfig),
        "--instance",
        "k1",
        "--executor",
        "log",
        "--snapshots",
        str(tmp_path / "snapshots.db"),
        "--watch-timeout",
        "5",
        *LEASE,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=log.open("w"),
    )
    ledger: Ledger | None = None
    try:

        async def uids() -> set[str]:
            nonlocal ledger
            if ledger is None:
                try:
                    ledger = await open_ledger(url, create=False)
                except Exception:  # the topic does not exist yet
                    return set()
            return {
                event.uid
                for rec in await topic_records(ledger)
                if isinstance(event := decode_event(rec.payload), PodUpserted)
            }

        async def has(uid: str) -> bool:
            assert proc.returncode is None, log.read_text()
            return uid in await uids()

        await eventually(lambda: has("uid-before"), limit_s=60, what="the listed pod on Kafka")
        server.put("pods", pod("after", uid="uid-after", node="n1", phase="Running"))
        await eventually(lambda: has("uid-after"), limit_s=60, what="the watched pod on Kafka")
        assert ledger is not None
        events = [decode_event(rec.payload) for rec in await topic_records(ledger)]
        elected = [e.instance for e in events if isinstance(e, LeaderElected)]
        assert elected == ["k1"], log.read_text()
        lease = server.get("leases", "quotaledger", "quotaledger", group="coordination.k8s.io")
        assert lease is not None and lease["spec"]["holderIdentity"] == "k1"
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
        try:  # SIGTERM drains and exits within the shutdown bound (DESIGN §9)
            async with asyncio.timeout(30):
                code = await proc.wait()
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise AssertionError(f"ignored SIGTERM for 30 s: {log.read_text()}") from None
        assert code == 0, log.read_text()
        if ledger is not None:
            await ledger.close()
        await server.stop()


@pytest.mark.parametrize("waits_in", ["catch-up", "claim"])
async def test_sigterm_ends_serve_while_its_start_waits_on_the_broker(
    tmp_path: Path, waits_in: str
) -> None:
    """DESIGN §9: SIGTERM ends ``serve`` (exit 0) within the shutdown bound wherever the start
    of its term waits on the broker (DECISIONS 228, 300, 301). Every client of the broker
    goes through a proxy tansu advertises. ``catch-up``: the link stalls once ``serve``
    listens, for good, so the term's catch-up waits (it held SIGTERM until its read gave up,
    30 s later); ``claim``: Fetch responses leave out the batch holding ``LeaderElected``, so
    the claim of its epoch is appended but never read back."""
    broker = ProxiedTansu()
    await asyncio.to_thread(broker.start)
    stall: FaultProxy | None = None
    hide: HidingProxy | None = None
    if waits_in == "catch-up":
        stall = await FaultProxy("127.0.0.1", broker.port, kafka=True).start(broker.proxy_port)
    else:
        hide = await HidingProxy(broker.port, broker.proxy_port).start()
        hide.hide = hiding_bytes(b'"kind":"LeaderElected"')
    server = ApiServer()
    await server.start()
    server.put("nodes", node("n1"))
    log = tmp_path / "engine.log"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "quotaledger.adapters.cli",
        "serve",
        broker.url("held"),
        "--listen",
        "127.0.0.1:0",
        "--kubeconfig",
        str(server.kubeconfig(tmp_path / "kubeconfig")),
        "--instance",
        "k1",
        "--executor",
        "log",
        "--snapshots",
        str(tmp_path / "snapshots.db"),
        *LEASE,
        stdout=asyncio.subprocess.PIPE,
        stderr=log.open("w"),
    )
    try:
        assert proc.stdout is not None
        line = await asyncio.wait_for(proc.stdout.readline(), 60)
        assert line.startswith(b"quotaledger serving"), log.read_text()
        if stall is not None:
            stall.stall(600)

        async def lease_taken() -> bool:
            assert proc.returncode is None, log.read_text()
            return "taken by k1" in log.read_text()

        await eventually(lease_taken, limit_s=60, what="the Lease taken by k1")
        if hide is not None:
            hiding = hide

            async def claim_hidden() -> bool:
                return hiding.altered > 0

            await eventually(claim_hidden, limit_s=60, what="the claim left out of a fetch")
        await asyncio.sleep(0.5)  # whatever the term does now waits on the broker
        assert "leading" not in log.read_text()
        proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        try:
            async with asyncio.timeout(60):
                code = await proc.wait()
        except TimeoutError:
            raise AssertionError(f"ignored SIGTERM for 60 s: {log.read_text()}") from None
        took = time.monotonic() - sent
        assert code == 0, log.read_text()
        # 2 s (DESIGN §9) and the interpreter's own exit, on a loaded machine
        assert took < 10, f"SIGTERM took {took:.1f} s: {log.read_text()}"
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        for proxy in (stall, hide):
            if proxy is not None:
                await proxy.close()
        await server.stop()
        await asyncio.to_thread(broker.close)
