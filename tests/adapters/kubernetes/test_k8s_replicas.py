"""Replicas of ``quotaledger run --kubeconfig`` as real processes: one stand-in API server,
one SQLite ledger, the leader SIGKILLed again and again while evictions are in flight
(DESIGN §12 leader election, executor ``kubernetes``)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections import Counter
from pathlib import Path

import pytest

from quotaledger.events.codec import decode_event, encode_event
from quotaledger.events.ledger import Append
from quotaledger.events.model import (
    ClocksObserved,
    EvictionRequested,
    LeaderElected,
    PreemptionFinished,
    PreemptionStarted,
)
from tests.k8s_api_server import EvictionAnswer
from tests.k8s_support import Rig, eventually, node, pod, records, rig, running_watcher

LEASE_S, RENEW_S, RETRY_S = 1.0, 0.6, 0.2
#: The takeover bound is lease duration + one retry period, plus this margin for a
#: loaded machine: the successor's retry loop, the ledger read that sees its
#: LeaderElected and this test's polling all wait for a CPU (on an idle machine
#: the takeover takes about LEASE_S + RETRY_S / 2).
SCHEDULING_MARGIN_S = 10.0
PODS = 6


async def seed(r: Rig) -> None:
    r.server.put("nodes", node("n1"))
    r.server.put(
        "quotas", {"metadata": {"name": "q"}, "spec": {"min": {"cpu": "1"}}}, group="quotaledger.io"
    )
    for i in range(PODS):
        r.server.put(
            "pods",
            pod(
                f"v{i}",
                uid=f"u{i}",
                node="n1",
                phase="Running",
                labels={"quotaledger.io/quota": "q"},
            ),
        )
    async with running_watcher(r) as watcher:

        async def listed() -> bool:
            await watcher.flushed()
            return len(await records(r.ledger)) >= 2 + PODS + 1

        await eventually(listed)
    basis = await r.ledger.last_offset()
    decisions: list[object] = [
        # the revoke's timer: q's overuse clock, long due (the guard admits only
        # a decision whose timer holds, DECISIONS 211)
        ClocksObserved(basis=basis, owing_started={"q": 0}),
        PreemptionStarted(
            preemption_id="p", queue="q", cause="overuse", target={"cpu": 600}, basis=basis
        ),
    ]
    decisions += [
        EvictionRequested(
            eviction_id=f"e{i}", preemption_id="p", pod_uid=f"u{i}", queue="q", instance="seed"
        )
        for i in range(PODS)
    ]
    await r.ledger.append([Append(payload=encode_event(e)) for e in decisions])  # type: ignore[arg-type]


async def spawn(r: Rig, name: str, log_dir: Path) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "quotaledger.adapters.cli",
        "run",
        str(r.ledger_path),
        "--kubeconfig",
        str(r.kubeconfig),
        "--instance",
        name,
        "--executor",
        "kubernetes",
        "--lease-duration",
        str(LEASE_S),
        "--renew-deadline",
        str(RENEW_S),
        "--retry-period",
        str(RETRY_S),
        "--watch-timeout",
        "5",
        stdout=asyncio.subprocess.DEVNULL,
        stderr=(log_dir / f"{name}.log").open("w"),
    )


def holder(r: Rig) -> str | None:
    lease = r.server.get("leases", "quotaledger", "quotaledger", group="coordination.k8s.io")
    return lease["spec"].get("holderIdentity") if lease else None


async def leader_elected(r: Rig, name: str) -> bool:
    for rec in await records(r.ledger):
        event = decode_event(rec.payload)
        if isinstance(event, LeaderElected) and event.instance == name:
            return True
    return False


@pytest.mark.slow
@pytest.mark.parametrize(("replicas", "kills"), [(2, 4), (3, 20)])
async def test_sigkill_the_leader_repeatedly(tmp_path: Path, replicas: int, kills: int) -> None:
    async with rig(tmp_path) as r:
        await seed(r)
        # every eviction is refused (a PDB) for a while: they stay in flight across kills
        r.server.evictions.extend([EvictionAnswer(429, "PDB", retry_after=1)] * (3 * kills))
        processes: dict[str, asyncio.subprocess.Process] = {}
        serial = 0
        try:
            for _ in range(replicas):
                serial += 1
                processes[f"rep-{serial}"] = await spawn(r, f"rep-{serial}", tmp_path)
            killed: list[str] = []
            loop = asyncio.get_running_loop()
            for _ in range(kills):
                await eventually(
                    lambda: _led(r, killed),
                    limit_s=60,
                    what="a leader that appended its LeaderElected",
                )
                leader = holder(r)
                assert leader is not None
                processes[leader].send_signal(signal.SIGKILL)
                await processes.pop(leader).wait()
                killed.append(leader)
                gone_at = loop.time()
                await eventually(lambda: _taken(r, killed), limit_s=60, what="takeover")
                # taken within lease duration + one retry period (+ scheduling margin)
                took = loop.time() - gone_at
                assert took <= LEASE_S + RETRY_S + SCHEDULING_MARGIN_S, f"takeover {took:.1f} s"
                serial += 1
                processes[f"rep-{serial}"] = await spawn(r, f"rep-{serial}", tmp_path)

            async def finished() -> bool:
                return any(
                    isinstance(decode_event(rec.payload), PreemptionFinished)
                    for rec in await records(r.ledger)
                )

            await eventually(finished, limit_s=120, what="all evictions settled")
        finally:
            for process in processes.values():
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signal.SIGTERM)
            for process in processes.values():
                await process.wait()
        # never one eviction executed twice: one 201 per pod, nothing sent after it
        posts = r.server.eviction_posts
        accepted = Counter(name for _, name, status in posts if status == 201)
        assert set(accepted.values()) <= {1}
        for name in accepted:
            statuses = [status for _, n, status in posts if n == name]
            assert statuses.index(201) == len(statuses) - 1 or set(
                statuses[statuses.index(201) + 1 :]
            ) == {404}
        events = [decode_event(rec.payload) for rec in await records(r.ledger)]
        elected = [e for e in events if isinstance(e, LeaderElected)]
        assert [e.epoch for e in elected] == sorted({e.epoch for e in elected})
        assert len({e.instance for e in elected}) >= kills + 1
        # no decision of an older epoch after a newer LeaderElected
        newest = 0
        for event in events:
            if isinstance(event, LeaderElected):
                newest = max(newest, event.epoch)
            elif isinstance(event, PreemptionStarted | EvictionRequested | PreemptionFinished):
                assert event.epoch in (0, newest) or event.epoch >= newest
        assert os.path.exists(r.ledger_path)


async def _led(r: Rig, killed: list[str]) -> bool:
    name = holder(r)
    return name is not None and name not in killed and await leader_elected(r, name)


async def _taken(r: Rig, killed: list[str]) -> bool:
    name = holder(r)
    return name is not None and name not in killed
