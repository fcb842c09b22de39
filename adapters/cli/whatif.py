"""``whatif``: fork the state at a point, apply hypothetical facts, show the evictions (DESIGN §7).

Nothing is written: the ledger (or JSONL file) is folded up to ``--at``, the
``--change`` facts (strict: a typo must not silently change nothing) are
applied on a virtual clock until ``--horizon``, and each eviction says whether
it would also happen without the change. The what-if engine is imported when
the command runs, not at every command's start-up.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from quotaledger.engine.fold_loop import Until, fold
from quotaledger.projections import Projection

from ..ledgers.jsonl import STDIN, is_jsonl_path, open_jsonl, read_lines
from ..ledgers.sources import jsonl_file_records
from .common import (
    LEDGER_HELP,
    SNAPSHOTS_HELP,
    Commands,
    UserError,
    check_end,
    ledger_arg,
    print_json,
    until_option,
)
from .fold import fold_ledger


def fold_for_whatif(path: Path | str, until: Until, args: argparse.Namespace) -> Projection:
    """The state to fork: LEDGER folded up to ``--at``, without progress. A JSONL
    file keeps an export's offsets (its own ``LedgerOpened`` is offset 0)."""
    options = argparse.Namespace(
        no_snapshot=args.no_snapshot, progress=False, snapshots=getattr(args, "snapshots", None)
    )
    if isinstance(path, str):
        return asyncio.run(fold_ledger(path, until, options)).projection
    if is_jsonl_path(path):
        projection = Projection()
        fold(projection, [jsonl_file_records(path)], until)
        return projection
    if not path.exists():
        raise UserError(f"{path}: no such file")
    return asyncio.run(fold_ledger(path, until, options)).projection


def cmd_whatif(args: argparse.Namespace) -> int:
    from quotaledger.engine.whatif import ChangeError, parse_duration, whatif, whatif_text

    try:
        horizon = parse_duration(args.horizon, "--horizon")
    except ValueError as exc:
        raise UserError(str(exc)) from None
    until = until_option(args.at, "--at")
    if args.change == STDIN and args.ledger == STDIN:
        raise UserError("LEDGER and --change cannot both be - (standard input)")
    # Hypothetical facts are strict: a typo must not silently change nothing.
    with open_jsonl(args.change) as change_source:
        changes = [(line.ts, line.payload) for line in read_lines(change_source, strict=True)]
    projection = fold_for_whatif(ledger_arg(args.ledger), until, args)
    state = projection.state
    check_end(until, state.offset, "--at")
    try:
        result = whatif(state, changes, at=until.ts, horizon_ms=horizon)
    except ChangeError as exc:
        raise UserError(f"{args.change}: {exc}") from None
    if args.json:
        print_json(result)
    else:
        print(whatif_text(result))
    return 0


def register(commands: Commands) -> None:
    """``whatif``."""
    raw = argparse.RawDescriptionHelpFormatter

    whatif = commands.add_parser(
        "whatif",
        help="fork the state at a point, apply hypothetical facts, show the evictions",
        description="Fork the state of LEDGER after --at (an offset, inclusive, or an RFC 3339"
        " time; default: the end), apply the facts of --change FILE.jsonl (a line without"
        " `at`, or with an earlier one, takes the fork time), run the reconcilers on a virtual"
        " clock until fork time + --horizon, and print the evictions per queue and pod, with"
        " the rule and the time. Each eviction says whether it would also happen without the"
        " change. Nothing is written to the ledger.",
        epilog="examples:\n"
        "  quotaledger whatif sim.db --at 7 --change lower-max.jsonl\n"
        "  quotaledger whatif ledger.db --at 2026-01-01T12:00:00Z --change c.jsonl"
        " --horizon 30m\n"
        "  quotaledger whatif ledger.db --change c.jsonl --horizon 1d --json\n"
        "\nDURATION: a number with a unit: 90s, 30m, 2h, 1d, 1h30m, 500ms (bare: seconds).\n",
        formatter_class=raw,
    )
    whatif.add_argument("ledger", metavar="LEDGER", help=f"{LEDGER_HELP}, or FILE.jsonl")
    whatif.add_argument("--snapshots", metavar="PATH", help=SNAPSHOTS_HELP)
    whatif.add_argument(
        "--at", metavar="OFFSET|TIME", help="fork point (default: the end of the ledger)"
    )
    whatif.add_argument(
        "--change",
        metavar="FILE.jsonl",
        required=True,
        help="hypothetical facts, one a line (- reads stdin); a bad line is an error",
    )
    whatif.add_argument(
        "--horizon",
        metavar="DURATION",
        default="1h",
        help="how far to simulate, at most 3650d (default: 1h)",
    )
    whatif.add_argument(
        "--json",
        action="store_true",
        help='print {"at", "horizon_s", "evictions": [{queue, pod_uid, at, cause,'
        ' preemption_id, without_change}], "preemptions": [...], "state": {...}}',
    )
    whatif.add_argument(
        "--no-snapshot", action="store_true", help="fold from offset 0, ignoring snapshots"
    )
    whatif.set_defaults(handler=cmd_whatif)
