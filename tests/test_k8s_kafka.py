"""``run``/``serve`` on a cluster with a Kafka ledger (DESIGN §10, §12): the real CLI as a
process, a tansu broker and the stand-in API server; pods created on the stand-in become
``PodUpserted`` records on the topic, appended by the Lease holder."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

import pytest

from quotaledger.adapters.ledgers.url import open_ledger
from quotaledger.events.codec import decode_event
from quotaledger.events.ledger import Ledger, Record
from quotaledger.events.model import LeaderElected, PodUpserted

from .k8s_api_server import ApiServer
from .k8s_support import eventually, node, pod
from .tansu import Tansu

LEASE = ["--lease-duration", "1", "--renew-deadline", "0.6", "--retry-period", "0.2"]


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
        assert [e.instance for e in events if isinstance(e, LeaderElected)] == ["k1"]
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
