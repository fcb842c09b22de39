"""``quotaledger import`` of Kueue Cohorts, ClusterQueues and LocalQueues
(DESIGN §13, IMPORT.md): the published examples, the naming of cohorts and
local queues, flavors summed, the default ClusterQueue, and the property that
every import folds without rejection whatever the input order.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quotaledger.adapters.importers import SourceDocument, translate
from tests.import_support import (
    DATA,
    amounts,
    equivalent,
    fold_accepts,
    quotas,
    run,
    warning_keys,
    write,
)

# -------------------------------------------------------------- the real files


def test_kueue_cluster_queue_docs_borrowing_limit(capsys: pytest.CaptureFixture[str]) -> None:
    code, facts, err = run(capsys, str(DATA / "kueue" / "cohort-borrowing-limit.yaml"))
    assert code == 0
    assert equivalent(
        facts,
        [
            {
                "kind": "QuotaUpserted",
                "name": "team-ab",
                "is_parent": True,
                "min": {"cpu": "21"},
                "allow_lent": False,
                "borrowing_limit": {"cpu": 0, "memory": 0},
            },
            {
                "kind": "QuotaUpserted",
                "name": "team-a-cq",
                "parent": "team-ab",
                "min": {"cpu": 9},
                "borrowing_limit": {"cpu": "1"},
            },
            {"kind": "QuotaUpserted", "name": "team-b-cq", "parent": "team-ab", "min": {"cpu": 12}},
        ],
    )
    assert warning_keys(err) == {("implicit-cohort", "Cohort/team-ab")}


def test_kueue_flavors_are_summed_and_warned(capsys: pytest.CaptureFixture[str]) -> None:
    code, facts, err = run(capsys, str(DATA / "kueue" / "concurrent-admission-setup.yaml"))
    assert code == 0, err
    queue = quotas(facts)["team-cluster-queue"]
    assert queue["min"] == {"cpu": "28000m", "memory": (16 + 32 + 64) * 2**30}
    assert queue["namespaces"] == ["default"]
    assert ("flavor", "ClusterQueue/team-cluster-queue") in warning_keys(err)
    assert ("concurrentAdmissionPolicy", "ClusterQueue/team-cluster-queue") in warning_keys(err)


# ----------------------------------------------------------------------- rules


def test_kueue_names_cohorts_and_local_queues(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = write(
        tmp_path,
        """\
        apiVersion: kueue.x-k8s.io/v1beta1
        kind: Cohort
        metadata: {name: shared}
        spec:
          parent: org
          resourceGroups:
          - coveredResources: [cpu]
            flavors:
            - name: f
              resources: [{name: cpu, nominalQuota: 2, lendingLimit: 1}]
        ---
        apiVersion: kueue.x-k8s.io/v1beta1
        kind: ClusterQueue
        metadata: {name: shared}
        spec:
          cohort: shared
          namespaceSelector: {matchLabels: {team: a}}
          resourceGroups:
          - coveredResources: [cpu, memory]
            flavors:
            - name: f
              resources:
              - {name: cpu, nominalQuota: 3, borrowingLimit: 1}
              - {name: memory, nominalQuota: 1Gi}
            - name: g
              resources:
              - {name: cpu, nominalQuota: 1}
        ---
        apiVersion: kueue.x-k8s.io/v1beta1
        kind: ClusterQueue
        metadata: {name: system}
        spec: {cohort: org}
        ---
        apiVersion: kueue.x-k8s.io/v1beta1
        kind: LocalQueue
        metadata: {name: lq1, namespace: ns1}
        spec: {clusterQueue: shared}
        ---
        apiVersion: kueue.x-k8s.io/v1beta1
        kind: LocalQueue
        metadata: {name: lq2, namespace: ns2}
        spec: {clusterQueue: shared}
        ---
        apiVersion: kueue.x-k8s.io/v1beta1
        kind: LocalQueue
        metadata: {name: lq3, namespace: ns2}
        spec: {clusterQueue: system}
        ---
        apiVersion: kueue.x-k8s.io/v1beta1
        kind: Workload
        metadata: {name: w}
        """,
    )
    code, facts, err = run(capsys, path)
    assert code == 0
    assert equivalent(
        facts,
        [
            {
                "kind": "QuotaUpserted",
                "name": "org",
                "is_parent": True,
                "min": {"cpu": 6, "memory": "1Gi"},
                "allow_lent": False,
                "borrowing_limit": {"cpu": 0, "memory": 0},
            },
            {"kind": "QuotaUpserted", "name": "clusterqueue/system", "parent": "org"},
            {
                "kind": "QuotaUpserted",
                "name": "cohort/shared",
                "parent": "org",
                "is_parent": True,
                "min": {"cpu": 6, "memory": "1Gi"},
                "lending_limit": {"cpu": 1},
            },
            {
                "kind": "QuotaUpserted",
                "name": "shared",
                "parent": "cohort/shared",
                "min": {"cpu": 4, "memory": "1Gi"},
                "namespaces": ["ns1"],
            },
        ],
    )
    assert warning_keys(err) == {
        ("implicit-cohort", "Cohort/org"),
        ("renamed", "Cohort/shared"),
        ("renamed", "ClusterQueue/system"),
        ("flavor", "ClusterQueue/shared"),
        ("namespaceSelector", "ClusterQueue/shared"),
        ("localqueue", "namespace/ns2"),
        ("skipped-kind", "Workload/w"),
    }


def test_kueue_default_cluster_queue_and_no_peer_files(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = write(
        tmp_path,
        """\
        apiVersion: kueue.x-k8s.io/v1beta2
        kind: ClusterQueue
        metadata: {name: default}
        spec:
          resourceGroups:
          - coveredResources: [cpu]
            flavors: [{name: f, resources: [{name: cpu, nominalQuota: 1}]}]
        """,
    )
    code, facts, err = run(capsys, path)
    assert code == 0
    assert facts[0]["name"] == "default" and facts[0]["allow_lent"] is False
    assert warning_keys(err) == {("default-queue", "ClusterQueue/default")}
    pod = write(tmp_path, "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n", "pod.yaml")
    code, facts, err = run(capsys, pod)
    assert code == 0 and facts == []
    assert warning_keys(err) == {("skipped-kind", "Pod/p")}


# ------------------------------------------------------------------ properties


@st.composite
def kueue_objects(draw: st.DrawFn) -> list[dict[str, Any]]:
    def groups() -> list[dict[str, Any]]:
        resources = []
        for flavor in draw(st.lists(st.sampled_from(["f1", "f2"]), unique=True, max_size=2)):
            entries = []
            for resource in draw(st.lists(st.sampled_from(["cpu", "memory", "gpu"]), unique=True)):
                entry: dict[str, Any] = {"name": resource, "nominalQuota": draw(amounts)}
                for limit in ("borrowingLimit", "lendingLimit"):
                    if draw(st.booleans()):
                        entry[limit] = draw(amounts)
                entries.append(entry)
            resources.append({"name": flavor, "resources": entries})
        return [{"coveredResources": ["cpu", "memory", "gpu"], "flavors": resources}]

    objects: list[dict[str, Any]] = []
    cohorts = draw(st.lists(st.sampled_from(["c1", "c2", "c3", "q1", "root"]), unique=True))
    for index, name in enumerate(cohorts):
        parent = draw(st.sampled_from(["", "implicit", *cohorts[:index]]))
        objects.append(
            {
                "apiVersion": "kueue.x-k8s.io/v1beta1",
                "kind": "Cohort",
                "metadata": {"name": name},
                "spec": {"parent": parent, "resourceGroups": groups()},
            }
        )
    for name in draw(st.lists(st.sampled_from(["q1", "q2", "default", "system"]), unique=True)):
        cohort = draw(st.sampled_from(["", "implicit", *cohorts]))
        objects.append(
            {
                "apiVersion": "kueue.x-k8s.io/v1beta1",
                "kind": "ClusterQueue",
                "metadata": {"name": name},
                "spec": {"cohort": cohort, "resourceGroups": groups()},
            }
        )
        for namespace in draw(st.lists(st.sampled_from(["n1", "n2"]), max_size=2)):
            objects.append(
                {
                    "apiVersion": "kueue.x-k8s.io/v1beta1",
                    "kind": "LocalQueue",
                    "metadata": {"name": f"lq-{name}", "namespace": namespace},
                    "spec": {"clusterQueue": name},
                }
            )
    return objects


@given(kueue_objects(), st.randoms(use_true_random=False))
@settings(max_examples=60, deadline=None)
def test_kueue_imports_are_valid_and_order_free(objects: list[dict[str, Any]], rnd: Any) -> None:
    documents = [SourceDocument("doc", o) for o in objects]
    result = translate("kueue", documents)
    assert not result.rejected
    fold_accepts(result.facts)
    rnd.shuffle(documents)
    assert translate("kueue", documents).facts == result.facts
