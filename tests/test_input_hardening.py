"""Bad input never stops a stream nor crashes a command
(DESIGN §4, §8 rules 3-6, §9; DECISIONS 31-34).

- A bad or out-of-bounds line is a FactRejected record and the stream goes on;
  ``--strict`` stops at the first with FILE:LINE and the field (DECISIONS 31).
- Bounds at decode: amounts ≤ 2^62, delays ≤ ten years, times 1970 .. 9000,
  and the projection itself survives any value (DECISIONS 33, 34).
- A time without offset is UTC on every machine.
- What is not JSONL is refused whole, before a ledger is created (DECISIONS 32).
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from quotaledger.adapters.cli import build_parser, main
from quotaledger.events.model import PodUpserted, QuotaUpserted
from quotaledger.events.times import MAX_DELAY_S, rfc3339
from quotaledger.projections import Projection, state_json

REPO = Path(__file__).resolve().parent.parent
EXE = Path(sys.executable).parent / "quotaledger"
QUOTA_DECREASE = REPO / "examples" / "quota-decrease.jsonl"

SETTINGS = {
    "kind": "SettingsChanged",
    "at": "2026-01-01T00:00:00Z",
    "quota_preemption_enabled": True,
}
NODE = {"kind": "NodeUpserted", "name": "n1", "allocatable": {"cpu": "16", "memory": "64Gi"}}
QUOTA = {"kind": "QuotaUpserted", "name": "q", "max": {"cpu": "8"}, "preemption_delay_s": 60}


def pod(uid: str, **extra: Any) -> dict[str, Any]:
    return {
        "kind": "PodUpserted",
        "uid": uid,
        "name": uid,
        "namespace": "q",
        "requests": {"cpu": "2"},
        "phase": "Running",
        "node": "n1",
        **extra,
    }


def line(item: dict[str, Any] | str) -> str:
    return item if isinstance(item, str) else json.dumps(item)


def write(path: Path, *items: dict[str, Any] | str) -> Path:
    path.write_text("".join(line(item) + "\n" for item in items))
    return path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


def replay_json(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    code, out, err = run(capsys, "replay", *argv, "--json")
    assert code == 0, err
    document: dict[str, Any] = json.loads(out)
    return document


def sqlite_payloads(path: Path) -> list[tuple[int, bytes]]:
    with sqlite3.connect(path) as conn:
        rows = conn.execute("select offset, payload from records order by offset").fetchall()
    return [
        (int(offset), payload.encode() if isinstance(payload, str) else bytes(payload))
        for offset, payload in rows
    ]


# --------------------------------------------------------- 1. keep going

#: Lines that once stopped every stream with exit 2 (DECISIONS 31), and the
#: out-of-bounds ones of §9, each with the field its error must name.
BAD_LINES = [
    ({"kind": "PodExploded"}, "PodExploded", "$.kind"),
    (pod("px", requests={"cpu": -1}), "PodUpserted", "$.requests.cpu"),
    (
        {"kind": "QuotaUpserted", "name": "z", "preemption_delay_s": -1},
        "QuotaUpserted",
        "$.preemption_delay_s",
    ),
    ({"kind": "NamespaceWeighted", "namespace": "q", "weight": 0}, "NamespaceWeighted", "$.weight"),
    (
        {"kind": "QuotaUpserted", "name": "z", "preemption_delay_s": 1e308},
        "QuotaUpserted",
        "$.preemption_delay_s",
    ),
    (
        {"kind": "QuotaUpserted", "name": "z", "preemption_delay_s": 1e12},
        "QuotaUpserted",
        "$.preemption_delay_s",
    ),
    ({"kind": "SettingsChanged", "revoke_after_s": 4e8}, "SettingsChanged", "$.revoke_after_s"),
    ({"kind": "SettingsChanged", "reclaim_after_s": 1e300}, "SettingsChanged", "$.reclaim_after_s"),
    ({"kind": "NodeRemoved", "name": "x", "at": "9999-12-31T23:59:30Z"}, "NodeRemoved", "$.at"),
    ({"kind": "NodeRemoved", "name": "x", "at": "1969-12-31T23:59:59Z"}, "NodeRemoved", "$.at"),
    (pod("px", created_at="9500-01-01T00:00:00"), "PodUpserted", "$.created_at"),
    (
        {"kind": "NodeUpserted", "name": "big", "allocatable": {"memory": "20Ei"}},
        "NodeUpserted",
        "$.allocatable.memory",
    ),
    (
        {"kind": "NodeUpserted", "name": "big", "allocatable": {"cpu": 2**80}},
        "NodeUpserted",
        "$.allocatable.cpu",
    ),
    (pod("px", priority=2**40), "PodUpserted", "$.priority"),
    ('{"kind": "PodRemoved", "uid": ', None, "malformed JSON"),
]
BAD_IDS = [f"{kind}:{field}" for _, kind, field in BAD_LINES]


def stream_file(tmp_path: Path, bad: dict[str, Any] | str) -> Path:
    """Line 4 is bad; line 5 (pod b) must still be folded."""
    return write(tmp_path / "events.jsonl", SETTINGS, NODE, QUOTA, bad, pod("b"))


@pytest.mark.parametrize(("bad", "kind", "field"), BAD_LINES, ids=BAD_IDS)
def test_replay_keeps_a_bad_line_as_rejected_and_goes_on(
    bad: dict[str, Any] | str,
    kind: str | None,
    field: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = stream_file(tmp_path, bad)
    document = replay_json(capsys, str(path))
    assert [(r["offset"], r["kind"]) for r in document["rejected"]] == [(4, kind)]
    assert field in document["rejected"][0]["reason"]
    assert "line 4" in document["rejected"][0]["reason"]
    assert document["offset"] == 5
    assert document["quotas"]["q"]["pods"] == ["b"]


@pytest.mark.parametrize(("bad", "kind", "field"), BAD_LINES, ids=BAD_IDS)
def test_strict_stops_at_the_bad_line_naming_file_line_and_field(
    bad: dict[str, Any] | str,
    kind: str | None,
    field: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = stream_file(tmp_path, bad)
    for command in (["replay", "--json"], ["simulate", "--json"], ["tree"]):
        code, out, err = run(capsys, command[0], str(path), "--strict", *command[1:])
        assert code == 2
        assert err.startswith(f"quotaledger: error: {path}:4: ")
        assert field in err
        assert out == ""


@pytest.mark.parametrize(("bad", "kind", "field"), BAD_LINES[:6], ids=BAD_IDS[:6])
def test_simulate_keeps_going_past_a_bad_line(
    bad: dict[str, Any] | str,
    kind: str | None,
    field: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = stream_file(tmp_path, bad)
    code, out, err = run(capsys, "simulate", str(path), "--json")
    assert code == 0, err
    state = json.loads(out)["state"]
    assert [(r["offset"], r["kind"]) for r in state["rejected"]] == [(4, kind)]
    assert state["quotas"]["q"]["pods"] == ["b"]
    # --skip-invalid, the old name of the default, is a no-op alias.
    assert run(capsys, "simulate", str(path), "--json", "--skip-invalid")[1] == out


@pytest.mark.parametrize(("bad", "kind", "field"), BAD_LINES[:6], ids=BAD_IDS[:6])
def test_ingest_keeps_the_raw_line_as_fact_rejected(
    bad: dict[str, Any] | str,
    kind: str | None,
    field: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = stream_file(tmp_path, bad)
    ledger = tmp_path / "ledger.db"
    code, out, err = run(capsys, "ingest", str(path), str(ledger))
    assert code == 0, err
    assert "appended 5 record(s)" in out
    offset, payload = sqlite_payloads(ledger)[4]
    rejected = json.loads(payload)
    assert rejected["kind"] == "FactRejected"
    assert rejected["offset"] == offset == 4
    assert rejected["raw"] == line(bad)
    assert rejected["rejected_kind"] == kind
    from_ledger = replay_json(capsys, str(ledger))
    from_file = replay_json(capsys, str(path))
    assert from_ledger["hash"] == from_file["hash"]
    assert from_ledger["rejected"] == from_file["rejected"]


# --------------------------------------------------------- 2. poison facts


def poison_file(tmp_path: Path, *tail: dict[str, Any] | str) -> Path:
    """Pods above a lowered max arm a quota-decrease timer: the delay is used."""
    return write(
        tmp_path / "poison.jsonl",
        SETTINGS,
        NODE,
        QUOTA,
        pod("a", created_at="2026-01-01T00:00:00Z"),
        pod("b", created_at="2026-01-01T00:00:01Z"),
        *tail,
    )


POISONS = [
    {"kind": "QuotaUpserted", "name": "q", "max": {"cpu": "2"}, "preemption_delay_s": 1e308},
    {"kind": "QuotaUpserted", "name": "q", "max": {"cpu": "2"}, "preemption_delay_s": 1e12},
    {
        "kind": "QuotaUpserted",
        "name": "q",
        "max": {"cpu": "2"},
        "preemption_delay_s": 60,
        "at": "9999-12-31T23:59:30Z",
    },
]


@pytest.mark.parametrize("poison", POISONS, ids=["1e308", "1e12", "year-9999"])
def test_a_poison_fact_never_crashes_a_later_command(
    poison: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = poison_file(tmp_path, poison)
    document = replay_json(capsys, str(path))
    assert [r["offset"] for r in document["rejected"]] == [6]
    ledger = tmp_path / "ledger.db"
    assert run(capsys, "ingest", str(path), str(ledger))[0] == 0
    assert run(capsys, "snapshot", str(ledger))[0] == 0
    assert replay_json(capsys, str(ledger))["hash"] == document["hash"]
    assert run(capsys, "audit", str(ledger))[0] == 0
    code, out, err = run(capsys, "simulate", str(path), "--json")
    assert code == 0, err
    assert json.loads(out)["state"]["hash"] == document["hash"]
    change = write(tmp_path / "change.jsonl", {"kind": "NodeRemoved", "name": "n1"})
    assert run(capsys, "whatif", str(ledger), "--change", str(change))[0] == 0
    assert run(capsys, "run", str(ledger), "--stop-after", "0.3", "--no-election")[0] == 0


def test_the_projection_survives_what_decoding_refuses() -> None:
    """Defence in depth (DECISIONS 34): structs built in Python skip the decoder."""
    projection = Projection()
    projection.apply(0, 0, QuotaUpserted(name="q", max={"cpu": 8000}))
    for uid in ("a", "b"):
        upsert = PodUpserted(
            uid=uid, name=uid, namespace="q", requests={"cpu": 2000}, phase="Running", node="n"
        )
        projection.apply(1 if uid == "a" else 2, 0, upsert)
    ts = 253_402_300_770_000  # 9999-12-31T23:59:30Z
    poison = QuotaUpserted(name="q", max={"cpu": 2000}, preemption_delay_s=1e308)
    assert projection.apply(3, ts, poison)
    state = projection.state
    assert state.decrease_deadlines["q"] == ts + MAX_DELAY_S * 1000
    document = state_json(state)
    # 3650 days later, over three leap days (10000, 10004, 10008)
    assert document["preemptions"]["q"]["deadline"] == "+010009-12-28T23:59:30Z"
    nan = QuotaUpserted(name="q", max={"cpu": 1000}, preemption_delay_s=float("nan"))
    assert projection.apply(4, ts, nan)
    assert "q" not in projection.state.decrease_deadlines  # a NaN delay is 0: disarmed
    state_json(projection.state)


@pytest.mark.parametrize(
    ("ts", "text"),
    [
        (0, "1970-01-01T00:00:00Z"),
        (1_078_041_600_001, "2004-02-29T08:00:00.001Z"),
        (253_402_300_799_999, "9999-12-31T23:59:59.999Z"),
        (253_402_300_800_000, "+010000-01-01T00:00:00Z"),
        (-1, "1969-12-31T23:59:59.999Z"),
        (-62_135_596_800_001, "0000-12-31T23:59:59.999Z"),  # ISO year 0 is 1 BC
        (-62_167_219_200_001, "-000001-12-31T23:59:59.999Z"),
        (10**18, "+31690708-07-05T01:46:40Z"),
    ],
)
def test_rfc3339_renders_any_integer(ts: int, text: str) -> None:
    assert rfc3339(ts) == text


def test_whatif_horizon_is_bounded(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = poison_file(tmp_path)
    change = write(tmp_path / "change.jsonl", {"kind": "NodeRemoved", "name": "n1"})
    for horizon in ("99999999d", "3651d", "9" * 400):
        code, _, err = run(
            capsys, "whatif", str(path), "--change", str(change), "--horizon", horizon
        )
        assert code == 2
        assert "--horizon" in err and "3650d" in err
    assert run(capsys, "whatif", str(path), "--change", str(change), "--horizon", "3650d")[0] == 0


# ----------------------------------------------------------- 4. time zone


def test_naive_times_are_utc_whatever_the_machine_zone(tmp_path: Path) -> None:
    """Pod a's naive created_at is 03:00 UTC (younger than b, evicted first);
    read in Asia/Tokyo's local time it was 18:00 UTC the day before."""
    path = write(
        tmp_path / "tz.jsonl",
        SETTINGS,
        NODE,
        {"kind": "QuotaUpserted", "name": "q", "max": {"cpu": "8"}, "preemption_delay_s": 10},
        pod("a", created_at="2026-01-01T03:00:00"),
        pod("b", created_at="2026-01-01T00:00:00Z"),
        {"kind": "QuotaUpserted", "name": "q", "max": {"cpu": "2"}, "preemption_delay_s": 10},
        {"kind": "NodeRemoved", "name": "unknown", "at": "2026-01-01T00:01:00"},
    )
    outputs = set()
    for zone in ("UTC", "Asia/Tokyo"):
        for seed in ("0", "4242"):
            env = {**os.environ, "TZ": zone, "PYTHONHASHSEED": seed}
            done = subprocess.run(
                [str(EXE), "simulate", str(path), "--json"],
                capture_output=True,
                env=env,
                timeout=120,
            )
            assert done.returncode == 0, done.stderr
            outputs.add(done.stdout)
    assert len(outputs) == 1
    result = json.loads(outputs.pop())
    evicted = [d["pod_uid"] for d in result["decisions"] if d["kind"] == "EvictionRequested"]
    assert evicted == ["a"]
    assert result["state"]["time"] == "2026-01-01T00:01:00Z"


