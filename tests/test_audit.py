"""``quotaledger audit``: each decision explained and re-derived from the facts (DESIGN §7)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from quotaledger.adapters.cli import main
from quotaledger.engine.audit import lagging as lagging_module
from quotaledger.engine.audit.decisions import Auditor
from quotaledger.engine.audit.lagging import LaggingFold
from quotaledger.engine.simulate import Simulation
from quotaledger.events.ledger import Record
from quotaledger.events.times import rfc3339
from quotaledger.projections import Projection, state_json

REPO = Path(__file__).resolve().parent.parent
QUOTA_DECREASE = REPO / "examples" / "quota-decrease.jsonl"
OVERUSE = REPO / "examples" / "overuse.jsonl"
G = 2**30


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    capsys.readouterr()
    code = main(list(argv))
    return code, capsys.readouterr().out


def simulated(capsys: pytest.CaptureFixture[str], example: Path, out: Path) -> Path:
    code, _ = run_cli(capsys, "simulate", str(example), "--out", str(out))
    assert code == 0
    return out


def audit_json(capsys: pytest.CaptureFixture[str], path: Path, *extra: str) -> tuple[int, Any]:
    code, out = run_cli(capsys, "audit", str(path), "--json", *extra)
    return code, json.loads(out)


def by_kind(document: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [d for d in document["decisions"] if d["kind"] == kind]


def rows(path: Path) -> list[tuple[int, int, dict[str, Any]]]:
    with sqlite3.connect(path) as conn:
        return [
            (offset, ts, json.loads(payload))
            for offset, ts, payload in conn.execute(
                "SELECT offset, ts, payload FROM records ORDER BY offset"
            )
        ]


def export(path: Path, records: list[tuple[int, int, dict[str, Any]]]) -> Path:
    """A JSONL export: one event per line, ``at`` = the record's ts, LedgerOpened first."""
    lines = [json.dumps({**event, "at": rfc3339(ts)}) for _, ts, event in records]
    path.write_text("\n".join(lines) + "\n")
    return path


def set_payload(path: Path, offset: int, event: dict[str, Any]) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE records SET payload = ? WHERE offset = ?", (json.dumps(event), offset))


# ---------------------------------------------------------------- justified ledgers


