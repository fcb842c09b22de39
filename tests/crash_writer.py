"""Helper process for tests/test_sqlite_ledger.py: append to a SQLite ledger in a loop.

    python tests/crash_writer.py PATH TAG SEED [--workers K] [--batches N] [--ledger-id ID]
                                               [--wait-go]

Opens PATH (creating it if needed), prints ``READY <ledger_id>`` to stderr,
with ``--wait-go`` waits for a line on stdin (so several writers start together), then
runs K coroutines that each append batches of random size (and random ``ts``:
None, below or above the tail) through the same ledger object, so their appends
are group-committed. After each ``append`` returns, the coroutine prints one
JSON line ``[worker, first_seq, offsets]`` to stdout and flushes: every printed
line is an acknowledged append. The payload of sequence number ``seq`` of worker
``w``, in a batch of ``size`` records starting at ``first``, is :func:`payload`
``(TAG, w, seq, first, size)``: a reader can tell whether a batch is whole.

With ``--batches N`` each worker stops after N batches and the process exits 0;
without it the process appends until it is killed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys

from quotaledger.adapters.ledgers.sqlite.ledger import SqliteLedger
from quotaledger.events.ledger import Append
from quotaledger.events.times import wall_clock_ms


def payload(tag: str, worker: int, seq: int, first: int, size: int) -> bytes:
    """The event JSON of one appended record (unique per tag, worker and seq)."""
    return b'{"kind":"PodRemoved","uid":"%s.%d.%d","batch":[%d,%d]}' % (
        tag.encode(),
        worker,
        seq,
        first,
        size,
    )


async def _worker(ledger: SqliteLedger, tag: str, w: int, rng: random.Random, batches: int) -> None:
    seq = 0
    done = 0
    base = wall_clock_ms()
    while batches == 0 or done < batches:
        size = rng.randint(1, 16)
        items = []
        for i in range(size):
            roll = rng.random()
            ts = None if roll < 0.5 else base + rng.randint(-5_000, 5_000)
            items.append(Append(payload(tag, w, seq + i, seq, size), ts))
        offsets = await ledger.append(items)
        sys.stdout.write(json.dumps([w, seq, offsets]) + "\n")
        sys.stdout.flush()
        seq += size
        done += 1


async def _main(args: argparse.Namespace) -> None:
    ledger = await SqliteLedger.open(args.path, ledger_id=args.ledger_id)
    sys.stderr.write(f"READY {ledger.ledger_id}\n")
    sys.stderr.flush()
    if args.wait_go:
        await asyncio.to_thread(sys.stdin.readline)
    rng = random.Random(args.seed)
    workers = [
        _worker(ledger, args.tag, w, random.Random(rng.random()), args.batches)
        for w in range(args.workers)
    ]
    await asyncio.gather(*workers)
    await ledger.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("path")
    parser.add_argument("tag")
    parser.add_argument("seed", type=int)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--batches", type=int, default=0)
    parser.add_argument("--ledger-id", default=None)
    parser.add_argument("--wait-go", action="store_true", help="start after a line on stdin")
    asyncio.run(_main(parser.parse_args()))


if __name__ == "__main__":
    main()
