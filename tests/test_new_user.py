"""What a new user meets first: the commands' words, exit statuses and times (DESIGN §7,
§9, §11; DECISIONS 9, 262-266)."""

from __future__ import annotations

import asyncio
import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from quotaledger.adapters.cli import main
from quotaledger.adapters.http.requests import MAX_EVENTS_BYTES
from quotaledger.adapters.ledgers.sqlite.ledger import SqliteLedger
from quotaledger.events.ledger import Append

from .read_only_medium import can_bind_read_only, run_on_read_only_medium
from .serve_support import running

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
README = REPO / "README.md"
RFC3339_Z = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# ------------------------------------------------------------------ tree and replay


def test_tree_prints_the_tree_alone(capsys: pytest.CaptureFixture[str]) -> None:
    """``tree`` is the indented tree only; ``replay`` prints the same tree between its
    header (offset, time, hash, cluster totals) and its footer (rejections)."""
    example = str(EXAMPLES / "rejected-line.jsonl")
    code, tree, err = run(capsys, "tree", example)
    assert code == 0, err
    code, replay, err = run(capsys, "replay", example)
    assert code == 0, err
    tree_lines, replay_lines = tree.splitlines(), replay.splitlines()
    assert tree_lines[0] == "root"
    assert all(line[:4] in ("├── ", "└── ", "│   ", "    ") for line in tree_lines[1:])
    start = replay_lines.index("root")
    assert replay_lines[start : start + len(tree_lines)] == tree_lines
    header, footer = replay_lines[:start], replay_lines[start + len(tree_lines) :]
    assert header[0].startswith("offset 7 at ") and header[1].startswith("cluster total ")
    assert footer == ["3 rejected record(s); see `replay --json`"]
    for word in ("offset", "hash", "cluster total", "rejected"):
        assert word not in tree


# ------------------------------------------------------------------ simulate, times


def test_simulate_lists_decisions_not_the_ledger_opening(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A file's ledger opens at the epoch on purpose (its facts keep their own times);
    that record is not a decision anyone took: not listed as one, no 1970 line."""
    code, out, err = run(capsys, "simulate", str(EXAMPLES / "quota-decrease.jsonl"))
    assert code == 0, err
    assert "1970" not in out and "LedgerOpened" not in out
    assert re.search(r"^2026-01-01T00:06:00Z #\d+ PreemptionStarted", out, re.M)


def _created_at(document: object) -> list[str]:
    found: list[str] = []
    if isinstance(document, dict):
        for key, value in document.items():
            if key == "created_at" and isinstance(value, str):
                found.append(value)
            else:
                found += _created_at(value)
    elif isinstance(document, list):
        for item in document:
            found += _created_at(item)
    return found


def test_times_are_written_with_z(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """DECISIONS 9: RFC 3339 UTC with ``Z`` in simulate's decisions (the explain's
    sort_key.created_at, as the engine writes it into the ledger), whatif and audit."""
    sim = tmp_path / "sim.db"
    code, out, err = run(
        capsys, "simulate", str(EXAMPLES / "quota-decrease.jsonl"), "--json", "--out", str(sim)
    )
    assert code == 0, err
    document = json.loads(out)
    created = _created_at(document["decisions"])
    assert created and all(RFC3339_Z.match(text) for text in created), created
    assert all(RFC3339_Z.match(d["at"]) for d in document["decisions"])
    assert "+00:00" not in out
    stored = asyncio.run(_payloads(sim))
    assert any(b'"created_at":"2026-01-01T00:00:20Z"' in p for p in stored)
    assert not any(b"+00:00" in p for p in stored)
    change = tmp_path / "c.jsonl"
    change.write_text(
        '{"kind": "QuotaUpserted", "name": "analytics", "min": {"memory": "20Gi"},'
        ' "max": {"memory": "40Gi"}, "preemption_delay_s": 60}\n'
    )
    code, out, err = run(capsys, "whatif", str(sim), "--at", "7", "--change", str(change), "--json")
    assert code == 0, err
    assert _created_at(json.loads(out)) and "+00:00" not in out
    code, out, err = run(capsys, "audit", str(sim), "--json")
    assert code == 0, err
    assert "+00:00" not in out


async def _payloads(path: Path) -> list[bytes]:
    ledger = await SqliteLedger.open(str(path), read_only=True)
    try:
        return [r.payload async for batch in ledger.read(0) for r in batch]
    finally:
        await ledger.close()


def test_a_ledger_written_with_offset_times_still_audits_clean(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Ledgers written before created_at was written with ``Z`` hold ``+00:00`` in their
    explains: the same instant, so audit does not flag them (DECISIONS 264)."""
    sim = tmp_path / "sim.db"
    assert main(["simulate", str(EXAMPLES / "quota-decrease.jsonl"), "--out", str(sim)]) == 0
    old = tmp_path / "old.db"

    async def rewrite() -> None:
        source = await SqliteLedger.open(str(sim), read_only=True)
        rows = [r async for batch in source.read(0) for r in batch]
        await source.close()
        target = await SqliteLedger.open(
            str(old), create=True, ledger_id=source.ledger_id, clock_ms=lambda: rows[0].ts
        )
        payloads = [re.sub(rb'("created_at":"[^"]+)Z"', rb'\1+00:00"', r.payload) for r in rows]
        assert payloads != [r.payload for r in rows]
        await target.append(
            [Append(p, ts=r.ts) for p, r in zip(payloads[1:], rows[1:], strict=True)]
        )
        await target.close()

    asyncio.run(rewrite())
    capsys.readouterr()
    code, out, err = run(capsys, "audit", str(old), "--json")
    assert code == 0, out + err
    report = json.loads(out)
    assert report["flagged"] == 0 and len(report["decisions"]) >= 3


