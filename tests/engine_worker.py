"""Helper process for the live-engine tests: one :class:`LiveEngine` per ledger, one loop.

    python tests/engine_worker.py --instance NAME [--no-election] [--slow-ms LO HI] [--stall]
                                  [--append-delay-ms LO HI] [--seed N] [--poll S] [--idle S]
                                  LEDGER [LEDGER ...]

Runs an engine over every LEDGER (existing SQLite ledgers) concurrently in one
asyncio loop, so two processes can serve hundreds of ledgers without hundreds
of interpreter start-ups. Prints ``ready`` on stdout once every engine is
running (restored, elected when election is on). SIGTERM or SIGINT stops all
engines (each drains and leaves its ledger consistent) and the process exits
0; an engine that fails makes it exit non-zero with the traceback on stderr.

The executor is the simulate one (``EvictionSucceeded`` + ``PodRemoved``).
With ``--slow-ms LO HI`` each eviction first prints
``drive LEDGER_NAME EVICTION_ID`` (flushed) and sleeps a random LO..HI ms, so
a test can SIGKILL the process while evictions are in flight and see which
ones were being driven. With ``--stall`` as well, the executor never returns
after that line (the process is there to be SIGKILLed while driving: a test can
then kill it mid-eviction on that line instead of at a chosen time). With
``--append-delay-ms LO HI`` every append of the
engine waits a random LO..HI ms first (a slow link to the ledger): a decision
then lands a while after the state it was computed from, which widens the
window in which two engines decide on states that miss each other's writes.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import sys
from collections.abc import Sequence
from typing import Any

from quotaledger.adapters.ledgers.sqlite.ledger import SqliteLedger
from quotaledger.engine.executors import SimulateExecutor
from quotaledger.engine.live import LiveEngine
from quotaledger.events.ledger import Append
from quotaledger.events.model import Event
from quotaledger.projections.state import EvictionRun, ProjectedState


class SlowSimulateExecutor(SimulateExecutor):
    """The simulate executor after a random pause; announces each eviction on stdout."""

    def __init__(
        self, name: str, rng: random.Random, low_ms: float, high_ms: float, stall: bool = False
    ) -> None:
        self.name = name
        self.rng = rng
        self.low_ms = low_ms
        self.high_ms = high_ms
        self.stall = stall

    async def evict(self, eviction: EvictionRun, state: ProjectedState) -> list[Event]:
        sys.stdout.write(f"drive {self.name} {eviction.eviction_id}\n")
        sys.stdout.flush()
        if self.stall:
            await asyncio.Event().wait()
        await asyncio.sleep(self.rng.uniform(self.low_ms, self.high_ms) / 1000)
        return await super().evict(eviction, state)


class SlowLink:
    """A ledger whose appends start after a random pause; the rest is the ledger's."""

    def __init__(self, ledger: SqliteLedger, rng: random.Random, low_ms: float, high_ms: float):
        self.ledger = ledger
        self.rng = rng
        self.low_ms = low_ms
        self.high_ms = high_ms

    def __getattr__(self, name: str) -> Any:
        return getattr(self.ledger, name)

    async def append(self, batch: Sequence[Append]) -> list[int]:
        await asyncio.sleep(self.rng.uniform(self.low_ms, self.high_ms) / 1000)
        return await self.ledger.append(batch)


async def _main(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    rng = random.Random(args.seed)
    ledgers = [
        await SqliteLedger.open(path, create=False, poll_interval=args.poll)
        for path in args.ledgers
    ]
    remaining = len(ledgers)

    async def ready() -> None:
        nonlocal remaining
        remaining -= 1
        if remaining == 0:
            sys.stdout.write("ready\n")
            sys.stdout.flush()

    engines = []
    for path, ledger in zip(args.ledgers, ledgers, strict=True):
        name = os.path.basename(path)
        executor = (
            SlowSimulateExecutor(
                name, random.Random(rng.random()), args.slow_ms[0], args.slow_ms[1], args.stall
            )
            if args.slow_ms
            else SimulateExecutor()
        )
        link: Any = ledger
        if args.append_delay_ms:
            link = SlowLink(ledger, random.Random(rng.random()), *args.append_delay_ms)
        engines.append(
            LiveEngine(
                link,
                executor,
                instance=args.instance,
                election=not args.no_election,
                idle_poll_s=args.idle,
            )
        )
    try:
        async with asyncio.TaskGroup() as group:
            for engine in engines:
                group.create_task(engine.run(stop, ready))
    finally:
        for ledger in ledgers:
            await ledger.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("ledgers", nargs="+", metavar="LEDGER")
    parser.add_argument("--instance", required=True)
    parser.add_argument("--no-election", action="store_true")
    parser.add_argument("--slow-ms", type=float, nargs=2, metavar=("LO", "HI"))
    parser.add_argument("--stall", action="store_true", help="with --slow-ms: never return")
    parser.add_argument("--append-delay-ms", type=float, nargs=2, metavar=("LO", "HI"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--poll", type=float, default=0.02, help="follow poll interval (s)")
    parser.add_argument("--idle", type=float, default=0.05, help="reconciler idle poll (s)")
    asyncio.run(_main(parser.parse_args()))


if __name__ == "__main__":
    main()
