"""``/metrics``: one collector reading the state at scrape time (DESIGN §11)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from quotaledger.adapters.bench.serve import generate  # the one import of the generator
from quotaledger.adapters.http.metrics import (
    FoldStatistics,
    LedgerPosition,
    StateCollector,
)
from quotaledger.projections import Projection, settle, state_json
from tests.serve_support import caught_up, ingest, running

QUOTA_FIELDS = (
    "min",
    "max",
    "effective_min",
    "request",
    "limited_request",
    "used",
    "runtime",
    "available",
)


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def unit(resource: str, amount: int) -> float:
    return amount / 1000 if resource == "cpu" else float(amount)


def expected_series(state: dict[str, Any]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """What the state JSON says every quota/namespace/cluster gauge must be."""
    want = {}
    for name, quota in state["quotas"].items():
        for field in QUOTA_FIELDS:
            for resource, amount in (quota[field] or {}).items():
                if amount:
                    key = (("quota", name), ("resource", resource))
                    want[(f"quotaledger_quota_{field}", key)] = unit(resource, amount)
        for ns, usage in quota["namespaces"].items():
            for field in ("request", "used", "fair_share"):
                for resource, amount in usage[field].items():
                    if amount:
                        key = (("namespace", ns), ("quota", name), ("resource", resource))
                        want[(f"quotaledger_namespace_{field}", key)] = unit(resource, amount)
    for field, values in (
        ("allocatable", state["cluster"]["allocatable"]),
        ("total", state["cluster"]["total"]),
    ):
        for resource, amount in values.items():
            want[(f"quotaledger_cluster_{field}", (("resource", resource),))] = unit(
                resource, amount
            )
    return want


def state_series(got: dict[Any, float]) -> dict[Any, float]:
    prefixes = ("quotaledger_quota_", "quotaledger_namespace_", "quotaledger_cluster_")
    return {key: value for key, value in got.items() if key[0].startswith(prefixes)}


def registry_for(projection: Projection) -> tuple[CollectorRegistry, StateCollector]:
    collector = StateCollector(
        lambda: projection.state, FoldStatistics(), LedgerPosition(), lambda: 0, "test"
    )
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry, collector


def folded(records: Iterable[Any]) -> Projection:
    projection = Projection()
    for record in records:
        projection.apply_record(record)
    settle(projection.state)
    return projection


@settings(max_examples=6, deadline=None)
@given(st.integers(min_value=1, max_value=10_000))
def test_metrics_equal_the_state_json_on_a_generated_cluster(seed: int) -> None:
    workload = generate(quotas=60, pods=800, nodes=20, events=2_000, seed=seed)
    projection = folded(workload.records)
    text = registry_for(projection)[1].render().decode()
    got = samples(text)
    assert state_series(got) == expected_series(state_json(projection.state))
    namespaces = {key for key in got if key[0] == "quotaledger_namespace_request"}
    assert len({dict(key[1])["quota"] for key in namespaces}) > 1


def test_exposition_is_what_prometheus_client_writes() -> None:
    workload = generate(quotas=40, pods=300, nodes=10, events=500, seed=3)
    projection = folded(workload.records)
    registry, collector = registry_for(projection)
    statistics = collector._statistics
    statistics.preemptions[("reclaim", "complete")] += 2
    statistics.evictions["requested"] += 3
    statistics.fold_seconds.observe(0.003)
    text = collector.render()
    assert text == generate_latest(registry)
    assert b'quotaledger_preemptions_total{cause="reclaim",outcome="complete"} 2.0' in text


async def test_scrape_over_http_after_a_live_preemption(tmp_path: Path) -> None:
    # The quota-decrease example's deadline is long past: the engine fires it at once.
    path = await ingest("quota-decrease.jsonl", tmp_path / "l.db")
    async with running(path) as run:
        async with asyncio.timeout(60):  # a hang guard, not a speed requirement
            while not run.server.state.finished_preemptions:
                await asyncio.sleep(0.02)
        await caught_up(run, await run.ledger.last_offset())
        async with run.session.get(f"{run.base}/v1/state") as response:
            state = await response.json()
        async with run.session.get(f"{run.base}/metrics") as response:
            assert response.headers["Content-Type"].startswith("text/plain")
            text = await response.text()
    got = samples(text)
    assert state_series(got) == expected_series(state)
    assert (
        got[
            (
                "quotaledger_preemptions_total",
                (("cause", "quota-decrease"), ("outcome", "complete")),
            )
        ]
        == 1
    )
    assert got[("quotaledger_evictions_total", (("outcome", "requested"),))] == 1
    assert got[("quotaledger_evictions_total", (("outcome", "succeeded"),))] == 1
    assert got[("quotaledger_evictions_total", (("outcome", "failed"),))] == 0
    assert got[("quotaledger_decision_latency_seconds_count", ())] == 1
    assert got[("quotaledger_fold_seconds_count", ())] >= 1
    assert got[("quotaledger_ledger_offset", ())] == state["offset"]
    assert got[("quotaledger_ledger_lag_records", ())] == 0
    assert got[("quotaledger_leader_epoch", ())] == 1
    assert ("quotaledger_build_info", (("version", "0.1.0"),)) in got
    names = {family.name for family in text_string_to_metric_families(text)}
    for name in (
        "quotaledger_preemption_running",
        "quotaledger_timer_deadline_seconds",
        "quotaledger_rejected_facts",
    ):
        assert name in names
