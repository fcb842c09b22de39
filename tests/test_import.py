"""``quotaledger import`` (DESIGN §13, IMPORT.md): real files published by the four
projects, the seed documents' examples, IMPORT.md's examples and rules, bad input,
and properties of the output order.

Expected outputs are compared with IMPORT.md's equivalence rule (:func:`equivalent`).
Every import is also replayed: DESIGN §5 validation must accept every fact.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quotaledger.adapters.cli import main
from quotaledger.adapters.importers import SourceDocument, translate
from quotaledger.adapters.importers.yunikorn import go_duration_seconds
from quotaledger.events.codec import decode_event
from quotaledger.events.model import LedgerOpened
from quotaledger.events.quantity import canonical_amount
from quotaledger.projections import Projection

DATA = Path(__file__).resolve().parent / "data" / "import"
REAL_FILES = sorted(DATA.glob("*/*.yaml"))
QUOTA_DEFAULTS: dict[str, Any] = {
    "parent": "root",
    "is_parent": False,
    "min": {},
    "max": None,
    "shared_weight": None,
    "allow_lent": True,
    "lending_limit": None,
    "borrowing_limit": None,
    "namespaces": [],
    "preemption_delay_s": 0,
}
RL_FIELDS = ("min", "max", "shared_weight", "lending_limit", "borrowing_limit")


# ------------------------------------------------------------------ helpers


def _canonical(fact: dict[str, Any]) -> dict[str, Any]:
    """IMPORT.md §1 Equivalence: defaults filled, quantities canonical (DESIGN §2),
    ``min`` with absent = 0."""
    if fact.get("kind") != "QuotaUpserted":
        return fact
    out = {**QUOTA_DEFAULTS, **fact}
    for name in RL_FIELDS:
        if out[name] is not None:
            out[name] = {r: canonical_amount(r, v) for r, v in out[name].items()}
    out["min"] = {r: v for r, v in out["min"].items() if v != 0}
    out["preemption_delay_s"] = float(out["preemption_delay_s"])
    return out


def equivalent(lines: list[dict[str, Any]], expected: list[dict[str, Any]]) -> bool:
    return [_canonical(f) for f in lines] == [_canonical(f) for f in expected]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[dict[str, Any]], str]:
    code = main(["import", *argv])
    out, err = capsys.readouterr()
    return code, [json.loads(line) for line in out.splitlines()], err


def write(tmp_path: Path, text: str, name: str = "in.yaml") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return str(path)


def replay_rejections(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, facts: list[dict[str, Any]]
) -> list[Any]:
    path = tmp_path / "facts.jsonl"
    path.write_text("".join(json.dumps(f) + "\n" for f in facts))
    assert main(["replay", str(path), "--json"]) == 0
    out, _ = capsys.readouterr()
    rejected: list[Any] = json.loads(out)["rejected"]
    return rejected


def warning_keys(err: str) -> set[tuple[str, str]]:
    pairs = set()
    for line in err.splitlines():
        assert line.startswith("warning: "), line
        key, subject, _ = line.removeprefix("warning: ").split(": ", 2)
        pairs.add((key, subject))
    return pairs


def quotas(facts: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {f["name"]: f for f in facts if f["kind"] == "QuotaUpserted"}


# ----------------------------------------------------------- the real files


@pytest.mark.parametrize("path", REAL_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_real_file_imports_and_replays_without_rejection(
    path: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, facts, err = run(capsys, str(path))
    assert code == 0, err
    for line in err.splitlines():
        assert line.startswith("warning: ")
    assert replay_rejections(capsys, tmp_path, facts) == []
    seen = {"root"}
    for fact in facts:
        if fact["kind"] == "QuotaUpserted":
            assert fact["parent"] in seen
            assert set(fact) == {"kind", "name", *QUOTA_DEFAULTS}
            seen.add(fact["name"])


def test_every_peer_has_real_files_with_a_source() -> None:
    for peer in ("koordinator", "kueue", "volcano", "yunikorn"):
        assert len(list((DATA / peer).glob("*.yaml"))) >= 3
        source = (DATA / peer / "SOURCE.md").read_text()
        assert "Apache-2.0" in source and "commit" in source


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


def test_yunikorn_preemption_example_lifts_silently_and_warns_properties(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, facts, err = run(capsys, str(DATA / "yunikorn" / "preemption-configmap.yaml"))
    assert code == 0, err
    found = quotas(facts)
    # tenants and sandbox set no guaranteed: the children's sum is implied, silently.
    assert found["sandbox.tenants"]["min"] == {"cpu": "600m", "memory": 600 * 2**20}
    assert found["sandbox"]["min"] == {"cpu": "600m", "memory": 600 * 2**20}
    assert found["sandbox"]["max"] == {"cpu": "1000m", "memory": 1000 * 2**20}
    assert found["sandbox.system"]["parent"] == "sandbox"  # a nested `system` keeps its path
    keys = warning_keys(err)
    assert ("preemption.delay", "queue/root.sandbox.tenants") in keys
    assert ("preemption.policy", "queue/root.sandbox.tenants") in keys
    assert not any(key == "min-lifted" for key, _ in keys)


def test_yunikorn_top_level_system_is_renamed_to_its_path(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, facts, err = run(capsys, str(DATA / "yunikorn" / "priority-configmap.yaml"))
    assert code == 0, err
    found = quotas(facts)
    assert found["root.system"]["is_parent"] is True
    assert found["system.high-priority"]["parent"] == "root.system"
    assert ("renamed", "queue/root.system") in warning_keys(err)


def test_yunikorn_pre_1_0_file_is_read_with_1_0_rules(capsys: pytest.CaptureFixture[str]) -> None:
    # IMPORT.md §5: k8shim's namespace example's `memory: 500000` is 500 kB.
    code, facts, err = run(capsys, str(DATA / "yunikorn" / "namespace-queues.yaml"))
    assert code == 0, err
    found = quotas(facts)
    assert found["development"]["min"] == {"cpu": "50000000m", "memory": 500000}
    assert found["default"]["parent"] == "root"
    assert ("default-queue", "queue/root.default") in warning_keys(err)


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


# ------------------------------------------------------- the seeds' examples


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


def test_seed_yunikorn_quota_preemption(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """The seed's configuration: quotapreemptionenabled and a delay on queueA. The seed
    writes a bare 7200 ("unit is seconds"); YuniKorn parses a Go duration, so a bare
    number is unparsable (delay 0, warned) while 2h is 7200 s."""
    path = write(
        tmp_path,
        """\
        partitions:
        - name: default
          preemption:
            quotapreemptionenabled: true
          queues:
          - name: queueA
            resources:
              max:
                {memory: 10G}
            properties:
              quota.preemption.delay: 7200
          - name: queueB
            resources:
              max:
                {memory: 10G}
            properties:
              quota.preemption.delay: 2h
        """,
    )
    code, facts, err = run(capsys, path)
    assert code == 0
    assert facts[0] == {"kind": "SettingsChanged", "quota_preemption_enabled": True}
    found = quotas(facts)
    assert found["queuea"]["preemption_delay_s"] == 0
    assert found["queueb"]["preemption_delay_s"] == 7200
    assert found["queueb"]["max"] == {"memory": 10_000_000_000}
    assert ("quota.preemption.delay", "queue/root.queuea") in warning_keys(err)


# ------------------------------------------------------ IMPORT.md's examples


def test_import_md_yunikorn_quantities(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
        partitions:
        - name: default
          queues:
          - name: root
            queues:
            - name: a
              resources:
                guaranteed: {vcore: 10, memory: 500G, nvidia.com/gpu: 2k}
                max: {vcore: 20500m, memory: 1Gi}
        """,
    )
    code, facts, err = run(capsys, path)
    assert code == 0, err
    a = quotas(facts)["a"]
    assert a["min"] == {"cpu": "10000m", "memory": 500_000_000_000, "nvidia.com/gpu": 2000}
    # max lacks the gpu that min guarantees: capped at the guarantee (IMPORT.md §1 fix 2)
    assert a["max"] == {"cpu": "20500m", "memory": 500_000_000_000, "nvidia.com/gpu": 2000}
    assert a["shared_weight"] == a["min"]
    assert ("max-missing-key", "queue/root.a") in warning_keys(err)
    assert ("max-below-min", "queue/root.a") in warning_keys(err)  # 1Gi < 500G