# -------------------------------------------------------------- 5. ingest


def test_strict_ingest_stops_whole_lines_and_resumes_without_duplicates(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = [SETTINGS, NODE, QUOTA, *(pod(f"p{i}", requests={"cpu": "10m"}) for i in range(2500))]
    broken = [*good[:1800], '{"kind": "PodUpserted", "uid": "half', *good[1800:]]
    path = write(tmp_path / "events.jsonl", *broken)
    ledger = tmp_path / "ledger.db"
    code, out, err = run(capsys, "ingest", str(path), str(ledger), "--strict")
    assert code == 2
    assert f"{path}:1801:" in err
    assert "appended 1800 record(s)" in err
    assert "--from-line 1801" in err
    assert out == ""
    assert len(sqlite_payloads(ledger)) == 1 + 1800  # LedgerOpened + every line before
    # Fix the line in place, resume where it said.
    fixed = [*good[:1800], pod("fixed", requests={"cpu": "10m"}), *good[1800:]]
    write(path, *fixed)
    code, out, err = run(
        capsys, "ingest", str(path), str(ledger), "--strict", "--from-line", "1801"
    )
    assert code == 0, err
    assert f"appended {len(fixed) - 1800} record(s)" in out
    assert replay_json(capsys, str(ledger))["hash"] == replay_json(capsys, str(path))["hash"]
    assert len(sqlite_payloads(ledger)) == 1 + len(fixed)


def test_strict_ingest_failing_at_line_1_creates_no_ledger(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path / "events.jsonl", {"kind": "PodExploded"}, NODE)
    ledger = tmp_path / "ledger.db"
    code, _, err = run(capsys, "ingest", str(path), str(ledger), "--strict")
    assert code == 2
    assert "appended 0 record(s)" in err and "no ledger was created" in err
    assert not ledger.exists()


def test_from_line_skips_physical_lines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path / "events.jsonl", NODE, "", pod("x"), pod("y"))
    ledger = tmp_path / "ledger.db"
    code, out, _ = run(capsys, "ingest", str(path), str(ledger), "--from-line", "4")
    assert code == 0
    assert "appended 1 record(s)" in out
    assert replay_json(capsys, str(ledger))["quotas"]["default"]["pods"] == ["y"]
    assert run(capsys, "ingest", str(path), str(ledger), "--from-line", "0")[0] == 2


