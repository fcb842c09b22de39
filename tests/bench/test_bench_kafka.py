"""``quotaledger bench kafka``: the report's shape on a small workload (no speed asserts)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from quotaledger.adapters.cli import main
from tests.tansu import Tansu

FIGURES = (
    "produce_events_per_s",
    "consume_events_per_s",
    "raw_produce_events_per_s",
    "raw_consume_events_per_s",
    "replay_events_per_s",
    "sqlite_replay_events_per_s",
)


def test_bench_kafka_json(tansu: Tansu, capsys: pytest.CaptureFixture[str]) -> None:
    small = ["--quotas", "50", "--pods", "500", "--nodes", "5", "--events", "2000"]
    argv = ["bench", "kafka", "--json", "--rounds", "1", "--bootstrap", tansu.bootstrap]
    assert main([*argv, *small]) == 0
    out = capsys.readouterr().out
    report: dict[str, Any] = json.loads(out)
    assert out.strip().count("\n") == 0
    for key in FIGURES:
        assert isinstance(report[key], int) and report[key] > 0, key
    assert report["events"] == 2000 + 500 + 50 + 5
    assert set(report["targets_met"]) == {"produce_vs_raw", "consume_vs_raw", "replay_vs_sqlite"}