def test_import_md_go_durations() -> None:
    assert go_duration_seconds("15m") == 900
    assert go_duration_seconds("1h30m") == 5400
    assert go_duration_seconds("1.5s") == 1.5
    assert go_duration_seconds("0") == 0
    assert go_duration_seconds("-5s") == -5
    for bad in ("7200", "", "m", "5 s", "1d"):
        with pytest.raises(ValueError):
            go_duration_seconds(bad)


def test_import_md_equivalence_rule() -> None:
    one = [{"kind": "QuotaUpserted", "name": "a", "min": {"cpu": "9", "gpu": 0}}]
    assert equivalent(one, [{"kind": "QuotaUpserted", "name": "a", "min": {"cpu": 9}}])
    assert equivalent(one, [{"kind": "QuotaUpserted", "name": "a", "min": {"cpu": "9000m"}}])
    assert not equivalent(one, [{"kind": "QuotaUpserted", "name": "a", "min": {"cpu": "9001m"}}])
    with_max = [{"kind": "QuotaUpserted", "name": "a", "max": {"gpu": 0}}]
    assert not equivalent(with_max, [{"kind": "QuotaUpserted", "name": "a", "max": {}}])


def test_yunikorn_delay_is_inherited_and_fixed_where_max_does_not_exceed_min(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = write(
        tmp_path,
        """\
        partitions:
        - name: default
          queues:
          - name: root
            properties: {quota.preemption.delay: 15m}
            queues:
            - name: a
              resources: {guaranteed: {vcore: 2}, max: {vcore: 4}}
            - name: b
              resources: {guaranteed: {vcore: 4}, max: {vcore: 4}}
            - name: c
              properties: {quota.preemption.delay: "0"}
        """,
    )
    code, facts, err = run(capsys, path)
    assert code == 0, err
    found = quotas(facts)
    assert found["a"]["preemption_delay_s"] == 900
    assert found["b"]["preemption_delay_s"] == 0
    assert found["c"]["preemption_delay_s"] == 0
    assert warning_keys(err) == {("quota.preemption.delay", "queue/root.b")}


def test_yunikorn_wraps_queues_without_root_and_picks_default_partition(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = write(
        tmp_path,
        """\
        partitions:
        - name: other
          queues: [{name: x}]
        - name: default
          preemption: {enabled: false}
          queues:
          - name: Team
            queues: [{name: Dev}]
          - name: default
            parent: true
        """,
    )
    code, facts, err = run(capsys, path)
    assert code == 0, err
    assert [f.get("name") for f in facts] == [None, "root.default", "team", "team.dev"]
    assert facts[0] == {"kind": "SettingsChanged", "reclaim_enabled": False}
    keys = warning_keys(err)
    assert ("partition", "partition/other") in keys
    assert ("renamed", "queue/root.default") in keys


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


# ------------------------------------------------------------------ bad input


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("a: [1, 2\n", "document 1: invalid YAML at line 2"),
        ("kind: x\n---\nkey: : :\n", "document 2: invalid YAML"),
        (b"\xff\xfe", "not UTF-8 text"),
    ],
)
def test_unreadable_yaml_exits_2_with_nothing_printed(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: str | bytes, message: str
) -> None:
    if isinstance(content, bytes):
        (tmp_path / "in.yaml").write_bytes(content)
        path = str(tmp_path / "in.yaml")
    else:
        path = write(tmp_path, content)
    code = main(["import", path])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.startswith("quotaledger: error: ") and message in err, err
    assert "Traceback" not in err


