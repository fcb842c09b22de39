"""The ``quotaledger`` command line (DESIGN §7).

Every command prints a clear ``quotaledger: error: ...`` and exits 2 on bad
input (a bad JSONL line names its line number and field), 1 on other failures;
never a traceback for a user's mistake.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

import msgspec

from quotaledger.engine.fold_loop import Until, fold, parse_until
from quotaledger.engine.render import tree_text
from quotaledger.events.ledger import Append, LedgerError, Record, Snapshot
from quotaledger.projections import Projection, state_json
from quotaledger.projections.snapshot import SnapshotError, dump, load

from .jsonl import JsonlError, ledger_id_for, read_lines, records

JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")


class UserError(Exception):
    """A mistake in what the user asked for; printed without a traceback."""


class Progress:
    """A progress line on stderr for long work; silent for short or non-TTY runs."""

    def __init__(self, label: str, total: int | None, stream: TextIO, enabled: bool) -> None:
        self.label, self.total, self.stream, self.enabled = label, total, stream, enabled
        self.started = time.monotonic()
        self.shown_at = self.started
        self.drawn = False

    def __call__(self, done: int) -> None:
        now = time.monotonic()
        if not self.enabled or now - self.shown_at < 0.5:
            return
        self.shown_at = now
        rate = done / max(now - self.started, 1e-9)
        if self.total:
            width = 30
            filled = min(width, int(width * done / self.total))
            bar = "#" * filled + "-" * (width - filled)
            text = f"\r{self.label} [{bar}] {done:,}/{self.total:,} ({rate:,.0f}/s)"
        else:
            text = f"\r{self.label} {done:,} records ({rate:,.0f}/s)"
        self.stream.write(text)
        self.stream.flush()
        self.drawn = True

    def close(self) -> None:
        if self.drawn:
            self.stream.write("\n")
            self.stream.flush()


def _is_jsonl(path: Path) -> bool:
    return path.suffix.lower() in JSONL_SUFFIXES


def _batched(items: Iterable[Record], size: int = 5000) -> Iterator[list[Record]]:
    batch: list[Record] = []
    for item in items:
        batch.append(item)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def _progress_enabled(args: argparse.Namespace) -> bool:
    if args.progress is not None:
        return bool(args.progress)
    return sys.stderr.isatty()


async def _fold_ledger(path: Path, until: Until, args: argparse.Namespace) -> Projection:
    from .sqlite_ledger import SqliteLedger

    ledger = await SqliteLedger.open(str(path), create=False)
    try:
        projection = Projection()
        start = 0
        if not args.no_snapshot:
            snapshot = await ledger.load_snapshot(until.offset)
            if snapshot is not None:
                state = load(snapshot.blob)
                if state.ledger_id != ledger.ledger_id:
                    raise LedgerError(
                        f"snapshot at {snapshot.offset} belongs to ledger {state.ledger_id},"
                        f" not {ledger.ledger_id}"
                    )
                if until.ts is None or state.ts <= until.ts:
                    projection = Projection(state)
                    start = snapshot.offset + 1
        total = await ledger.last_offset() + 1
        progress = Progress("replay", total, sys.stderr, _progress_enabled(args))
        progress.started = time.monotonic()
        fold(projection, ledger.iter_batches(start), until, progress)
        progress.close()
        return projection
    finally:
        await ledger.close()


def fold_path(path: Path, args: argparse.Namespace) -> Projection:
    """Fold a JSONL file or a SQLite ledger up to ``--until``."""
    if not path.exists():
        raise UserError(f"{path}: no such file")
    try:
        until = parse_until(args.until)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    if _is_jsonl(path):
        projection = Projection()
        size = path.stat().st_size
        progress = Progress("replay", None, sys.stderr, _progress_enabled(args) and size > 1 << 24)
        stream: Iterable[Record] = records(path, skip_invalid=args.skip_invalid)
        if until.offset is not None:
            # Do not even read (and fail on) lines past the stop offset.
            stream = itertools.islice(stream, until.offset + 1)
        fold(projection, _batched(stream), until, progress)
        progress.close()
        return projection
    return asyncio.run(_fold_ledger(path, until, args))


def _print_json(document: Any) -> None:
    sys.stdout.buffer.write(msgspec.json.format(msgspec.json.encode(document), indent=2))
    sys.stdout.buffer.write(b"\n")
    sys.stdout.flush()


def cmd_replay(args: argparse.Namespace) -> int:
    projection = fold_path(Path(args.source), args)
    document = state_json(projection.state)
    if args.json:
        _print_json(document)
    else:
        print(tree_text(document))
    return 0


def cmd_tree(args: argparse.Namespace) -> int:
    projection = fold_path(Path(args.source), args)
    print(tree_text(state_json(projection.state)))
    return 0


async def _ingest(source: Path, target: Path, skip_invalid: bool) -> tuple[int, int]:
    from .sqlite_ledger import SqliteLedger

    new = not target.exists() or target.stat().st_size == 0
    # A new ledger's LedgerOpened is stamped at the epoch, as in a JSONL replay:
    # at the wall clock it would clamp every older `at` of the file up to now.
    clock: dict[str, Any] = {"clock_ms": lambda: 0} if new else {}
    ledger = await SqliteLedger.open(str(target), create=True, **clock)
    try:
        count = 0
        batch: list[Append] = []
        first = await ledger.last_offset() + 1
        for line in read_lines(source, skip_invalid=skip_invalid, first_offset=first):
            batch.append(Append(payload=line.payload, ts=line.ts))
            if len(batch) >= 1000:
                await ledger.append(batch)
                count += len(batch)
                batch = []
        if batch:
            await ledger.append(batch)
            count += len(batch)
        return count, await ledger.last_offset()
    finally:
        await ledger.close()


def cmd_ingest(args: argparse.Namespace) -> int:
    source = Path(args.source)
    if not source.exists():
        raise UserError(f"{source}: no such file")
    count, last = asyncio.run(_ingest(source, Path(args.ledger), args.skip_invalid))
    print(f"appended {count} record(s) to {args.ledger}; last offset {last}")
    return 0


async def _snapshot(path: Path) -> tuple[int, str]:
    from .sqlite_ledger import SqliteLedger

    ledger = await SqliteLedger.open(str(path), create=False)
    try:
        projection = Projection()
        snapshot = await ledger.load_snapshot(None)
        start = 0
        if snapshot is not None:
            projection = Projection(load(snapshot.blob))
            start = snapshot.offset + 1
        fold(projection, ledger.iter_batches(start))
        state = projection.state
        await ledger.save_snapshot(Snapshot(offset=state.offset, blob=dump(state)))
        return state.offset, state_json(state)["hash"]
    finally:
        await ledger.close()


def cmd_snapshot(args: argparse.Namespace) -> int:
    path = Path(args.ledger)
    if not path.exists():
        raise UserError(f"{path}: no such file")
    offset, digest = asyncio.run(_snapshot(path))
    print(f"snapshot at offset {offset}, state hash {digest}")
    return 0


def describe_decision(decision: dict[str, Any]) -> str:
    """One line per decision for people (``simulate`` without ``--json``)."""
    kind = decision["kind"]
    head = f"{decision['at']} #{decision['offset']} {kind}"
    if kind == "PreemptionStarted":
        return f"{head} {decision['cause']} on {decision['queue']} target {decision['target']}"
    if kind == "EvictionRequested":
        explain = decision.get("explain", {})
        return (
            f"{head} pod {decision['pod_uid']} in {decision['queue']}"
            f" (rule {explain.get('rule')}, rank {explain.get('rank')})"
        )
    if kind == "PreemptionFinished":
        reason = f" ({decision['reason']})" if decision.get("reason") else ""
        outcome = f"{decision['outcome']} claimed {decision['claimed']}"
        return f"{head} {decision['queue']} {outcome}{reason}"
    if kind in ("EvictionSucceeded", "EvictionFailed"):
        return f"{head} {decision['eviction_id']}"
    return head


async def _write_ledger(path: Path, ledger_id: str, rows: list[Record]) -> None:
    from .sqlite_ledger import SqliteLedger

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

    source = Path(args.source)
    if not source.exists():
        raise UserError(f"{source}: no such file")
    try:
        until = parse_until(args.until)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    if until.offset is not None:
        raise UserError("--until takes a time for simulate (RFC 3339)")
    simulation = Simulation(executor=args.executor, ledger_id=ledger_id_for(source))
    lines = ((line.ts, line.payload) for line in read_lines(source, skip_invalid=args.skip_invalid))
    simulation.run(lines, until=until.ts)
    if args.out:
        asyncio.run(_write_ledger(Path(args.out), simulation.ledger_id, simulation.records[1:]))
    result = simulation.result()
    if args.json:
        _print_json(result)
    else:
        for decision in result["decisions"]:
            print(describe_decision(decision))
        print(tree_text(result["state"]))
    return 0


async def _run_engine(args: argparse.Namespace) -> None:
    import signal

    from quotaledger.engine.live import LiveEngine, LogExecutor, SimulateExecutor

    from .sqlite_ledger import SqliteLedger

    ledger = await SqliteLedger.open(str(args.ledger), create=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    if args.stop_after is not None:
        loop.call_later(args.stop_after, stop.set)
    executor = SimulateExecutor() if args.executor == "simulate" else LogExecutor()
    engine = LiveEngine(
        ledger,
        executor,
        instance=args.instance,
        election=not args.no_election,
        snapshot_every=args.snapshot_every,
    )

    async def ready() -> None:
        print(
            f"engine {args.instance} running on {args.ledger} at offset {engine.state.offset}",
            file=sys.stderr,
            flush=True,
        )

    try:
        await engine.run(stop, ready)
    finally:
        await ledger.close()


def cmd_run(args: argparse.Namespace) -> int:
    import logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    asyncio.run(_run_engine(args))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from quotaledger.engine import bench

    return bench.main(args)


EXAMPLES = """\
examples:
  quotaledger replay examples/koordinator.jsonl           # fold a file, print the tree
  quotaledger replay examples/koordinator.jsonl --json    # the state JSON (DESIGN §7)
  quotaledger replay ledger.db --until 1500               # state as of offset 1500
  quotaledger replay ledger.db --until 2026-01-01T12:00:00Z
  quotaledger ingest examples/koordinator.jsonl ledger.db # JSONL -> SQLite ledger
  quotaledger tree ledger.db
  quotaledger simulate examples/quota-decrease.jsonl      # reconcilers on a virtual clock
  quotaledger snapshot ledger.db
  quotaledger bench fold --json
