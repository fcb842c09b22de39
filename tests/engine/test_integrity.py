"""Integrity (DESIGN §9): the digest chain, LedgerDigest, verified snapshots, audit of
digests, parallel audit, read-only media."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quotaledger.adapters.cli import main
from quotaledger.adapters.ledgers.jsonl import records as jsonl_records
from quotaledger.adapters.ledgers.sqlite.connection import connect_read_only
from quotaledger.adapters.ledgers.sqlite.ledger import SqliteLedger
from quotaledger.engine.executors import SimulateExecutor
from quotaledger.engine.live import LiveEngine
from quotaledger.engine.restore import restore
from quotaledger.engine.simulate import Simulation
from quotaledger.events.codec import encode_event
from quotaledger.events.digest import GENESIS, DigestChain
from quotaledger.events.ledger import Append, LedgerGap, Record
from quotaledger.events.model import LedgerDigest
from quotaledger.projections import Projection, state_hash, state_json
from tests.paths import REPO

REPO = REPO
KOORDINATOR = REPO / "examples" / "koordinator.jsonl"
QUOTA_DECREASE = REPO / "examples" / "quota-decrease.jsonl"
OVERUSE = REPO / "examples" / "overuse.jsonl"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def replay_json(capsys: pytest.CaptureFixture[str], path: Path, *extra: str) -> dict[str, Any]:
    code, out, err = run(capsys, "replay", str(path), "--json", *extra)
    assert code == 0, err
    document: dict[str, Any] = json.loads(out)
    return document


def _with_one_pod_changed(blob: bytes) -> bytes:
    """The snapshot blob, still well-formed, with its first pod's cpu request changed."""
    body = json.loads(blob)
    pods = body["state"]["pods"]
    first = sorted(pods)[0]
    pods[first]["requests"] = {**pods[first]["requests"], "cpu": 123_000}
    return json.dumps(body, sort_keys=True).encode()


def rows(path: Path) -> list[tuple[int, int, bytes]]:
    with sqlite3.connect(path) as conn:
        conn.text_factory = bytes
        return [
            (int(o), int(t), bytes(p))
            for o, t, p in conn.execute("SELECT offset, ts, payload FROM records ORDER BY offset")
        ]


def manual_digest(records: list[tuple[int, int, bytes]]) -> str:
    """DESIGN §9 written out: d(n) = sha256(d(n-1) ‖ offset BE8 ‖ ts BE8 ‖ payload)."""
    digest = bytes(32)
    for offset, ts, payload in records:
        digest = hashlib.sha256(
            digest + offset.to_bytes(8, "big") + ts.to_bytes(8, "big") + payload
        ).digest()
    return digest.hex()


def simulated(capsys: pytest.CaptureFixture[str], example: Path, out: Path) -> Path:
    code, _, err = run(capsys, "simulate", str(example), "--out", str(out))
    assert code == 0, err
    return out


def set_payload(path: Path, offset: int, payload: bytes | str) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE records SET payload = ? WHERE offset = ?", (payload, offset))


def snapshot_blob(path: Path) -> tuple[int, bytes]:
    with sqlite3.connect(path) as conn:
        offset, blob = conn.execute(
            "SELECT offset, blob FROM snapshots ORDER BY offset DESC LIMIT 1"
        ).fetchone()
    return int(offset), bytes(blob)


def set_blob(path: Path, blob: bytes, *, checksum: bool = True, **columns: str) -> None:
    """Rewrite the snapshot's blob (and its checksum, as a forger would, unless told)."""
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE snapshots SET blob = ?", (blob,))
        if checksum:
            conn.execute("UPDATE snapshots SET checksum = ?", (hashlib.sha256(blob).hexdigest(),))
        for column, value in columns.items():
            conn.execute(f"UPDATE snapshots SET {column} = ?", (value,))


# ---------------------------------------------------------------- the digest chain


def test_digest_chain_is_the_formula_of_design_9() -> None:
    chain = DigestChain()
    assert chain.digest == GENESIS == bytes(32) and chain.through == -1
    first = Record(0, 5, b'{"kind":"LedgerOpened","ledger_id":"x"}')
    second = Record(1, 2**40, b"anything")
    chain.update(first)
    chain.update(second)
    assert chain.hex == manual_digest([(0, 5, first.payload), (1, 2**40, b"anything")])
    with pytest.raises(LedgerGap, match="records are missing"):
        chain.update(Record(3, 0, b""))


