"""``serve`` on a cluster (DESIGN §11, §12; DECISIONS 130): replicas of ``quotaledger serve
--kubeconfig`` as real processes on one SQLite ledger and the stand-in API server. Only
the Lease holder runs the engine and the watcher; every replica serves fresh reads."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from quotaledger.adapters.cli import build_parser
from quotaledger.adapters.http.command import serve_options
from quotaledger.adapters.http.server import Server, serve
from quotaledger.adapters.kubernetes.lease import LeaseElector
from quotaledger.adapters.kubernetes.options import check_arguments, on_cluster
from quotaledger.adapters.ledgers.sqlite.ledger import SqliteLedger
from quotaledger.events.codec import decode_event, peek_kind
from quotaledger.events.ledger import Record
from quotaledger.events.model import LeaderElected, PodUpserted
from tests.adapters.kubernetes.test_k8s_rbac import DEPLOY, evict_relist_and_check
from tests.adapters.kubernetes.test_k8s_replicas import seed
from tests.k8s_support import Rig, eventually, node, pod, records, rig

LEASE = ["--lease-duration", "1", "--renew-deadline", "0.6", "--retry-period", "0.2"]
#: A lease that outlives scheduling delays: with 1 s, a replica starved for 0.6 s on a
#: loaded machine misses its renew deadline and the replicas take turns (a run under load saw 23
#: LeaderElected where the test asks for one leader until it kills it).
STEADY_LEASE = ["--lease-duration", "6", "--renew-deadline", "4", "--retry-period", "0.5"]


async def spawn(
    r: Rig, name: str, log_dir: Path, lease: list[str] = LEASE
) -> tuple[asyncio.subprocess.Process, str]:
    """A ``serve`` replica; returns it and its base URL (from its first stdout line)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "quotaledger.adapters.cli",
        "serve",
        str(r.ledger_path),
        "--kubeconfig",
        str(r.kubeconfig),
        "--instance",
        name,
        "--listen",
        "127.0.0.1:0",
        "--executor",
        "log",
        "--watch-timeout",
        "5",
        *lease,
        stdout=asyncio.subprocess.PIPE,
        stderr=(log_dir / f"{name}.log").open("w"),
    )
    assert proc.stdout is not None
    line = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
    assert line.startswith("quotaledger serving http://"), (log_dir / f"{name}.log").read_text()
    return proc, line.split()[-1].rstrip("/")


def holder(r: Rig) -> str | None:
    lease = r.server.get("leases", "quotaledger", "quotaledger", group="coordination.k8s.io")
    return lease["spec"].get("holderIdentity") if lease else None


async def elected(r: Rig) -> list[str]:
    return [
        event.instance
        for rec in await records(r.ledger)
        if isinstance(event := decode_event(rec.payload), LeaderElected)
    ]


async def pod_facts(r: Rig) -> Counter[str]:
    return Counter(
        event.uid
        for rec in await records(r.ledger)
        if peek_kind(rec.payload) == "PodUpserted"
        and isinstance(event := decode_event(rec.payload), PodUpserted)
    )


async def get(session: aiohttp.ClientSession, url: str) -> tuple[int, Any]:
    async with session.get(url) as response:
        return response.status, await response.json()


@pytest.mark.slow
async def test_two_serve_replicas_one_leader_reads_everywhere_takeover(tmp_path: Path) -> None:
    async with rig(tmp_path) as r, aiohttp.ClientSession() as session:
        r.server.put("nodes", node("n1"))
        r.server.put(
            "quotas",
            {"metadata": {"name": "q"}, "spec": {"min": {"cpu": "1"}}},
            group="quotaledger.io",
        )
        r.server.put("pods", pod("first", uid="uid-first", node="n1", phase="Running"))
        processes: dict[str, asyncio.subprocess.Process] = {}
        bases: dict[str, str] = {}
        try:
            for name in ("rep-a", "rep-b"):
                processes[name], bases[name] = await spawn(r, name, tmp_path, STEADY_LEASE)

            async def led() -> bool:
                name = holder(r)
                return name is not None and name in await elected(r)

            await eventually(led, limit_s=60, what="a leader that appended LeaderElected")
            leader = holder(r)
            assert leader is not None
            follower = next(name for name in processes if name != leader)

            async def shows(name: str, uid: str) -> bool:
                status, state = await get(session, bases[name] + "/v1/state")
                return status == 200 and uid in json.dumps(state)

            async def ready(name: str) -> dict[str, Any] | None:
                status, document = await get(session, bases[name] + "/readyz")
                return document if status == 200 else None

            # the leader's watcher appended the pod; the follower's reads caught up
            await eventually(lambda: shows(follower, "uid-first"), what="follower read")
            r.server.put("pods", pod("second", uid="uid-second", node="n1", phase="Running"))
            await eventually(lambda: shows(follower, "uid-second"), what="follower follows")

            async def follower_ready() -> bool:
                document = await ready(follower)
                return document is not None and document["leader"] is False

            await eventually(follower_ready, what="follower /readyz")
            leader_doc = await ready(leader)
            assert leader_doc is not None and leader_doc["leader"] is True
            assert await elected(r) == [leader]  # the follower appended nothing
            assert (await pod_facts(r))["uid-first"] == 1

            processes[leader].send_signal(signal.SIGKILL)
            await processes.pop(leader).wait()

            async def taken() -> bool:
                return holder(r) == follower and follower in await elected(r)

            await eventually(taken, limit_s=60, what="takeover by the follower")
            r.server.put("pods", pod("third", uid="uid-third", node="n1", phase="Running"))
            await eventually(lambda: shows(follower, "uid-third"), what="the new leader watches")

            async def now_leading() -> bool:
                document = await ready(follower)
                return document is not None and document["leader"] is True

            await eventually(now_leading, what="the new leader's /readyz")
        finally:
            for process in processes.values():
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signal.SIGTERM)
            for process in processes.values():
                await process.wait()
        assert await elected(r) == [leader, follower]
        # the new leader's watcher was seeded from the ledger: nothing appended twice
        facts = await pod_facts(r)
        assert facts["uid-first"] == 1 and facts["uid-second"] == 1 and facts["uid-third"] == 1


