"""``quotaledger import`` of Koordinator ElasticQuotas (DESIGN §13, IMPORT.md):
the published examples, the seed document's example, the labels and annotations
rules, and properties of the output order (parents first, siblings by name,
orphan subtrees last, independent of the input order).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quotaledger.adapters.importers import SourceDocument, translate
from quotaledger.events.codec import decode_event
from quotaledger.events.model import LedgerOpened
from quotaledger.projections import Projection
from tests.import_support import (
    DATA,
    equivalent,
    quotas,
    run,
    warning_keys,
    write,
)

# -------------------------------------------------------------- the real files


def test_koordinator_proposal_example_value_types(capsys: pytest.CaptureFixture[str]) -> None:
    code, facts, err = run(capsys, str(DATA / "koordinator" / "proposal-multi-hierarchy.yaml"))
    assert code == 0, err
    assert equivalent(
        facts,
        [
            {
                "kind": "QuotaUpserted",
                "name": "test",
                "min": {"cpu": 10, "memory": "20Gi", "nvidia.com/gpu": 1},
                "max": {"cpu": 20, "memory": "40Gi", "nvidia.com/gpu": 2},
                "namespaces": ["namespace1", "namespace2"],
            }
        ],
    )
    keys = warning_keys(err)
    assert keys == {("value-type", "ElasticQuota/test"), ("unknown-key", "ElasticQuota/test")}


def test_koordinator_multi_tree_root(capsys: pytest.CaptureFixture[str]) -> None:
    code, facts, err = run(capsys, str(DATA / "koordinator" / "multi-tree-quota.yaml"))
    assert code == 0, err
    tree = quotas(facts)["cn-hangzhou-k-amd64-root-quota"]
    assert tree["parent"] == "root" and tree["allow_lent"] is False
    assert tree["borrowing_limit"] == {"cpu": "0m", "memory": 0}
    assert {("multi-tree", "ElasticQuota/cn-hangzhou-k-amd64-root-quota")} <= warning_keys(err)
    assert ("skipped-kind", "ElasticQuotaProfile/cn-hangzhou-k-amd64-standard") in warning_keys(err)


# ---------------------------------------------------------- the seed's example


def test_seed_koordinator_elastic_quota(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """The seed's ElasticQuota example, indentation restored."""
    path = write(
        tmp_path,
        """\
        apiVersion: scheduling.sigs.k8s.io/v1alpha1
        kind: ElasticQuota
        metadata:
          name: test
          namespace: test
          annotations:
            quota.scheduling.koordinator.sh/runtime: {cpu:4, memory: 8Gi}
            quota.scheduling.koordinator.sh/shared-weight: {cpu:4, memory: 8Gi}
          labels:
            quota.scheduling.koordinator.sh/is-parent: false
            quota.scheduling.koordinator.sh/parent-quota-name: "parent"
            quota.scheduling.koordinator.sh/allow-lent-resource: true
        spec:
          max:
            cpu: 20
            memory: 40Gi
            nvidia.com/gpu: 2
          min:
            cpu: 10
            memory: 20Gi
            nvidia.com/gpu: 1
        """,
    )
    code, facts, err = run(capsys, path)
    assert code == 0
    assert facts == [
        {
            "kind": "QuotaUpserted",
            "name": "test",
            "parent": "root",
            "is_parent": False,
            "min": {"cpu": "10000m", "memory": 20 * 2**30, "nvidia.com/gpu": 1},
            "max": {"cpu": "20000m", "memory": 40 * 2**30, "nvidia.com/gpu": 2},
            "shared_weight": None,
            "allow_lent": True,
            "lending_limit": None,
            "borrowing_limit": None,
            "namespaces": [],
            "preemption_delay_s": 0,
        }
    ]
    assert "parent-quota-name" in err  # the proposal's label is named, not silently dropped


# ----------------------------------------------------------------------- rules