# ------------------------------------------------------------------ not found, no state


def test_audit_of_an_unknown_pod_says_no_such_pod(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    sim = tmp_path / "sim.db"
    assert main(["simulate", str(EXAMPLES / "quota-decrease.jsonl"), "--out", str(sim)]) == 0
    capsys.readouterr()
    for extra in ([], ["--json"], ["--jobs", "2"]):
        code, out, err = run(capsys, "audit", str(sim), "--pod", "no-such-uid", *extra)
        assert code == 2, (extra, out)
        assert err.strip() == f"quotaledger: error: --pod no-such-uid: no such pod in {sim}"
        assert out == ""
    # a pod the ledger holds, without decisions: its (empty) audit, exit 0
    code, out, err = run(capsys, "audit", str(sim), "--pod", "spark-1")
    assert code == 0, err
    assert "0 decision(s) audited" in out
    code, out, err = run(capsys, "audit", str(sim), "--pod", "spark-3")
    assert code == 0 and "evict spark-3" in out


def test_until_before_the_ledger_opened_is_an_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A ledger opened at the wall clock has no state at an earlier time (DECISIONS 266):
    an error naming it, not a state at offset -1."""
    ledger = tmp_path / "new.db"
    assert main(["init", str(ledger)]) == 0
    capsys.readouterr()
    for command in (["replay", str(ledger)], ["tree", str(ledger)]):
        code, out, err = run(capsys, *command, "--until", "2020-01-01T00:00:00Z")
        assert code == 2, out
        assert "--until 2020-01-01T00:00:00Z: before the ledger opened" in err
    change = tmp_path / "c.jsonl"
    change.write_text('{"kind": "QuotaUpserted", "name": "q"}\n')
    code, _, err = run(
        capsys, "whatif", str(ledger), "--change", str(change), "--at", "2020-01-01T00:00:00Z"
    )
    assert code == 2 and "--at 2020-01-01T00:00:00Z: before the ledger opened" in err


async def test_state_at_a_time_before_the_ledger_opened_is_404(tmp_path: Path) -> None:
    async with running(tmp_path / "new.db") as run_:
        url = f"{run_.base}/v1/state?at=2020-01-01T00:00:00Z"
        async with run_.session.get(url) as response:
            assert response.status == 404
            error = (await response.json())["error"]
        assert error["field"] == "at"
        assert error["message"].startswith("at 2020-01-01T00:00:00Z: before the ledger opened")
        assert re.search(r"offset 0 at \d{4}-\d\d-\d\dT[\d:.]+Z", error["message"])
        async with run_.session.get(f"{run_.base}/v1/state?at=0") as response:
            assert response.status == 200
            assert (await response.json())["offset"] == 0


# ------------------------------------------------------------------ creating a ledger


def test_creating_a_ledger_in_a_missing_directory(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    target = tmp_path / "missing" / "l.db"
    for argv in (
        ["init", str(target)],
        ["ingest", str(EXAMPLES / "koordinator.jsonl"), str(target)],
        ["simulate", str(EXAMPLES / "reclaim.jsonl"), "--out", str(target)],
    ):
        code, _, err = run(capsys, *argv)
        assert code == 2, argv
        assert f"cannot create ledger {target}: no such directory {target.parent}" in err, err
        assert "unable to open database file" not in err


def test_creating_a_ledger_in_a_read_only_directory(tmp_path: Path) -> None:
    """As a normal user a chmod'ed directory; as root a read-only bind mount."""
    directory = tmp_path / "ro"
    directory.mkdir()
    target = directory / "l.db"
    commands = [
        ["init", str(target)],
        ["ingest", str(EXAMPLES / "koordinator.jsonl"), str(target)],
    ]
    if os.geteuid() != 0:
        directory.chmod(0o555)
        try:
            results = [_cli(*argv) for argv in commands]
        finally:
            directory.chmod(0o755)
    else:
        if not can_bind_read_only():
            pytest.skip("root without mount namespaces")
        results = run_on_read_only_medium(directory, commands, tmp_path)
    for code, err in results:
        assert code == 2, err
        assert f"cannot create ledger {target}: the directory {directory} is not writable" in err
        assert "unable to open database file" not in err
    assert not target.exists()


def _cli(*argv: str) -> tuple[int, str]:
    done = subprocess.run(
        [sys.executable, "-m", "quotaledger.adapters.cli", *argv],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.returncode, done.stderr


# ------------------------------------------------------------------ serve and demo


def _spawn(*argv: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "quotaledger.adapters.cli", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _lines_until(process: subprocess.Popen[str], pattern: str, limit_s: float = 60) -> list[str]:
    """stdout lines up to the first matching ``pattern`` (a hang guard of ``limit_s``)."""
    stdout = process.stdout
    assert stdout is not None
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        for line in stdout:
            lines.put(line.rstrip("\n"))
            if re.search(pattern, line):
                return
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    seen: list[str] = []
    deadline = time.monotonic() + limit_s
    while True:
        try:
            line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
        except queue.Empty:
            raise AssertionError(f"no {pattern!r} within {limit_s} s: {seen}") from None
        if line is None:
            raise AssertionError(f"ended before {pattern!r}: {seen}")
        seen.append(line)
        if re.search(pattern, line):
            return seen


def _environment(token: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "QUOTALEDGER_TOKEN"}
    if token is not None:
        env["QUOTALEDGER_TOKEN"] = token
    return env


@pytest.mark.parametrize("token", [None, "s3cret"])
def test_serve_says_at_start_whether_writes_are_enabled(tmp_path: Path, token: str | None) -> None:
    process = _spawn(
        "serve", str(tmp_path / "l.db"), "--listen", "127.0.0.1:0", env=_environment(token)
    )
    try:
        lines = _lines_until(process, r"^  writes ")
    finally:
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=60)
    writes = lines[-1]
    if token is None:
        assert "disabled: no token configured" in writes and "QUOTALEDGER_TOKEN" in writes
        assert "403" in writes
    else:
        assert re.search(r"POST http://127\.0\.0\.1:\d+/v1/events", writes), writes
        assert "s3cret" not in writes
    assert process.returncode == 0, err


@pytest.mark.parametrize(
    ("argv", "ready"),
    [
        (["serve", "LEDGER", "--listen", "127.0.0.1:0"], r"^  writes "),
        (["demo", "--listen", "127.0.0.1:0", "--speed", "30"], r"^  token "),
    ],
)
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_serve_and_demo_stop_on_a_signal_with_status_0(
    tmp_path: Path, argv: list[str], ready: str, signum: signal.Signals
) -> None:
    """The long-running commands (run, serve, demo) end on SIGINT/SIGTERM as their
    normal way out: drain, exit 0 (README "Stopping"; one-shot commands exit 128+N)."""
    process = _spawn(*[str(tmp_path / "l.db") if a == "LEDGER" else a for a in argv])
    try:
        _lines_until(process, ready)
        sent = time.monotonic()
        process.send_signal(signum)
        _, err = process.communicate(timeout=60)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode == 0, err
    assert time.monotonic() - sent < 30  # a hang guard; the 2 s bound: test_shutdown_progress
    assert "Traceback" not in err


# ------------------------------------------------------------------ README


def test_readme_states_exit_statuses_limits_and_units() -> None:
    text = " ".join(README.read_text().split())
    assert "exits 143 (130 for SIGINT)" in text
    assert "`run`, `serve` and `demo` drain and exit 0" in text
    assert MAX_EVENTS_BYTES == 16 * 2**20 and "16 MiB" in text and "413" in text
    assert "millicores" in text and "cores" in text and "bytes" in text


# ------------------------------------------------------------------ serve --read-only


def test_serve_read_only_serves_a_ledger_it_cannot_write(tmp_path: Path) -> None:
    """``serve --read-only`` opens the ledger read-only (as replay and audit do): on a
    read-only medium it serves the state, the tree and the metrics (DESIGN §9, §11)."""
    directory = tmp_path / "ro"
    directory.mkdir()
    ledger = directory / "l.db"
    assert main(["ingest", str(EXAMPLES / "koordinator.jsonl"), str(ledger)]) == 0
    argv = ["serve", str(ledger), "--read-only", "--listen", "127.0.0.1:0"]
    if os.geteuid() != 0:
        ledger.chmod(0o444)
        directory.chmod(0o555)
        process = _spawn(*argv, env=_environment("s3cret"))
    elif can_bind_read_only():
        from .read_only_medium import spawn_on_read_only_medium

        process = spawn_on_read_only_medium(directory, argv)
    else:
        pytest.skip("root without mount namespaces")
    try:
        lines = _lines_until(process, r"^  writes ")
        base = re.search(r"(http://127\.0\.0\.1:\d+)/", lines[0])
        assert base is not None, lines
        assert "disabled: --read-only" in lines[-1]
        state = json.loads(_get(f"{base.group(1)}/v1/state"))
        assert state["offset"] == 17 and "research" in state["quotas"]
        assert '"ready":true' in _get(f"{base.group(1)}/readyz").replace(" ", "")
        metrics = _get(f"{base.group(1)}/metrics")
        assert 'quotaledger_quota_runtime{quota="team-a",resource="cpu"} 6.0' in metrics
    finally:
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=60)
        if os.geteuid() != 0:
            directory.chmod(0o755)
            ledger.chmod(0o644)
    assert process.returncode == 0, err
    assert "for writing" not in err
    assert sorted(p.name for p in directory.iterdir()) == ["l.db"]


def _get(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url, timeout=30) as response:
        return response.read().decode()
