"""``quotaledger bench fold``: the report's shape and the generated workload (no speed asserts)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from quotaledger.adapters.cli import main
from quotaledger.adapters.workload import Workload, generate
from quotaledger.events.codec import decode_event
from quotaledger.events.model import QuotaUpserted
from quotaledger.projections import Projection
from quotaledger.projections.state import BUILTIN

SMALL = ["--quotas", "100", "--pods", "1000", "--nodes", "10", "--events", "5000"]
FIGURES = (
    "decode_events_per_s",
    "fold_events_per_s",
    "full_recompute_ms",
    "incremental_recompute_us",
    "append_events_per_s",
    "read_events_per_s",
    "bytes_per_pod",
    "replay_10m_estimate_s",
    "digest_chain_events_per_s",
    "replay_1m_s",
    "audit_1m_s",
    "audit_1m_jobs2_s",
    "audit_jobs2_vs_1",
    "fold_vs_msgspec",
    "state_hash_ms",
    "state_hash_incremental_us",
    "digest_settle_ms",
    "state_hash_bytes_per_pod",
    "bytes_per_pod_hashed",
    "tail_state_hash_ms",
    "tail_snapshot_dump_ms",
)


@pytest.fixture(scope="module")
def workload() -> Workload:
    return generate(quotas=100, pods=1000, nodes=10, events=5000, seed=1)


def test_bench_fold_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "fold", "--json", *SMALL, "--cli-runs", "1"]) == 0
    out = capsys.readouterr().out
    report: dict[str, Any] = json.loads(out)  # exactly one JSON object on stdout
    assert out.strip().count("\n") == 0
    for key in FIGURES:
        assert isinstance(report[key], int | float), key
        assert report[key] > 0, key
    assert (report["quotas"], report["pods"], report["nodes"], report["events"]) == (
        100,
        1000,
        10,
        5000,
    )
    assert report["tree_levels"] == 5
    assert report["records"] == 1 + 10 + 100 + 1000 + 5000
    assert 0 <= report["rejected"] < report["records"] // 100
    assert set(report["targets_met"]) <= set(report)


def test_bench_fold_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "fold", *SMALL, "--events", "500", "--cli-runs", "1"]) == 0
    out = capsys.readouterr().out
    assert "fold" in out and "target" in out and "estimate" in out


def test_generator_is_deterministic(workload: Workload) -> None:
    again = generate(quotas=100, pods=1000, nodes=10, events=5000, seed=1)
    assert [r.payload for r in again.records] == [r.payload for r in workload.records]
    other = generate(quotas=100, pods=1000, nodes=10, events=5000, seed=2)
    assert [r.payload for r in other.churn] != [r.payload for r in workload.churn]


def test_generated_tree_has_five_levels(workload: Workload) -> None:
    configs = [
        event
        for event in (decode_event(r.payload) for r in workload.config)
        if isinstance(event, QuotaUpserted)
    ]
    assert len(configs) == 100
    parent_of = {config.name: config.parent for config in configs}
    seen: set[str] = set()
    for config in configs:  # parents come first
        assert config.parent == "root" or config.parent in seen
        seen.add(config.name)

    def depth(name: str) -> int:
        return 1 if parent_of[name] == "root" else 1 + depth(parent_of[name])

    depths = {name: depth(name) for name in parent_of}
    assert max(depths.values()) == 5
    assert depths == workload.levels
    leaves = {c.name for c in configs if not c.is_parent}
    assert {depths[name] for name in leaves} == {5}
    assert len(leaves) > len(configs) // 2


def test_fold_of_the_workload(workload: Workload) -> None:
    projection = Projection()
    for record in workload.records:
        projection.apply_record(record)
    state = projection.settled()
    quotas = [name for name in state.quotas if name not in BUILTIN]
    assert len(quotas) == 100
    assert max(state.quotas[name].depth for name in quotas) == 5
    assert all(state.quotas[name].connected for name in quotas)
    assert len(state.rejected) < len(workload.records) // 100
    assert len(state.nodes) == 10
    # pods land in leaves: the leaves' requests add up under the top level
    assert sum(1 for uid in state.pod_quota if state.pod_quota[uid] in workload.leaves) > 0
    # timestamps advance over the day
    assert workload.churn[-1].ts > workload.config[0].ts
    assert all(a.ts <= b.ts for a, b in zip(workload.records, workload.records[1:], strict=False))


def test_churn_mix(workload: Workload) -> None:
    mix = workload.mix
    total = sum(mix.values())
    assert total == 5000
    pod_upserts = sum(v for k, v in mix.items() if k.startswith("PodUpserted"))
    assert 0.85 < pod_upserts / total < 0.97
    assert 0.01 < mix["QuotaUpserted"] / total < 0.05
    assert 0.02 < mix["PodRemoved"] / total < 0.06


def test_too_few_quotas() -> None:
    with pytest.raises(ValueError, match="at least 5"):
        generate(quotas=4, pods=10, nodes=1, events=10)
