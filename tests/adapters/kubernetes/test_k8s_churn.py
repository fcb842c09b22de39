"""Churn: 5,000 pods created, bound, finished and deleted while the watcher runs, with a
forced 410 Gone and a cut connection in the middle; the ledger ends equal to the server's
objects, and no change is appended twice (DESIGN §12)."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import pytest

from quotaledger.adapters.kubernetes.translate import fact_payload, node_fact, pod_fact
from quotaledger.events.codec import decode_event
from quotaledger.events.model import PodRemoved, PodUpserted
from tests.k8s_support import eventually, fold, node, pod, records, rig, running_watcher

PODS = 5000
KEEP = 500  # the last pods stay (bound or finished) so the end state is not empty
CHECKPOINT = 500  # every CHECKPOINT-th pod is waited for until the watcher has seen it


@pytest.mark.slow
async def test_churn_with_410_ends_equal_to_the_server(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        for i in range(10):
            r.server.put("nodes", node(f"n{i}"))
        async with running_watcher(r) as watcher:
            for i in range(PODS):
                name, uid = f"p{i}", f"u{i}"
                r.server.put("pods", pod(name, uid=uid, cpu=f"{100 + i % 7}m"))
                r.server.put(
                    "pods",
                    pod(name, uid=uid, cpu=f"{100 + i % 7}m", node=f"n{i % 10}", phase="Running"),
                )
                if i < PODS - KEEP or i % 2:
                    r.server.put(
                        "pods",
                        pod(
                            name,
                            uid=uid,
                            cpu=f"{100 + i % 7}m",
                            node=f"n{i % 10}",
                            phase="Succeeded",
                        ),
                    )
                if i % CHECKPOINT == 0 and i < PODS - KEEP:
                    # the watcher sees this pod alive before it is deleted, however fast or
                    # slow the machine: deletions of seen pods are always exercised
                    async def seen_alive(uid: str = uid) -> bool:
                        await watcher.flushed()
                        return uid in (await fold(r.ledger)).pods

                    await eventually(seen_alive, limit_s=60, what=f"the watcher seeing {uid}")
                if i < PODS - KEEP:
                    r.server.delete("pods", name, "default")
                if i == PODS // 2:
                    r.server.compact()  # 410 Gone for every watch
                if i == PODS * 3 // 4:
                    r.server.drop_watches()  # a network failure
                if i % 50 == 0:
                    await asyncio.sleep(0)  # the watcher runs meanwhile
            r.server.delete("nodes", "n9")

            async def caught_up() -> bool:
                await watcher.flushed()
                state = await fold(r.ledger)
                return len(state.pods) == KEEP and "n9" not in state.nodes

            await eventually(caught_up, limit_s=120, what="the ledger catching up")
            assert watcher.reflectors["pods"].lists >= 2  # the 410 re-listed
        state = await fold(r.ledger)
        server_pods = {obj["metadata"]["uid"]: obj for obj in r.server.items("pods")}
        assert set(state.pods) == set(server_pods)
        for uid, obj in server_pods.items():
            assert state.pods[uid] == fact_payload(pod_fact(obj))[1]
        assert set(state.nodes) == {obj["metadata"]["name"] for obj in r.server.items("nodes")}
        for obj in r.server.items("nodes"):
            expected = fact_payload(node_fact(obj))[1]
            assert state.nodes[obj["metadata"]["name"]] == expected.allocatable  # type: ignore[union-attr]
        events = [decode_event(rec.payload) for rec in (await records(r.ledger))[1:]]
        upserts = Counter(e.uid for e in events if isinstance(e, PodUpserted))
        removals = Counter(e.uid for e in events if isinstance(e, PodRemoved))
        assert max(upserts.values()) <= 3  # created, bound, finished: never repeated
        # a pod created and deleted while the watcher was re-listing is never seen: fine;
        # every pod seen and later deleted is removed exactly once, after its upserts
        assert set(removals.values()) <= {
            1
        }  # (none when the watcher saw no pod before its deletion)
        assert set(removals) == set(upserts) - set(server_pods)
        seen: set[str] = set()
        gone: set[str] = set()
        for e in events:
            if isinstance(e, PodUpserted):
                assert e.uid not in gone  # never resurrected by a stale event
                seen.add(e.uid)
            elif isinstance(e, PodRemoved):
                assert e.uid in seen
                gone.add(e.uid)
        # the checkpoint pods were seen alive and then removed (how many others were
        # depends on how far the watcher kept up with the loop: not a contract)
        assert {f"u{i}" for i in range(0, PODS - KEEP, CHECKPOINT)} <= set(removals)
        assert state.rejected == []
