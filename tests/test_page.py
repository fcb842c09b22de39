"""``GET /``: the page draws the quota tree and the live decision feed (DESIGN §11).

Rendered in headless Chromium when it is installed (``apt-get install chromium``),
skipped otherwise. The server ends the page's event stream when it stops, which
lets Chromium's virtual time run out and dump the DOM.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
from pathlib import Path

import pytest

from .serve_support import EXAMPLES, caught_up, running

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


async def test_page_and_assets_are_served(tmp_path: Path) -> None:
    path = await _ledger(tmp_path)
    async with running(path) as run:
        async with run.session.get(f"{run.base}/") as response:
            assert response.status == 200
            html = await response.text()
        for asset in re.findall(r'(?:src|href)="(/page/[^"]+)"', html):
            async with run.session.get(f"{run.base}{asset}") as response:
                assert response.status == 200, asset
        assert "http" not in html.split("<body>")[1]  # no CDN, nothing external
        async with run.session.get(f"{run.base}/page/..%2Fhttp_api.py") as response:
            assert response.status == 404


async def _ledger(tmp_path: Path) -> Path:
    """koordinator + quota-decrease facts, with quota preemption still off."""
    lines = (EXAMPLES / "koordinator.jsonl").read_text().splitlines()
    for line in (EXAMPLES / "quota-decrease.jsonl").read_text().splitlines():
        doc = json.loads(line)
        if doc["kind"] == "SettingsChanged":
            doc["quota_preemption_enabled"] = False
        lines.append(json.dumps(doc))
    source = tmp_path / "events.jsonl"
    source.write_text("\n".join(lines) + "\n")
    from .serve_support import cli_main

    target = tmp_path / "l.db"
    assert await asyncio.to_thread(cli_main, ["ingest", str(source), str(target)]) == 0
    return target


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed")
async def test_headless_chromium_draws_the_tree_and_the_feed(tmp_path: Path) -> None:
    path = await _ledger(tmp_path)
    assert CHROMIUM is not None
    async with running(path) as run:
        browser = await asyncio.create_subprocess_exec(
            CHROMIUM,
            *FLAGS,
            f"--user-data-dir={tmp_path / 'chromium'}",
            "--virtual-time-budget=20000",
            "--dump-dom",
            f"{run.base}/",
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
        # The page subscribes to the stream once the tree and the decisions are drawn.
        for _ in range(1500):
            if run.server.feed.subscribers:
                break
            await asyncio.sleep(0.02)
        assert run.server.feed.subscribers, "the page never opened /v1/stream"
        # Turning quota preemption on fires the overdue quota-decrease deadline now:
        # the decisions reach the page only through the stream.
        setting = b'{"kind": "SettingsChanged", "quota_preemption_enabled": true}\n'
        async with run.session.post(
            f"{run.base}/v1/events", data=setting, headers=run.auth
        ) as response:
            assert response.status == 200
        for _ in range(1500):
            if run.server.state.finished_preemptions:
                break
            await asyncio.sleep(0.02)
        await caught_up(run, await run.ledger.last_offset())
        async with run.session.get(f"{run.base}/v1/state") as response:
            state = await response.json()
        # every record folded so far has been taken by the page's stream (its handler
        # writes them all before the end of the stream that the server's stop sends):
        # the page reads them before it sees the stream end, whatever the wall time
        for _ in range(1500):
            if all(s.pending == 0 for s in run.server.feed.subscribers):
                break
            await asyncio.sleep(0.02)
        assert all(s.pending == 0 for s in run.server.feed.subscribers), "stream not drained"
    # the server has stopped: the stream ended, virtual time runs out, the DOM is dumped
    out, _ = await asyncio.wait_for(browser.communicate(), 120)
    dom = out.decode()
    drawn = set(re.findall(r'data-quota="([^"]+)"', dom))
    assert drawn == set(state["quotas"])
    assert {"research", "team-a", "team-d", "batch", "analytics", "default"} <= drawn
    assert 'data-resource="nvidia.com/gpu"' in dom
    kinds = re.findall(r'data-kind="([A-Za-z]+)"', dom)
    assert "PreemptionStarted" in kinds and "PreemptionFinished" in kinds
