"""``quotaledger import`` of Volcano Queues and ResourceQuotas (DESIGN §13,
IMPORT.md): the published examples, the seed document's namespace weights, the
capacity plugin's rules, and the property that every import folds without
rejection.
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


def test_volcano_dra_guarantee_outside_resource_is_warned(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, facts, err = run(capsys, str(DATA / "volcano" / "dra-quota.yaml"))
    assert code == 0, err
    gpu = quotas(facts)["gpu-team"]
    assert gpu["min"] == {"deviceclass/gpu.nvidia.com": 4}
    assert gpu["lending_limit"] is None
    assert gpu["shared_weight"] == gpu["min"]
    assert ("guarantee", "Queue/gpu-team") in warning_keys(err)


# ---------------------------------------------------------- the seed's example


def test_seed_volcano_namespace_weight(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
        apiVersion: v1
        kind: ResourceQuota
        metadata:
          namespace: default
        spec:
          hard:
            limits.memory: 2Gi
            volcano.sh/namespace.weight: 1
        ---
        apiVersion: v1
        kind: ResourceQuota
        metadata:
          name: second
          namespace: default
        spec:
          hard:
            volcano.sh/namespace.weight: 3
        ---
        apiVersion: v1
        kind: ResourceQuota
        metadata:
          name: low
          namespace: ns2
        spec:
          hard:
            volcano.sh/namespace.weight: 0
        """,
    )
    code, facts, err = run(capsys, path)
    assert code == 0
    assert facts == [
        {"kind": "NamespaceWeighted", "namespace": "default", "weight": 3},
        {"kind": "NamespaceWeighted", "namespace": "ns2", "weight": 1},
    ]
    assert ("resourcequota", "ResourceQuota/?") in warning_keys(err)


# ----------------------------------------------------------------------- rules


def test_volcano_capacity_rules(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
        apiVersion: scheduling.volcano.sh/v1beta1
        kind: Queue
        metadata: {name: root}
        spec: {capability: {cpu: 100, memory: 100Gi, nvidia.com/gpu: 8}}
        ---
        apiVersion: scheduling.volcano.sh/v1beta1
        kind: Queue
        metadata: {name: eng}
        spec:
          parent: root
          deserved: {cpu: 10}
          capability: {cpu: 0, memory: 50Gi}
          weight: 3
          priority: 2
        ---
        apiVersion: scheduling.volcano.sh/v1beta1
        kind: Queue
        metadata: {name: dev, annotations: {volcano.sh/closed-by-parent: "true"}}
        spec:
          parent: eng
          deserved: {cpu: 4}
          guarantee: {resource: {cpu: 6, memory: 1Gi}}
          capability: {memory: 20Gi}
          dequeueStrategy: traverse
        ---
        apiVersion: scheduling.volcano.sh/v1beta1
        kind: Queue
        metadata: {name: default}
        spec: {parent: eng}
        """,
    )
    code, facts, err = run(capsys, path)
    assert code == 0
    assert equivalent(
        facts,
        [
            {
                "kind": "QuotaUpserted",
                "name": "eng",
                "is_parent": True,
                "min": {"cpu": 10, "memory": "1Gi"},
                "max": {"cpu": 100, "memory": "50Gi", "nvidia.com/gpu": 8},
                "shared_weight": {"cpu": 10},
            },
            {
                "kind": "QuotaUpserted",
                "name": "dev",
                "parent": "eng",
                "min": {"cpu": 6, "memory": "1Gi"},
                "max": {"cpu": 100, "memory": "20Gi", "nvidia.com/gpu": 8},
                "shared_weight": {"cpu": 6, "memory": "1Gi"},
                "lending_limit": {"cpu": 0, "memory": 0},
            },
            {
                "kind": "QuotaUpserted",
                "name": "queue/default",
                "parent": "eng",
                "max": {"cpu": 100, "memory": "50Gi", "nvidia.com/gpu": 8},
            },
        ],
    )
    assert warning_keys(err) == {
        ("root-capability", "Queue/root"),
        ("weight", "Queue/eng"),
        ("priority", "Queue/eng"),
        ("renamed", "Queue/default"),
    }


def test_volcano_resource_quota_without_weight_and_zero_guarantee(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = write(
        tmp_path,
        """\
        apiVersion: scheduling.volcano.sh/v1beta1
        kind: Queue
        metadata: {name: q}
        spec:
          deserved: {cpu: 2}
          guarantee: {resource: {cpu: 0, memory: 1Gi}}
          extendClusters: [{name: c1}]
        ---
        apiVersion: v1
        kind: ResourceQuota
        metadata: {name: plain, namespace: ns}
        spec: {hard: {pods: "10"}}
        """,
    )
    code, facts, err = run(capsys, path)
    assert code == 0
    q = quotas(facts)["q"]
    assert q["min"] == {"cpu": "2000m", "memory": 2**30}
    assert q["lending_limit"] == {"memory": 0}  # only resources with a guarantee > 0
    assert warning_keys(err) == {
        ("extendClusters", "Queue/q"),
        ("resourcequota", "ResourceQuota/plain"),
    }


# ------------------------------------------------------------------ properties


@st.composite
def volcano_queues(draw: st.DrawFn) -> list[dict[str, Any]]:
    chosen = draw(st.lists(st.sampled_from(["a", "b", "c", "d", "e", "default"]), unique=True))
    objects: list[dict[str, Any]] = []
    if draw(st.booleans()):
        capability = {"cpu": draw(amounts), "memory": f"{draw(amounts)}Gi"}
        objects.append(
            {
                "apiVersion": "scheduling.volcano.sh/v1beta1",
                "kind": "Queue",
                "metadata": {"name": "root"},
                "spec": {"capability": capability},
            }
        )
    for index, name in enumerate(chosen):
        spec: dict[str, Any] = {
            "parent": draw(st.sampled_from(["", "root", "gone", *chosen[:index]])),
            "deserved": {"cpu": draw(amounts), "nvidia.com/gpu": draw(amounts)},
        }
        if draw(st.booleans()):
            spec["guarantee"] = {"resource": {"cpu": draw(amounts), "memory": f"{draw(amounts)}Gi"}}
        if draw(st.booleans()):
            spec["capability"] = {"cpu": draw(st.integers(-1, 8)), "nvidia.com/gpu": draw(amounts)}
        objects.append(
            {
                "apiVersion": "scheduling.volcano.sh/v1beta1",
                "kind": "Queue",
                "metadata": {"name": name},
                "spec": spec,
            }
        )
    return objects


@given(volcano_queues())
@settings(max_examples=60, deadline=None)
def test_volcano_imports_are_valid(objects: list[dict[str, Any]]) -> None:
    result = translate("volcano", [SourceDocument("doc", o) for o in objects])
    assert not result.rejected
    fold_accepts(result.facts)