def test_missing_file_and_directory(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["import", str(tmp_path / "nope.yaml")]) == 2
    assert "nope.yaml: no such file" in capsys.readouterr().err
    assert main(["import", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err


def test_cycle_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    docs = []
    for name, parent in (("a", "b"), ("b", "a"), ("c", "")):
        docs.append(
            "apiVersion: scheduling.volcano.sh/v1beta1\nkind: Queue\n"
            f"metadata: {{name: {name}}}\nspec: {{parent: '{parent}'}}\n"
        )
    code = main(["import", write(tmp_path, "---\n".join(docs))])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert "quotaledger: error: cycle: Queue/a" in err


def test_wrong_types_reject_the_object_naming_file_document_field(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = write(
        tmp_path,
        """\
        apiVersion: scheduling.volcano.sh/v1beta1
        kind: Queue
        metadata: {name: ok}
        ---
        apiVersion: scheduling.volcano.sh/v1beta1
        kind: Queue
        metadata: {name: bad}
        spec: {deserved: [1, 2]}
        ---
        apiVersion: scheduling.volcano.sh/v1beta1
        kind: Queue
        metadata: {name: q}
        spec: {deserved: {cpu: lots, memory: -1}}
        ---
        - just a list
        """,
    )
    code, facts, err = run(capsys, path)
    assert code == 0
    assert [f["name"] for f in facts] == ["ok", "q"]
    assert f"warning: invalid: Queue/bad: {path} document 2: spec.deserved: expected a map" in err
    assert f"warning: invalid: {path} document 4: expected a map" in err
    assert "warning: quantity: Queue/q: spec.deserved.cpu" in err
    assert "Traceback" not in err


def test_mixed_peers_need_from(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    kueue = str(DATA / "kueue" / "single-clusterqueue-setup.yaml")
    volcano = str(DATA / "volcano" / "capacity-deserved.yaml")
    assert main(["import", kueue, volcano]) == 2
    assert "--from" in capsys.readouterr().err
    code, facts, err = run(capsys, kueue, volcano, "--from", "volcano")
    assert code == 0
    assert [f["name"] for f in facts] == ["queue1", "queue2"]
    assert ("skipped-kind", "ClusterQueue/cluster-queue") in warning_keys(err)


def test_stdin_json_and_out_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import io

    document = {
        "kind": "List",
        "items": [
            {
                "apiVersion": "scheduling.volcano.sh/v1beta1",
                "kind": "Queue",
                "metadata": {"name": "a"},
                "spec": {"deserved": {"cpu": "1"}},
            }
        ],
    }
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(document)))
    out = tmp_path / "facts.jsonl"
    assert main(["import", "-", "--out", str(out)]) == 0
    assert capsys.readouterr().out == ""
    assert json.loads(out.read_text())["min"] == {"cpu": "1000m"}


def test_yaml_1_1_words_stay_text(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """\
        kind: ElasticQuota
        metadata:
          name: on
          labels: {quota.scheduling.koordinator.sh/allow-lent-resource: no}
        spec: {min: {cpu: 1_000}}
        """,
    )
    code, facts, err = run(capsys, path)
    assert code == 0, err
    assert facts[0]["name"] == "on"
    assert facts[0]["allow_lent"] is True  # "no" is not "false"
    assert facts[0]["min"] == {}  # 1_000 is no quantity in YAML 1.2 nor Kubernetes
    assert ("quantity", "ElasticQuota/on") in warning_keys(err)


def test_help_has_examples(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["import", "--help"])
    assert "examples:" in capsys.readouterr().out


# ------------------------------------------------------------------- properties

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


def _fold_accepts(facts: list[dict[str, Any]]) -> None:
    """Every fact decodes and DESIGN §5 validation accepts it; parents come first."""
    projection = Projection()
    projection.apply(0, 0, LedgerOpened(ledger_id="t"))
    emitted = {"root"}
    names = {f["name"] for f in facts if f["kind"] == "QuotaUpserted"}
    for offset, fact in enumerate(facts, start=1):
        assert projection.apply(offset, 0, decode_event(json.dumps(fact))), (
            fact,
            projection.state.rejected,
        )
        if fact["kind"] == "QuotaUpserted":
            assert fact["parent"] in emitted or fact["parent"] not in names
            emitted.add(fact["name"])
    assert projection.state.rejected == []


amounts = st.integers(0, 6)


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
    _fold_accepts(result.facts)


@st.composite
def yunikorn_queue(draw: st.DrawFn, depth: int) -> dict[str, Any]:
    queue: dict[str, Any] = {"name": draw(st.sampled_from(["a", "B", "b", "default", "system"]))}
    resources: dict[str, Any] = {}
    if draw(st.booleans()):
        resources["guaranteed"] = {"vcore": f"{draw(amounts)}00m", "memory": f"{draw(amounts)}M"}
    if draw(st.booleans()):
        resources["max"] = {"vcore": draw(amounts), "nvidia.com/gpu": draw(amounts)}
    if resources:
        queue["resources"] = resources
    delay = draw(st.sampled_from([None, "0", "30s", "1h", "bad", "-1s"]))
    if delay is not None:
        queue["properties"] = {"quota.preemption.delay": delay}
    if depth > 0 and draw(st.booleans()):
        queue["queues"] = draw(st.lists(yunikorn_queue(depth - 1), max_size=3))
    elif draw(st.booleans()):
        queue["parent"] = True
    return queue


@given(st.lists(yunikorn_queue(2), max_size=4), st.booleans())
@settings(max_examples=60, deadline=None)
def test_yunikorn_imports_are_valid(queues: list[dict[str, Any]], wrap: bool) -> None:
    tops = [{"name": "root", "queues": queues}] if wrap else queues
    config = {"partitions": [{"name": "default", "queues": tops}]}
    result = translate("yunikorn", [SourceDocument("doc", config)])
    assert not result.rejected
    _fold_accepts(result.facts)


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
    _fold_accepts(result.facts)
    rnd.shuffle(documents)
    assert translate("kueue", documents).facts == result.facts


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (  # a Kueue cohort cycle
            "apiVersion: kueue.x-k8s.io/v1beta1\nkind: Cohort\nmetadata: {name: a}\n"
            "spec: {parent: b}\n---\n"
            "apiVersion: kueue.x-k8s.io/v1beta1\nkind: Cohort\nmetadata: {name: b}\n"
            "spec: {parentName: a}\n",
            "cycle: Cohort/a",
        ),
        (  # a Koordinator self-parent
            "kind: ElasticQuota\nmetadata:\n  name: a\n"
            "  labels: {quota.scheduling.koordinator.sh/parent: a}\n",
            "cycle: ElasticQuota/a",
        ),
        (  # a YuniKorn ConfigMap whose queues.yaml is broken
            "kind: ConfigMap\napiVersion: v1\nmetadata: {name: yunikorn-configs}\n"
            "data:\n  queues.yaml: |\n    partitions: [\n",
            "data[queues.yaml]: document 1: invalid YAML",
        ),
        (  # a self-referencing alias
            "partitions:\n- name: default\n  queues:\n  - &q {name: a, queues: [*q]}\n",
            "nested more than 64 levels",
        ),
    ],
)
def test_fatal_input_exits_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, content: str, message: str
) -> None:
    code = main(["import", write(tmp_path, content)])
    out, err = capsys.readouterr()
    assert message in err, err
    assert "Traceback" not in err
    if "nested" not in message:  # a too-deep partition is one unusable object, not fatal
        assert code == 2 and out == ""


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


