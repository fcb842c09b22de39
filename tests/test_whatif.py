"""``quotaledger whatif``: fork a ledger's state, apply hypothetical facts, show the evictions."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from quotaledger.adapters.cli import main
from quotaledger.adapters.ledgers.sqlite.ledger import SqliteLedger
from quotaledger.engine.simulate import Simulation
from quotaledger.engine.whatif import parse_duration, whatif
from quotaledger.projections import Projection, state_json

REPO = Path(__file__).resolve().parent.parent
QUOTA_DECREASE = REPO / "examples" / "quota-decrease.jsonl"
OVERUSE = REPO / "examples" / "overuse.jsonl"
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z

LOWER = {
    "kind": "QuotaUpserted",
    "name": "analytics",
    "min": {"memory": "20Gi"},
    "max": {"memory": "30Gi"},
    "preemption_delay_s": 600,
}


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(list(argv))
    return code, capsys.readouterr().out


def write(path: Path, *events: dict[str, Any]) -> Path:
    path.write_text("".join(json.dumps(event) + "\n" for event in events))
    return path


@pytest.fixture
def ledger(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> Path:
    """The quota-decrease example run through the engine, as a SQLite ledger (offsets 0-12)."""
    db = tmp_path / "qd.db"
    assert run_cli(capsys, "simulate", str(QUOTA_DECREASE), "--out", str(db))[0] == 0
    return db


def last_offset(path: Path) -> int:
    async def read() -> int:
        ledger = await SqliteLedger.open(str(path), create=False)
        try:
            return await ledger.last_offset()
        finally:
            await ledger.close()

    return asyncio.run(read())


def whatif_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    code, out = run_cli(capsys, "whatif", *argv, "--json")
    assert code == 0
    result: dict[str, Any] = json.loads(out)
    return result


def test_lowering_a_max_evicts_after_its_delay_and_leaves_the_ledger_alone(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, ledger: Path
) -> None:
    before = ledger.read_bytes()
    assert last_offset(ledger) == 12
    change = write(tmp_path / "lower.jsonl", LOWER)
    result = whatif_json(capsys, str(ledger), "--at", "12", "--change", str(change))
    assert result["at"] == "2026-01-01T00:06:00Z"
    assert result["horizon_s"] == 3600
    assert result["offset"] == 12
    # used 50Gi (spark-1 20Gi + spark-2 30Gi), new max 30Gi, min 20Gi: target 20Gi;
    # spark-2 (the non-originator) goes 600 s after the change
    assert [
        (e["queue"], e["pod_uid"], e["at"], e["cause"], e["without_change"])
        for e in result["evictions"]
    ] == [("analytics", "spark-2", "2026-01-01T00:16:00Z", "quota-decrease", False)]
    assert result["evictions"][0]["preemption_id"] == result["preemptions"][0]["preemption_id"]
    preemption = result["preemptions"][0]
    assert preemption["target"] == {"memory": 20 * 2**30}
    assert preemption["outcome"] == "complete"
    assert result["state"]["quotas"]["analytics"]["pods"] == ["spark-1"]
    assert result["state"]["offset"] > 12
    assert ledger.read_bytes() == before
    assert last_offset(ledger) == 12
    assert not Path(f"{ledger}-wal").exists() or Path(f"{ledger}-wal").stat().st_size == 0


def test_a_horizon_shorter_than_the_delay_evicts_nothing(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, ledger: Path
) -> None:
    before = ledger.read_bytes()
    change = write(tmp_path / "lower.jsonl", LOWER)
    result = whatif_json(capsys, str(ledger), "--change", str(change), "--horizon", "9m")
    assert result["evictions"] == [] and result["preemptions"] == []
    assert result["pending"] == [
        {"queue": "analytics", "cause": "quota-decrease", "deadline": "2026-01-01T00:16:00Z"}
    ]
    assert result["until"] == "2026-01-01T00:15:00Z"
    code, out = run_cli(capsys, "whatif", str(ledger), "--change", str(change), "--horizon", "9m")
    assert code == 0
    assert "still armed after the horizon: quota-decrease on analytics" in out
    assert ledger.read_bytes() == before


def test_fork_at_a_time_and_change_times(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, ledger: Path
) -> None:
    """--at TIME forks there; a change stamped earlier is clamped to it, a later one kept."""
    early = write(tmp_path / "early.jsonl", {**LOWER, "at": "2025-06-01T00:00:00Z"})
    result = whatif_json(
        capsys, str(ledger), "--at", "2026-01-01T00:05:30Z", "--change", str(early)
    )
    assert result["at"] == "2026-01-01T00:05:30Z" and result["offset"] == 7
    # the change at 00:05:30 resets the timer armed at 00:05:00: due 00:15:30;
    # used 80Gi over max 30Gi (min 20Gi): spark-3 then spark-2 go
    evicted = [(e["pod_uid"], e["at"], e["without_change"]) for e in result["evictions"]]
    assert evicted == [
        ("spark-3", "2026-01-01T00:15:30Z", True),  # evicted at 00:06:00 without the change
        ("spark-2", "2026-01-01T00:15:30Z", False),
    ]
    later = write(tmp_path / "later.jsonl", {**LOWER, "at": "2026-01-01T00:20:00Z"})
    result = whatif_json(capsys, str(ledger), "--change", str(later), "--horizon", "30m")
    assert [(e["pod_uid"], e["at"]) for e in result["evictions"]] == [
        ("spark-2", "2026-01-01T00:30:00Z")
    ]


def test_text_output_lists_evictions_per_queue(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, ledger: Path
) -> None:
    change = write(tmp_path / "lower.jsonl", LOWER)
    code, out = run_cli(capsys, "whatif", str(ledger), "--change", str(change))
    assert code == 0
    lines = out.splitlines()
    assert lines[0].startswith("what if: forked after offset 12 at 2026-01-01T00:06:00Z")
    assert "analytics: 1 eviction(s)" in lines
    assert any(
        line.strip().startswith("spark-2  at 2026-01-01T00:16:00Z  quota-decrease")
        for line in lines
    )
    assert lines[-1] == "1 eviction(s) in 1 queue(s) within the horizon; 1 caused by the change"


def test_overuse_whatif_from_a_jsonl_ledger(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Fork the overuse example before team-b's pods arrive and add them hypothetically."""
    lines = OVERUSE.read_text().splitlines()
    before = tmp_path / "before.jsonl"
    before.write_text("\n".join(lines[:8]) + "\n")
    arrivals = tmp_path / "arrivals.jsonl"
    arrivals.write_text(
        "\n".join(line.replace('"at": "2026-01-01T00:01:00Z", ', "") for line in lines[8:11]) + "\n"
    )
    result = whatif_json(capsys, str(before), "--change", str(arrivals))
    assert result["at"] == "2026-01-01T00:00:00Z"
    assert [(e["queue"], e["pod_uid"], e["at"], e["cause"]) for e in result["evictions"]] == [
        ("team-a", "a-3", "2026-01-01T00:01:00Z", "overuse")
    ]
    short = whatif_json(capsys, str(before), "--change", str(arrivals), "--horizon", "59s")
    assert short["evictions"] == []
    assert short["pending"][0]["cause"] == "overuse"


