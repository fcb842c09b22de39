"""``quotaledger bench fold``: the report's shape and the generated workload (no speed asserts)."""

from __future__ import annotations

import json
import platform
import re
from typing import Any

import pytest

from quotaledger.adapters.bench import fold as bench_fold
from quotaledger.adapters.bench.fold import (
    TARGET_AUDIT_1M_S,
    TARGET_AUDIT_JOBS2_VS_1,
    TARGET_BYTES_PER_POD,
    TARGET_FOLD_EVENTS_PER_S,
    TARGET_FOLD_VS_DECODE,
    TARGET_FOLD_VS_MSGSPEC,
    TARGET_FULL_RECOMPUTE_MS,
    TARGET_INCREMENTAL_US,
    TARGET_P99_US,
    TARGET_REPLAY_10M_S,
)
from quotaledger.adapters.bench.workload import Workload, generate
from quotaledger.adapters.cli import main
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


#: The table's rows, in order: (label, report key, unit, target).
TABLE_ROWS = (
    ("decode (ceiling)", "decode_events_per_s", "events/s", ""),
    ("msgspec alone", "msgspec_decode_events_per_s", "events/s", ""),
    ("fold", "fold_events_per_s", "events/s", f">= {TARGET_FOLD_EVENTS_PER_S:,}"),
    ("fold / decode", "fold_vs_decode", "", f">= {TARGET_FOLD_VS_DECODE}"),
    ("fold / msgspec alone", "fold_vs_msgspec", "", f">= {TARGET_FOLD_VS_MSGSPEC}"),
    ("digest chain alone", "digest_chain_events_per_s", "events/s", ""),
    ("full recompute", "full_recompute_ms", "ms", f"<= {TARGET_FULL_RECOMPUTE_MS:g}"),
    ("incremental (median)", "incremental_recompute_us", "us", f"<= {TARGET_INCREMENTAL_US:g}"),
    ("incremental (p99)", "incremental_recompute_p99_us", "us", f"<= {TARGET_P99_US:g}"),
    ("settle after the fold", "settle_after_fold_ms", "ms", ""),
    ("SQLite append", "append_events_per_s", "events/s", ""),
    ("SQLite read", "read_events_per_s", "events/s", ""),
    ("memory per pod", "bytes_per_pod", "bytes", f"<= {TARGET_BYTES_PER_POD}"),
    ("... with kept digests", "bytes_per_pod_hashed", "bytes", f"<= {TARGET_BYTES_PER_POD}"),
    ("state hash (full)", "state_hash_ms", "ms", ""),
    ("state hash (kept)", "state_hash_incremental_us", "us", ""),
    ("settle before a digest", "digest_settle_ms", "ms", ""),
    ("hash, tail out of order", "tail_state_hash_ms", "ms", ""),
    ("snapshot, tail disorder", "tail_snapshot_dump_ms", "ms", ""),
    ("10M replay (estimate)", "replay_10m_estimate_s", "s", f"<= {TARGET_REPLAY_10M_S:g}"),
    ("replay (CLI)", "replay_1m_s", "s", ""),
    ("audit (CLI)", "audit_1m_s", "s", f"<= {TARGET_AUDIT_1M_S:g}"),
    ("audit --jobs 2 (CLI)", "audit_1m_jobs2_s", "s", ""),
    ("audit jobs 2 / jobs 1", "audit_jobs2_vs_1", "", f"<= {TARGET_AUDIT_JOBS2_VS_1}"),
)
_ROW = re.compile(
    r"(?P<label>.{24})(?P<value>.{16})  (?P<unit>.{9})(?P<target>.{12})(?P<verdict>yes|NO|)"
)


def test_bench_fold_table(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The table (no ``--json``) shows the report of its own run: every figure in
    its row, as the report has it (to the digits shown), with its unit, its
    target and a verdict exactly where there is a target; the workload line,
    the record count, the rejections and the churn mix are the small
    workload's known figures."""
    reports: list[dict[str, Any]] = []
    measure = bench_fold.run

    def measured(*args: Any, **kwargs: Any) -> dict[str, Any]:
        reports.append(measure(*args, **kwargs))
        return reports[-1]

    monkeypatch.setattr(bench_fold, "run", measured)  # the real run, its report kept
    assert main(["bench", "fold", *SMALL, "--events", "500", "--cli-runs", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    [report] = reports

    work = generate(quotas=100, pods=1000, nodes=10, events=500, seed=1)
    projection = Projection()
    for record in work.records:
        projection.apply_record(record)
    assert lines[:3] == [
        "quotaledger bench fold: 100 quotas (5 levels), 1,000 pods, 10 nodes, 500 events"
        f" (seed 1, Python {platform.python_version()})",
        "",
        f"{'figure':<24}{'value':>16}  {'unit':<9}{'target':<12}met",
    ]
    rows = lines[3 : 3 + len(TABLE_ROWS)]
    assert len(rows) == len(TABLE_ROWS)
    for line, (label, key, unit, target) in zip(rows, TABLE_ROWS, strict=True):
        row = _ROW.fullmatch(line)
        assert row is not None, line
        assert (row["label"].rstrip(), row["unit"].rstrip(), row["target"].rstrip()) == (
            label,
            unit,
            target,
        ), line
        shown, value = float(row["value"].replace(",", "")), report[key]
        assert shown > 0, line
        if isinstance(value, int) or value >= 1000:  # whole numbers
            assert abs(shown - value) <= 0.5, (line, value)
        else:  # three significant digits
            assert abs(shown - value) <= 0.005 * abs(value), (line, value)
        verdict = ("yes" if report["targets_met"][key] else "NO") if target else ""
        assert row["verdict"] == verdict, line
    assert lines[3 + len(TABLE_ROWS) :] == [
        "",
        f"rejected by the projection: {len(projection.state.rejected)} of 1,611 records;"
        f" active pods at the end: {report['active_pods']:,}",
        "churn mix: " + ", ".join(f"{kind} {count:,}" for kind, count in work.mix.items()),
        "(the 10M replay figure is an estimate: 10M / fold rate + the final settle)",
    ]
    assert sum(work.mix.values()) == 500 and report["mix"] == work.mix


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
