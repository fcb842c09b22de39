"""``simulate``: the whole engine over a JSONL file on a virtual clock (DESIGN §7).

Timers fire exactly at their deadlines and the simulate executor answers each
eviction at the same instant; the result is ``{"decisions": [...], "state":
{...}}`` (``--json``) or one line per decision and the tree, and ``--out``
writes the resulting ledger to a new SQLite file. The simulation and the
SQLite ledger are imported when the command runs, not at every command's
start-up.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import Any

from quotaledger.engine.render import amounts, tree_text
from quotaledger.events.ledger import Append, Record

from ..ledgers.jsonl import open_jsonl, read_lines
from .common import Commands, UserError, add_strict, print_json, until_option, writable_ledger


def describe_decision(decision: dict[str, Any]) -> str:
    """One line per decision for people (``simulate`` without ``--json``)."""
    kind = decision["kind"]
    head = f"{decision['at']} #{decision['offset']} {kind}"
    if kind == "PreemptionStarted":
        target = amounts(decision["target"])
        return f"{head} {decision['cause']} on {decision['queue']} target {target}"
    if kind == "EvictionRequested":
        explain = decision.get("explain", {})
        return (
            f"{head} pod {decision['pod_uid']} in {decision['queue']}"
            f" (rule {explain.get('rule')}, rank {explain.get('rank')})"
        )
    if kind == "PreemptionFinished":
        reason = f" ({decision['reason']})" if decision.get("reason") else ""
        outcome = f"{decision['outcome']} claimed {amounts(decision['claimed'])}"
        return f"{head} {decision['queue']} {outcome}{reason}"
    if kind in ("EvictionSucceeded", "EvictionFailed"):
        return f"{head} {decision['eviction_id']}"
    if kind == "FactRejected":
        return f"{head} {decision.get('rejected_kind') or 'line'} refused: {decision['reason']}"
    return head


async def _write_ledger(path: Path, ledger_id: str, rows: list[Record]) -> None:
    """``--out``: the simulated ledger as a new SQLite file, record for record."""
    from ..ledgers.sqlite.ledger import SqliteLedger

    if path.exists():
        raise UserError(f"{path}: already exists; --out writes a new ledger")
    # LedgerOpened at the epoch, as in the simulation: at the wall clock it
    # would clamp every simulated ts up to now (DESIGN §3 keeps ts non-decreasing).
    ledger = await SqliteLedger.open(
        str(path), create=True, ledger_id=ledger_id, clock_ms=lambda: 0
    )
    try:
        for start in range(0, len(rows), 1000):
            chunk = rows[start : start + 1000]
            await ledger.append([Append(payload=r.payload, ts=r.ts) for r in chunk])
    finally:
        await ledger.close()


def cmd_simulate(args: argparse.Namespace) -> int:
    from quotaledger.engine.simulate import Simulation

    until = until_option(args.until)
    if until.offset is not None:
        raise UserError("--until takes a time for simulate (RFC 3339)")
    if args.out and writable_ledger(Path(args.out)).exists():
        raise UserError(f"{args.out}: already exists; --out writes a new ledger")
    with open_jsonl(args.source) as source:
        simulation = Simulation(executor=args.executor, ledger_id=source.ledger_id())
        lines = (
            (line.ts, line.payload if line.rejected is None else line.payload_at)
            for line in read_lines(source, strict=args.strict)
        )
        simulation.run(lines, until=until.ts)
    if args.out:
        asyncio.run(_write_ledger(Path(args.out), simulation.ledger_id, simulation.records[1:]))
    result = simulation.result()
    if args.json:
        print_json(result)
    else:
        for decision in result["decisions"]:
            # The ledger's opening record is no decision (DECISIONS 265; --json keeps it).
            if decision["kind"] != "LedgerOpened":
                print(describe_decision(decision))
        print(tree_text(result["state"]))
    return 0


def register(commands: Commands) -> None:
    """``simulate``."""
    raw = argparse.RawDescriptionHelpFormatter

    simulate = commands.add_parser(
        "simulate",
        help="run the whole engine on a virtual clock",
        description="Run reconcilers over FILE.jsonl on a virtual clock: timers fire exactly at"
        " their deadlines and the simulate executor answers each eviction at once. Prints"
        ' {"decisions": [...], "state": {...}} with --json. A bad line is kept as a'
        " FactRejected record and the run goes on; --strict stops at it instead (exit 2).",
        epilog="examples:\n  quotaledger simulate examples/quota-decrease.jsonl\n"
        "  quotaledger simulate examples/quota-decrease.jsonl --json --out sim.db\n"
        "  quotaledger simulate events.jsonl --until 2026-01-01T01:00:00Z\n"
        "  quotaledger simulate - --json < events.jsonl\n",
        formatter_class=raw,
    )
    simulate.add_argument("source", help="FILE.jsonl of facts (- reads stdin)")
    simulate.add_argument("--until", help="stop the virtual clock at this RFC 3339 time")
    simulate.add_argument("--json", action="store_true", help="print decisions and state as JSON")
    simulate.add_argument("--out", help="write the resulting ledger to a new SQLite file")
    simulate.add_argument(
        "--executor",
        choices=["simulate", "log"],
        default="simulate",
        help="simulate: evictions succeed at once; log: dry run, evictions fail"
        " (default: simulate)",
    )
    add_strict(simulate)
    simulate.set_defaults(handler=cmd_simulate)
