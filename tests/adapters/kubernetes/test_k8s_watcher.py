"""The cluster watcher against the stand-in API server, with the real kubernetes-asyncio
client and a real SQLite ledger (DESIGN §12)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from quotaledger.adapters.kubernetes.watcher import Baseline, WatchOptions
from quotaledger.events.codec import decode_event
from quotaledger.events.model import (
    FactRejected,
    NamespaceWeighted,
    NodeUpserted,
    PodRemoved,
    PodUpserted,
    QuotaRemoved,
    QuotaUpserted,
    SettingsChanged,
)
from tests.k8s_support import Rig, eventually, fold, node, pod, records, rig, running_watcher
from tests.paths import TESTS


async def events(r: Rig) -> list[Any]:
    return [decode_event(rec.payload) for rec in (await records(r.ledger))[1:]]


async def settled(r: Rig, watcher: Any, check: Any) -> None:
    async def done() -> bool:
        await watcher.flushed()
        return bool(check(await events(r)))

    await eventually(done)


async def test_list_then_watch_appends_each_change_once(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        r.server.put("nodes", node("n1"))
        r.server.put("pods", pod("a", uid="ua", node="n1", phase="Running"))
        async with running_watcher(r) as watcher:
            await settled(r, watcher, lambda es: len(es) == 2)
            r.server.put("pods", pod("b", uid="ub"))
            # same translated fact (only status details changed): nothing appended
            same = pod("a", uid="ua", node="n1", phase="Running")
            same["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
            r.server.put("pods", same)
            r.server.put("pods", pod("b", uid="ub", node="n1", phase="Running"))
            r.server.delete("pods", "a", "default")
            await settled(r, watcher, lambda es: any(isinstance(e, PodRemoved) for e in es))
        kinds = [
            (type(e).__name__, getattr(e, "uid", getattr(e, "name", ""))) for e in await events(r)
        ]
        # the first lists of nodes and pods run concurrently: either order
        assert sorted(kinds[:2]) == [("NodeUpserted", "n1"), ("PodUpserted", "ua")]
        assert kinds[2:] == [
            ("PodUpserted", "ub"),
            ("PodUpserted", "ub"),
            ("PodRemoved", "ua"),
        ]
        assert any(q.get("allowWatchBookmarks") in ("True", "true") for q in r.server.watch_params)


async def test_410_relists_and_appends_only_the_differences(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        for name in ("keep", "change", "vanish"):
            r.server.put("pods", pod(name, uid=f"u-{name}"))
        r.server.put("nodes", node("n1"))
        r.server.put("nodes", node("n2"))
        async with running_watcher(r) as watcher:
            await settled(r, watcher, lambda es: len(es) == 5)
            lists_before = watcher.reflectors["pods"].lists
            # the watcher is cut off; meanwhile the cluster changes and history is compacted
            r.server.refuse_watches = True
            r.server.drop_watches()
            r.server.put("pods", pod("change", uid="u-change", node="n1", phase="Running"))
            r.server.delete("pods", "vanish", "default")
            r.server.put("pods", pod("new", uid="u-new"))
            r.server.delete("nodes", "n2")
            r.server.compact(expire_watches=False)
            r.server.refuse_watches = False
            await settled(r, watcher, lambda es: len(es) >= 9)
            assert watcher.reflectors["pods"].lists == lists_before + 1
            r.server.put("pods", pod("late", uid="u-late"))
            await settled(r, watcher, lambda es: len(es) >= 10)
        tail = [
            (type(e).__name__, getattr(e, "uid", getattr(e, "name", None)))
            for e in (await events(r))[5:]
        ]
        assert sorted(tail[:4]) == sorted(
            [
                ("PodUpserted", "u-change"),
                ("PodUpserted", "u-new"),
                ("PodRemoved", "u-vanish"),
                ("NodeRemoved", "n2"),
            ]
        )
        assert tail[4:] == [("PodUpserted", "u-late")]
        state = await fold(r.ledger)
        assert sorted(state.pods) == ["u-change", "u-keep", "u-late", "u-new"]


async def test_network_errors_resume_without_loss_or_duplicates(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        async with running_watcher(r) as watcher:
            await settled(r, watcher, lambda es: True)
            for round_ in range(5):
                for i in range(10):
                    r.server.put("pods", pod(f"p{round_}-{i}", uid=f"u{round_}-{i}"))
                r.server.drop_watches()
                r.server.fail_lists = 1  # a failing list on the way is retried, too
            await settled(r, watcher, lambda es: len(es) == 50)
            r.server.bookmark()
            await eventually(
                lambda: _true(watcher.reflectors["pods"].resource_version == str(r.server.rv))
            )
        counts = Counter(e.uid for e in await events(r) if isinstance(e, PodUpserted))
        assert len(counts) == 50 and set(counts.values()) == {1}


async def _true(value: bool) -> bool:
    return value


async def test_restart_from_the_ledger_appends_nothing_new(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        r.server.put("nodes", node("n1"))
        r.server.put("pods", pod("a", uid="ua", node="n1", phase="Running"))
        r.server.put(
            "quotas",
            {"metadata": {"name": "team"}, "spec": {"min": {"cpu": 2}}},
            group="quotaledger.io",
        )
        r.server.put(
            "namespaces",
            {"metadata": {"name": "shop", "annotations": {"quotaledger.io/weight": "4"}}},
        )
        async with running_watcher(r) as watcher:
            await settled(r, watcher, lambda es: len(es) == 4)
        r.server.delete("pods", "a", "default")
        before = len(await events(r))
        baseline = Baseline.of(await fold(r.ledger))
        async with running_watcher(r, baseline=baseline) as watcher:
            await settled(r, watcher, lambda es: len(es) > before)
            await watcher.flushed()
        tail = (await events(r))[before:]
        assert tail == [PodRemoved(uid="ua")]


async def test_settings_configmap_and_namespace_weights(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        cm = {
            "metadata": {"name": "quotaledger-settings", "namespace": "quotaledger"},
            "data": {"revoke_after_s": "60", "reclaim_enabled": "false"},
        }
        r.server.put("configmaps", cm)
        r.server.put(
            "configmaps",
            {
                "metadata": {"name": "other", "namespace": "quotaledger"},
                "data": {"revoke_after_s": "1"},
            },
        )
        async with running_watcher(r) as watcher:
            await settled(r, watcher, lambda es: len(es) == 1)
            cm["data"] = {
                "revoke_after_s": "later",
                "reclaim_enabled": "false",
                "quota_preemption_enabled": "true",
            }
            r.server.put("configmaps", cm)
            # the ConfigMap and the namespaces come by separate watches, whose order on
            # the ledger is the scheduler's: the namespaces go in once the change is in
            await settled(r, watcher, lambda es: len(es) == 3)
            r.server.put(
                "namespaces",
                {"metadata": {"name": "a", "annotations": {"quotaledger.io/weight": "3"}}},
            )
            r.server.put(
                "namespaces",
                {"metadata": {"name": "b", "annotations": {"quotaledger.io/weight": "-1"}}},
            )
            r.server.put("namespaces", {"metadata": {"name": "c"}})
            await settled(r, watcher, lambda es: len(es) == 5)
        es = await events(r)
        assert es[0] == SettingsChanged(revoke_after_s=60.0, reclaim_enabled=False)
        assert isinstance(es[1], FactRejected) and "data.revoke_after_s" in es[1].reason
        assert "quotaledger/quotaledger-settings" in es[1].reason
        assert es[2] == SettingsChanged(quota_preemption_enabled=True)
        assert es[3] == NamespaceWeighted(namespace="a", weight=3)
        assert isinstance(es[4], FactRejected) and "namespace b" in es[4].reason
        state = await fold(r.ledger)
        assert state.settings.revoke_after_s == 60 and state.settings.quota_preemption_enabled
        assert [x.offset for x in state.rejected] == [2, 5]


async def test_quota_crd_upsert_remove_and_refusal(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        group = "quotaledger.io"
        r.server.put(
            "quotas",
            {"metadata": {"name": "eng"}, "spec": {"is_parent": True, "min": {"cpu": "4"}}},
            group=group,
        )
        r.server.put(
            "quotas",
            {
                "metadata": {"name": "ml"},
                "spec": {"parent": "eng", "min": {"cpu": "2"}, "max": {"cpu": "8"}},
            },
            group=group,
        )
        r.server.put(
            "quotas", {"metadata": {"name": "bad"}, "spec": {"minimum": {"cpu": 1}}}, group=group
        )
        async with running_watcher(r) as watcher:
            await settled(r, watcher, lambda es: len(es) == 3)
            r.server.delete("quotas", "ml", group=group)
            r.server.put(
                "quotas", {"metadata": {"name": "bad"}, "spec": {"min": {"cpu": "x"}}}, group=group
            )
            await settled(r, watcher, lambda es: len(es) == 5)
        es = await events(r)
        assert (
            isinstance(es[0], FactRejected)
            and "Quota/bad" in es[0].reason
            and "spec.minimum" in es[0].reason
        )
        assert (
            isinstance(es[1], QuotaUpserted) and es[1].name == "eng" and es[1].min == {"cpu": 4000}
        )
        assert (
            isinstance(es[2], QuotaUpserted)
            and es[2].parent == "eng"
            and es[2].max == {"cpu": 8000}
        )
        assert {type(e).__name__ for e in es[3:]} == {"QuotaRemoved", "FactRejected"}
        assert QuotaRemoved(name="ml") in es[3:]
        refusal = next(e for e in es[3:] if isinstance(e, FactRejected))
        assert "quota bad" in refusal.reason and "min" in refusal.reason


YUNIKORN_QUEUES = """
partitions:
  - name: default
    queues:
      - name: root
        queues:
          - name: eng
            resources:
              guaranteed: {vcore: 4, memory: 8G}
              max: {vcore: 8, memory: 16G}
