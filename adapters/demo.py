"""``quotaledger demo``: a synthetic cluster fed into a ledger, with engine and ``serve``
(DESIGN §11). What a newcomer runs to see the whole thing.

The cluster: four nodes (64 cpu), a three-level tree (``engineering`` → ``platform``,
``ml`` → four leaves), pods arriving and finishing in ``platform-batch`` all along,
and a script on the demo clock (seconds since the start, compressed by ``--speed``):

* t=30: ``platform-api``'s max drops from 40 to 14 cpu with a 60 s delay while it uses
  20 → at t≈90 a **quota-decrease preemption** evicts 6 cpu of its pods (its min 12
  and its parents' mins stay covered);
* t=120: ``ml-training`` scales up and fills the cluster, borrowing from the rest of
  the tree; t=130: a 6-cpu pod of ``ml-serving`` (within its min) cannot be placed:
  it **starves**, and after ``reclaim_after_s`` (30 s) a **reclaim** evicts
  ``ml-training`` pods (the nearest owing quota); t=220: the pod is bound.

Overuse revoke is switched off so that the two stories stay apart. The ledger and
the engine run on the demo clock: ``--speed 10`` makes a minute pass in six
seconds, timers included.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import secrets
import signal
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quotaledger.engine.stopping import unless_stopped
from quotaledger.events.ledger import Append, Ledger
from quotaledger.events.times import wall_clock_ms

from .http.command import base_url, parse_listen, run_server
from .http.options import ServeError

log = logging.getLogger("quotaledger.demo")

CPU_PER_NODE = 16
NODES = 4


@dataclass(slots=True)
class DemoClock:
    """Milliseconds on the demo clock: starts at the wall clock, runs ``speed`` × faster."""

    speed: float
    wall_start: float = field(default_factory=time.monotonic)
    epoch_start_ms: int = field(default_factory=wall_clock_ms)

    def __call__(self) -> int:
        return self.epoch_start_ms + int((time.monotonic() - self.wall_start) * 1000 * self.speed)

    def at(self, demo_s: float) -> int:
        return self.epoch_start_ms + int(demo_s * 1000)

    async def sleep_until(self, demo_s: float) -> None:
        wait = (self.at(demo_s) - self()) / 1000 / self.speed
        if wait > 0:
            await asyncio.sleep(wait)


def _quota(name: str, parent: str, min_cpu: int, **extra: Any) -> dict[str, Any]:
    return {
        "kind": "QuotaUpserted",
        "name": name,
        "parent": parent,
        "min": {"cpu": min_cpu},
        **extra,
    }


def _pod(
    uid: str, quota: str, cpu: int, *, node: str | None, phase: str = "Running"
) -> dict[str, Any]:
    return {
        "kind": "PodUpserted",
        "uid": uid,
        "name": uid,
        "namespace": quota,
        "requests": {"cpu": cpu, "memory": f"{cpu * 2}Gi"},
        "phase": phase,
        "node": node,
    }


def _node_of(index: int) -> str:
    return f"node-{index % NODES + 1}"


def setup() -> list[dict[str, Any]]:
    """Settings, nodes, the tree and the first pods (used: 54 of 64 cpu)."""
    facts: list[dict[str, Any]] = [
        {
            "kind": "SettingsChanged",
            "quota_preemption_enabled": True,
            "revoke_enabled": False,
            "reclaim_enabled": True,
            "reclaim_after_s": 30,
        }
    ]
    for index in range(NODES):
        facts.append(
            {
                "kind": "NodeUpserted",
                "name": _node_of(index),
                "allocatable": {"cpu": CPU_PER_NODE, "memory": f"{CPU_PER_NODE * 4}Gi"},
            }
        )
    facts += [
        _quota("engineering", "root", 44, is_parent=True),
        _quota("platform", "engineering", 20, is_parent=True),
        _quota("ml", "engineering", 24, is_parent=True),
        _quota("platform-api", "platform", 12, max={"cpu": 40}, preemption_delay_s=60),
        _quota("platform-batch", "platform", 8, max={"cpu": 48}),
        _quota("ml-training", "ml", 16, max={"cpu": 64}),
        _quota("ml-serving", "ml", 8, max={"cpu": 32}),
    ]
    facts += [_pod(f"api-{n}", "platform-api", 2, node=_node_of(n)) for n in range(10)]
    facts += [_pod(f"batch-{n}", "platform-batch", 1, node=_node_of(n)) for n in range(8)]
    facts += [_pod("serving-0", "ml-serving", 2, node=_node_of(0))]
    facts += [_pod(f"train-{n}", "ml-training", 4, node=_node_of(n)) for n in range(6)]
    return facts


def script() -> list[tuple[float, list[dict[str, Any]]]]:
    """The scripted steps after the setup, on demo seconds (see module docstring)."""
    return [
        (
            30,
            [_quota("platform-api", "platform", 12, max={"cpu": 14}, preemption_delay_s=60)],
        ),
        (120, [_pod(f"train-{n}", "ml-training", 4, node=_node_of(n)) for n in range(6, 10)]),
        (130, [_pod("serving-burst", "ml-serving", 6, node=None, phase="Pending")]),
        (220, [_pod("serving-burst", "ml-serving", 6, node=_node_of(1))]),
    ]


def churn(every_s: float = 10.0) -> Iterator[tuple[float, list[dict[str, Any]]]]:
    """``platform-batch`` forever: every ``every_s`` one pod finishes and a new one starts."""
    step = 0
    while True:
        step += 1
        done = f"batch-{step - 1}"
        new = f"batch-{step + 7}"
        finished = _pod(done, "platform-batch", 1, node=_node_of(step - 1), phase="Succeeded")
        yield (
            step * every_s,
            [
                finished,
                {"kind": "PodRemoved", "uid": done},
                _pod(new, "platform-batch", 1, node=_node_of(step + 7)),
            ],
        )


def timeline() -> Iterator[tuple[float, list[dict[str, Any]]]]:
    """The script and the churn merged in demo-time order."""
    scripted = iter(script())
    pending = next(scripted, None)
    for moment, facts in churn():
        while pending is not None and pending[0] <= moment:
            yield pending
            pending = next(scripted, None)
        yield moment, facts


async def produce(ledger: Ledger, clock: DemoClock) -> None:
    """Append the setup, then every step of the timeline when the demo clock reaches it."""

    def appends(facts: list[dict[str, Any]]) -> list[Append]:
        return [Append(payload=json.dumps(fact).encode()) for fact in facts]

    await ledger.append(appends(setup()))
    for moment, facts in timeline():
        await clock.sleep_until(moment)
        await ledger.append(appends(facts))


# ------------------------------------------------------------------------ running


@dataclass(slots=True)
class DemoOptions:
    host: str = "127.0.0.1"
    port: int = 8080
    speed: float = 10.0
    duration: float | None = None
    kafka: str | None = None
    serve: bool = True


async def open_demo_ledger(options: DemoOptions, directory: Path, clock: DemoClock) -> Ledger:
    """A new SQLite ledger on the demo clock, or the Kafka URL (through
    :func:`quotaledger.adapters.ledgers.url.open_ledger`, the one opener)."""
    from .ledgers.sqlite.ledger import SqliteLedger
    from .ledgers.url import open_ledger

    if options.kafka is not None:
        return await open_ledger(options.kafka, create=True)
    return await SqliteLedger.open(str(directory / "demo.db"), create=True, clock_ms=clock)


async def run_demo(
    options: DemoOptions,
    *,
    stop: asyncio.Event | None = None,
    out: Any = None,
    on_server: Callable[[Any], None] | None = None,
) -> dict[str, int]:
    """Run the demo until ``--duration``, SIGTERM/SIGINT or ``stop``; return the
    decisions by kind that the ledger holds at the end."""
    from .http.options import ServeOptions
    from .http.server import Server

    out = out or sys.stdout
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    clock = DemoClock(options.speed)
    token = secrets.token_urlsafe(16)
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    if options.duration is not None:
        loop.call_later(options.duration, stop.set)
    server: Server | None = None
    with tempfile.TemporaryDirectory(prefix="quotaledger-demo-") as tmp:
        ledger = await open_demo_ledger(options, Path(tmp), clock)
        try:

            def announce(running: Server) -> None:
                base = base_url(running)
                print(f"quotaledger demo serving {base}/  (speed {options.speed:g}x)", file=out)
                print(f"  page     {base}/", file=out)
                print(f"  metrics  {base}/metrics", file=out)
                print(f"  API      {base}/v1/tree  {base}/v1/decisions", file=out)
                print(f"  token    {token}   (POST /v1/events)", file=out, flush=True)
                if on_server is not None:
                    on_server(running)

            async def producer() -> None:
                # the timeline until the stop (cancelled and waited for then), and
                # the demo goes on serving what it wrote until the stop
                await unless_stopped(produce(ledger, clock), stop)
                await stop.wait()

            async with asyncio.TaskGroup() as group:
                group.create_task(producer())
                if options.serve:
                    server = Server(
                        ledger,
                        ServeOptions(
                            host=options.host,
                            port=options.port,
                            token=token.encode(),
                            instance="demo",
                            clock_ms=clock,
                            idle_poll_s=max(0.01, 0.5 / options.speed),
                        ),
                    )
                    group.create_task(server.run(stop, announce))
            counts = await _decision_counts(ledger)
        finally:
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(signum)
            await ledger.close()
    summary = ", ".join(f"{kind} {n}" for kind, n in sorted(counts.items())) or "none"
    print(f"demo finished: decisions in the ledger: {summary}", file=out, flush=True)
    return counts


async def _decision_counts(ledger: Ledger) -> dict[str, int]:
    from quotaledger.events.codec import peek_kind
    from quotaledger.events.model import DECISION_KINDS

    counts: Counter[str] = Counter()
    async for batch in ledger.read(0):
        for record in batch:
            kind = peek_kind(record.payload)
            if kind in DECISION_KINDS and kind not in ("LedgerOpened", "ClocksObserved"):
                counts[kind] += 1
    return dict(counts)


DEMO_EPILOG = """\
examples:
  quotaledger demo                          # open http://127.0.0.1:8080/, Ctrl-C to stop
  quotaledger demo --speed 30 --duration 20 # the whole story in about ten seconds
  quotaledger demo --listen 0.0.0.0:8080    # reachable from other machines
  quotaledger demo --kafka kafka://kafka:9092/quotaledger --no-serve --speed 1  # producer

