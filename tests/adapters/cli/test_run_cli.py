"""`quotaledger run`: the live engine as a process (DESIGN §6; DECISIONS 19)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from quotaledger.adapters.cli import main
from tests.paths import REPO

REPO = REPO


@pytest.mark.slow
def test_run_decides_overdue_preemption_and_drains_on_sigterm(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ledger = tmp_path / "live.db"
    assert main(["ingest", str(REPO / "examples" / "quota-decrease.jsonl"), str(ledger)]) == 0
    capsys.readouterr()
    process = subprocess.Popen(
        [sys.executable, "-m", "quotaledger.adapters.cli", "run", str(ledger), "--instance", "t1"],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert process.stderr is not None
        lines = [process.stderr.readline()]
        while lines[-1] and "running on" not in lines[-1]:
            lines.append(process.stderr.readline())
        assert "engine t1 running" in lines[-1], lines
        assert any("t1 leads with epoch 1" in line for line in lines), lines
        # the example's deadline (2026-01-01T00:06:00Z) is long past: it fires at once
        limit = time.monotonic() + 60  # a hang guard, not a speed requirement
        while True:
            assert main(["replay", str(ledger), "--json", "--no-snapshot"]) == 0
            state = json.loads(capsys.readouterr().out)
            # the eviction's PodRemoved and the PreemptionFinished after it are
            # two appends: the SIGTERM comes once both are in
            evicted = state["quotas"]["analytics"]["pods"] == ["spark-1", "spark-2"]
            if evicted and state["preemptions"] == {}:
                break
            if time.monotonic() > limit:
                pytest.fail("the overdue preemption was not carried out")
            time.sleep(0.05)
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=20) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert main(["replay", str(ledger), "--json"]) == 0
    state = json.loads(capsys.readouterr().out)
    assert state["rejected"] == []
    assert state["preemptions"] == {}
    # every decision the live engine took is justified by the facts before it
    assert main(["audit", str(ledger)]) == 0