"""


def _add_source(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", help="a SQLite ledger file, or FILE.jsonl of events")
    parser.add_argument("--until", help="stop after this offset (inclusive) or RFC 3339 time")
    parser.add_argument(
        "--skip-invalid",
        action="store_true",
        help="record a bad JSONL line as FactRejected and go on (default: stop with an error)",
    )
    parser.add_argument(
        "--no-snapshot", action="store_true", help="fold from offset 0, ignoring snapshots"
    )
    parser.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress on stderr (default: when stderr is a terminal)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="quotaledger",
        description="Event-sourced hierarchical elastic quota for shared Kubernetes clusters.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    raw = argparse.RawDescriptionHelpFormatter

    replay = commands.add_parser(
        "replay",
        help="fold a ledger or JSONL file and print the state",
        description="Fold only (no reconcilers) and print the state: the tree, or --json.",
        epilog="examples:\n  quotaledger replay examples/koordinator.jsonl --json\n"
        "  quotaledger replay ledger.db --until 1500\n",
        formatter_class=raw,
    )
    _add_source(replay)
    replay.add_argument("--json", action="store_true", help="print the state JSON (DESIGN §7)")
    replay.set_defaults(handler=cmd_replay)

    tree = commands.add_parser(
        "tree",
        help="show the quota tree in human units",
        description="The tree with min/max/request/used/runtime per quota.",
        epilog="examples:\n  quotaledger tree examples/koordinator.jsonl\n"
        "  quotaledger tree ledger.db --until 2026-01-01T00:00:00Z\n",
        formatter_class=raw,
    )
    _add_source(tree)
    tree.set_defaults(handler=cmd_tree)

    ingest = commands.add_parser(
        "ingest",
        help="append a JSONL file of events to a SQLite ledger",
        description="Append events (each line's `at` becomes its ts) to a ledger, creating it.",
        epilog="examples:\n  quotaledger ingest events.jsonl ledger.db\n",
        formatter_class=raw,
    )
    ingest.add_argument("source", help="FILE.jsonl")
    ingest.add_argument("ledger", help="SQLite ledger file (created if missing)")
    ingest.add_argument(
        "--skip-invalid", action="store_true", help="keep bad lines as FactRejected"
    )
    ingest.set_defaults(handler=cmd_ingest)

    snapshot = commands.add_parser(
        "snapshot",
        help="store a snapshot of the folded state in the ledger file",
        description="Fold the ledger to its tail and store a snapshot in the same file.",
        epilog="examples:\n  quotaledger snapshot ledger.db\n",
        formatter_class=raw,
    )
    snapshot.add_argument("ledger", help="SQLite ledger file")
    snapshot.set_defaults(handler=cmd_snapshot)

    simulate = commands.add_parser(
        "simulate",
        help="run the whole engine on a virtual clock",
        description="Run reconcilers over FILE.jsonl on a virtual clock: timers fire exactly at"
        " their deadlines and the simulate executor answers each eviction at once. Prints"
        ' {"decisions": [...], "state": {...}} with --json.',
        epilog="examples:\n  quotaledger simulate examples/quota-decrease.jsonl\n"
        "  quotaledger simulate examples/quota-decrease.jsonl --json --out sim.db\n"
        "  quotaledger simulate events.jsonl --until 2026-01-01T01:00:00Z\n",
        formatter_class=raw,
    )
    simulate.add_argument("source", help="FILE.jsonl of facts")
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
    simulate.add_argument(
        "--skip-invalid", action="store_true", help="keep bad lines as FactRejected"
    )
    simulate.set_defaults(handler=cmd_simulate)

    run = commands.add_parser(
        "run",
        help="run the engine live against a SQLite ledger",
        description="Follow the ledger, run the reconcilers on the wall clock and drive"
        " evictions, until SIGTERM/SIGINT (which drain and exit cleanly).",
        epilog="examples:\n  quotaledger run ledger.db\n"
        "  quotaledger run ledger.db --executor log --instance eng-1\n",
        formatter_class=raw,
    )
    run.add_argument("ledger", help="SQLite ledger file (created if missing)")
    run.add_argument("--executor", choices=["simulate", "log"], default="simulate")
    run.add_argument("--instance", default=f"engine-{os.getpid()}", help="this engine's name")
    run.add_argument(
        "--no-election",
        action="store_true",
        help="do not claim a leader epoch (several engines then all propose; the guard decides)",
    )
    run.add_argument("--snapshot-every", type=int, default=50_000, help="records between snapshots")
    run.add_argument("--stop-after", type=float, help="stop after this many seconds")
    run.set_defaults(handler=cmd_run)

    bench = commands.add_parser(
        "bench",
        help="measure throughput and latency",
        description="Benchmarks on generated workloads; --json emits one JSON object.",
        epilog="examples:\n  quotaledger bench fold\n"
        "  quotaledger bench fold --json --events 200000\n",
        formatter_class=raw,
    )
    bench.add_argument("suite", choices=["fold"], help="which benchmark")
    bench.add_argument("--json", action="store_true", help="emit one JSON object")
    bench.add_argument("--quotas", type=int, default=10_000)
    bench.add_argument("--pods", type=int, default=100_000)
    bench.add_argument("--nodes", type=int, default=1_000)
    bench.add_argument("--events", type=int, default=1_000_000)
    bench.add_argument("--seed", type=int, default=1)
    bench.set_defaults(handler=cmd_bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "handler", None) is None:
        parser.print_help()
        return 2
    try:
        return int(args.handler(args))
    except (UserError, JsonlError, LedgerError, SnapshotError) as exc:
        print(f"quotaledger: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
