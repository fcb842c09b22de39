"""SqliteLedger's own rules: the file (ids, foreign and damaged files, TEXT/BLOB
payloads), group commit, batched and synchronous reads, waking its followers,
several processes on one file, crashes.

The DESIGN §3 invariants every backend keeps (record 0, offsets, ts, follow,
snapshots, read-only opening, gaps) are the ledger contract's:
tests/ledger_contract.py, run for SQLite by tests/test_ledger_contract.py.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import random
import re
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from itertools import pairwise
from pathlib import Path
from typing import IO

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quotaledger.adapters.ledgers.sqlite.ledger import SqliteLedger
from quotaledger.events import (
    Append,
    LedgerError,
    LedgerMismatch,
    LedgerOpened,
    Record,
    decode_event,
)

WRITER = Path(__file__).with_name("crash_writer.py")
_spec = importlib.util.spec_from_file_location("_crash_writer", WRITER)
assert _spec is not None and _spec.loader is not None
_crash_writer = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_crash_writer)
writer_payload: Callable[[str, int, int, int, int], bytes] = _crash_writer.payload

#: One acknowledged append of a writer process: (tag, worker, first seq, offsets).
Ack = tuple[str, int, int, list[int]]


async def read_all(ledger: SqliteLedger, from_offset: int = 0) -> list[Record]:
    return [r for batch in [b async for b in ledger.read(from_offset)] for r in batch]


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "ledger.db"


# ------------------------------------------------------------ record 0, ids


async def test_random_ledger_id_is_kept_on_reopen(db: Path) -> None:
    ledger = await SqliteLedger.open(db)
    lid = ledger.ledger_id
    # a random uuid4 as 32 lowercase hex digits, as written in record 0
    assert re.fullmatch("[0-9a-f]{32}", lid), lid
    assert uuid.UUID(hex=lid).version == 4
    [record] = await read_all(ledger)
    opened = decode_event(record.payload)
    assert isinstance(opened, LedgerOpened) and opened.ledger_id == lid
    # each new ledger draws its own
    others = [await SqliteLedger.open(db.with_name(f"other-{i}.db")) for i in range(2)]
    assert len({lid, *(other.ledger_id for other in others)}) == 3
    for other in others:
        await other.close()
    await ledger.append([Append(b'{"kind":"PodRemoved","uid":"a"}')])
    await ledger.close()
    again = await SqliteLedger.open(db)
    assert again.ledger_id == lid
    assert await again.last_offset() == 1
    await again.close()


async def test_expect_ledger_id_mismatch(db: Path) -> None:
    await (await SqliteLedger.open(db, ledger_id="mine")).close()
    with pytest.raises(LedgerMismatch) as info:
        await SqliteLedger.open(db, expect_ledger_id="theirs")
    assert "mine" in str(info.value) and "theirs" in str(info.value)
    # ledger_id= for an existing file is checked the same way
    with pytest.raises(LedgerMismatch):
        await SqliteLedger.open(db, ledger_id="theirs")
    # the file is untouched and still opens
    await (await SqliteLedger.open(db, expect_ledger_id="mine")).close()


async def test_garbage_file_is_refused(db: Path) -> None:
    garbage = b"this is not a database\n" * 100
    db.write_bytes(garbage)
    with pytest.raises(LedgerError) as info:
        await SqliteLedger.open(db)
    assert "not a quotaledger ledger" in str(info.value)
    assert info.value.__cause__ is None and info.value.__suppress_context__
    assert db.read_bytes() == garbage


async def test_foreign_sqlite_database_is_refused(db: Path) -> None:
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY)")
    conn.commit()
    conn.close()
    with pytest.raises(LedgerError, match="not a quotaledger ledger"):
        await SqliteLedger.open(db)


async def test_missing_or_empty_file_without_create(tmp_path: Path) -> None:
    with pytest.raises(LedgerError, match="no ledger"):
        await SqliteLedger.open(tmp_path / "missing.db", create=False)
    assert not (tmp_path / "missing.db").exists()
    empty = tmp_path / "empty.db"
    empty.touch()
    with pytest.raises(LedgerError, match="empty"):
        await SqliteLedger.open(empty, create=False)
    ledger = await SqliteLedger.open(empty)  # create=True turns an empty file into a ledger
    assert await ledger.last_offset() == 0
    await ledger.close()


# ------------------------------------------------------------------ append


async def test_concurrent_appends_are_gap_free_and_group_committed(db: Path) -> None:
    ledger = await SqliteLedger.open(db, ledger_id="g")
    rng = random.Random(7)
    batches = [
        [Append(b'{"n":"%d.%d"}' % (i, j)) for j in range(rng.randint(1, 5))] for i in range(300)
    ]
    results = await asyncio.gather(*(ledger.append(b) for b in batches))
    for batch, offsets in zip(batches, results, strict=True):
        assert len(offsets) == len(batch)
        assert offsets == list(range(offsets[0], offsets[0] + len(batch)))
    flat = sorted(o for offsets in results for o in offsets)
    assert flat == list(range(1, len(flat) + 1))
    assert ledger.commit_count < len(batches)

    # sequential appenders interleaving: still coalesced, still gap-free
    before = ledger.commit_count

    async def appender(w: int) -> list[int]:
        out: list[int] = []
        for k in range(10):
            out += await ledger.append([Append(b'{"w":"%d.%d"}' % (w, k))])
        return out

    more = await asyncio.gather(*(appender(w) for w in range(30)))
    calls = 30 * 10
    assert ledger.commit_count - before < calls / 2
    all_offsets = sorted(flat + [o for offs in more for o in offs])
    assert all_offsets == list(range(1, len(all_offsets) + 1))

    # every acknowledged record is committed: a fresh connection sees it
    records = await read_all(ledger)
    assert [r.offset for r in records] == list(range(len(records)))
    for batch, offsets in zip(batches, results, strict=True):
        assert [records[o].payload for o in offsets] == [a.payload for a in batch]
    await ledger.close()
    conn = sqlite3.connect(db)
    assert conn.execute("SELECT count(*) FROM records").fetchone()[0] == len(records)
    conn.close()


async def test_bad_appends_are_refused_and_write_nothing(db: Path) -> None:
    ledger = await SqliteLedger.open(db, ledger_id="bad")
    with pytest.raises(TypeError):
        await ledger.append([Append("text")])  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        await ledger.append([b"raw"])  # type: ignore[list-item]
    with pytest.raises(ValueError):
        await ledger.append([Append(b"x", 2**63)])
    assert await ledger.append([]) == []
    assert await ledger.last_offset() == 0
    await ledger.close()
    await ledger.close()  # idempotent
    with pytest.raises(LedgerError, match="closed"):
        await ledger.append([Append(b"x")])


async def test_payload_is_text_when_utf8_for_audit(db: Path) -> None:
    ledger = await SqliteLedger.open(db, ledger_id="audit")
    odd = [b'{"name":"caf\xc3\xa9"}', b"\xff\xfe binary", b"nul\x00inside", b""]
    await ledger.append([Append(p) for p in odd])
    assert [r.payload for r in await read_all(ledger, 1)] == odd
    await ledger.close()
    conn = sqlite3.connect(db)
    kinds = [k for (k,) in conn.execute("SELECT typeof(payload) FROM records ORDER BY offset")]
    assert kinds == ["text", "text", "blob", "blob", "text"]
    row = conn.execute("SELECT payload FROM records WHERE offset = 0").fetchone()[0]
    assert json.loads(row) == {"kind": "LedgerOpened", "at": None, "ledger_id": "audit"}
    conn.close()


# -------------------------------------------------------------------- read


async def test_read_and_iter_batches_in_batches(db: Path) -> None:
    ledger = await SqliteLedger.open(db, ledger_id="r")
    for start in range(0, 12_344, 1_000):
        await ledger.append([Append(b"%d" % i) for i in range(start, min(start + 1_000, 12_344))])
    sizes = [len(b) for b in ledger.iter_batches(batch=5_000)]
    assert sizes == [5_000, 5_000, 2_345]
    async_sizes = [len(b) async for b in ledger.read()]
    assert async_sizes == [1_000] * 12 + [345]
    tail = [r for b in ledger.iter_batches(12_000, batch=100) for r in b]
    assert [r.offset for r in tail] == list(range(12_000, 12_345))
    assert [r.payload for r in tail] == [b"%d" % (o - 1) for o in range(12_000, 12_345)]
    assert [len(b) async for b in ledger.read(12_345)] == []
    assert list(ledger.iter_batches(99_999)) == []
    await ledger.close()


async def test_follow_sees_later_appends_and_is_cancellable(db: Path) -> None:
    # a huge poll interval: only the wake-up by this object's appends can deliver
    ledger = await SqliteLedger.open(db, ledger_id="f", poll_interval=60.0)
    seen: list[Record] = []
    got_three = asyncio.Event()

    async def follow() -> None:
        async for batch in ledger.read(1, follow=True):
            seen.extend(batch)
            if len(seen) >= 3:
                got_three.set()

    task = asyncio.create_task(follow())
    await asyncio.sleep(0.05)
    assert seen == []
    await ledger.append([Append(b"a")])
    await ledger.append([Append(b"b"), Append(b"c")])
    # (any limit far below the 60 s poll proves the wake-up; this one only guards a hang)
    await asyncio.wait_for(got_three.wait(), 30)
    assert [(r.offset, r.payload) for r in seen] == [(1, b"a"), (2, b"b"), (3, b"c")]
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert task.cancelled()
    await ledger.close()


# --------------------------------------------------------------- snapshots


# ---------------------------------------------------------------- property

_batches = st.lists(
    st.lists(
        st.tuples(
            st.binary(max_size=40),
            st.one_of(st.none(), st.integers(min_value=-(2**63), max_value=2**63 - 1)),
        ),
        max_size=8,
    ),
    max_size=12,
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches=_batches, now=st.integers(min_value=0, max_value=2**45))
def test_property_offsets_ts_payloads(
    tmp_path_factory: pytest.TempPathFactory,
    batches: list[list[tuple[bytes, int | None]]],
    now: int,
) -> None:
    path = tmp_path_factory.mktemp("prop") / "ledger.db"

    async def run() -> tuple[list[list[int]], list[Record], list[Record]]:
        ledger = await SqliteLedger.open(path, ledger_id="prop", clock_ms=lambda: now)
        got = [await ledger.append([Append(p, ts) for p, ts in batch]) for batch in batches]
        records = await read_all(ledger)
        synced = [r for b in ledger.iter_batches(batch=3) for r in b]
        await ledger.close()
        return got, records, synced

    got, records, synced = asyncio.run(run())
    n = sum(len(b) for b in batches)
    assert [r.offset for r in records] == list(range(n + 1))
    assert synced == records
    expected_offsets: list[list[int]] = []
    expected_ts = [now]
    next_offset = 1
    for batch in batches:
        expected_offsets.append(list(range(next_offset, next_offset + len(batch))))
        next_offset += len(batch)
        for _, ts in batch:
            expected_ts.append(max(expected_ts[-1], now if ts is None else ts))
    assert got == expected_offsets
    assert [r.ts for r in records] == expected_ts
    assert all(a.ts <= b.ts for a, b in pairwise(records))
    assert [r.payload for r in records[1:]] == [p for batch in batches for p, _ in batch]


# --------------------------------------------------------------- processes


def parse_acks(tag: str, out: str) -> list[Ack]:
    """Acknowledged appends printed by crash_writer; only the last line may be torn."""
    lines = out.split("\n")
    acks: list[Ack] = []
    for i, line in enumerate(lines):
        if not line:
            continue
        try:
            worker, seq, offsets = json.loads(line)
        except ValueError:
            assert i == len(lines) - 1, f"torn line in the middle of the output: {line!r}"
            continue
        acks.append((tag, worker, seq, offsets))
    return acks


def verify_ledger(path: Path, ledger_id: str, acks: list[Ack], since: int = 1) -> list[Record]:
    """Reopen ``path`` and check every DESIGN §3 invariant plus the acknowledged appends.

    Batch atomicity is checked for the records from offset ``since`` on (those of
    writers that have not been checked yet).
    """

    async def load() -> tuple[list[Record], int]:
        ledger = await SqliteLedger.open(path, ledger_id=ledger_id)
        try:
            return [r for b in ledger.iter_batches() for r in b], await ledger.last_offset()
        finally:
            await ledger.close()

    records, last = asyncio.run(load())
    assert [r.offset for r in records] == list(range(len(records))), "offsets have a gap"
    assert last == len(records) - 1
    first = decode_event(records[0].payload)
    assert isinstance(first, LedgerOpened) and first.ledger_id == ledger_id
    assert all(a.ts <= b.ts for a, b in pairwise(records)), "ts decreased"
    counts = Counter(r.payload for r in records)
    assert [p for p, c in counts.items() if c > 1] == [], "a payload is duplicated"
    for tag, worker, seq, offsets in acks:
        assert offsets == list(range(offsets[0], offsets[0] + len(offsets)))
        for i, offset in enumerate(offsets):
            assert offset < len(records), f"acknowledged offset {offset} is missing"
            expected = writer_payload(tag, worker, seq + i, seq, len(offsets))
            assert records[offset].payload == expected
    # Batches are atomic, acknowledged or not: every batch present is whole, at
    # consecutive offsets, and each worker's sequence numbers have no hole.
    batches: dict[tuple[str, int, int], list[int]] = defaultdict(list)
    sizes: dict[tuple[str, int, int], int] = {}
    seqs: dict[tuple[str, int], list[int]] = defaultdict(list)
    for record in records[max(since, 1) :]:
        event = json.loads(record.payload)
        writer, worker_no, seq_no = event["uid"].rsplit(".", 2)
        first, size = event["batch"]
        batches[writer, int(worker_no), first].append(record.offset)
        sizes[writer, int(worker_no), first] = size
        seqs[writer, int(worker_no)].append(int(seq_no))
    for batch_key, batch_offsets in batches.items():
        whole = list(range(batch_offsets[0], batch_offsets[0] + sizes[batch_key]))
        assert batch_offsets == whole, f"torn batch {batch_key}"
    for key, numbers in seqs.items():
        assert sorted(numbers) == list(range(len(numbers))), f"lost records of {key}"
    return records


def spawn_writer(
    path: Path,
    tag: str,
    seed: int,
    *args: str,
    stdout: int | IO[str],
    stdin: int | IO[str] | None = None,
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(WRITER), str(path), tag, str(seed), *args],
        stdin=stdin,
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_two_processes_append_to_one_file(db: Path) -> None:
    # both open a missing file at once: exactly one of them creates it
    args = ("--batches", "100", "--workers", "3", "--wait-go")
    procs = [
        spawn_writer(db, f"p{i}", i, *args, stdout=subprocess.PIPE, stdin=subprocess.PIPE)
        for i in range(2)
    ]
    ready = []
    for proc in procs:
        assert proc.stderr is not None
        ready.append(proc.stderr.readline())
    # then they append at the same time
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    outs = [p.communicate(timeout=60) for p in procs]
    for proc, line, (_, err) in zip(procs, ready, outs, strict=True):
        assert proc.returncode == 0, line + err
    ids = {line.split()[1] for line in ready}
    assert len(ids) == 1, ids
    acks = [a for i, (out, _) in enumerate(outs) for a in parse_acks(f"p{i}", out)]
    assert len(acks) == 2 * 3 * 100
    records = verify_ledger(db, ids.pop(), acks)
    acked = sum(len(a[3]) for a in acks)
    assert len(records) == 1 + acked  # nothing but record 0 and the acknowledged appends
    # the two processes really interleaved
    spans = [
        (
            min(o for a in acks if a[0] == tag for o in a[3]),
            max(o for a in acks if a[0] == tag for o in a[3]),
        )
        for tag in ("p0", "p1")
    ]
    assert spans[0][0] < spans[1][1] and spans[1][0] < spans[0][1], spans


@pytest.mark.slow
def test_crash_kill9_at_random_points(tmp_path: Path) -> None:
    """SIGKILL a writer at random points, 50 times; every reopen keeps the invariants.

    Ten ledgers, five crashes each (so recovery is also followed by more appends),
    two trials at a time. One trial in six kills during start-up or open.
    """
    seed = int.from_bytes(os.urandom(4), "big")
    chains, per_chain = 10, 5

    def chain(c: int) -> tuple[int, int]:
        rng = random.Random(seed * 100 + c)
        path = tmp_path / f"crash{c}.db"
        ledger_id = f"crash-{c}"
        acks: list[Ack] = []
        checked = 1
        killed_while_writing = 0
        for t in range(per_chain):
            tag = f"c{c}t{t}"
            out_path = tmp_path / f"{tag}.out"
            with out_path.open("w") as out:
                proc = spawn_writer(
                    path, tag, rng.randrange(2**31), "--ledger-id", ledger_id, stdout=out
                )
                assert proc.stderr is not None
                if rng.random() < 1 / 6:
                    time.sleep(rng.uniform(0.0, 0.15))
                else:
                    ready = proc.stderr.readline()
                    assert ready.startswith("READY"), ready + proc.stderr.read()
                    time.sleep(rng.uniform(0.02, 0.2))
                    killed_while_writing += 1
                proc.send_signal(signal.SIGKILL)
                proc.wait(timeout=10)
                err = proc.stderr.read()
                proc.stderr.close()
            assert proc.returncode == -signal.SIGKILL, f"writer died on its own: {err}"
            try:
                acks += parse_acks(tag, out_path.read_text())
                checked = len(verify_ledger(path, ledger_id, acks, since=checked))
            except AssertionError as exc:
                raise AssertionError(f"seed {seed}, ledger {c}, crash {t}: {exc}") from exc
        return len(acks), killed_while_writing

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(chain, range(chains)))
    total_acks = sum(a for a, _ in results)
    assert sum(k for _, k in results) >= chains  # most kills hit a writing process
    assert total_acks > 100, f"writers acknowledged too little ({total_acks}); seed {seed}"