async def test_serve_on_a_cluster_uses_exactly_the_shipped_rbac(tmp_path: Path) -> None:
    """``serve --kubeconfig --executor kubernetes`` makes only the calls deploy/kubernetes
    grants, and uses every grant (as ``run`` does: the same run_on_cluster)."""
    async with rig(tmp_path) as r:
        await seed(r)
        r.server.calls.clear()
        args = build_parser().parse_args(
            [
                "serve", str(r.ledger_path), "--kubeconfig", str(r.kubeconfig), "--instance",
                "rbac", "--executor", "kubernetes", "--listen", "127.0.0.1:0", *LEASE,
                "--watch-timeout", "1",
            ]
        )  # fmt: skip
        options = serve_options(args)  # as `serve` builds them: the cluster options typed
        assert options.port == 0 and options.cluster is not None
        stop = asyncio.Event()
        task = asyncio.create_task(serve(args.ledger, options, stop=stop, signals=False))

        await evict_relist_and_check(r, task, stop)


def test_the_deployment_args_are_a_serve_on_the_cluster() -> None:
    """deploy/kubernetes runs ``serve ... --in-cluster``: the real parser takes it, and it
    is a ``serve`` with the cluster options (``serve`` once refused --in-cluster; DECISIONS 130)."""
    deployment = next(yaml.safe_load_all((DEPLOY / "single" / "quotaledger.yaml").read_text()))
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    args = build_parser().parse_args(container["args"])
    assert args.handler.__name__ == "cmd_serve"
    assert on_cluster(args) and args.in_cluster
    assert check_arguments(args) is None
    assert args.executor == "log"


class SwallowingLedger:
    """A ledger whose first follow read to be cancelled swallows that cancellation and
    reads on, as aiokafka's client close once did now and then (DECISIONS 300)."""

    def __init__(self, inner: SqliteLedger) -> None:
        self.inner = inner
        self.swallowed = 0

    async def read(
        self, from_offset: int = 0, *, follow: bool = False
    ) -> AsyncIterator[list[Record]]:
        offset = from_offset
        while True:
            batches = self.inner.read(offset, follow=follow)
            try:
                async for batch in batches:
                    offset = batch[-1].offset + 1
                    yield batch
                return
            except asyncio.CancelledError:
                if not follow or self.swallowed:
                    raise
                self.swallowed += 1
            finally:
                await batches.aclose()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def test_a_follower_that_swallows_a_cancellation_does_not_hold_the_term_up(
    tmp_path: Path,
) -> None:
    """A replica that takes the Lease cancels the follower it ran meanwhile before its
    term begins. One cancellation swallowed inside that follower's read (aiokafka's client
    close did that at random) once left it following for ever: the term never began, the
    cluster's pods never reached the ledger and SIGTERM was ignored (DECISIONS 300). The
    follower is cancelled until it ends: the term begins and the stop ends the replica."""
    async with rig(tmp_path) as r:
        r.server.put("nodes", node("n1"))
        r.server.put("pods", pod("p", uid="uid-p", node="n1", phase="Running"))
        # another holds the Lease for its duration: k1 follows the ledger meanwhile
        other = LeaseElector(
            r.cluster.coordination, "quotaledger", "quotaledger", "other", 1.0, 0.6, 0.2
        )
        assert await other.try_acquire_or_renew()
        args = build_parser().parse_args(
            [
                "serve", str(r.ledger_path), "--kubeconfig", str(r.kubeconfig), "--instance",
                "k1", "--executor", "log", "--listen", "127.0.0.1:0", *LEASE,
                "--watch-timeout", "5",
            ]
        )  # fmt: skip
        ledger = SwallowingLedger(await SqliteLedger.open(r.ledger_path))
        stop = asyncio.Event()
        task = asyncio.create_task(Server(ledger, serve_options(args)).run(stop))  # type: ignore[arg-type]
        try:

            async def listed() -> bool:
                assert not task.done(), task
                return (await pod_facts(r))["uid-p"] == 1

            await eventually(listed, limit_s=60, what="the pod on the ledger, appended by k1")
            assert ledger.swallowed == 1 and holder(r) == "k1"
        finally:
            stop.set()
            async with asyncio.timeout(30):  # a hang guard: the stop ends the replica
                await task
            await ledger.inner.close()