What happens (demo seconds; --speed compresses them): t=30 platform-api's max drops to
14 cpu with a 60 s delay -> quota-decrease preemption at t=90; t=120 ml-training fills
the cluster, t=130 a pod of ml-serving starves -> reclaim at t=160; pods of
platform-batch arrive and finish all along. Watch /, /v1/decisions and /metrics.
"""


def add_demo_parser(commands: Any) -> None:
    """``demo`` among the CLI's subcommands (``adapters/cli/``)."""
    parser = commands.add_parser(
        "demo",
        help="a synthetic cluster with engine, HTTP API, metrics and page",
        description="Feed a synthetic cluster (nodes, a three-level quota tree, pods"
        " arriving and finishing, a quota decrease that causes a preemption, a starving pod"
        " that causes a reclaim) into a temporary SQLite ledger (or Kafka) and run the"
        " engine and `serve` on it. Prints the URLs; stops on Ctrl-C or after --duration.",
        epilog=DEMO_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--listen",
        default="127.0.0.1:8080",
        metavar="ADDR",
        help="HOST:PORT (default 127.0.0.1:8080)",
    )
    parser.add_argument(
        "--speed",
        type=float,
        default=None,
        help="demo seconds per real second (default 10; with --kafka 1, the only speed there)",
    )
    parser.add_argument(
        "--duration", type=float, metavar="S", help="stop after S real seconds (default: never)"
    )
    parser.add_argument(
        "--kafka", metavar="URL", help="kafka://HOST:PORT/TOPIC instead of a temporary SQLite file"
    )
    parser.add_argument(
        "--no-serve",
        dest="serve",
        action="store_false",
        help="only produce the facts (another process runs `serve` on the ledger)",
    )
    parser.set_defaults(handler=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    if args.speed is None:  # a Kafka ledger's time is the wall clock (DECISIONS 133)
        args.speed = 1.0 if args.kafka is not None else 10.0
    if not args.speed > 0 or args.speed > 10_000:
        raise ServeError("--speed must be > 0 and at most 10000")
    if args.duration is not None and not args.duration > 0:
        raise ServeError("--duration must be > 0")
    if args.kafka is not None and args.speed != 1:
        raise ServeError(
            "--speed must be 1 with --kafka: the Kafka ledger stamps records with the wall clock"
        )
    if not args.serve and args.kafka is None:
        raise ServeError("--no-serve needs --kafka (a temporary ledger nobody serves is useless)")
    host, port = parse_listen(args.listen)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    options = DemoOptions(
        host=host,
        port=port,
        speed=args.speed,
        duration=args.duration,
        kafka=args.kafka,
        serve=args.serve,
    )
    run_server(run_demo(options), args.listen)
    return 0
