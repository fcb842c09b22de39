"""``serve`` under concurrent clients over loopback (DESIGN §11).

50 clients post facts and read quotas and the state for 20 s (``QUOTALEDGER_LOAD_SECONDS``
overrides the duration for local runs; CI runs the full 20 s). No request may fail, and
the ledger must hold exactly what was acknowledged. The p99 latency of
``GET /v1/quotas/{name}`` is printed (docs/PERFORMANCE.md records a run).
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

from quotaledger.adapters.bench.serve import LOAD_SETUP, drive_load
from tests.serve_support import TOKEN

CLIENTS = 50
SECONDS = float(os.environ.get("QUOTALEDGER_LOAD_SECONDS", "20"))


async def test_fifty_clients_lose_nothing(tmp_path: Path) -> None:
    source = tmp_path / "setup.jsonl"
    source.write_text("".join(json.dumps(fact) + "\n" for fact in LOAD_SETUP))
    ledger = tmp_path / "load.db"
    from quotaledger.adapters.cli import main

    assert await asyncio.to_thread(main, ["ingest", str(source), str(ledger)]) == 0
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "quotaledger.adapters.cli",
            "serve",
            str(ledger),
            "--listen",
            "127.0.0.1:0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "QUOTALEDGER_TOKEN": TOKEN},
    )
    try:
        assert proc.stdout is not None
        base = proc.stdout.readline().decode().split()[-1].rstrip("/")
        report = await drive_load(base, TOKEN, clients=CLIENTS, seconds=SECONDS)
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) == 0
    summary = report.summary()
    print(f"\nload: {json.dumps(summary)}")
    assert report.failures == [], report.failures[:5]
    assert report.posts > 0 and report.quota_latencies
    # exactly what was acknowledged: every acknowledged offset holds a load pod, and no
    # load pod is anywhere else
    acknowledged = {
        offset for first, last in report.acknowledged for offset in range(first, last + 1)
    }
    assert len(acknowledged) == report.events
    with sqlite3.connect(ledger) as conn:
        rows = conn.execute("select offset, payload from records").fetchall()
    load_offsets = set()
    uids = set()
    for offset, payload in rows:
        text = payload if isinstance(payload, str) else bytes(payload).decode()
        if '"uid": "load-' in text:
            load_offsets.add(offset)
            uids.add(json.loads(text)["uid"])
    assert load_offsets == acknowledged
    assert len(uids) == report.events  # no duplicates