def test_replay_json_reports_the_digest_of_the_last_record_folded(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    document = replay_json(capsys, KOORDINATOR)
    file_records = [
        (r.offset, r.ts, r.payload) for r in jsonl_records(KOORDINATOR, skip_invalid=False)
    ]
    assert document["digest"] == manual_digest(file_records)
    until = replay_json(capsys, KOORDINATOR, "--until", "3")
    assert until["offset"] == 3 and until["digest"] == manual_digest(file_records[:4])
    ledger = tmp_path / "ledger.db"
    assert run(capsys, "ingest", str(KOORDINATOR), str(ledger))[0] == 0
    stored = replay_json(capsys, ledger)
    assert stored["digest"] == manual_digest(rows(ledger))
    assert run(capsys, "snapshot", str(ledger))[0] == 0
    from_snapshot = replay_json(capsys, ledger)
    assert from_snapshot["digest"] == manual_digest(rows(ledger))
    assert replay_json(capsys, ledger, "--no-snapshot")["digest"] == from_snapshot["digest"]
    assert replay_json(capsys, ledger, "--until", "4")["digest"] == manual_digest(rows(ledger)[:5])


# ---------------------------------------------------------------- LedgerDigest


def _simulation_records() -> list[Record]:
    simulation = Simulation()
    lines = [line.encode() for line in OVERUSE.read_text().splitlines() if line.strip()]
    simulation.run((0, line) for line in lines)
    return list(simulation.records)


SIMULATED = _simulation_records()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(min_value=1, max_value=len(SIMULATED)), max_size=8))
def test_ledger_digest_records_change_neither_state_nor_hash(positions: list[int]) -> None:
    """The projection ignores LedgerDigest (DESIGN §9): inserting any number of them
    anywhere leaves the state JSON (but the offset) and the hash as they were."""
    plain = Projection()
    for record in SIMULATED:
        plain.apply_record(record)
    with_digests = Projection()
    offset = 0
    inserted = sorted(positions)
    for index, record in enumerate(SIMULATED):
        while inserted and inserted[0] == index:
            inserted.pop(0)
            anchor = LedgerDigest(through=offset - 1, digest="00" * 32, state_hash="x")
            assert with_digests.apply_record(
                Record(offset, record.ts + 10**9, encode_event(anchor))
            )
            offset += 1
        with_digests.apply_record(Record(offset, record.ts, record.payload))
        offset += 1
    left, right = state_json(plain.state), state_json(with_digests.state)
    assert right["offset"] == left["offset"] + len(positions) - len(inserted)
    assert right["time"] == left["time"]
    left.pop("offset"), right.pop("offset")
    assert left == right
    assert state_hash(plain.state) == state_hash(with_digests.state)


# ---------------------------------------------------------------- verified snapshots