def test_koordinator_rules(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
        kind: List
        items:
        - kind: ElasticQuota
          metadata: {name: koordinator-root-quota}
        - kind: ElasticQuota
          metadata: {name: koordinator-default-quota}
          spec: {max: {cpu: 2}}
        - kind: ElasticQuota
          metadata:
            name: dept
            labels: {quota.scheduling.koordinator.sh/is-parent: "true"}
          spec: {min: {cpu: 3}, max: {cpu: 100, memory: 10Gi}}
        - kind: ElasticQuota
          metadata:
            name: team-a
            labels:
              quota.scheduling.koordinator.sh/parent: dept
              quota.scheduling.koordinator.sh/allow-lent-resource: "false"
            annotations:
              quota.scheduling.koordinator.sh/shared-weight: '{"cpu": "4"}'
              quota.scheduling.koordinator.sh/namespaces: '["ns-a"]'
              quota.scheduling.koordinator.sh/runtime: '{"cpu": "4"}'
              koord-queue/policy: x
          spec: {min: {cpu: 4, memory: 1Gi}, max: {cpu: 8}}
        - kind: ElasticQuota
          metadata:
            name: lost
            labels: {quota.scheduling.koordinator.sh/parent: nowhere}
        - kind: ElasticQuota
          metadata: {name: team-a}
        """,
    )
    code, facts, err = run(capsys, path)
    assert code == 0
    assert equivalent(
        facts,
        [
            {"kind": "QuotaUpserted", "name": "default", "max": {"cpu": 2}},
            {
                "kind": "QuotaUpserted",
                "name": "dept",
                "is_parent": True,
                "min": {"cpu": 4, "memory": "1Gi"},
                "max": {"cpu": 100, "memory": "10Gi"},
            },
            {
                "kind": "QuotaUpserted",
                "name": "team-a",
                "parent": "dept",
                "min": {"cpu": 4, "memory": "1Gi"},
                "max": {"cpu": 8, "memory": "1Gi"},
                "shared_weight": {"cpu": 4},
                "allow_lent": False,
                "namespaces": ["ns-a"],
            },
            {"kind": "QuotaUpserted", "name": "lost", "parent": "nowhere", "max": {}},
        ],
    )
    assert warning_keys(err) == {
        ("builtin", "ElasticQuota/koordinator-root-quota"),
        ("min-lifted", "ElasticQuota/dept"),
        ("max-missing-key", "ElasticQuota/team-a"),
        ("koord-queue", "ElasticQuota/team-a"),
        ("missing-parent", "ElasticQuota/lost"),
        ("duplicate-name", "ElasticQuota/team-a"),
    }
    assert "min cpu raised from 3000 to 4000" in err


def test_koordinator_annotations_and_edge_names(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    k = "quota.scheduling.koordinator.sh"
    path = write(
        tmp_path,
        f"""\
        kind: ElasticQuota
        metadata:
          name: a
          labels: {{{k}/allow-force-update: "true", {k}/tree-id: "7"}}
          annotations:
            {k}/shared-weight: '{{"cpu": 0, "memory": "0"}}'
            {k}/namespaces: '["shared", "a-only"]'
            {k}/max-strict-check-resource-keys: '["cpu"]'
            {k}/guaranteed: '{{"cpu": 1}}'
        ---
        kind: ElasticQuota
        metadata:
          name: b
          annotations:
            {k}/shared-weight: 'cpu: 1'
            {k}/namespaces: '["shared"'
        ---
        kind: ElasticQuota
        metadata:
          name: c
          annotations: {{{k}/namespaces: '["shared"]', {k}/shared-weight: '{{"gpu": 2}}'}}
          labels: {{{k}/parent: koordinator-default-quota}}
        ---
        kind: ElasticQuota
        metadata: {{name: system}}
        """,
    )
    code, facts, err = run(capsys, path)
    assert code == 0
    found = quotas(facts)
    assert found["a"]["shared_weight"] is None  # all zero: Koordinator uses max
    assert found["a"]["namespaces"] == ["a-only"]  # "shared" is claimed twice: neither
    assert found["c"]["namespaces"] == []
    assert found["b"]["shared_weight"] is None
    assert found["c"]["shared_weight"] == {"gpu": 2}  # partial lists stay partial
    assert found["c"]["parent"] == "root"
    assert warning_keys(err) == {
        ("allow-force-update", "ElasticQuota/a"),
        ("max-strict-check-resource-keys", "ElasticQuota/a"),
        ("shared-weight", "ElasticQuota/b"),
        ("namespaces", "ElasticQuota/b"),
        ("namespaces", "namespace/shared"),
        ("missing-parent", "ElasticQuota/c"),
        ("builtin", "ElasticQuota/system"),
    }


# ------------------------------------------------------------------ properties


names = st.sampled_from([f"q{i}" for i in range(8)])


@st.composite
def koordinator_trees(draw: st.DrawFn) -> list[dict[str, Any]]:
    chosen = draw(st.lists(names, unique=True, max_size=8))
    objects = []
    for index, name in enumerate(chosen):
        parent = draw(st.sampled_from(["", "missing", *chosen[:index]]))
        labels = {"quota.scheduling.koordinator.sh/parent": parent}
        if draw(st.booleans()):
            labels["quota.scheduling.koordinator.sh/is-parent"] = "true"
        spec = {
            "min": {"cpu": draw(st.integers(0, 5)), "memory": f"{draw(st.integers(0, 3))}Gi"},
            "max": draw(st.sampled_from([{"cpu": 20}, {"cpu": 2, "memory": "1Gi"}, {}])),
        }
        objects.append(
            {"kind": "ElasticQuota", "metadata": {"name": name, "labels": labels}, "spec": spec}
        )
    return objects


@given(koordinator_trees(), st.randoms(use_true_random=False))
@settings(max_examples=60, deadline=None)
def test_order_and_determinism(objects: list[dict[str, Any]], rnd: Any) -> None:
    """Parents precede children, orphan subtrees come last sorted by (missing parent,
    name), siblings by name; shuffling the input documents changes nothing."""
    documents = [SourceDocument(f"doc {i}", o) for i, o in enumerate(objects)]
    first = translate("koordinator", documents)
    rnd.shuffle(documents)
    again = translate("koordinator", documents)
    assert first.facts == again.facts
    emitted: list[str] = []
    for fact in first.facts:
        name, parent = fact["name"], fact["parent"]
        if parent in {o["metadata"]["name"] for o in objects}:
            assert parent in emitted
        emitted.append(name)
    siblings: dict[str, list[str]] = {}
    for fact in first.facts:
        siblings.setdefault(fact["parent"], []).append(fact["name"])
    for group in siblings.values():
        assert group == sorted(group)
    assert sorted(emitted) == sorted(o["metadata"]["name"] for o in objects)
    # Depth-first pre-order: each quota hangs under the previous one or one of its ancestors.
    parent_of = {f["name"]: f["parent"] for f in first.facts}
    previous: str | None = None
    for fact in first.facts:
        chain, node = {"root"}, previous
        while node is not None and node not in chain:
            chain.add(node)
            node = parent_of.get(node)
        assert fact["parent"] in chain or fact["parent"] not in parent_of
        previous = fact["name"]
    # Subtrees connected to root first, then orphan subtrees by (missing parent, name).
    tops = [(f["parent"], f["name"]) for f in first.facts if f["parent"] not in parent_of]
    connected = [top for top in tops if top[0] == "root"]
    assert tops == connected + sorted(top for top in tops if top[0] != "root")


@given(koordinator_trees())
@settings(max_examples=40, deadline=None)
def test_every_imported_fact_is_valid(objects: list[dict[str, Any]]) -> None:
    """Replaying any import rejects nothing (IMPORT.md §1 validity fixes)."""
    result = translate("koordinator", [SourceDocument("doc", o) for o in objects])
    projection = Projection()
    projection.apply(0, 0, LedgerOpened(ledger_id="t"))
    for offset, fact in enumerate(result.facts, start=1):
        assert projection.apply(offset, 0, decode_event(json.dumps(fact)))
    assert projection.state.rejected == []
