"""``ingest`` reports where its own records are, while others write too (DESIGN §9; DECISIONS 202).

Another writer appends to the same ledger before, during and after an ``ingest``
run (a real second process or connection, on SQLite and on Kafka): the run names
the first and last offsets of its own records, never the ledger's tail.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec

from quotaledger.adapters.cli.ledger import IngestProgress
from quotaledger.adapters.ledgers.url import open_ledger
from quotaledger.events.ledger import Append, Ledger, Record
from tests.cli_process import cli
from tests.tansu import Tansu

LINES = 2500  # three batches of the ingest's 1,000


def node(name: str) -> bytes:
    return msgspec.json.encode({"kind": "NodeUpserted", "name": name, "allocatable": {"cpu": "1"}})


@contextlib.asynccontextmanager
async def another_writer(ledger: Ledger) -> AsyncIterator[list[int]]:
    """Appends one fact every millisecond or so until the block ends; its offsets."""
    offsets: list[int] = []
    stop = asyncio.Event()

    async def write() -> None:
        n = 0
        while not stop.is_set():
            offsets.extend(await ledger.append([Append(node(f"other-{n}"))]))
            n += 1
            await asyncio.sleep(0.001)

    task = asyncio.create_task(write())
    try:
        yield offsets
    finally:
        stop.set()
        await task


async def read_all(ledger: Ledger) -> list[Record]:
    out: list[Record] = []
    async for batch in ledger.read(0):
        out.extend(batch)
    return out


async def ingest_beside_another_writer(url: str, tmp_path: Path) -> None:
    source = tmp_path / "facts.jsonl"
    source.write_bytes(b"".join(node(f"ingested-{i}") + b"\n" for i in range(LINES)))
    assert cli("init", url).returncode == 0
    ledger = await open_ledger(url, create=False)
    try:
        async with another_writer(ledger) as theirs:
            while len(theirs) < 20:  # the tail moved before the run
                await asyncio.sleep(0.01)
            done = await asyncio.to_thread(cli, "ingest", str(source), url)
            assert done.returncode == 0, done.stderr
            during = len(theirs)
            while len(theirs) < during + 20:  # and after it
                await asyncio.sleep(0.01)
        match = re.fullmatch(
            rf"appended {LINES} record\(s\) to \S+ at offsets (\d+)\.\.(\d+)\n", done.stdout
        )
        assert match is not None, done.stdout
        first, last = int(match.group(1)), int(match.group(2))
        records = await read_all(ledger)
        ours = [r.offset for r in records if b"ingested-" in r.payload]
        assert len(ours) == LINES
        assert (ours[0], ours[-1]) == (first, last)
        assert records[-1].offset > last  # the tail is another writer's
        assert theirs[0] < first
    finally:
        await ledger.close()


async def test_ingest_reports_its_own_offsets_on_sqlite(tmp_path: Path) -> None:
    await ingest_beside_another_writer(str(tmp_path / "ledger.db"), tmp_path)


async def test_ingest_reports_its_own_offsets_on_kafka(
    tansu: Tansu, topic: str, tmp_path: Path
) -> None:
    await ingest_beside_another_writer(tansu.url(topic), tmp_path)


async def test_an_interrupted_batch_is_found_among_other_records(tmp_path: Path) -> None:
    """Interrupted during an append, a run finds which of the records it was sending
    reached the ledger, past other writers' records, and resumes after them."""
    path = str(tmp_path / "ledger.db")
    ledger = await open_ledger(path, create=True)
    try:
        await ledger.append([Append(node("before"))])
        progress = IngestProgress(from_line=1)
        progress.floor = 2
        (offset,) = await ledger.append([Append(node("ingested-0"))])
        progress.took(offset, 2)
        await ledger.append([Append(node("other-1")), Append(node("other-2"))])
        sent = [(node(f"ingested-{i}"), i + 2) for i in range(1, 4)]
        landed = await ledger.append([Append(payload) for payload, _ in sent])
        await ledger.append([Append(node("other-3"))])
        progress.sending = sent
    finally:
        await ledger.close()
    await progress.settle(path)
    assert (progress.count, progress.first, progress.last) == (4, offset, landed[-1])
    assert progress.resume_line == 5 and not progress.sending
    # a batch that never landed leaves the count and the resume line as they were
    progress.sending = [(node("never"), 6)]
    await progress.settle(path)
    assert (progress.count, progress.last, progress.resume_line) == (4, landed[-1], 5)