#: The warnings each real file gives, (key, subject): reviewed against IMPORT.md by hand.
REAL_FILE_WARNINGS: dict[str, set[tuple[str, str]]] = {
    "koordinator/multi-tree-quota.yaml": {
        ("skipped-kind", "ElasticQuotaProfile/cn-hangzhou-k-amd64-standard"),
        ("multi-tree", "ElasticQuota/cn-hangzhou-k-amd64-root-quota"),
    },
    "koordinator/networktopology-quota.yaml": set(),
    "koordinator/proposal-multi-hierarchy.yaml": {
        ("value-type", "ElasticQuota/test"),
        ("unknown-key", "ElasticQuota/test"),
    },
    "kueue/admission-fair-sharing-setup.yaml": {
        ("queueingStrategy", "ClusterQueue/cluster-queue"),
        ("admissionScope", "ClusterQueue/cluster-queue"),
        ("fairSharing", "LocalQueue/lq-a"),
        ("fairSharing", "LocalQueue/lq-b"),
    },
    "kueue/cohort-borrowing-limit.yaml": {
        ("implicit-cohort", "Cohort/team-ab"),
    },
    "kueue/cohort-lending-limit.yaml": {
        ("implicit-cohort", "Cohort/team-ab"),
    },
    "kueue/cohort-shared-quota.yaml": set(),
    "kueue/cohort-tree.yaml": {
        ("fairSharing", "Cohort/important-org"),
        ("fairSharing", "Cohort/regular-org"),
    },
    "kueue/concurrent-admission-setup.yaml": {
        ("concurrentAdmissionPolicy", "ClusterQueue/team-cluster-queue"),
        ("flavor", "ClusterQueue/team-cluster-queue"),
    },
    "kueue/resource-flavor-taints.yaml": {
        ("flavor", "ResourceFlavor/spot"),
    },
    "kueue/shared-quota-setup.yaml": {
        ("flavor", "ResourceFlavor/on-demand"),
        ("flavor", "ResourceFlavor/spot"),
        ("flavor", "ClusterQueue/team-cluster-queue"),
    },
    "kueue/single-clusterqueue-setup.yaml": set(),
    "volcano/benchmark-queue.yaml": {
        ("reclaimable", "Queue/benchmark-queue"),
    },
    "volcano/capacity-deserved.yaml": set(),
    "volcano/default-queue.yaml": {
        ("default-queue", "Queue/default"),
    },
    "volcano/deployment-queue.yaml": {
        ("reclaimable", "Queue/test"),
    },
    "volcano/dra-quota.yaml": {
        ("guarantee", "Queue/gpu-team"),
        ("guarantee", "Queue/vgpu-team"),
    },
    "volcano/hierarchical-jobs-queues.yaml": {
        ("hdrf", "Queue/root-eng-prod"),
        ("hdrf", "Queue/root-eng-dev"),
        ("hdrf", "Queue/root-sci-prod"),
        ("hdrf", "Queue/root-sci-dev"),
    },
    "volcano/node-group-hierarchy.yaml": {
        ("affinity", "Queue/root"),
    },
    "yunikorn/core-queues.yaml": {
        ("placementrules", "partition/default"),
        ("limits", "partition/default"),
        ("nodesortpolicy", "partition/default"),
        ("submitacl", "queue/root.sandbox"),
        ("partition", "partition/gpu"),
    },
    "yunikorn/e2e-queues.yaml": {
        ("placementrules", "partition/default"),
        ("submitacl", "queue/root"),
        ("default-queue", "queue/root.default"),
    },
    "yunikorn/namespace-queues.yaml": {
        ("placementrules", "partition/default"),
        ("submitacl", "queue/root"),
        ("default-queue", "queue/root.default"),
    },
    "yunikorn/preemption-configmap.yaml": {
        ("preemption.delay", "queue/root.sandbox.tenants"),
        ("preemption.policy", "queue/root.sandbox.tenants"),
        ("submitacl", "queue/root.sandbox.tenants.tenant-normal"),
        ("priority.offset", "queue/root.sandbox.tenants.tenant-normal"),
        ("submitacl", "queue/root.sandbox.tenants.tenant-high"),
        ("priority.offset", "queue/root.sandbox.tenants.tenant-high"),
        ("submitacl", "queue/root.sandbox.tenants.tenant-low"),
        ("priority.offset", "queue/root.sandbox.tenants.tenant-low"),
        ("submitacl", "queue/root.sandbox.system.system-low"),
        ("priority.offset", "queue/root.sandbox.system.system-low"),
    },
    "yunikorn/priority-configmap.yaml": {
        ("application.sort.policy", "queue/root"),
        ("application.sort.priority", "queue/root"),
        ("adminacl", "queue/root.system"),
        ("renamed", "queue/root.system"),
        ("priority.offset", "queue/root.system.high-priority"),
        ("priority.offset", "queue/root.system.normal-priority"),
        ("priority.offset", "queue/root.system.low-priority"),
        ("priority.policy", "queue/root.tenants"),
        ("adminacl", "queue/root.tenants.group-a"),
        ("priority.offset", "queue/root.tenants.group-a"),
        ("adminacl", "queue/root.tenants.group-b"),
        ("priority.offset", "queue/root.tenants.group-b"),
    },
    "yunikorn/resource-limits-configmap.yaml": {
        ("adminacl", "queue/root.system"),
        ("renamed", "queue/root.system"),
        ("adminacl", "queue/root.tenants.group-a"),
        ("adminacl", "queue/root.tenants.group-b"),
    },
}