"""


async def test_peer_sources_translate_live_objects(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        cm = {
            "metadata": {"name": "yunikorn-configs", "namespace": "yunikorn"},
            "data": {"queues.yaml": YUNIKORN_QUEUES},
        }
        r.server.put("configmaps", cm)
        options = WatchOptions(quota_source="yunikorn", watch_timeout_s=5)
        async with running_watcher(r, options) as watcher:
            await settled(r, watcher, lambda es: len(es) == 1)
            cm["data"] = {"queues.yaml": "partitions: [unclosed"}
            r.server.put("configmaps", cm)
            await settled(r, watcher, lambda es: len(es) >= 3)
        es = await events(r)
        assert isinstance(es[0], QuotaUpserted) and es[0].name == "eng"
        assert es[0].min == {"cpu": 4000, "memory": 8000 * 10**6}
        assert isinstance(es[1], FactRejected) and "yunikorn-configs" in es[1].reason
        assert es[2] == QuotaRemoved(name="eng")


async def test_kueue_source_with_two_collections(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        cq = {
            "metadata": {"name": "team-a"},
            "spec": {
                "cohort": "org",
                "resourceGroups": [
                    {
                        "coveredResources": ["cpu"],
                        "flavors": [
                            {"name": "default", "resources": [{"name": "cpu", "nominalQuota": "6"}]}
                        ],
                    }
                ],
            },
        }
        r.server.put("clusterqueues", cq, group="kueue.x-k8s.io")
        r.server.put("cohorts", {"metadata": {"name": "org"}, "spec": {}}, group="kueue.x-k8s.io")
        r.server.put(
            "clusterqueues",
            {"metadata": {"name": "broken"}, "spec": {"resourceGroups": 5}},
            group="kueue.x-k8s.io",
        )
        options = WatchOptions(quota_source="kueue", watch_timeout_s=5)
        async with running_watcher(r, options) as watcher:
            await settled(r, watcher, lambda es: len(es) == 3)
        es = await events(r)
        assert isinstance(es[0], FactRejected) and "ClusterQueue/broken" in es[0].reason
        assert [(e.name, e.parent) for e in es[1:]] == [("org", "root"), ("team-a", "org")]


async def test_bad_pod_is_refused_not_fatal(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        bad = pod("bad", uid="ubad", cpu="much")
        r.server.put("pods", bad)
        r.server.put("pods", pod("good", uid="ugood"))
        async with running_watcher(r) as watcher:
            await settled(r, watcher, lambda es: len(es) == 2)
            r.server.put("pods", pod("bad", uid="ubad", cpu="1"))
            await settled(r, watcher, lambda es: len(es) == 3)
        es = await events(r)
        refusal = next(e for e in es if isinstance(e, FactRejected))
        assert "pod default/bad" in refusal.reason and "requests.cpu" in refusal.reason
        assert json.loads(refusal.raw or "{}")["metadata"]["name"] == "bad"
        assert isinstance(es[2], PodUpserted) and es[2].uid == "ubad"
        assert not any(isinstance(e, NodeUpserted) for e in es)


async def test_paged_list_with_changes_between_pages(tmp_path: Path) -> None:
    """Lists come in pages of ``page_size`` from one snapshot; what changes meanwhile
    arrives by the watch from the list's version."""
    async with rig(tmp_path) as r:
        for i in range(25):
            r.server.put("pods", pod(f"p{i:02}", uid=f"u{i:02}"))
        options = WatchOptions(watch_timeout_s=5, page_size=4)
        async with running_watcher(r, options) as watcher:
            r.server.delete("pods", "p00", "default")  # possibly while paging
            r.server.put("pods", pod("p99", uid="u99"))
            await settled(
                r,
                watcher,
                lambda es: any(isinstance(e, PodUpserted) and e.uid == "u99" for e in es),
            )
            await settled(r, watcher, lambda es: True)
        list_calls = [c for c in r.server.calls if c.resource == "pods" and c.verb == "list"]
        assert len(list_calls) >= 7  # 25 pods, 4 per page
        state = await fold(r.ledger)
        assert sorted(state.pods) == sorted({f"u{i:02}" for i in range(1, 25)} | {"u99"})


