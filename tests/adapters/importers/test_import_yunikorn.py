"""``quotaledger import`` of YuniKorn queue configurations (DESIGN §13,
IMPORT.md): the published examples, the seed document's quota preemption,
IMPORT.md's quantities and Go durations, delays, partitions and the root queue,
the keys without an equivalent, and the property that every import folds
without rejection.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quotaledger.adapters.importers import SourceDocument, translate
from quotaledger.adapters.importers.yunikorn import go_duration_seconds
from tests.import_support import (
    DATA,
    amounts,
    fold_accepts,
    quotas,
    run,
    warning_keys,
    write,
)

# -------------------------------------------------------------- the real files


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


# ---------------------------------------------------------- the seed's example


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


# -------------------------------------------------------- IMPORT.md's examples


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


# ----------------------------------------------------------------------- rules


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


# ------------------------------------------------------------------ properties


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
    fold_accepts(result.facts)