@pytest.mark.parametrize("path", REAL_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_real_file_warnings(path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every field without an equivalent is named, and nothing else (IMPORT.md §1)."""
    code, _, err = run(capsys, str(path))
    assert code == 0
    assert warning_keys(err) == REAL_FILE_WARNINGS[f"{path.parent.name}/{path.name}"]
    assert len(err.splitlines()) == len(warning_keys(err))  # one line per (key, subject)


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


def test_yunikorn_queue_and_partition_keys_are_named(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    path = write(
        tmp_path,
        """\
        checksum: ABC
        partitions:
        - name: default
          usergroupresolver: {type: os}
          preemption: {quotapreemptionenabled: yes}
          queues:
          - name: root
            childtemplate: {resources: {max: {vcore: 1}}}
            queues:
            - name: a
              maxapplications: 5
              limits: [{limit: x, users: [u], maxapplications: 1}]
              resources: {guaranteed: {vcore: lots}, max: {vcore: 0, memory: 0}}
              extra: 1
        """,
    )
    code, facts, err = run(capsys, path)
    assert code == 0
    assert facts == [
        {
            "kind": "QuotaUpserted",
            "name": "a",
            "parent": "root",
            "is_parent": False,
            "min": {},
            "max": None,
            "shared_weight": None,
            "allow_lent": True,
            "lending_limit": None,
            "borrowing_limit": None,
            "namespaces": [],
            "preemption_delay_s": 0,
        }
    ]
    assert warning_keys(err) == {
        ("usergroupresolver", "partition/default"),
        ("preemption", "partition/default"),  # `yes` is text, not a boolean
        ("childtemplate", "queue/root"),
        ("maxapplications", "queue/root.a"),
        ("limits", "queue/root.a"),
        ("quantity", "queue/root.a"),
        ("extra", "queue/root.a"),
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