async def test_standin_410_as_kubernetes_asyncio_watch_forever_sees_it(tmp_path: Path) -> None:
    """The stand-in's 410 against the client's own watch-forever mode: it retries once with
    the same too-old version, then raises 410 (the reflector uses server timeouts instead)."""
    from kubernetes_asyncio import watch
    from kubernetes_asyncio.client.exceptions import ApiException

    async with rig(tmp_path) as r:
        r.server.put("nodes", node("n1"))
        r.server.put("nodes", node("n2"))
        r.server.compact(expire_watches=False)
        stream = watch.Watch()
        with pytest.raises(ApiException) as caught:
            async for _ in stream.stream(r.cluster.core.list_node, resource_version="1"):
                pass
        await stream.close()
        assert caught.value.status == 410
        tries = [q for q in r.server.watch_params if q.get("resourceVersion") == "1"]
        assert len(tries) == 2


PEER_FILES = {
    "koordinator": ("proposal-multi-hierarchy.yaml", "scheduling.sigs.k8s.io", "elasticquotas"),
    "volcano": ("hierarchical-jobs-queues.yaml", "scheduling.volcano.sh", "queues"),
    "kueue": ("cohort-tree.yaml", "kueue.x-k8s.io", None),
}


@pytest.mark.parametrize("peer", sorted(PEER_FILES))
async def test_live_source_appends_what_import_translates(tmp_path: Path, peer: str) -> None:
    """The real sample files of each peer, served as live objects: the watcher appends the
    same QuotaUpserted facts as `import` of the file (one code path, IMPORT.md)."""
    import yaml

    from quotaledger.adapters.importers import SourceDocument, translate
    from quotaledger.events.codec import decode_event as decode

    name, group, plural = PEER_FILES[peer]
    path = TESTS / "data" / "import" / peer / name
    documents = [d for d in yaml.safe_load_all(path.read_text()) if isinstance(d, dict)]
    expected = {
        fact["name"]: decode(json.dumps(fact))
        for fact in translate(peer, [SourceDocument(name, d) for d in documents]).facts
        if fact["kind"] == "QuotaUpserted"
    }
    assert expected
    async with rig(tmp_path) as r:
        for document in documents:
            kind = document.get("kind", "")
            resource = plural or {"ClusterQueue": "clusterqueues", "Cohort": "cohorts"}.get(kind)
            if resource is None:
                continue
            document.get("metadata", {}).setdefault("name", "unnamed")
            r.server.put(resource, document, group=group)
        options = WatchOptions(quota_source=peer, watch_timeout_s=5)
        async with running_watcher(r, options) as watcher:
            await settled(
                r,
                watcher,
                lambda es: len([e for e in es if isinstance(e, QuotaUpserted)]) >= len(expected),
            )
        got = {e.name: e for e in await events(r) if isinstance(e, QuotaUpserted)}
        assert got == expected