def test_bad_changes_and_arguments_are_usage_errors(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, ledger: Path
) -> None:
    decision = write(
        tmp_path / "decision.jsonl",
        {"kind": "EvictionSucceeded", "eviction_id": "x"},
    )
    assert main(["whatif", str(ledger), "--change", str(decision)]) == 2
    assert "facts only" in capsys.readouterr().err
    change = write(tmp_path / "lower.jsonl", LOWER)
    assert main(["whatif", str(ledger), "--change", str(change), "--horizon", "soon"]) == 2
    assert main(["whatif", str(ledger), "--change", str(change), "--at", "99"]) == 2
    assert "ledger ends at offset 12" in capsys.readouterr().err
    invalid = tmp_path / "invalid.jsonl"
    invalid.write_text('{"kind": "QuotaUpserted"}\n')
    assert main(["whatif", str(ledger), "--change", str(invalid)]) == 2


def test_a_refused_change_is_reported(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, ledger: Path
) -> None:
    bad = write(tmp_path / "bad.jsonl", {**LOWER, "min": {"memory": "40Gi"}})  # min > max
    result = whatif_json(capsys, str(ledger), "--change", str(bad))
    assert result["evictions"] == []
    assert [r["kind"] for r in result["rejected"]] == ["QuotaUpserted"]


@pytest.mark.parametrize(
    ("text", "ms"),
    [
        ("90s", 90_000),
        ("30m", 1_800_000),
        ("2h", 7_200_000),
        ("1d", 86_400_000),
        ("1h30m", 5_400_000),
        ("500ms", 500),
        ("45", 45_000),
        ("1.5h", 5_400_000),
    ],
)
def test_parse_duration(text: str, ms: int) -> None:
    assert parse_duration(text) == ms


@pytest.mark.parametrize("text", ["", "h", "5x", "1h 30m", "-5m", "m30"])
def test_parse_duration_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


def test_whatif_leaves_the_forked_state_untouched() -> None:
    simulation = Simulation()
    payloads = [line.encode() for line in QUOTA_DECREASE.read_text().splitlines()]
    simulation.run([(T0, payload) for payload in payloads[:6]])
    state = simulation.projection.state
    before = state_json(state)
    result = whatif(state, [(0, json.dumps(LOWER).encode())], horizon_ms=3_600_000)
    assert [e["pod_uid"] for e in result["evictions"]] == ["spark-3", "spark-2"]
    assert state_json(state) == before


def test_a_simulation_continues_a_folded_projection() -> None:
    """Simulation(projection=...) at offset N appends N+1, N+2, ... from its ts."""
    base = Simulation()
    payloads = [line.encode() for line in QUOTA_DECREASE.read_text().splitlines()]
    base.run([(T0, payload) for payload in payloads[:6]])
    projection = Projection()
    for record in base.records:
        projection.apply_record(record)
    fork = Simulation(projection=projection)
    assert fork.records == [] and fork.now == T0
    fork.run([(T0 + 300_000, payloads[6])])
    assert [r.offset for r in fork.records][:2] == [7, 8]
    assert fork.decisions[0][0].offset == 8
    assert fork.decisions_json()[0]["at"] == "2026-01-01T00:06:00Z"
