"""``init``, ``ingest`` and ``snapshot``: the commands that write a ledger (DESIGN §3, §9, §10).

``ingest`` appends whole lines only, follows its own records by the offsets the
ledger assigns them (other writers may append meanwhile, DECISIONS 202), and
when it stops early (``--strict`` at a bad line, SIGTERM/SIGINT) says how many
records it appended and the ``--from-line`` to resume with. ``snapshot``
anchors the folded state with a ``LedgerDigest`` and stores the snapshot.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from quotaledger.engine.fold_loop import Until, parse_until
from quotaledger.engine.restore import restore
from quotaledger.events.codec import encode_event
from quotaledger.events.ledger import Append, Snapshot
from quotaledger.events.model import LedgerDigest
from quotaledger.projections import state_hash
from quotaledger.projections.snapshot import dump

from ..ledgers.jsonl import JsonlError, JsonlInput, open_jsonl, read_lines
from ..ledgers.url import open_ledger
from .common import (
    LEDGER_HELP,
    SNAPSHOTS_HELP,
    Commands,
    Interrupted,
    UserError,
    add_strict,
    ledger_arg,
    progress_for,
    warn,
    writable_ledger,
)


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
    named = ledger_arg(args.ledger)
    target = named if isinstance(named, str) else writable_ledger(named)
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
    ledger = ledger_arg(args.ledger)
    if isinstance(ledger, str) and args.snapshots is None:
        raise UserError("a Kafka ledger keeps its snapshots in a local file: add --snapshots PATH")
    if isinstance(ledger, Path) and not ledger.exists():
        raise UserError(f"{args.ledger}: no such file")
    offset, digest = asyncio.run(_snapshot(ledger, args.snapshots))
    print(f"snapshot at offset {offset}, state hash {digest}")
    return 0


def register(commands: Commands) -> None:
    """``init``, ``ingest`` and ``snapshot``."""
    raw = argparse.RawDescriptionHelpFormatter

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
    add_strict(ingest)
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