def test_quota_decrease_ledger_is_explained_with_its_numbers(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    db = simulated(capsys, QUOTA_DECREASE, tmp_path / "qd.db")
    code, document = audit_json(capsys, db)
    assert code == 0
    assert document["flagged"] == 0
    kinds = [d["kind"] for d in document["decisions"]]
    assert kinds == [
        "PreemptionStarted",
        "EvictionRequested",
        "EvictionSucceeded",
        "PreemptionFinished",
    ]
    assert all(d["justified"] and d["problems"] == [] for d in document["decisions"])
    started = by_kind(document, "PreemptionStarted")[0]
    assert started["offset"] == 8 and started["queue"] == "analytics"
    text = started["explanation"]
    assert text.startswith("2026-01-01T00:06:00Z #8 quota-decrease preemption")
    for words in (
        "used memory 80Gi exceeded max 50Gi",
        "since the change at 2026-01-01T00:05:00Z + delay 60s",
        "guaranteed 20Gi",
        "target 30Gi",
        "spark-3",
    ):
        assert words in text
    evicted = by_kind(document, "EvictionRequested")[0]
    assert evicted["pod_uid"] == "spark-3"
    for words in ("rank 0", "non-originator", "priority 0", "younger", "used 10 cpu, 80Gi"):
        assert words in evicted["explanation"]
    finished = by_kind(document, "PreemptionFinished")[0]
    assert "finished complete: claimed 4 cpu, 30Gi of target 30Gi" in finished["explanation"]


def test_overuse_example_revokes_after_revoke_after_s(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """examples/overuse.jsonl: team-b's pods make team-a owing at 00:01:00; after
    revoke_after_s (60 s) the revoke evicts a-3 only (a-4 fits again: added back)."""
    code, out = run_cli(capsys, "simulate", str(OVERUSE), "--json")
    assert code == 0
    result = json.loads(out)
    started = [d for d in result["decisions"] if d["kind"] == "PreemptionStarted"]
    assert [(d["cause"], d["queue"], d["at"]) for d in started] == [
        ("overuse", "team-a", "2026-01-01T00:02:00Z")
    ]
    assert started[0]["target"] == {"cpu": 4000}
    evicted = [d["pod_uid"] for d in result["decisions"] if d["kind"] == "EvictionRequested"]
    assert evicted == ["a-3"]
    finished = [d for d in result["decisions"] if d["kind"] == "PreemptionFinished"]
    assert finished[0]["outcome"] == "complete"
    team_a = result["state"]["quotas"]["team-a"]
    assert team_a["used"]["cpu"] <= team_a["runtime"]["cpu"] == 4000


def test_overuse_ledger_is_explained(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    db = simulated(capsys, OVERUSE, tmp_path / "ov.db")
    code, document = audit_json(capsys, db)
    assert code == 0 and document["flagged"] == 0
    started = by_kind(document, "PreemptionStarted")[0]
    for words in (
        "overuse preemption",
        "held cpu 8",
        "runtime cpu 4",
        "owing continuously since 2026-01-01T00:01:00Z",
        "revoke_after 60s",
        "due 2026-01-01T00:02:00Z",
        "target used − runtime = 4 cpu",
    ):
        assert words in started["explanation"]
    evicted = by_kind(document, "EvictionRequested")[0]
    assert evicted["pod_uid"] == "a-3"
    assert "rank 1" in evicted["explanation"] and "runtime 4 cpu" in evicted["explanation"]
    finished = by_kind(document, "PreemptionFinished")[0]
    assert "team-a now uses 4 cpu, 8Gi with runtime 4 cpu" in finished["explanation"]


def test_text_output_and_help_document_the_exit_status(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    db = simulated(capsys, QUOTA_DECREASE, tmp_path / "qd.db")
    code, out = run_cli(capsys, "audit", str(db))
    assert code == 0
    assert "FLAGGED" not in out
    assert out.strip().endswith("4 decision(s) audited over 13 record(s); 0 flagged")
    with pytest.raises(SystemExit) as exited:
        main(["audit", "--help"])
    assert exited.value.code == 0
    help_text = capsys.readouterr().out
    assert "exit status: 0 when no decision is flagged and every digest matches; 1" in help_text
    assert "examples:" in help_text


def test_parent_split_and_jsonl_export_audit_clean(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A parent's decrease split over two leaves, audited from a JSONL export."""
    t0 = "2026-01-01T00:00:0"

    def fact(second: int, **event: Any) -> dict[str, Any]:
        return {**event, "at": f"{t0}{second}Z"}

    def pod(uid: str, quota: str) -> dict[str, Any]:
        return fact(
            1,
            kind="PodUpserted",
            uid=uid,
            name=uid,
            namespace=quota,
            requests={"cpu": 1},
            phase="Running",
            node="n1",
        )

    parent = {"kind": "QuotaUpserted", "name": "p", "is_parent": True, "min": {"cpu": 4}}
    facts = [
        fact(0, kind="SettingsChanged", quota_preemption_enabled=True, revoke_enabled=False),
        fact(0, kind="NodeUpserted", name="n1", allocatable={"cpu": 100}),
        fact(0, **parent, max={"cpu": 100}, preemption_delay_s=5),
        fact(0, kind="QuotaUpserted", name="a", parent="p", min={"cpu": 4}),
        fact(0, kind="QuotaUpserted", name="b", parent="p"),
        *[pod(f"a{i}", "a") for i in range(10)],
        *[pod(f"b{i}", "b") for i in range(3)],
        fact(2, **parent, max={"cpu": 9}, preemption_delay_s=5),
    ]
    source = tmp_path / "facts.jsonl"
    source.write_text("\n".join(json.dumps(f) for f in facts) + "\n")
    db = simulated(capsys, source, tmp_path / "p.db")
    exported = export(tmp_path / "export.jsonl", rows(db))
    code, document = audit_json(capsys, exported)
    assert code == 0, document
    evictions = by_kind(document, "EvictionRequested")
    assert len(evictions) == 5
    text = evictions[0]["explanation"]
    assert "a used 10 cpu, a guaranteed 4 cpu, p's max 9 cpu" in text
    assert "a's share of p's target 2667m cpu" in text
    started = by_kind(document, "PreemptionStarted")[0]
    assert "split among the children by releasable usage" in started["explanation"]


def test_reclaim_ledger_audits_clean(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    source = tmp_path / "reclaim.jsonl"
    source.write_text(
        OVERUSE.read_text().replace(
            '"revoke_enabled": true, "revoke_after_s": 60, "reclaim_enabled": false',
            '"revoke_enabled": false, "reclaim_enabled": true, "reclaim_after_s": 30',
        )
    )
    db = simulated(capsys, source, tmp_path / "rc.db")
    code, document = audit_json(capsys, db)
    assert code == 0, document
    started = by_kind(document, "PreemptionStarted")
    assert [d["queue"] for d in started] == ["team-b"]
    assert "pod b-2 in team-b is starving" in started[0]["explanation"]
    assert "reclaim_after 30s" in started[0]["explanation"]


# ---------------------------------------------------------------- tampered ledgers


def test_an_edited_eviction_is_flagged_and_exits_1(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    db = simulated(capsys, QUOTA_DECREASE, tmp_path / "qd.db")
    offset, _, event = next(r for r in rows(db) if r[2]["kind"] == "EvictionRequested")
    set_payload(db, offset, {**event, "pod_uid": "spark-2"})
    code, document = audit_json(capsys, db)
    assert code == 1
    assert document["flagged"] >= 1
    flagged = [d for d in document["decisions"] if not d["justified"]]
    first = flagged[0]
    assert first["offset"] == offset and first["kind"] == "EvictionRequested"
    assert first["pod_uid"] == "spark-2"
    assert any("spark-2" in p and "spark-3" in p for p in first["problems"])
    # the real victim was never requested: the finish says so too
    finished = by_kind(document, "PreemptionFinished")[0]
    assert any("spark-3 were never requested" in p for p in finished["problems"])
    code, out = run_cli(capsys, "audit", str(db))
    assert code == 1
    assert "FLAGGED" in out and "  ! names spark-2" in out


def test_a_forged_target_in_a_jsonl_export_is_flagged(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    db = simulated(capsys, QUOTA_DECREASE, tmp_path / "qd.db")
    records = rows(db)
    clean = export(tmp_path / "clean.jsonl", records)
    assert audit_json(capsys, clean)[0] == 0
    forged = [
        (o, ts, {**e, "target": {"memory": 60 * G}} if e["kind"] == "PreemptionStarted" else e)
        for o, ts, e in records
    ]
    code, document = audit_json(capsys, export(tmp_path / "forged.jsonl", forged))
    assert code == 1
    started = by_kind(document, "PreemptionStarted")[0]
    assert not started["justified"]
    assert started["problems"] == ["recorded target 60Gi differs from the re-derived 30Gi"]


def test_a_decision_before_its_deadline_is_flagged(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    db = simulated(capsys, QUOTA_DECREASE, tmp_path / "qd.db")
    early = 1_767_225_600_000 + 330_000  # 00:05:30, the deadline is 00:06:00
    records = [(o, early if o >= 8 else ts, e) for o, ts, e in rows(db)]
    code, document = audit_json(capsys, export(tmp_path / "early.jsonl", records))
    # the guard itself refuses a start before the deadline: the guard working, so the
    # decision is listed as refused (not flagged), and audit says why too
    assert code == 0
    assert document["flagged"] == 0 and document["refused"] >= 1
    started = by_kind(document, "PreemptionStarted")[0]
    assert started["refused"].startswith("queue: 'analytics' deadline")
    assert (
        "fired at 2026-01-01T00:05:30Z, before its deadline 2026-01-01T00:06:00Z"
        in (started["problems"])
    )
    assert {"code": "early", "ts": early, "deadline": early + 30_000} in started["problem_data"]


def test_decisions_the_projection_refused_are_flagged(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    db = simulated(capsys, QUOTA_DECREASE, tmp_path / "qd.db")
    records = rows(db)
    started = next(e for _, _, e in records if e["kind"] == "PreemptionStarted")
    ts = records[8][1]
    second = {**started, "preemption_id": "second", "cause": "overuse"}
    forged = [*records[:9], (9, ts, second), *records[9:]]
    code, document = audit_json(capsys, export(tmp_path / "twice.jsonl", forged))
    # refused by the guard: reported and counted as refused, not a failed audit
    assert code == 0
    assert document["refused"] == 1 and document["flagged"] == 0
    refused = [d for d in document["decisions"] if d["preemption_id"] == "second"]
    assert len(refused) == 1
    assert refused[0]["refused"].startswith("queue: 'analytics' is occupied")
    assert "revoke_enabled was false at basis #7" in refused[0]["problems"]
    code, out = run_cli(capsys, "audit", str(tmp_path / "twice.jsonl"))
    assert code == 0
    assert "REFUSED " in out and "  refused by the projection: queue: 'analytics'" in out
    assert out.strip().endswith("0 flagged, 1 refused by the guard (not flagged)")


def test_pod_filter(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    db = simulated(capsys, QUOTA_DECREASE, tmp_path / "qd.db")
    code, document = audit_json(capsys, db, "--pod", "spark-3")
    assert code == 0
    assert [d["kind"] for d in document["decisions"]] == [
        "PreemptionStarted",
        "EvictionRequested",
        "EvictionSucceeded",
        "PreemptionFinished",
    ]
    code, document = audit_json(capsys, db, "--pod", "spark-1")
    assert code == 0 and document["decisions"] == []
    offset, _, event = next(r for r in rows(db) if r[2]["kind"] == "EvictionRequested")
    set_payload(db, offset, {**event, "pod_uid": "spark-2"})
    assert audit_json(capsys, db, "--pod", "spark-1")[0] == 0  # not this pod's decisions
    code, document = audit_json(capsys, db, "--pod", "spark-2")
    assert code == 1
    assert next(d["offset"] for d in document["decisions"] if not d["justified"]) == offset


def test_missing_file_is_a_usage_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["audit", str(tmp_path / "none.db")]) == 2
    assert "no such file" in capsys.readouterr().err


# ---------------------------------------------------------------- the lagging fold


def test_a_basis_behind_the_lagging_fold_refolds(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a tiny buffer the lagging fold folds nothing until asked, reads the
    records the buffer dropped again from the source, refolds from offset 0 for
    a basis behind it, and always gives the state of a fresh fold through that basis."""
    monkeypatch.setattr(lagging_module, "BUFFER_LIMIT", 1)
    simulation = Simulation()
    lines = [line.encode() for line in QUOTA_DECREASE.read_text().splitlines() if line.strip()]
    ts = [1_767_225_600_000] * 6 + [1_767_225_900_000]
    simulation.run(zip(ts, lines, strict=True))
    records: list[Record] = simulation.records
    lagging = LaggingFold(lambda start: records[start:])
    for record in records:
        lagging.push(record)
    assert lagging.projection.state.offset == -1
    for basis in (3, 7, 5, 6, len(records) - 1, len(records) - 1, 0):
        fresh = Projection()
        for record in records[: basis + 1]:
            fresh.apply_record(record)
        assert state_json(lagging.at(basis)) == state_json(fresh.state)
    assert lagging.refolds == 2
    # the auditor over the same records: nothing flagged, every decision explained
    auditor = Auditor(lambda start: records[start:])
    for record in records:
        auditor.feed(record)
    report = auditor.finish()
    assert report.flagged == 0 and len(report.findings) == 4


def test_forged_clock_start_is_flagged(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """Clocks justify revoke and reclaim deadlines, so audit checks them (DECISIONS 13)."""
    db = simulated(capsys, OVERUSE, tmp_path / "ov.db")
    records = rows(db)
    clocks = [(o, ts, e) for o, ts, e in records if e["kind"] == "ClocksObserved"]
    assert clocks, "the overuse example samples its clocks"
    code, document = audit_json(capsys, db)
    assert code == 0
    assert any(d["kind"] == "ClocksObserved" for d in document["decisions"])
    offset, ts, first = clocks[0]
    forged = {**first, "owing_started": {**first.get("owing_started", {}), "team-b": ts}}
    tampered = [(o, t, forged if o == offset else e) for o, t, e in records]
    code, document = audit_json(capsys, export(tmp_path / "forged.jsonl", tampered))
    assert code == 1
    flagged = [d for d in document["decisions"] if d["kind"] == "ClocksObserved" and d["problems"]]
    assert flagged[0]["problems"] == [f"team-b did not owe at basis #{first['basis']}"]


def test_the_lagging_fold_never_reads_past_what_the_main_fold_passed() -> None:
    """A (forged) basis beyond the records fed so far gives the state through the
    last record fed, whether the buffer holds it or it must be read again."""
    simulation = Simulation()
    lines = [line.encode() for line in QUOTA_DECREASE.read_text().splitlines() if line.strip()]
    simulation.run(zip([1_767_225_600_000] * len(lines), lines, strict=True))
    records: list[Record] = simulation.records
    through = Projection()
    for record in records[:4]:
        through.apply_record(record)
    fresh = LaggingFold(lambda start: records[start:], fed=3)  # a segment starting at 4
    assert fresh.at(len(records) - 1).offset == 3
    assert state_json(fresh.projection.state) == state_json(through.state)
    buffered = LaggingFold(lambda start: records[start:])
    for record in records[:4]:
        buffered.push(record)
    assert buffered.at(len(records) - 1).offset == 3
