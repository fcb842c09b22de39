"""``run``: the live engine on the wall clock against a ledger (DESIGN §6, §10, §12).

The engine follows the ledger, runs the reconcilers and drives evictions
through the chosen executor until SIGTERM/SIGINT, which drain and exit
cleanly (DESIGN §9 shutdown). Imported when the command runs, not at
start-up: the live engine (only ``run`` needs it), and the Kafka executor and
the Kubernetes cluster only when asked for (aiokafka and kubernetes-asyncio
take longer to import than most other commands take to run).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

from quotaledger.events.ledger import LedgerError

from ..kubernetes.options import add_arguments as add_cluster_arguments
from ..kubernetes.options import check_arguments, on_cluster
from ..ledgers.url import is_kafka_url, open_ledger, parse_ledger_url
from .common import (
    LEDGER_HELP,
    SNAPSHOTS_HELP,
    Commands,
    UserError,
    positive_int,
    positive_seconds,
    progress_every_s,
    writable_ledger,
)


async def _run_engine(args: argparse.Namespace) -> None:
    """Open (or create) the ledger and run the live engine, or the engine and the
    cluster watcher when on a cluster, until SIGTERM/SIGINT or ``--stop-after``."""
    from quotaledger.engine.executors import LogExecutor, SimulateExecutor
    from quotaledger.engine.live import LiveEngine

    if args.executor == "kafka" and not is_kafka_url(args.ledger):
        raise UserError(
            "--executor kafka needs a kafka:// ledger (its topics are TOPIC.evictions"
            " and TOPIC.outcomes)"
        )
    every_s = progress_every_s()
    # Until the loop's handlers are in place, a signal raises Interrupted (main).
    ledger = await open_ledger(args.ledger, create=True, snapshots=args.snapshots)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    # Before restore: LiveEngine.restore checks ``stop`` between catch-up batches.
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    if args.stop_after is not None:
        loop.call_later(args.stop_after, stop.set)
    if on_cluster(args):
        # Imported here: kubernetes-asyncio alone takes seconds to import.
        from ..kubernetes.client import ClusterConfigError
        from ..kubernetes.cluster import run_on_cluster
        from ..kubernetes.options import ClusterOptions

        try:
            options = ClusterOptions.from_args(args, snapshot_every=args.snapshot_every)
            await run_on_cluster(options, ledger, stop)
        except ClusterConfigError as exc:
            raise UserError(str(exc)) from None
        finally:
            await ledger.close()
        return
    executor: Any = SimulateExecutor() if args.executor == "simulate" else LogExecutor()
    if args.executor == "kafka":
        from ..ledgers.kafka.executor import KafkaExecutor  # here: aiokafka is slow to import

        url = parse_ledger_url(args.ledger)
        executor = KafkaExecutor(
            url.bootstrap,
            url.topic,
            client_options=url.client_options(),
            outcome_timeout_s=args.eviction_timeout,
        )
    engine = LiveEngine(
        ledger,
        executor,
        instance=args.instance,
        election=not args.no_election,
        snapshot_every=args.snapshot_every,
        progress_every_s=every_s,
        digest_every=args.digest_every,
    )

    async def ready() -> None:
        if args.executor == "kafka":
            # after the restore: the outcome reader knows which evictions are outstanding
            executor.bind(lambda: engine.state)
            await executor.start()
        print(
            f"engine {args.instance} running on {args.ledger} at offset {engine.state.offset}",
            file=sys.stderr,
            flush=True,
        )

    try:
        try:
            await engine.run(stop, ready)
        except* LedgerError as group:
            # e.g. a Kafka broker that lost its log: one clear error, not a traceback
            raise group.exceptions[0] from None
    finally:
        if args.executor == "kafka":
            await executor.close()
        await ledger.close()


def cmd_run(args: argparse.Namespace) -> int:
    writable_ledger(Path(args.ledger))
    problem = check_arguments(args)
    if problem is not None:
        raise UserError(problem)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("aiokafka").setLevel(logging.WARNING)  # its INFO is per connection
    asyncio.run(_run_engine(args))
    return 0


def register(commands: Commands) -> None:
    """``run``."""
    raw = argparse.RawDescriptionHelpFormatter

    run = commands.add_parser(
        "run",
        help="run the engine live against a SQLite ledger",
        description="Follow the ledger, run the reconcilers on the wall clock and drive"
        " evictions, until SIGTERM/SIGINT (which drain and exit cleanly).",
        epilog="examples:\n  quotaledger run ledger.db\n"
        "  quotaledger run ledger.db --executor log --instance eng-1\n"
        "  quotaledger run ledger.db --kubeconfig ~/.kube/config --executor log   # shadow mode\n"
        "  quotaledger run /data/ledger.db --in-cluster --executor kubernetes\n",
        formatter_class=raw,
    )
    run.add_argument("ledger", help=f"{LEDGER_HELP} (created if missing)")
    run.add_argument("--snapshots", metavar="PATH", help=SNAPSHOTS_HELP)
    run.add_argument(
        "--executor",
        choices=["simulate", "log", "kubernetes", "kafka"],
        default="simulate",
        help="simulate: each eviction succeeds at once and the pod is removed; log: dry run,"
        " evictions are logged and recorded as failed; kubernetes: policy/v1 evictions (needs"
        " --kubeconfig or --in-cluster); kafka: commands on TOPIC.evictions, answers from"
        " TOPIC.outcomes (docs/PRODUCERS.md) (default: simulate)",
    )
    run.add_argument(
        "--eviction-timeout",
        type=float,
        default=300.0,
        metavar="SECONDS",
        help="kafka executor: an eviction without an answer by then fails (default 300)",
    )
    run.add_argument("--instance", default=f"engine-{os.getpid()}", help="this engine's name")
    run.add_argument(
        "--no-election",
        action="store_true",
        help="do not claim a leader epoch (several engines then all propose; the guard decides)",
    )
    run.add_argument(
        "--snapshot-every",
        metavar="N",
        type=positive_int,
        default=50_000,
        help="records between snapshots (default: 50000)",
    )
    run.add_argument(
        "--digest-every",
        metavar="N",
        type=positive_int,
        default=10_000,
        help="records between LedgerDigest records (DESIGN §9; default: 10000)",
    )
    run.add_argument(
        "--stop-after",
        metavar="SECONDS",
        type=positive_seconds,
        help="stop (and drain) after this many seconds (default: run until SIGTERM/SIGINT)",
    )
    add_cluster_arguments(run)
    run.set_defaults(handler=cmd_run)