# ----------------------------------------------------------- 6. bad files


def _bad_inputs(root: Path, suffix: str) -> dict[str, Path]:
    directory = root / f"adir{suffix}"
    directory.mkdir(exist_ok=True)
    empty = root / f"empty{suffix}"
    empty.write_bytes(b"")
    garbage = root / f"garbage{suffix}"
    garbage.write_bytes(bytes(range(256)) * 16)
    return {
        "directory": directory,
        "missing": root / f"missing{suffix}",
        "empty": empty,
        "garbage": garbage,
    }


#: (name, argv with {} for the path under test, suffix, kind of position)
POSITIONS = [
    ("replay-jsonl", ["replay", "{}"], ".jsonl", "jsonl"),
    ("replay-db", ["replay", "{}"], ".db", "read"),
    ("tree-jsonl", ["tree", "{}"], ".jsonl", "jsonl"),
    ("tree-db", ["tree", "{}"], ".db", "read"),
    ("snapshot", ["snapshot", "{}"], ".db", "read"),
    ("audit-jsonl", ["audit", "{}"], ".jsonl", "jsonl"),
    ("audit-db", ["audit", "{}"], ".db", "read"),
    ("whatif-ledger-jsonl", ["whatif", "{}", "--change", "{good}"], ".jsonl", "jsonl"),
    ("whatif-ledger-db", ["whatif", "{}", "--change", "{good}"], ".db", "read"),
    ("whatif-change", ["whatif", "{good_db}", "--change", "{}"], ".jsonl", "jsonl"),
    ("simulate", ["simulate", "{}"], ".jsonl", "jsonl"),
    ("simulate-out", ["simulate", "{good}", "--out", "{}"], ".db", "new"),
    ("ingest-source", ["ingest", "{}", "{new_db}"], ".jsonl", "jsonl"),
    ("ingest-ledger", ["ingest", "{good}", "{}"], ".db", "write"),
    ("run", ["run", "{}", "--stop-after", "0.2", "--no-election"], ".db", "write"),
]

