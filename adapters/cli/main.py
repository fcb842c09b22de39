"""The ``quotaledger`` command line (DESIGN §7): the parser registry and dispatch.

Each command family has its own module, which registers its parsers through
``register(commands)`` and sets the handler the command runs; this module adds
the global options (``--version``, the examples), sizes the collector and
turns what a handler raises into the exit status: a clear ``quotaledger:
error: ...`` and 2 on bad input (a bad JSONL line names its line number and
field), 1 on other failures, ``128 + N`` when signal N stopped the command
(DESIGN §9), never a traceback for a user's mistake.

Start-up stays short for every command: a command module imports what its
command needs at its top, except for what only its own command uses and takes
long to import, imported when that command runs and named in that module's
docstring (the auditor, the live engine, the simulation, sqlite3, aiokafka,
kubernetes-asyncio, the benchmarks): ``quotaledger --help`` imports none of them.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import PackageNotFoundError, version

from quotaledger.events.ledger import LedgerError
from quotaledger.projections.snapshot import SnapshotError

from ..demo import add_demo_parser
from ..http.command import add_serve_parser
from ..ledgers.jsonl import JsonlError
from . import audit, bench, fold, importing, ledger, run, simulate, whatif
from .common import Commands, Interrupted, UserError, interruptible, tune_gc

EXAMPLES = """\
examples:
  quotaledger replay examples/koordinator.jsonl           # fold a file, print the tree
  quotaledger replay examples/koordinator.jsonl --json    # the state JSON (DESIGN §7)
  quotaledger replay events.jsonl --strict                # stop at the first bad line
  cat events.jsonl | quotaledger replay -                 # - is standard input
  quotaledger replay ledger.db --until 1500               # state as of offset 1500
  quotaledger replay ledger.db --until 2026-01-01T12:00:00Z
  quotaledger ingest examples/koordinator.jsonl ledger.db # JSONL -> SQLite ledger
  quotaledger tree ledger.db
  quotaledger simulate examples/quota-decrease.jsonl      # reconcilers on a virtual clock
  quotaledger snapshot ledger.db
  quotaledger audit sim.db                                # explain and re-derive decisions
  quotaledger whatif sim.db --at 7 --change c.jsonl       # evictions a change would cause
  quotaledger serve ledger.db                             # HTTP API, metrics, page
  quotaledger demo                                        # a synthetic cluster to watch
  quotaledger bench fold --json
  quotaledger import queues.yaml --out quotas.jsonl      # other schedulers' quotas -> facts
  quotaledger init kafka://127.0.0.1:9092/quota-ledger   # a Kafka ledger (one partition)
  quotaledger run kafka://127.0.0.1:9092/quota-ledger --snapshots ql-snapshots.db
  quotaledger replay kafka://127.0.0.1:9092/quota-ledger --json
"""


#: Every command family's registration, in the order ``quotaledger --help`` lists them.
REGISTRATIONS: tuple[Callable[[Commands], None], ...] = (
    fold.register,  # replay, tree
    ledger.register,  # init, ingest, snapshot
    simulate.register,
    run.register,
    audit.register,
    whatif.register,
    bench.register,
    add_serve_parser,  # serve: registered by the HTTP interface itself
    add_demo_parser,
    importing.register,
)


def _version() -> str:
    try:
        return version("quotaledger")
    except PackageNotFoundError:
        return "unknown"


#: Options whose value may start with ``-`` (``--horizon -5m``, ``--at -3``):
#: argparse would take such a value for an option; joined as ``--opt=value``
#: it reaches the option, which refuses it with its own message.
VALUE_OPTIONS = frozenset(
    {"--until", "--at", "--horizon", "--stop-after", "--snapshot-every", "--from-line"}
)


def _join_dash_values(argv: Sequence[str]) -> list[str]:
    """``--opt -value`` as ``--opt=-value`` for the :data:`VALUE_OPTIONS`."""
    out: list[str] = []
    items = list(argv)
    index = 0
    while index < len(items):
        item = items[index]
        following = items[index + 1] if index + 1 < len(items) else None
        if (
            item in VALUE_OPTIONS
            and following is not None
            and following.startswith("-")
            and following != "-"
            and following[1:2] not in ("-", "")
            and not following[1:2].isalpha()
        ):
            out.append(f"{item}={following}")
            index += 2
            continue
        out.append(item)
        index += 1
    return out


def build_parser() -> argparse.ArgumentParser:
    """The ``quotaledger`` parser: the global options and every command's own parser."""
    parser = argparse.ArgumentParser(
        prog="quotaledger",
        description="Event-sourced hierarchical elastic quota for shared Kubernetes clusters.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {_version()}", help="print the version"
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for register in REGISTRATIONS:
        register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command ``argv`` names (default: ``sys.argv[1:]``); return the exit status."""
    tune_gc()
    parser = build_parser()
    args = parser.parse_args(_join_dash_values(sys.argv[1:] if argv is None else argv))
    if getattr(args, "handler", None) is None:
        parser.print_help()
        return 2
    try:
        with interruptible():
            return int(args.handler(args))
    except (UserError, JsonlError, LedgerError, SnapshotError) as exc:
        print(f"quotaledger: error: {exc}", file=sys.stderr)
        return 2
    except Interrupted as exc:
        # The signal may have been raised inside a task other than the main one
        # (a ledger's writer loop): asyncio would then log that task's
        # "exception never retrieved" with a traceback when it is collected.
        # The interruption is the expected way out, reported below.
        logging.getLogger("asyncio").disabled = True
        name = signal.Signals(exc.signum).name
        detail = f"; {exc.detail}" if exc.detail else ""
        print(f"quotaledger: stopped by {name}{detail}", file=sys.stderr, flush=True)
        return 128 + exc.signum
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as exc:  # an input path that is a directory, unreadable, ...
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"quotaledger: error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 2