@pytest.fixture
def snapshotted(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> Path:
    ledger = simulated(capsys, OVERUSE, tmp_path / "ov.db")
    code, _out, err = run(capsys, "snapshot", str(ledger))
    assert code == 0, err
    return ledger


def test_snapshot_stores_digest_and_hash_and_is_anchored_by_a_ledger_digest(
    capsys: pytest.CaptureFixture[str], snapshotted: Path
) -> None:
    with sqlite3.connect(snapshotted) as conn:
        offset, digest, hashed = conn.execute(
            "SELECT offset, digest, state_hash FROM snapshots"
        ).fetchone()
    records = rows(snapshotted)
    assert digest == manual_digest(records[: offset + 1])
    anchor = json.loads(records[-1][2])
    assert anchor == {
        "kind": "LedgerDigest",
        "at": None,
        "through": offset,
        "digest": digest,
        "state_hash": hashed,
    }
    code, _, err = run(capsys, "replay", str(snapshotted))
    assert code == 0 and "warning" not in err


def _fallback(capsys: pytest.CaptureFixture[str], ledger: Path, offset: int, why: str) -> None:
    """A damaged snapshot: a warning naming it, then the full replay's hash."""
    code, out, err = run(capsys, "replay", str(ledger), "--json")
    assert code == 0, err
    assert f"quotaledger: warning: snapshot at offset {offset} not used: " in err
    assert why in err
    assert "replaying from offset 0" in err
    full = replay_json(capsys, ledger, "--no-snapshot")
    assert json.loads(out) == full
    for command in ("tree", "snapshot"):
        code, _, err = run(capsys, command, str(ledger))
        assert code == 0 and f"snapshot at offset {offset} not used" in err


@pytest.mark.parametrize("checksum", [False, True])
def test_flipped_bytes_in_the_snapshot_blob(
    checksum: bool, capsys: pytest.CaptureFixture[str], snapshotted: Path
) -> None:
    """Before: a UnicodeDecodeError traceback. Damage is caught by the checksum, and
    with the checksum recomputed, by decoding (any exception: unreadable)."""
    offset, blob = snapshot_blob(snapshotted)
    damaged = bytearray(blob)
    for index in range(10, len(damaged), 7):
        damaged[index] ^= 0xFF
    set_blob(snapshotted, bytes(damaged), checksum=checksum)
    why = "unreadable blob" if checksum else "does not match its checksum"
    _fallback(capsys, snapshotted, offset, why)


def test_a_snapshot_rewritten_with_other_numbers(
    capsys: pytest.CaptureFixture[str], snapshotted: Path
) -> None:
    """A well-formed snapshot, one pod's cpu changed: before, replay printed a wrong hash."""
    offset, blob = snapshot_blob(snapshotted)
    set_blob(snapshotted, _with_one_pod_changed(blob))
    _fallback(capsys, snapshotted, offset, "its state hashes to")


def test_a_snapshot_forged_with_its_hash_is_caught_by_the_ledger_digest(
    capsys: pytest.CaptureFixture[str], snapshotted: Path
) -> None:
    offset, blob = snapshot_blob(snapshotted)
    from quotaledger.projections.snapshot import load

    forged = _with_one_pod_changed(blob)
    set_blob(snapshotted, forged, state_hash=state_hash(load(forged)))
    _fallback(capsys, snapshotted, offset, "LedgerDigest at offset")


def test_a_snapshot_without_digest_columns_is_unverifiable(
    capsys: pytest.CaptureFixture[str], snapshotted: Path
) -> None:
    """A file written before the columns existed: not used, then upgraded by `snapshot`."""
    offset, blob = snapshot_blob(snapshotted)
    with sqlite3.connect(snapshotted) as conn:
        conn.execute("DROP TABLE snapshots")
        conn.execute("CREATE TABLE snapshots (offset INTEGER PRIMARY KEY, blob BLOB NOT NULL)")
        conn.execute("INSERT INTO snapshots VALUES (?, ?)", (offset, blob))
    _fallback(capsys, snapshotted, offset, "unverifiable")
    code, _, err = run(capsys, "replay", str(snapshotted))
    assert code == 0 and "warning" not in err  # `snapshot` stored a verifiable one


def test_snapshot_of_another_ledger_is_not_used(
    capsys: pytest.CaptureFixture[str], snapshotted: Path, tmp_path: Path
) -> None:
    other = simulated(capsys, QUOTA_DECREASE, tmp_path / "other.db")
    assert run(capsys, "snapshot", str(other))[0] == 0
    offset, blob = snapshot_blob(other)
    with sqlite3.connect(other) as conn:
        meta = conn.execute("SELECT digest, state_hash, checksum FROM snapshots").fetchone()
    with sqlite3.connect(snapshotted) as conn:
        conn.execute(
            "INSERT OR REPLACE INTO snapshots VALUES (?, ?, ?, ?, ?)", (offset, blob, *meta)
        )
    code, out, err = run(capsys, "replay", str(snapshotted), "--until", str(offset), "--json")
    assert code == 0, err
    assert "belongs to ledger" in err
    assert json.loads(out) == replay_json(
        capsys, snapshotted, "--until", str(offset), "--no-snapshot"
    )


def test_a_gap_in_the_records_is_a_clear_error(
    capsys: pytest.CaptureFixture[str], snapshotted: Path
) -> None:
    with sqlite3.connect(snapshotted) as conn:
        conn.execute("DELETE FROM records WHERE offset = 3")
    code, _, err = run(capsys, "replay", str(snapshotted), "--no-snapshot")
    assert code == 2
    assert "quotaledger: error:" in err and "records are missing" in err
    code, out, _ = run(capsys, "audit", str(snapshotted), "--json")
    assert code == 1
    assert json.loads(out)["damage"] == [
        "record 3 is missing: the next record read is 4 (records were removed or the file is"
        " damaged); nothing after it was audited"
    ]


# ---------------------------------------------------------------- audit of digests


def _two_anchors(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> tuple[Path, int, int]:
    """A ledger with LedgerDigest records for offsets a and b (a < b)."""
    ledger = simulated(capsys, OVERUSE, tmp_path / "ov.db")
    assert run(capsys, "snapshot", str(ledger))[0] == 0
    first = len(rows(ledger)) - 2
    extra = tmp_path / "more.jsonl"
    extra.write_text(
        "\n".join(
            json.dumps({"kind": "NodeUpserted", "name": f"extra-{i}", "allocatable": {"cpu": 1}})
            for i in range(4)
        )
        + "\n"
    )
    assert run(capsys, "ingest", str(extra), str(ledger))[0] == 0
    assert run(capsys, "snapshot", str(ledger))[0] == 0
    second = len(rows(ledger)) - 2
    return ledger, first, second


def _digest_problems(document: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for check in document["digests"] for p in check["problem_data"]]


def test_audit_verifies_every_ledger_digest(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    ledger, first, second = _two_anchors(capsys, tmp_path)
    code, out, _err = run(capsys, "audit", str(ledger), "--json")
    assert code == 0, out
    document = json.loads(out)
    assert [(c["through"], c["verified"]) for c in document["digests"]] == [
        (first, True),
        (second, True),
    ]
    assert document["tampered"] == 0
    assert document["covered_through"] == second
    assert document["digest"] == manual_digest(rows(ledger))
    code, text, _ = run(capsys, "audit", str(ledger))
    assert code == 0
    assert f"digest of records 0..{second} verified (LedgerDigest #{second + 1})" in text
    last = len(rows(ledger)) - 1
    assert f"records {second + 1}..{last} are covered by no matching digest" in text


@pytest.mark.parametrize("where", ["before-first", "between"])
def test_audit_reports_a_changed_record_with_its_offset(
    where: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Before: a changed record body was invisible to audit."""
    ledger, first, second = _two_anchors(capsys, tmp_path)
    records = rows(ledger)
    target = 2 if where == "before-first" else second - 1
    original = json.loads(records[target][2])
    changed = (
        json.dumps({**original, "allocatable": {"cpu": 999}})
        if "allocatable" in original
        else (records[target][2].decode().replace("}", " }"))
    )
    set_payload(ledger, target, changed)
    code, out, _ = run(capsys, "audit", str(ledger), "--json")
    assert code == 1
    document = json.loads(out)
    assert document["tampered"] >= 1
    problems = _digest_problems(document)
    located = problems[0]
    assert located["code"] == "digest-mismatch"
    assert located["first"] <= target <= located["last"]
    if where == "between":
        assert (located["first"], located["last"]) == (first + 1, second)
    else:
        assert (located["first"], located["last"]) == (0, first)
        # the second digest fails too, but the records after the first are as recorded
        mismatches = [p for p in problems if p["code"] == "digest-mismatch"]
        assert len(mismatches) == 2 and mismatches[1]["consistent_after"] == first
    code, text, _ = run(capsys, "audit", str(ledger))
    assert code == 1 and "TAMPERED" in text and "was changed after this digest was taken" in text


def test_audit_single_changed_record_is_named(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    ledger = simulated(capsys, QUOTA_DECREASE, tmp_path / "qd.db")
    document = replay_json(capsys, ledger, "--until", "5")
    four = replay_json(capsys, ledger, "--until", "4")["digest"]
    args = ["--digest", f"4:{four}", "--digest", f"5:{document['digest']}"]
    code, out, _ = run(capsys, "audit", str(ledger), "--json", *args)
    assert code == 0, out
    set_payload(ledger, 5, rows(ledger)[5][2] + b" ")
    code, out, _ = run(capsys, "audit", str(ledger), "--json", *args)
    assert code == 1
    problem = _digest_problems(json.loads(out))[0]
    assert (problem["first"], problem["last"]) == (5, 5)
    code, text, _ = run(capsys, "audit", str(ledger), *args)
    assert "record 5 was changed" in text


def test_audit_digest_kept_elsewhere(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    ledger = simulated(capsys, QUOTA_DECREASE, tmp_path / "qd.db")
    kept = replay_json(capsys, ledger)
    last = kept["offset"]
    good = f"{last}:{kept['digest']}"
    assert run(capsys, "audit", str(ledger), "--digest", good)[0] == 0
    code, out, _ = run(capsys, "audit", str(ledger), "--digest", f"{last}:{'0' * 64}")
    assert code == 1 and "TAMPERED" in out
    code, out, _ = run(capsys, "audit", str(ledger), "--json", "--digest", f"{last + 5}:{'a' * 64}")
    assert code == 1
    assert _digest_problems(json.loads(out))[0]["code"] == "beyond-end"
    code, _, err = run(capsys, "audit", str(ledger), "--digest", "12:nothex")
    assert code == 2 and "--digest" in err
    # removing the last record is caught by a digest kept for it
    with sqlite3.connect(ledger) as conn:
        conn.execute("DELETE FROM records WHERE offset = ?", (last,))
    assert run(capsys, "audit", str(ledger), "--digest", good)[0] == 1


def test_audit_checks_the_state_hash_of_a_ledger_digest(
    capsys: pytest.CaptureFixture[str], snapshotted: Path
) -> None:
    records = rows(snapshotted)
    offset = len(records) - 1
    anchor = json.loads(records[offset][2])
    set_payload(snapshotted, offset, json.dumps({**anchor, "state_hash": "f" * 64}))
    code, out, _ = run(capsys, "audit", str(snapshotted), "--json")
    assert code == 1
    codes = [p["code"] for p in _digest_problems(json.loads(out))]
    assert codes == ["state-hash-mismatch"]


# ---------------------------------------------------------------- parallel audit


def _audit_json(capsys: pytest.CaptureFixture[str], path: Path, *extra: str) -> tuple[int, Any]:
    code, out, err = run(capsys, "audit", str(path), "--json", *extra)
    assert code in (0, 1), err
    return code, json.loads(out)


def test_parallel_audit_equals_one_process(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    ledger, _, _ = _two_anchors(capsys, tmp_path)
    qd = simulated(capsys, QUOTA_DECREASE, tmp_path / "qd.db")
    assert run(capsys, "snapshot", str(qd))[0] == 0
    for path in (ledger, qd):
        single = _audit_json(capsys, path)
        for jobs in ("2", "3"):
            assert _audit_json(capsys, path, "--jobs", jobs) == single
    # tampered: an edited eviction (its preemption started in an earlier segment
    # with --jobs 3) and a changed record covered by the LedgerDigest
    evicted = next(o for o, _, p in rows(qd) if b"EvictionRequested" in p)
    event = json.loads(rows(qd)[evicted][2])
    set_payload(qd, evicted, json.dumps({**event, "pod_uid": "spark-2"}))
    single = _audit_json(capsys, qd)
    assert single[0] == 1 and single[1]["flagged"] >= 1 and single[1]["tampered"] == 1
    for jobs in ("2", "3", "5"):
        assert _audit_json(capsys, qd, "--jobs", jobs) == single


# ---------------------------------------------------------------- the live engine


async def _run_engine(path: Path, facts: list[bytes]) -> list[Record]:
    ledger = await SqliteLedger.open(str(path), create=True, clock_ms=lambda: 1_000)
    engine = LiveEngine(
        ledger,
        SimulateExecutor(),
        instance="e1",
        digest_every=5,
        snapshot_every=12,
        idle_poll_s=0.01,
    )
    stop = asyncio.Event()
    ready = asyncio.Event()

    async def on_ready() -> None:
        ready.set()

    task = asyncio.create_task(engine.run(stop, on_ready))
    await ready.wait()  # elected: the leader appends the digests
    for start in range(0, len(facts), 4):
        await ledger.append([Append(payload=fact) for fact in facts[start : start + 4]])
    async with asyncio.timeout(60):
        while True:
            snapshot = await ledger.load_snapshot()
            kinds = [r.payload for batch in [b async for b in ledger.read(0)] for r in batch]
            if snapshot is not None and sum(b"LedgerDigest" in k for k in kinds) >= 3:
                break
            await asyncio.sleep(0.02)
    stop.set()
    await task
    # A checkpoint's LedgerDigest the writer had already taken when the stop
    # cancelled the engine is committed by close(), not before (DECISIONS 52):
    # read the ledger as the next process would, after the close.
    await ledger.close()
    ledger = await SqliteLedger.open(str(path), create=False, read_only=True)
    out = [r for batch in [b async for b in ledger.read(0)] for r in batch]
    restored = await restore(ledger, warn=pytest.fail)
    assert restored.snapshot == snapshot.offset
    everything = [(r.offset, r.ts, r.payload) for r in out]
    assert restored.fold.chain.through == out[-1].offset
    assert restored.digest == manual_digest(everything)
    assert snapshot.digest == manual_digest(
        [(r.offset, r.ts, r.payload) for r in out][: snapshot.offset + 1]
    )
    await ledger.close()
    return out


def test_live_engine_appends_ledger_digests_and_verified_snapshots(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    facts = [
        json.dumps({"kind": "NodeUpserted", "name": f"n{i}", "allocatable": {"cpu": 4}}).encode()
        for i in range(20)
    ]
    path = tmp_path / "live.db"
    records = asyncio.run(_run_engine(path, facts))
    anchors = [json.loads(r.payload) for r in records if b"LedgerDigest" in r.payload]
    assert len(anchors) >= 3
    code, document = _audit_json(capsys, path)
    assert code == 0
    assert len(document["digests"]) == len(anchors)
    assert all(check["verified"] for check in document["digests"])


# ---------------------------------------------------------------- read-only media


def _ledger_in(directory: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    directory.mkdir()
    ledger = simulated(capsys, QUOTA_DECREASE, directory / "qd.db")
    assert run(capsys, "snapshot", str(ledger))[0] == 0
    assert not (directory / "qd.db-wal").exists()  # the last close checkpointed
    return ledger


def test_read_only_fallback_to_immutable(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The URI fallback itself: when ``mode=ro`` cannot open (here: forced with a VFS
    that does not exist), ``immutable=1`` reads the file."""
    ledger = _ledger_in(tmp_path / "d", capsys)
    conn, params = connect_read_only(
        str(ledger), 1000, tries=("mode=ro&vfs=no-such-vfs", "mode=ro&immutable=1")
    )
    assert params == "mode=ro&immutable=1"
    assert conn.execute("SELECT count(*) FROM records").fetchone()[0] == len(rows(ledger))
    conn.close()


CHANGE = '{"kind": "QuotaUpserted", "name": "analytics", "max": {"memory": "10Gi"}}\n'


def _read_only_commands(ledger: Path, change: Path) -> list[list[str]]:
    return [
        ["replay", str(ledger), "--json"],
        ["tree", str(ledger)],
        ["audit", str(ledger)],
        ["whatif", str(ledger), "--change", str(change)],
    ]


def _can_bind_read_only() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "-m", "sh", "-c", "mount --bind -o ro /tmp /tmp && ! touch /tmp/.ql-probe"],
        capture_output=True,
    )
    return probe.returncode == 0


def test_read_only_medium(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """DESIGN §9: every read-only command reads a ledger on a read-only medium; a
    command that writes fails with a clear error. As a normal user a chmod'ed
    directory is read-only; as root (chmod does not stop root) a read-only bind
    mount in a private mount namespace (``unshare -m``), run in a subprocess."""
    directory = tmp_path / "ro"
    ledger = _ledger_in(directory, capsys)
    change = tmp_path / "change.jsonl"
    change.write_text(CHANGE)
    expected = replay_json(capsys, ledger)
    if os.geteuid() != 0:
        ledger.chmod(0o444)
        directory.chmod(0o555)
        try:
            for argv in _read_only_commands(ledger, change):
                code, out, err = run(capsys, *argv)
                assert code == 0, (argv, err)
                if argv[0] == "replay":
                    assert json.loads(out) == expected
            code, _, err = run(capsys, "snapshot", str(ledger))
            assert code == 2 and "for writing" in err
        finally:
            directory.chmod(0o755)
            ledger.chmod(0o644)
        return
    if not _can_bind_read_only():
        pytest.skip("root without mount namespaces: see test_read_only_fallback_to_immutable")
    script = [f"mount --bind -o ro {directory} {directory}"]
    cli = f"{sys.executable} -m quotaledger.adapters.cli"
    for argv in _read_only_commands(ledger, change):
        script.append(f"{cli} {' '.join(argv)} > {tmp_path}/{argv[0]}.out || exit 10")
    script.append(
        f"{cli} snapshot {ledger} 2> {tmp_path}/snapshot.err; echo $? > {tmp_path}/snapshot.rc"
    )
    script.append(f"touch {directory}/probe 2>/dev/null && exit 11; exit 0")
    result = subprocess.run(
        ["unshare", "-m", "sh", "-c", " && ".join(script[:1]) + " && " + "; ".join(script[1:])],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads((tmp_path / "replay.out").read_text()) == expected
    assert (tmp_path / "snapshot.rc").read_text().strip() == "2"
    assert "for writing" in (tmp_path / "snapshot.err").read_text()
    assert not (directory / "probe").exists()
