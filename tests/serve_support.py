"""Helpers for tests that start ``serve`` in-process on a real loopback socket."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from quotaledger.adapters.cli import main as cli_main
from quotaledger.adapters.http.options import ServeOptions
from quotaledger.adapters.http.server import Server
from quotaledger.adapters.ledgers.sqlite.ledger import SqliteLedger

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
TOKEN = "test-token-0123456789"


@dataclass
class Running:
    server: Server
    ledger: SqliteLedger
    base: str
    session: aiohttp.ClientSession

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {TOKEN}"}


def ingest_now(example: str, target: Path) -> Path:
    assert cli_main(["ingest", str(EXAMPLES / example), str(target)]) == 0
    return target


async def ingest(example: str, target: Path) -> Path:
    """``quotaledger ingest`` (in a thread: the CLI runs its own event loop)."""
    return await asyncio.to_thread(ingest_now, example, target)


async def simulate(example: str, target: Path) -> Path:
    """``quotaledger simulate --out``: a ledger holding decisions."""
    args = ["simulate", str(EXAMPLES / example), "--out", str(target)]
    assert await asyncio.to_thread(cli_main, args) == 0
    return target


@contextlib.asynccontextmanager
async def running(
    path: Path, *, token: str | None = TOKEN, read_only: bool = False
) -> AsyncIterator[Running]:
    """A server over the ledger at ``path`` on 127.0.0.1, port 0."""
    ledger = await SqliteLedger.open(str(path), create=True)
    options = ServeOptions(
        host="127.0.0.1",
        port=0,
        token=None if token is None else token.encode(),
        read_only=read_only,
        instance="test",
    )
    server = Server(ledger, options)
    stop = asyncio.Event()
    task = asyncio.create_task(server.run(stop))
    try:
        await asyncio.wait_for(server.listening.wait(), 30)
        base = f"http://127.0.0.1:{server.port}"
        async with aiohttp.ClientSession() as session:
            await wait_ready(session, base)
            yield Running(server, ledger, base, session)
    finally:
        stop.set()
        await asyncio.wait_for(task, 30)
        await ledger.close()


async def wait_ready(session: aiohttp.ClientSession, base: str, tries: int = 600) -> None:
    for _ in range(tries):
        async with session.get(f"{base}/readyz") as response:
            if response.status == 200:
                return
        await asyncio.sleep(0.05)
    raise AssertionError("server never became ready")


async def facts_after(run: Running, offset: int) -> list[tuple[int, bytes]]:
    """(offset, payload) of every fact (not an engine decision) after ``offset``: what a
    client appended, whatever the engine may have appended meanwhile."""
    from quotaledger.events.codec import peek_kind
    from quotaledger.events.model import DECISION_KINDS

    out = []
    async for batch in run.ledger.read(offset + 1):
        out += [(r.offset, r.payload) for r in batch if peek_kind(r.payload) not in DECISION_KINDS]
    return out


async def caught_up(run: Running, offset: int) -> None:
    """Wait until the server has folded ``offset``."""
    for _ in range(600):
        if run.server.state.offset >= offset:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"never folded offset {offset}")
