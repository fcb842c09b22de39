"""``GET /``: the page draws the quota tree and the live decision feed (DESIGN §11).

Rendered in headless Chromium when it is installed (``apt-get install chromium``),
skipped otherwise. The server ends the page's event stream when it stops, which
lets Chromium's virtual time run out and dump the DOM.
"""

from __future__ import annotations

import asyncio
import html
import json
import re
import shutil
from pathlib import Path

import pytest

from tests.paths import REPO
from tests.serve_support import EXAMPLES, caught_up, running

PAGE = REPO / "adapters" / "http" / "page"
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
        async with run.session.get(f"{run.base}/page/..%2Fserver.py") as response:
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
    from tests.serve_support import cli_main

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
    # units and relations (DECISIONS 268): batch sets a max for cpu only, so its pods'
    # memory is used but not limited there: said in words, no "runtime 0" beside it
    bars = _bars(dom)
    relation, numbers = bars[("batch", "memory")]
    assert relation == "unlimited" and numbers == "used 24Gi · not limited here"
    assert bars[("batch", "cpu")] == ("managed", "min 8 · runtime 12 · used 12 · max 32")
    assert bars[("system", "memory")][0] == bars[("default", "cpu")][0] == "outside"
    for (quota, resource), (relation, numbers) in bars.items():
        assert (" · runtime " in numbers) == (relation == "managed"), (quota, resource, numbers)


def _bars(dom: str) -> dict[tuple[str, str], tuple[str, str]]:
    """(quota, resource) -> (relation, the numbers' text) of every drawn bar."""
    out: dict[tuple[str, str], tuple[str, str]] = {}
    for block in re.split(r'(?=<div class="quota" data-quota=")', dom)[1:]:
        quota = re.match(r'<div class="quota" data-quota="([^"]+)"', block)
        assert quota is not None
        own = block.split('<div class="children">')[0]
        for match in re.finditer(
            r'data-resource="([^"]+)" data-relation="([a-z]+)">.*?<span class="numbers"'
            r' title="[^"]*">([^<]*)</span>',
            own,
        ):
            out[(quota.group(1), match.group(1))] = (match.group(2), html.unescape(match.group(3)))
    return out


def _rgb(text: str) -> tuple[float, float, float]:
    value = text.lstrip("#")
    return (int(value[0:2], 16) / 255, int(value[2:4], 16) / 255, int(value[4:6], 16) / 255)


def test_runtime_and_used_are_told_apart_by_hue_and_lightness() -> None:
    """The page draws runtime as a wide band and used as a thin bar over it: they must not
    be two shades of one colour (WCAG relative luminance and hue)."""
    import colorsys

    css = (PAGE / "style.css").read_text()
    colours = dict(re.findall(r"--(runtime|used|min|max):\s*(#[0-9a-fA-F]{6})", css))
    runtime, used = _rgb(colours["runtime"]), _rgb(colours["used"])

    def luminance(rgb: tuple[float, float, float]) -> float:
        linear = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in rgb]
        return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]

    light, dark = sorted((luminance(runtime), luminance(used)), reverse=True)
    assert (light + 0.05) / (dark + 0.05) >= 4.5  # WCAG AA contrast between the two
    hue_runtime = colorsys.rgb_to_hls(*runtime)[0] * 360
    hue_used = colorsys.rgb_to_hls(*used)[0] * 360
    gap = abs(hue_runtime - hue_used) % 360
    assert min(gap, 360 - gap) >= 60, (hue_runtime, hue_used)
    legend = (PAGE / "index.html").read_text()
    assert "cpu in cores" in legend and "memory in bytes" in legend
