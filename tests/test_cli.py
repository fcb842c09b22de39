"""The ``quotaledger`` command line (DESIGN §3 JSONL replay, §7 state JSON, §8 rules 5-6)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from quotaledger.adapters.cli import main

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "koordinator.jsonl"
EXE = Path(sys.executable).parent / "quotaledger"

TOP_KEYS = {"offset", "time", "hash", "digest", "cluster", "quotas", "preemptions", "rejected"}
CLUSTER_KEYS = {"allocatable", "system_used", "default_used", "total"}
QUOTA_KEYS = {
    "parent",
    "is_parent",
    "orphan",
    "min",
    "max",
    "effective_min",
    "shared_weight",
    "allow_lent",
    "lending_limit",
    "borrowing_limit",
    "request",
    "limited_request",
    "used",
    "runtime",
    "available",
    "pods",
    "children",
    "namespaces",
}
NAMESPACE_KEYS = {"weight", "request", "used", "fair_share"}
EPOCH = "1970-01-01T00:00:00Z"

NODE = {"kind": "NodeUpserted", "name": "n1", "allocatable": {"cpu": "16", "memory": "64Gi"}}
QUOTA = {"kind": "QuotaUpserted", "name": "q", "min": {"cpu": "2"}, "max": {"cpu": "8"}}


def pod(uid: str, **extra: Any) -> dict[str, Any]:
    return {
        "kind": "PodUpserted",
        "uid": uid,
        "name": uid,
        "namespace": "q",
        "requests": {"cpu": "1"},
        **extra,
    }


def write(path: Path, *lines: dict[str, Any] | str) -> Path:
    path.write_text(
        "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines)
    )
    return path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def state(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, Any]:
    code, out, err = run(capsys, "replay", *argv, "--json")
    assert code == 0, err
    document: dict[str, Any] = json.loads(out)
    return document


# ------------------------------------------------------------- state JSON


def test_replay_example_prints_the_state_json(capsys: pytest.CaptureFixture[str]) -> None:
    document = state(capsys, str(EXAMPLE))
    assert set(document) == TOP_KEYS
    assert set(document["cluster"]) == CLUSTER_KEYS
    lines = [line for line in EXAMPLE.read_text().splitlines() if line.strip()]
    assert document["offset"] == len(lines)
    assert document["time"] == "2026-01-01T00:01:00Z"
    assert isinstance(document["hash"], str) and document["hash"]
    for rejection in document["rejected"]:
        assert set(rejection) == {"offset", "kind", "reason"}
    assert isinstance(document["preemptions"], dict)
    quotas = document["quotas"]
    assert {"research", "team-a", "team-b", "team-c", "team-d", "batch"} <= set(quotas)
    for name, quota in quotas.items():
        assert set(quota) == QUOTA_KEYS, name
        for ns, info in quota["namespaces"].items():
            assert set(info) == NAMESPACE_KEYS, (name, ns)
    # Canonical integers, children and pods sorted, unlimited max is null.
    assert document["cluster"]["allocatable"] == {
        "cpu": 128000,
        "memory": 512 * 2**30,
        "nvidia.com/gpu": 100,
    }
    assert quotas["research"]["is_parent"] is True
    children = quotas["research"]["children"]
    assert children == sorted(children)
    assert {"team-a", "team-b", "team-c", "team-d"} <= set(children)
    assert quotas["team-a"]["parent"] == "research"
    assert quotas["team-a"]["min"] == {"cpu": 10000, "memory": 40 * 2**30, "nvidia.com/gpu": 10}
    assert quotas["team-a"]["pods"] == ["a-1", "a-2"]
    assert quotas["team-a"]["namespaces"]["vision"]["weight"] == 3
    assert quotas["default"]["max"] is None
    assert quotas["batch"]["used"]["cpu"] == 12000


def test_replay_is_deterministic(capsys: pytest.CaptureFixture[str]) -> None:
    first = state(capsys, str(EXAMPLE))
    second = state(capsys, str(EXAMPLE))
    assert first == second


def test_replay_without_json_prints_the_tree(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "replay", str(EXAMPLE))
    assert code == 0, err
    assert "root" in out
    assert "team-a" in out
    with pytest.raises(json.JSONDecodeError):
        json.loads(out)


# ------------------------------------------------------ offsets and times


def test_line_n_has_offset_n(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path / "e.jsonl", NODE, QUOTA, pod("p1"), pod("p2"), pod("p3"))
    assert state(capsys, str(path))["offset"] == 5
    for n in range(6):
        document = state(capsys, str(path), "--until", str(n))
        assert document["offset"] == n
    assert state(capsys, str(path), "--until", "2")["quotas"]["q"]["pods"] == []
    assert state(capsys, str(path), "--until", "3")["quotas"]["q"]["pods"] == ["p1"]
    assert state(capsys, str(path), "--until", "4")["quotas"]["q"]["pods"] == ["p1", "p2"]


def test_empty_file_is_offset_zero_at_the_epoch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "empty.jsonl"
    path.write_text("")
    document = state(capsys, str(path))
    assert document["offset"] == 0
    assert document["time"] == EPOCH


def test_line_without_at_takes_the_previous_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(
        tmp_path / "e.jsonl",
        NODE,  # no at: the epoch
        {**QUOTA, "at": "2026-03-01T10:00:00Z"},
        pod("p1"),  # no at: 10:00
        {**pod("p2"), "at": "2026-03-01T10:05:00.250Z"},
        pod("p3"),
    )
    times = [state(capsys, str(path), "--until", str(n))["time"] for n in range(1, 6)]
    assert times == [
        EPOCH,
        "2026-03-01T10:00:00Z",
        "2026-03-01T10:00:00Z",
        "2026-03-01T10:05:00.250Z",
        "2026-03-01T10:05:00.250Z",
    ]


def test_times_are_utc_with_exact_milliseconds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(
        tmp_path / "e.jsonl",
        {**NODE, "at": "2004-03-15T07:55:47.472Z"},
        {**QUOTA, "at": "2026-03-01T12:00:00.001+02:00"},
    )
    assert state(capsys, str(path), "--until", "1")["time"] == "2004-03-15T07:55:47.472Z"
    assert state(capsys, str(path))["time"] == "2026-03-01T10:00:00.001Z"
    # --until by time is inclusive, to the millisecond.
    until = state(capsys, str(path), "--until", "2004-03-15T07:55:47.472Z")
    assert until["offset"] == 1


def test_earlier_at_is_clamped_to_the_previous_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(
        tmp_path / "e.jsonl",
        {**NODE, "at": "2026-01-01T10:00:00Z"},
        {**QUOTA, "at": "2026-01-01T09:00:00Z"},
        pod("p1"),
    )
    assert state(capsys, str(path), "--until", "2")["time"] == "2026-01-01T10:00:00Z"
    assert state(capsys, str(path))["time"] == "2026-01-01T10:00:00Z"


def test_until_time(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(
        tmp_path / "e.jsonl",
        {**NODE, "at": "2026-01-01T00:00:00Z"},
        QUOTA,
        {**pod("p1"), "at": "2026-01-01T00:05:00Z"},
        pod("p2"),
        {**pod("p3"), "at": "2026-01-01T00:10:00Z"},
    )
    before = state(capsys, str(path), "--until", "2025-12-31T23:59:59Z")
    assert before["offset"] == 0
    at_start = state(capsys, str(path), "--until", "2026-01-01T00:00:00Z")
    assert at_start["offset"] == 2
    assert at_start["quotas"]["q"]["pods"] == []
    middle = state(capsys, str(path), "--until", "2026-01-01T00:07:00Z")
    assert middle["offset"] == 4
    assert middle["time"] == "2026-01-01T00:05:00Z"
    assert middle["quotas"]["q"]["pods"] == ["p1", "p2"]
    # Offsets given as an RFC 3339 time with an offset mean the same instant.
    shifted = state(capsys, str(path), "--until", "2026-01-01T01:07:00+01:00")
    assert shifted == middle
    after = state(capsys, str(path), "--until", "2030-01-01T00:00:00Z")
    assert after == state(capsys, str(path))


def test_bad_until_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path / "e.jsonl", NODE)
    code, out, err = run(capsys, "replay", str(path), "--until", "tomorrow")
    assert code == 2
    assert "--until" in err
    assert "Traceback" not in err
    assert out == ""


# ------------------------------------------------------------- bad lines


def bad_file(tmp_path: Path) -> Path:
    return write(
        tmp_path / "bad.jsonl",
        NODE,
        QUOTA,
        pod("p1", requests={"cpu": -1}),
        pod("p2"),
    )


def test_strict_bad_line_stops_replay_naming_file_line_and_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = bad_file(tmp_path)
    code, out, err = run(capsys, "replay", str(path), "--json", "--strict")
    assert code == 2
    assert f"{path}:3:" in err
    assert "$.requests.cpu" in err
    assert "Traceback" not in err
    assert out == ""


def test_bad_line_past_until_offset_is_not_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = bad_file(tmp_path)
    document = state(capsys, str(path), "--until", "2")
    assert document["offset"] == 2
    assert document["rejected"] == []


def test_malformed_json_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path / "bad.jsonl", NODE, '{"kind": "PodRemoved", "uid": ')
    code, _, err = run(capsys, "tree", str(path), "--strict")
    assert code == 2
    assert f"{path}:2:" in err
    assert "malformed JSON" in err


def test_bad_line_is_recorded_as_rejected_by_default(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = bad_file(tmp_path)
    document = state(capsys, str(path))
    # --skip-invalid, the old name of today's default, is still accepted.
    assert state(capsys, str(path), "--skip-invalid") == document
    assert document["offset"] == 4
    assert len(document["rejected"]) == 1
    rejection = document["rejected"][0]
    assert set(rejection) == {"offset", "kind", "reason"}
    assert rejection["offset"] == 3
    assert rejection["kind"] == "PodUpserted"
    assert "$.requests.cpu" in rejection["reason"]
    # The refused pod changed nothing; the next line was applied.
    assert document["quotas"]["q"]["pods"] == ["p2"]


def test_malformed_json_has_no_kind(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path / "bad.jsonl", NODE, "{not json", {"kind": "Nonsense"}, QUOTA)
    document = state(capsys, str(path))
    assert document["offset"] == 4
    assert [(r["offset"], r["kind"]) for r in document["rejected"]] == [
        (2, None),
        (3, "Nonsense"),
    ]
    assert "q" in document["quotas"]


def test_rejected_fact_leaves_the_hash_unchanged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = write(tmp_path / "good.jsonl", NODE, QUOTA, pod("p2"))
    bad = write(tmp_path / "bad.jsonl", NODE, QUOTA, pod("p1", requests={"cpu": -1}), pod("p2"))
    expected = state(capsys, str(good))
    got = state(capsys, str(bad))
    assert got["quotas"] == expected["quotas"]


def test_invalid_quota_keeps_the_last_valid_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(
        tmp_path / "e.jsonl",
        NODE,
        QUOTA,
        {"kind": "QuotaUpserted", "name": "q", "min": {"cpu": "10"}, "max": {"cpu": "4"}},
    )
    document = state(capsys, str(path))
    assert document["offset"] == 3
    assert [(r["offset"], r["kind"]) for r in document["rejected"]] == [(3, "QuotaUpserted")]
    assert document["rejected"][0]["reason"]
    assert document["quotas"]["q"]["min"] == {"cpu": 2000}
    assert document["quotas"]["q"]["max"] == {"cpu": 8000}


# ------------------------------------------------------------------ tree


def test_tree_prints_human_units(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(
        tmp_path / "e.jsonl",
        {"kind": "NodeUpserted", "name": "n1", "allocatable": {"cpu": "32", "memory": "64Gi"}},
        {"kind": "QuotaUpserted", "name": "team", "max": {"cpu": "4.5", "memory": "12Gi"}},
        pod("p1", namespace="team", requests={"cpu": "1500m", "memory": "512Mi"}, node="n1"),
    )
    code, out, err = run(capsys, "tree", str(path))
    assert code == 0, err
    assert "4.5 cpu" in out
    assert "12Gi" in out
    assert "1.5 cpu" in out
    assert "512Mi" in out
    assert "32 cpu" not in out  # the cluster total is replay's header, not the tree
    assert "team" in out
    assert "4500" not in out


def test_tree_follows_until(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path / "e.jsonl", NODE, QUOTA, {"kind": "QuotaUpserted", "name": "later"})
    code, out, _ = run(capsys, "tree", str(path), "--until", "2")
    assert code == 0
    assert "q " in out or "q  " in out
    assert "later" not in out


# ------------------------------------------------------------ help, errors


def test_top_level_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for command in ("replay", "tree", "ingest", "snapshot", "bench"):
        assert command in out
    assert "examples" in out


@pytest.mark.parametrize("command", ["replay", "tree", "ingest", "snapshot", "bench"])
def test_every_command_help_has_examples(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main([command, "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "examples" in out
    assert f"quotaledger {command}" in out


def test_no_command_prints_help_and_fails(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys)
    assert code == 2
    assert "replay" in out


@pytest.mark.parametrize("command", ["replay", "tree"])
@pytest.mark.parametrize("name", ["missing.jsonl", "missing.db"])
def test_missing_file(
    command: str, name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / name
    code, out, err = run(capsys, command, str(path))
    assert code == 2
    assert str(path) in err
    assert "no such file" in err
    assert "Traceback" not in err
    assert out == ""
    assert not path.exists()


def test_missing_ingest_source(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "ingest", str(tmp_path / "nope.jsonl"), str(tmp_path / "l.db"))
    assert code == 2
    assert "no such file" in err
    assert not (tmp_path / "l.db").exists()


def test_missing_snapshot_ledger(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "snapshot", str(tmp_path / "nope.db"))
    assert code == 2
    assert "no such file" in err
    assert not (tmp_path / "nope.db").exists()


def test_not_a_ledger(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("hello\n")
    code, _, err = run(capsys, "replay", str(path))
    assert code == 2
    assert str(path) in err
    assert "Traceback" not in err


# ------------------------------------------------------ real subprocesses


def test_console_script_replay_json(tmp_path: Path) -> None:
    assert EXE.exists(), f"console script missing at {EXE}"
    done = subprocess.run(
        [str(EXE), "replay", str(EXAMPLE), "--json"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert set(document) == TOP_KEYS
    assert document["offset"] == len([x for x in EXAMPLE.read_text().splitlines() if x.strip()])


def test_console_script_bad_line_exits_2(tmp_path: Path) -> None:
    path = bad_file(tmp_path)
    done = subprocess.run(
        [str(EXE), "replay", str(path), "--strict"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert f"{path}:3:" in done.stderr
    assert "$.requests.cpu" in done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout == ""


def test_console_script_help(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(EXE), "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0
    for command in ("replay", "tree", "ingest", "snapshot", "bench"):
        assert command in done.stdout


# ------------------------------------------------------------ SQLite ledger


def _sqlite_ready() -> str | None:
    try:
        from quotaledger.adapters.ledgers.sqlite.ledger import SqliteLedger  # noqa: F401
    except Exception as exc:  # pragma: no cover - depends on another agent's work
        return f"quotaledger.adapters.ledgers.sqlite.ledger is not importable yet: {exc!r}"
    return None


sqlite = pytest.mark.skipif(_sqlite_ready() is not None, reason=str(_sqlite_ready()))


def timed_file(tmp_path: Path) -> Path:
    return write(
        tmp_path / "timed.jsonl",
        {**NODE, "at": "2026-01-01T00:00:00Z"},
        QUOTA,
        {"kind": "QuotaUpserted", "name": "r", "min": {"cpu": "1"}},
        {**pod("p1", phase="Running", node="n1"), "at": "2026-01-01T00:01:00Z"},
        pod("p2", namespace="r", requests={"cpu": "3"}, phase="Running", node="n1"),
        {**pod("p3"), "at": "2026-01-01T00:02:00Z"},
        {"kind": "PodRemoved", "uid": "p1", "at": "2026-01-01T00:03:00Z"},
    )


def comparable(document: dict[str, Any]) -> dict[str, Any]:
    return {key: document[key] for key in ("offset", "time", "hash", "cluster", "quotas")}


@sqlite
@pytest.mark.parametrize("source", ["example", "timed"])
def test_ingest_then_replay_matches_the_file(
    source: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = EXAMPLE if source == "example" else timed_file(tmp_path)
    ledger = tmp_path / "ledger.db"
    code, out, err = run(capsys, "ingest", str(path), str(ledger))
    assert code == 0, err
    assert ledger.exists()
    direct = state(capsys, str(path))
    stored = state(capsys, str(ledger))
    assert stored["hash"] == direct["hash"]
    assert stored["quotas"] == direct["quotas"]
    assert comparable(stored) == comparable(direct)
    assert str(direct["offset"]) in out


@sqlite
def test_snapshot_then_replay_gives_the_same_hash(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = timed_file(tmp_path)
    ledger = tmp_path / "ledger.db"
    assert run(capsys, "ingest", str(path), str(ledger))[0] == 0
    before = state(capsys, str(ledger))
    code, out, err = run(capsys, "snapshot", str(ledger))
    assert code == 0, err
    assert before["hash"] in out
    after = state(capsys, str(ledger))
    assert after["hash"] == before["hash"]
    # the snapshot is anchored by a LedgerDigest record, which changes nothing else
    assert comparable(after) == {**comparable(before), "offset": before["offset"] + 1}
    ignoring = state(capsys, str(ledger), "--no-snapshot")
    assert comparable(ignoring) == comparable(after)
    assert ignoring["digest"] == after["digest"]


@sqlite
@pytest.mark.parametrize(
    "until", ["0", "2", "4", "5", "7", "2026-01-01T00:00:30Z", "2026-01-01T00:02:00Z"]
)
def test_ledger_until_matches_the_file_with_and_without_snapshots(
    until: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = timed_file(tmp_path)
    ledger = tmp_path / "ledger.db"
    assert run(capsys, "ingest", str(path), str(ledger))[0] == 0
    direct = state(capsys, str(path), "--until", until)
    assert comparable(state(capsys, str(ledger), "--until", until)) == comparable(direct)
    assert run(capsys, "snapshot", str(ledger))[0] == 0
    assert comparable(state(capsys, str(ledger), "--until", until)) == comparable(direct)


@sqlite
def test_ingest_bad_line_into_existing_ledger_keeps_ledger_offsets(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = write(tmp_path / "first.jsonl", NODE, QUOTA)
    second = write(tmp_path / "second.jsonl", pod("p1"), pod("p2", requests={"cpu": "x"}))
    ledger = tmp_path / "ledger.db"
    assert run(capsys, "ingest", str(first), str(ledger))[0] == 0
    code, _, err = run(capsys, "ingest", str(second), str(ledger))
    assert code == 0, err
    document = state(capsys, str(ledger))
    assert document["offset"] == 4
    assert [(r["offset"], r["kind"]) for r in document["rejected"]] == [(4, "PodUpserted")]
    assert document["quotas"]["q"]["pods"] == ["p1"]


@sqlite
def test_ingest_strict_refuses_a_bad_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ledger = tmp_path / "ledger.db"
    code, _, err = run(capsys, "ingest", str(bad_file(tmp_path)), str(ledger), "--strict")
    assert code == 2
    assert ":3:" in err
    assert "appended 2 record(s)" in err
    assert "--from-line 3" in err
    assert "$.requests.cpu" in err
    assert "Traceback" not in err


def test_the_entry_point_sizes_the_collector_for_a_long_lived_engine(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import gc

    from quotaledger.adapters.cli.common import GC_THRESHOLDS

    before = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        assert main([]) == 2  # no command: help, exit 2
        assert gc.get_threshold() == GC_THRESHOLDS
    finally:
        gc.set_threshold(*before)
    assert "usage" in capsys.readouterr().out


def test_a_command_starts_without_importing_what_only_other_commands_need() -> None:
    """Every command builds the whole parser; the heavy modules of one command
    (the auditor, the live engine, sqlite3, aiokafka, kubernetes-asyncio, numpy)
    are imported only when that command runs."""
    heavy = [
        "aiokafka",
        "kubernetes_asyncio",
        "numpy",
        "sqlite3",
        "multiprocessing",
        "aiohttp",
        "quotaledger.engine.audit",
        "quotaledger.engine.live",
        "quotaledger.engine.simulate",
        "quotaledger.adapters.cli.audit_jobs",
    ]
    code = (
        "import sys; from quotaledger.adapters.cli import build_parser; build_parser(); "
        f"print([m for m in {heavy!r} if m in sys.modules])"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_as_a_module_a_user_error_inside_an_audit_worker_module_is_no_traceback(
    tmp_path: Path,
) -> None:
    """``python -m quotaledger.adapters.cli`` and the console script share one
    ``UserError``: ``audit --jobs 2`` of a missing ledger is exit 2 and one line."""
    missing = tmp_path / "none.db"
    done = subprocess.run(
        [sys.executable, "-m", "quotaledger.adapters.cli", "audit", str(missing), "--jobs", "2"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    assert done.stderr == f"quotaledger: error: {missing}: no such file\n"
