"""``quotaledger import`` whatever the scheduler (DESIGN §13, IMPORT.md): every
real file published by the four projects imports and replays without rejection
and gives exactly the warnings reviewed for it; IMPORT.md's equivalence rule;
the command's bad input (unreadable YAML, missing files, wrong types, cycles in
any scheduler's tree, fatal documents), several schedulers' files at once
(``--from``), stdin and ``--out``, YAML 1.1 words, ``--help``.

The rules of each importer are in ``test_import_<scheduler>.py``; the helpers
in :mod:`tests.import_support`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quotaledger.adapters.cli import main
from tests.import_support import (
    DATA,
    QUOTA_DEFAULTS,
    REAL_FILES,
    equivalent,
    replay_rejections,
    run,
    warning_keys,
    write,
)

# -------------------------------------------------------------- the real files


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


# ----------------------------------------------------------- IMPORT.md's rules


def test_import_md_equivalence_rule() -> None:
    one = [{"kind": "QuotaUpserted", "name": "a", "min": {"cpu": "9", "gpu": 0}}]
    assert equivalent(one, [{"kind": "QuotaUpserted", "name": "a", "min": {"cpu": 9}}])
    assert equivalent(one, [{"kind": "QuotaUpserted", "name": "a", "min": {"cpu": "9000m"}}])
    assert not equivalent(one, [{"kind": "QuotaUpserted", "name": "a", "min": {"cpu": "9001m"}}])
    with_max = [{"kind": "QuotaUpserted", "name": "a", "max": {"gpu": 0}}]
    assert not equivalent(with_max, [{"kind": "QuotaUpserted", "name": "a", "max": {}}])


# ------------------------------------------------------------------- bad input


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


# ----------------------------------------------------------------- the command


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
