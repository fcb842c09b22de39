"""Executor ``kubernetes`` (DESIGN §12): the live engine drives an accepted eviction through
the Eviction subresource of the stand-in API server, answers scripted per test."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from quotaledger.adapters.kubernetes.executor import KubernetesExecutor
from quotaledger.adapters.kubernetes.watcher import Baseline
from quotaledger.engine.live import LiveEngine
from quotaledger.events.codec import decode_event, encode_event
from quotaledger.events.ledger import Append
from quotaledger.events.model import (
    ClocksObserved,
    EvictionFailed,
    EvictionRequested,
    EvictionSucceeded,
    PodRemoved,
    PodUpserted,
    PreemptionFinished,
    PreemptionStarted,
    QuotaUpserted,
)
from tests.k8s_api_server import EvictionAnswer
from tests.k8s_support import Rig, eventually, fold, pod, records, rig, running_watcher

PDB = "Cannot evict pod as it would violate the pod's disruption budget."


async def seed(r: Rig, *, on_server: bool = True) -> None:
    """A quota, its running pod (on the server too), and an eviction of it requested."""
    if on_server:
        r.server.put(
            "pods",
            pod(
                "victim",
                uid="u-victim",
                node="n1",
                phase="Running",
                labels={"quotaledger.io/quota": "q"},
            ),
        )
    facts = [
        QuotaUpserted(name="q"),
        PodUpserted(
            uid="u-victim",
            name="victim",
            namespace="default",
            requests={"cpu": 100},
            phase="Running",
            node="n1",
            quota="q",
            labels={"quotaledger.io/quota": "q"},
        ),
    ]
    await r.ledger.append([Append(payload=encode_event(e)) for e in facts])
    basis = await r.ledger.last_offset()
    decisions = [
        # the revoke's timer: q's overuse clock, long due (the guard admits only
        # a decision whose timer holds, DECISIONS 211)
        ClocksObserved(basis=basis, owing_started={"q": 0}),
        PreemptionStarted(
            preemption_id="p1", queue="q", cause="overuse", target={"cpu": 100}, basis=basis
        ),
        EvictionRequested(
            eviction_id="e1", preemption_id="p1", pod_uid="u-victim", queue="q", instance="engine"
        ),
    ]
    await r.ledger.append([Append(payload=encode_event(e)) for e in decisions])


@contextlib.asynccontextmanager
async def engine(r: Rig, retry_for_s: float = 300.0) -> AsyncIterator[LiveEngine]:
    executor = KubernetesExecutor(
        r.cluster.core, r.ledger, retry_for_s=retry_for_s, backoff_first_s=0.05, backoff_cap_s=0.2
    )
    live = LiveEngine(r.ledger, executor, instance="engine", election=False, idle_poll_s=0.05)
    stop = asyncio.Event()
    task = asyncio.create_task(live.run(stop))
    try:
        yield live
    finally:
        stop.set()
        await task


async def outcome_events(r: Rig) -> list[Any]:
    return [
        e
        for e in (decode_event(rec.payload) for rec in await records(r.ledger))
        if isinstance(e, EvictionSucceeded | EvictionFailed | PodRemoved | PreemptionFinished)
    ]


async def finished(r: Rig) -> bool:
    return any(isinstance(e, PreemptionFinished) for e in await outcome_events(r))


async def test_201_success_is_the_pod_removal_seen_by_the_watcher(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        await seed(r)
        baseline = Baseline.of(await fold(r.ledger))
        async with running_watcher(r, baseline=baseline), engine(r):
            await eventually(lambda: finished(r), what="preemption finished")
        assert r.server.eviction_posts == [("default", "victim", 201)]
        got = await outcome_events(r)
        assert [type(e) for e in got] == [PodRemoved, PreemptionFinished]
        state = await fold(r.ledger)
        assert "u-victim" not in state.pods
        # a restarted engine does not evict again: once it has folded the whole
        # ledger, it gets a few reconciler rounds (idle poll 0.05 s) to try
        tail = await r.ledger.last_offset()
        async with engine(r) as again:
            await eventually(lambda: _true(again.state.offset >= tail), what="restart caught up")
            await asyncio.sleep(0.3)
        assert len(r.server.eviction_posts) == 1


async def test_404_is_success(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        await seed(r, on_server=False)
        async with engine(r):
            await eventually(lambda: finished(r))
        assert r.server.eviction_posts == [("default", "victim", 404)]
        assert isinstance((await outcome_events(r))[0], EvictionSucceeded)


async def test_429_and_5xx_are_retried_honouring_retry_after(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        await seed(r)
        r.server.evictions.extend(
            [
                EvictionAnswer(429, PDB, retry_after=0),
                EvictionAnswer(500, "etcd timeout"),
                EvictionAnswer(503),
            ]
        )
        async with engine(r):
            await eventually(lambda: _posted(r, 4))
        assert [s for _, _, s in r.server.eviction_posts] == [429, 500, 503, 201]
        assert not any(isinstance(e, EvictionFailed) for e in await outcome_events(r))


async def _true(value: bool) -> bool:
    return value


async def _posted(r: Rig, n: int) -> bool:
    return len(r.server.eviction_posts) >= n


async def test_429_until_the_deadline_fails_with_the_server_message(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        await seed(r)
        r.server.evictions.extend([EvictionAnswer(429, PDB, retry_after=1)] * 50)
        async with engine(r, retry_for_s=1.5):
            await eventually(lambda: finished(r))
        failed = (await outcome_events(r))[0]
        assert isinstance(failed, EvictionFailed)
        assert PDB in failed.error and failed.error.startswith("429")
        # Retry-After 1 s within a 1.5 s budget: at most two tries
        assert 1 <= len(r.server.eviction_posts) <= 2


async def test_403_fails_at_once(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        await seed(r)
        r.server.evictions.append(EvictionAnswer(403, 'pods "victim" is forbidden'))
        async with engine(r):
            await eventually(lambda: finished(r))
        assert [s for _, _, s in r.server.eviction_posts] == [403]
        failed = (await outcome_events(r))[0]
        assert isinstance(failed, EvictionFailed) and "forbidden" in failed.error


async def test_deadline_counts_from_the_request_record_not_the_restart(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        await seed(r)
        await asyncio.sleep(2.0)  # the engine starts 2 s after the request, budget 4 s
        r.server.evictions.extend([EvictionAnswer(429, PDB, retry_after=1.5)] * 5)
        async with engine(r, retry_for_s=4.0):
            await eventually(lambda: finished(r))
        # tries at +2 s and +3.5 s; a third (+5 s) would pass the request's ts + 4 s
        assert 1 <= len(r.server.eviction_posts) <= 2
        assert isinstance((await outcome_events(r))[0], EvictionFailed)


async def test_a_leadership_lost_before_the_body_is_written_sends_nothing(tmp_path: Path) -> None:
    """aiohttp writes an eviction's request line, headers and body from a task of its
    own, a loop turn after the request got its connection: a replica paused there
    (SIGSTOP past its Lease) would send a POST checked before the pause. The fence is
    checked again right before the bytes are written (DECISIONS 304): here leadership
    holds for the executor's check and the connection's, and is gone at the write."""
    async with rig(tmp_path) as r:
        await seed(r)
        checks: list[bool] = []

        def may_evict() -> bool:
            checks.append(len(checks) < 2)  # the loop's check, the connection's; then lost
            return checks[-1]

        executor = KubernetesExecutor(r.cluster.core, r.ledger, may_evict=may_evict, poll_s=0.01)
        state = await fold(r.ledger)
        [run] = state.evictions.values()
        async with asyncio.timeout(10):  # a POST sent would wait for the pod's removal
            assert await executor.evict(run, state) == []
        assert checks == [True, True, False]
        assert r.server.eviction_posts == []
        # no eviction request reached the server at all, not even its request line
        assert not any(call.subresource == "eviction" for call in r.server.calls)
