"""``quotaledger bench decide``: the report's shape and its accounting (no speed asserts)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from quotaledger.adapters.cli import main

SMALL = [
    *("--quotas", "100", "--pods", "2000", "--nodes", "10"),
    *("--events", "3000", "--triggers", "4", "--rate", "500"),
]


def test_bench_decide_json_accounts_for_every_trigger(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["bench", "decide", "--json", *SMALL]) == 0
    out = capsys.readouterr().out
    report: dict[str, Any] = json.loads(out)
    assert out.strip().count("\n") == 0
    # every trigger is a sample (a victim found), a no-victim case or unanswered
    assert report["triggers"] == 4
    assert report["samples"] == report["victims_found"]
    assert report["victims_found"] + report["no_victim"] + report["unanswered"] == 4
    assert report["unanswered"] == 0, report
    assert sum(report["no_victim_reasons"].values()) == report["no_victim"]
    # the follower was fed 3,000 records faster than it folds, and checkpointed
    assert report["follow_events"] == 3000
    assert report["follow_events_per_s"] > 0 and report["follow_seconds"] > 0
    assert report["follow_cpu_seconds"] >= 0
    for key in ("p50_ms", "p99_ms", "decision_p99_ms", "simulate_events_per_s"):
        assert isinstance(report[key], int | float), key


def test_bench_decide_follow_only_times_the_follower_alone(
    capsys: pytest.CaptureFixture[str],
) -> None:
    small = [*("--quotas", "100", "--pods", "2000", "--nodes", "10", "--events", "3000")]
    assert main(["bench", "decide", "--json", "--follow-only", *small]) == 0
    report: dict[str, Any] = json.loads(capsys.readouterr().out)
    assert report["follow_events"] == 3000
    assert report["follow_events_per_s"] > 0 and report["follow_cpu_seconds"] >= 0
    assert report["target_follow_events_per_s"] == 50_000
    assert report["follow_met"] == (report["follow_events_per_s"] >= 50_000)
    # neither the latency run nor simulate ran
    assert not {"p99_ms", "triggers", "simulate_events_per_s", "simulate_met"} & report.keys()