#: The documented exit status per kind of position and bad input (DECISIONS 32):
#: an empty JSONL file is a valid empty input; an empty file where a ledger is
#: created is a new ledger; a missing ledger a command creates is created.
EXPECTED = {
    "jsonl": {"directory": 2, "missing": 2, "empty": 0, "garbage": 2},
    "read": {"directory": 2, "missing": 2, "empty": 2, "garbage": 2},
    "write": {"directory": 2, "missing": 0, "empty": 0, "garbage": 2},
    "new": {"directory": 2, "missing": 0, "empty": 2, "garbage": 2},
}


@pytest.mark.parametrize("bad", ["directory", "missing", "empty", "garbage"])
@pytest.mark.parametrize(
    ("argv", "suffix", "position"),
    [position[1:] for position in POSITIONS],
    ids=[position[0] for position in POSITIONS],
)
def test_every_command_refuses_bad_files_cleanly(
    argv: list[str],
    suffix: str,
    position: str,
    bad: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    good = write(tmp_path / "good.jsonl", NODE, QUOTA, pod("a"))
    good_db = tmp_path / "good.db"
    assert main(["ingest", str(good), str(good_db)]) == 0
    capsys.readouterr()
    target = _bad_inputs(tmp_path, suffix)[bad]
    before = target.read_bytes() if target.is_file() else None
    new_db = tmp_path / "new.db"
    names = {"good": str(good), "good_db": str(good_db), "new_db": str(new_db)}
    args = [str(target) if item == "{}" else item.format(**names) for item in argv]
    code, _, err = run(capsys, *args)
    assert code == EXPECTED[position][bad], err
    if code == 2:
        assert err.startswith("quotaledger: error: "), err
        assert str(target.name) in err
        assert not new_db.exists()  # ingest-source: no ledger created for a bad input
        if before is not None:
            assert target.read_bytes() == before  # nothing written to a bad file
        if bad == "missing":
            assert not target.exists()


@pytest.mark.parametrize(
    "argv",
    [["ingest", "adir", "x.db"], ["simulate", "adir"], ["replay", "adir.jsonl"]],
)
def test_console_script_on_a_directory(argv: list[str], tmp_path: Path) -> None:
    (tmp_path / "adir").mkdir()
    (tmp_path / "adir.jsonl").mkdir()
    done = subprocess.run(
        [str(EXE), *argv], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2
    assert done.stderr.startswith("quotaledger: error: ")
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "x.db").exists()


def test_a_ledger_named_like_jsonl_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = write(tmp_path / "good.jsonl", NODE)
    other = tmp_path / "other.jsonl"
    code, _, err = run(capsys, "ingest", str(good), str(other))
    assert code == 2 and "swap" in err
    assert not other.exists()


# -------------------------------------------------------- 7. CLI details


def test_whatif_at_negative_names_at(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = poison_file(tmp_path)
    change = write(tmp_path / "change.jsonl", {"kind": "NodeRemoved", "name": "n1"})
    code, _, err = run(capsys, "whatif", str(path), "--change", str(change), "--at", "-3")
    assert code == 2
    assert "--at" in err and "--until" not in err and "negative" in err


def test_whatif_negative_horizon_is_refused_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = poison_file(tmp_path)
    change = write(tmp_path / "change.jsonl", {"kind": "NodeRemoved", "name": "n1"})
    code, _, err = run(capsys, "whatif", str(path), "--change", str(change), "--horizon", "-5m")
    assert code == 2
    assert "--horizon -5m: must not be negative" in err
    assert "expected one argument" not in err


@pytest.mark.parametrize(
    ("option", "value"),
    [("--stop-after", "-1"), ("--stop-after", "0"), ("--snapshot-every", "0")],
)
def test_run_refuses_non_positive_options(
    option: str, value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ledger = tmp_path / "ledger.db"
    with pytest.raises(SystemExit) as exited:
        main(["run", str(ledger), option, value])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {option}" in err
    assert "expected one argument" not in err
    assert not ledger.exists()


def test_an_offset_beyond_the_end_is_an_error_everywhere(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = poison_file(tmp_path)  # offsets 0..5
    ledger = tmp_path / "ledger.db"
    assert run(capsys, "ingest", str(path), str(ledger))[0] == 0
    change = write(tmp_path / "change.jsonl", {"kind": "NodeRemoved", "name": "n1"})
    for argv, option in (
        (["replay", str(path), "--until", "99999999"], "--until"),
        (["replay", str(ledger), "--until", "99999999"], "--until"),
        (["tree", str(ledger), "--until", "6"], "--until"),
        (["whatif", str(ledger), "--change", str(change), "--at", "99999"], "--at"),
        (["whatif", str(path), "--change", str(change), "--at", "6"], "--at"),
    ):
        code, out, err = run(capsys, *argv)
        assert code == 2, argv
        assert f"quotaledger: error: {option} " in err
        assert "the ledger ends at offset 5" in err
        assert out == ""
    assert replay_json(capsys, str(ledger), "--until", "5")["offset"] == 5


def test_dash_reads_standard_input(tmp_path: Path) -> None:
    path = poison_file(tmp_path, {"kind": "PodExploded"})
    data = path.read_bytes()

    def quotaledger(*argv: str, stdin: bytes | None = None) -> bytes:
        done = subprocess.run(
            [str(EXE), *argv], input=stdin, capture_output=True, cwd=tmp_path, timeout=120
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert quotaledger("replay", "-", "--json", stdin=data) == quotaledger(
        "replay", str(path), "--json"
    )
    assert quotaledger("simulate", "-", "--json", stdin=data) == quotaledger(
        "simulate", str(path), "--json"
    )
    quotaledger("ingest", "-", "ledger.db", stdin=data)
    assert (
        json.loads(quotaledger("replay", "ledger.db", "--json"))["hash"]
        == json.loads(quotaledger("replay", str(path), "--json"))["hash"]
    )
    change = json.dumps({"kind": "NodeRemoved", "name": "n1"}).encode() + b"\n"
    assert quotaledger("whatif", "ledger.db", "--change", "-", "--json", stdin=change) == (
        quotaledger(
            "whatif",
            "ledger.db",
            "--change",
            str(write(tmp_path / "c.jsonl", change.decode().strip())),
            "--json",
        )
    )


def test_a_byte_order_mark_is_accepted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plain = poison_file(tmp_path)
    with_bom = tmp_path / "bom.jsonl"
    with_bom.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes())
    code, out, err = run(capsys, "replay", str(with_bom), "--json", "--strict")
    assert code == 0, err
    document = json.loads(out)
    assert document["rejected"] == []
    assert document["hash"] == replay_json(capsys, str(plain))["hash"]


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.startswith("quotaledger 0.")


def test_every_option_of_every_command_has_a_help_text() -> None:
    import argparse

    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    missing = []
    for name, command in subparsers.choices.items():
        for action in command._actions:
            if action.help is None or (
                action.help != argparse.SUPPRESS and not action.help.strip()
            ):
                missing.append(f"{name} {'/'.join(action.option_strings) or action.dest}")
    assert missing == []
    help_text = subparsers.choices["ingest"].format_help()
    assert "--strict" in help_text and "--from-line" in help_text
    assert "--skip-invalid" not in help_text  # hidden alias


def test_simulate_text_uses_human_units(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "simulate", str(QUOTA_DECREASE))
    assert code == 0, err
    started = next(text for text in out.splitlines() if "PreemptionStarted" in text)
    finished = next(text for text in out.splitlines() if "PreemptionFinished" in text)
    assert started.endswith("target 30Gi")
    assert "claimed 4 cpu, 30Gi" in finished
    assert "{" not in started + finished


def test_audit_text_caps_a_clocks_observed_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    names = [f"team-{i:05d}" for i in range(3000)]
    clocks = {
        "kind": "ClocksObserved",
        "basis": 1,
        "owing_started": {name: 0 for name in names},
        "owing_stopped": names,
    }
    path = write(tmp_path / "ledger.jsonl", NODE, clocks)
    code, out, _ = run(capsys, "audit", str(path))
    assert code == 1  # none of them owed: flagged
    line_of_clocks = next(text for text in out.splitlines() if "clocks sampled" in text)
    assert max(len(text) for text in out.splitlines()) < 600
    assert len(line_of_clocks) < 600
    assert "and 2,995 more (3,000 in all)" in line_of_clocks
    assert "audit --json" in line_of_clocks
    code, out, _ = run(capsys, "audit", str(path), "--json")
    explanation = json.loads(out)["decisions"][0]["explanation"]
    assert all(name in explanation for name in names)


def test_until_and_created_at_without_offset_are_utc(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(
        tmp_path / "events.jsonl",
        {**NODE, "at": "2026-01-01T00:00:00"},
        {**pod("a"), "at": "2026-01-01T01:00:00", "created_at": "2026-01-01T00:30:00"},
    )
    document = replay_json(capsys, str(path), "--until", "2026-01-01T00:59:59")
    assert document["offset"] == 1
    assert document["time"] == "2026-01-01T00:00:00Z"
    assert datetime.fromisoformat("2026-01-01T00:00:00").tzinfo is None  # the input was naive


def test_simulate_rejection_offset_is_its_records_offset(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Decisions come before the bad line: its FactRejected still names its own offset."""
    path = tmp_path / "events.jsonl"
    later = {"kind": "NodeRemoved", "name": "none", "at": "2026-01-01T00:07:00Z"}
    path.write_text(QUOTA_DECREASE.read_text() + json.dumps(later) + "\n{broken\n")
    out_ledger = tmp_path / "sim.db"
    code, out, err = run(capsys, "simulate", str(path), "--json", "--out", str(out_ledger))
    assert code == 0, err
    result = json.loads(out)
    assert "PreemptionStarted" in [decision["kind"] for decision in result["decisions"]]
    [rejection] = result["state"]["rejected"]
    payloads = dict(sqlite_payloads(out_ledger))
    record = json.loads(payloads[rejection["offset"]])
    assert record["kind"] == "FactRejected"
    assert record["offset"] == rejection["offset"]
    assert record["raw"] == "{broken"


@pytest.mark.parametrize("option", ["--quotas", "--pods", "--nodes", "--events", "--rate"])
def test_bench_sizes_must_be_positive(option: str, capsys: pytest.CaptureFixture[str]) -> None:
    """bench takes no file; its sizes are refused by name, never a traceback."""
    with pytest.raises(SystemExit) as exited:
        main(["bench", "fold", option, "0"])
    assert exited.value.code == 2
    assert f"argument {option}: must be at least 1" in capsys.readouterr().err


def test_invalid_utf8_in_an_unknown_field_is_rejected(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "events.jsonl"
    path.write_bytes(b'{"kind": "NodeRemoved", "name": "n", "\xffnote": 1}\n')
    [rejection] = replay_json(capsys, str(path))["rejected"]
    assert rejection["kind"] == "NodeRemoved"
    assert "invalid UTF-8 at byte 38" in rejection["reason"]
