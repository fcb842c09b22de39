"""Rebuilding the projected state from a ledger: the one restore path (DESIGN §3, §9).

``replay``, ``tree``, ``whatif`` and ``snapshot`` in the CLI and the live
engine's start-up all call :func:`restore`. Rules it keeps:

* **Snapshots are a cache, never evidence.** A snapshot is used only when it
  stores a digest and a state hash, its blob decodes (any exception counts as
  unreadable), it belongs to this ledger and offset, and the state hash
  recomputed from the decoded state equals the stored one. While the tail is
  folded, a ``LedgerDigest`` for the snapshot's offset must carry the same
  digest and state hash, and a ``LedgerDigest`` for a later offset must equal
  the chain continued from the snapshot's digest. Anything else: a warning
  naming the snapshot, then a full replay from offset 0.
* What is *not* checked here (it needs a full read, which is what a snapshot
  saves): the chain from offset 0 up to the snapshot. ``audit`` does that.
* Every record folded also goes through the digest chain (:class:`ChainedFold`),
  so ``replay --json`` reports ``d(last offset folded)``, and a ``LedgerDigest``
  in what is folded that disagrees with the records is reported as a warning
  (the state is still the fold of the records as they are: run ``audit``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from quotaledger.events.codec import peek_kind
from quotaledger.events.digest import DigestChain, parse_digest
from quotaledger.events.ledger import Ledger, LedgerError, LedgerMismatch, Record, Snapshot
from quotaledger.events.model import Event, LedgerDigest
from quotaledger.projections import Projection, state_hash
from quotaledger.projections.snapshot import load

from .fold_loop import Until

Warn = Callable[[str], None]
#: Digests kept to check a LedgerDigest written after its ``through`` (DECISIONS 42).
KEEP = 1 << 14
#: No stop point: fold to the tail.
FOREVER = Until()
Progress = Callable[[int], None]


class DigestMismatch(ValueError):
    """A ``LedgerDigest`` record that disagrees with the records or the snapshot."""


@dataclass(slots=True)
class ChainedFold:
    """A projection and the digest chain, fed the same records.

    The chain keeps the last :data:`KEEP` digests so a ``LedgerDigest`` written a
    little after its ``through`` can be checked; ``hashes`` holds state hashes
    known for an offset (the snapshot's), checked against a ``LedgerDigest`` for it.
    """

    projection: Projection
    chain: DigestChain = field(default_factory=lambda: DigestChain(keep=KEEP))
    hashes: dict[int, str] = field(default_factory=dict)
    on_mismatch: Callable[[str], None] | None = None

    def apply(self, record: Record) -> Event | None:
        """Fold one record into the chain and the projection; the accepted event."""
        self.chain.update(record)
        event = self.projection.apply_record(record)
        if type(event) is LedgerDigest:
            self._check(record.offset, event)
        return event

    apply_record = apply  # a RecordFold (``fold_loop.fold``)

    def apply_all(self, records: list[Record]) -> None:
        """:meth:`apply` each record in order (the replay loop, names bound once)."""
        update, apply_record = self.chain.update, self.projection.apply_record
        for record in records:
            update(record)
            event = apply_record(record)
            if type(event) is LedgerDigest:
                self._check(record.offset, event)

    def _check(self, offset: int, event: LedgerDigest) -> None:
        problem: str | None = None
        known = self.chain.at(event.through) if 0 <= event.through < offset else None
        if known is not None and known.hex() != event.digest:
            problem = (
                f"LedgerDigest at offset {offset} says d({event.through}) is {event.digest},"
                f" the records give {known.hex()}"
            )
        expected_hash = self.hashes.get(event.through)
        if problem is None and expected_hash is not None and expected_hash != event.state_hash:
            problem = (
                f"LedgerDigest at offset {offset} says the state hash at {event.through} is"
                f" {event.state_hash}, not {expected_hash}"
            )
        if problem is not None and self.on_mismatch is not None:
            self.on_mismatch(problem)


@contextlib.asynccontextmanager
async def _reading(ledger: Ledger, start: int) -> AsyncIterator[AsyncIterator[list[Record]]]:
    """``ledger.read(start)``, closed when left early (a generator's ``aclose``)."""
    batches = ledger.read(start)
    try:
        yield batches
    finally:
        close = getattr(batches, "aclose", None)
        if close is not None:
            await close()


class Stopped(Exception):
    """``stop`` was set during a restore (DESIGN §9 shutdown): nothing was written."""


async def _fold_ledger(
    fold: ChainedFold,
    ledger: Ledger,
    until: Until,
    progress: Progress | None,
    stop: asyncio.Event | None = None,
) -> None:
    """Fold the ledger's records after the fold's offset, up to ``until``.

    A read that has records never suspends, so each batch yields to the loop
    once: a signal handler (``loop.add_signal_handler``) can then set ``stop``,
    which ends the fold between two batches with :class:`Stopped`.
    """
    start = fold.projection.state.offset + 1
    applied = 0
    apply = fold.apply
    endless = until.endless  # the usual replay: no check per record
    async with _reading(ledger, start) as batches:
        async for batch in batches:
            if endless:
                fold.apply_all(batch)
                applied += len(batch)
            else:
                for record in batch:
                    if until.reached(record):
                        return
                    apply(record)
                    applied += 1
            if progress is not None:
                progress(applied)
            await asyncio.sleep(0)
            if stop is not None and stop.is_set():
                raise Stopped(f"stopped at offset {fold.projection.state.offset}")


@dataclass(slots=True)
class Restored:
    """The state restored from a ledger, with the chain through its offset."""

    fold: ChainedFold
    snapshot: int | None = None  # offset of the snapshot used, if one was
    warnings: list[str] = field(default_factory=list)

    @property
    def projection(self) -> Projection:
        return self.fold.projection

    @property
    def digest(self) -> str:
        """Hex of ``d(offset)`` of the last record folded."""
        return self.fold.chain.hex


class _Rejected(Exception):
    """Why a snapshot is not used."""


def verify_snapshot(snapshot: Snapshot, ledger_id: str) -> Projection:
    """The snapshot's state if it checks out on its own, else :class:`_Rejected`."""
    if snapshot.digest is None or snapshot.state_hash is None:
        raise _Rejected("it stores no digest or state hash (an older format): unverifiable")
    try:
        parse_digest(snapshot.digest)
    except ValueError as exc:
        raise _Rejected(str(exc)) from None
    if snapshot.checksum is not None and Snapshot.checksum_of(snapshot.blob) != snapshot.checksum:
        raise _Rejected("its blob does not match its checksum (damaged)")
    try:
        state = load(snapshot.blob)
        recomputed = state_hash(state)
    except Exception as exc:  # any damage to the blob: it is only a cache
        raise _Rejected(f"unreadable blob ({type(exc).__name__}: {exc})") from None
    if state.ledger_id != ledger_id:
        raise _Rejected(f"it belongs to ledger {state.ledger_id!r}, not {ledger_id!r}")
    if state.offset != snapshot.offset:
        raise _Rejected(f"its state is at offset {state.offset}, not {snapshot.offset}")
    if recomputed != snapshot.state_hash:
        raise _Rejected(f"its state hashes to {recomputed}, but it stores {snapshot.state_hash}")
    return Projection(state)


async def _from_snapshot(
    ledger: Ledger,
    snapshot: Snapshot,
    until: Until,
    progress: Progress | None,
    warn: Warn,
    stop: asyncio.Event | None,
) -> Restored | None:
    """Snapshot + tail, verified; None when the snapshot is past ``until``'s time."""
    projection = verify_snapshot(snapshot, ledger.ledger_id)
    assert snapshot.digest is not None and snapshot.state_hash is not None
    # The record at the snapshot's offset must exist (and gives its ts for --until).
    async with _reading(ledger, snapshot.offset) as batches:
        first = await anext(batches, None)
    if not first or first[0].offset != snapshot.offset:
        raise _Rejected(f"the ledger has no record {snapshot.offset}")
    if until.ts is not None and first[0].ts > until.ts:
        return None
    # The time is outside the state hash: it is the ts of the last record that is
    # not a LedgerDigest (those leave the state alone), so at most record S's ts.
    state_ts = projection.state.ts
    if state_ts > first[0].ts or (
        state_ts != first[0].ts and peek_kind(first[0].payload) != "LedgerDigest"
    ):
        raise _Rejected(f"its time {state_ts} does not fit record {snapshot.offset}'s ts")

    def stop_at_mismatch(problem: str) -> None:
        raise _Rejected(problem)

    fold = ChainedFold(
        projection,
        DigestChain(parse_digest(snapshot.digest), snapshot.offset, keep=KEEP),
        hashes={snapshot.offset: snapshot.state_hash},
        on_mismatch=stop_at_mismatch,
    )
    await _fold_ledger(fold, ledger, until, progress, stop)
    fold.on_mismatch = warn
    return Restored(fold, snapshot=snapshot.offset)


async def restore(
    ledger: Ledger,
    *,
    until: Until = FOREVER,
    use_snapshot: bool = True,
    warn: Warn,
    progress: Progress | None = None,
    stop: asyncio.Event | None = None,
) -> Restored:
    """The state of ``ledger`` through ``until`` (default: its tail).

    Raises :class:`Stopped` when ``stop`` is set during the fold.

    From the newest snapshot at or before ``until`` when it verifies (see the
    module docstring), else from offset 0; ``warn`` gets one line per snapshot
    not used and per ``LedgerDigest`` that disagrees with the records.
    """
    warnings: list[str] = []

    def note(message: str) -> None:
        warnings.append(message)
        warn(message)

    if use_snapshot:
        snapshot: Snapshot | None = None
        try:
            snapshot = await ledger.load_snapshot(until.offset)
        except LedgerError as exc:
            note(f"snapshots cannot be read ({exc}); replaying from offset 0")
        if snapshot is not None:
            try:
                restored = await _from_snapshot(ledger, snapshot, until, progress, note, stop)
            except _Rejected as exc:
                note(
                    f"snapshot at offset {snapshot.offset} not used: {exc}; replaying from offset 0"
                )
            else:
                if restored is not None:
                    restored.warnings = warnings
                    return restored
    fold = ChainedFold(Projection(), on_mismatch=note)
    await _fold_ledger(fold, ledger, until, progress, stop)
    if fold.projection.state.ledger_id not in (None, ledger.ledger_id):
        raise LedgerMismatch(
            f"state of ledger {fold.projection.state.ledger_id} cannot follow {ledger.ledger_id}"
        )
    return Restored(fold, warnings=warnings)
