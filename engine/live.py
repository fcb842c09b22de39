"""The live engine: follow a ledger, reconcile on the wall clock (DESIGN §6).

Structured concurrency: :meth:`LiveEngine.run` starts the follower, the
reconciler and every eviction in one ``asyncio.TaskGroup``; setting the
``stop`` event (SIGTERM) cancels the group and each task leaves the ledger
consistent (an append is one transaction).

Rules the engine keeps:

* it acts only on decisions read back from the ledger and accepted by the
  projection (evictions are driven from ``state.evictions``, never from what
  it proposed);
* after appending, it waits until its follower has applied those records
  before deciding again, so it never decides on a state missing its own
  decisions; the records applied at the offsets the ledger assigned must be
  its own, byte for byte, or it stops (DECISIONS 201);
* deadlines come from ledger ``ts``: after a restart an overdue timer fires at
  once, never later than its original deadline plus the restart;
* with election on, it appends ``LeaderElected{epoch+1}`` at start and
  proposes only while the newest accepted epoch is the one its own claim won
  (a stale writer is fenced by the projection anyway; a loser follows);
* SIGTERM during the start-up catch-up stops it between two batches;
* checkpoints (``LedgerDigest`` and snapshots, DESIGN §9) never hold a due
  timer or an eviction back: they are taken by their own task once the
  reconciler has looked at the state, and a snapshot is encoded a few
  milliseconds at a time and written off the loop (:meth:`LiveEngine.checkpoint`).

The pure parts live elsewhere: :mod:`.core` proposes, :mod:`.restore` restores,
:mod:`.executors` carry out evictions, :mod:`.readback` checks what is read back,
:mod:`.checkpoints` encodes snapshots, :mod:`.progress` logs the catch-up and
:mod:`.stopping` races work against the stop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from quotaledger.events.codec import encode_event
from quotaledger.events.ledger import Append, Ledger, LedgerError, Record, Snapshot
from quotaledger.events.model import (
    Event,
    LeaderElected,
    LedgerDigest,
)
from quotaledger.events.times import wall_clock_ms
from quotaledger.projections import Projection, state_hash
from quotaledger.projections.snapshot import copy_persisted
from quotaledger.projections.state import EvictionRun, ProjectedState

from .checkpoints import Checkpoint, encode_in_slices
from .core import EngineCore
from .executors import Executor
from .progress import CatchUpProgress
from .readback import ReadBackError, check_read_back, trim_kept
from .restore import ChainedFold, Restored, Stopped
from .restore import restore as restore_ledger
from .stopping import unless_stopped

log = logging.getLogger("quotaledger.engine")


@dataclass(slots=True)
class LiveEngine:
    """One engine instance over one ledger."""

    ledger: Ledger
    executor: Executor
    instance: str = "engine"
    election: bool = True
    snapshot_every: int = 50_000
    digest_every: int = 10_000
    clock_ms: Callable[[], int] = wall_clock_ms
    idle_poll_s: float = 0.5
    projection: Projection = field(default_factory=Projection)
    core: EngineCore = field(init=False)
    _applied: asyncio.Condition = field(init=False)
    _wake: asyncio.Event = field(init=False)
    _inflight: set[str] = field(default_factory=set)
    fold: ChainedFold = field(init=False)
    #: Longest stretch of snapshot encoding between two yields to the loop.
    snapshot_slice_s: float = 0.005
    _digest_through: int = -1  # offset of the last LedgerDigest taken
    _snapshot_through: int = -1  # offset of the last snapshot taken
    _checkpoint_due: asyncio.Event = field(init=False)
    _snapshot_task: asyncio.Task[None] | None = None
    _reconciling: bool = False  # the reconciler task runs
    _at_rest: bool = False  # ... and waits for a wake or its next deadline
    _rested: asyncio.Event = field(init=False)
    #: How long taking a checkpoint blocks the loop (the last one's length; it
    #: is mostly the state hash), so one is not started just before a deadline.
    _checkpoint_s: float = 0.05
    observe_every_ms: int = 1000
    _observed_at: int = 0
    _disarm_not_before: int = 0  # see step: a ledger clock behind ours

    elect_backoff_s: float = 0.05
    elect_backoff_max_s: float = 2.0
    #: Claims are made only while holding a Lease (DESIGN §12): no other engine
    #: claims meanwhile, so an accepted claim under this name that landed after
    #: this one's began is this engine's own, appended twice (DECISIONS 303).
    claims_under_lease: bool = False
    progress_every_s: float = 10.0
    _rng: random.Random = field(default_factory=random.Random)
    _leading: bool = False
    #: Appends waiting to read themselves back: token -> the state's offset when sent.
    _readbacks: dict[int, int] = field(default_factory=dict)
    _readback_token: int = 0
    #: Batches the follower applied while a read-back was pending.
    _kept: list[list[Record]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.core = EngineCore(self.projection, instance=self.instance)
        self.fold = ChainedFold(self.projection, on_mismatch=log.warning)

    @property
    def state(self) -> ProjectedState:
        return self.projection.state

    # ------------------------------------------------------------ start-up

    async def restore(self, stop: asyncio.Event | None = None) -> bool:
        """The state at the ledger's tail, through the one restore path
        (:func:`quotaledger.engine.restore.restore`: a verified snapshot or a
        full replay, with the digest chain).

        Returns False when ``stop`` was set during the catch-up (DESIGN §9
        shutdown: checked between batches, a few ms apart, and raced against
        every wait on the ledger; nothing is written while catching up, so the
        ledger is untouched). Logs progress every ``progress_every_s``.
        """
        progress = CatchUpProgress(self.instance, -1, self.progress_every_s)

        async def catch_up() -> Restored:
            progress.tail = await self.ledger.last_offset()
            return await restore_ledger(self.ledger, warn=log.warning, progress=progress, stop=stop)

        try:
            # raced against the stop too: a ledger that does not answer (a stalled broker
            # link) must not hold a stop up until its read times out (DECISIONS 301)
            restored = await unless_stopped(catch_up(), stop)
        except Stopped as exc:
            log.info("engine %s stopped during catch-up (%s)", self.instance, exc)
            return False
        if restored is None:
            log.info("engine %s stopped during catch-up (waiting on the ledger)", self.instance)
            return False
        progress.done(restored.projection.state.offset)
        self.fold = restored.fold
        self.fold.on_mismatch = log.warning
        self.projection = restored.projection
        self.core = EngineCore(self.projection, instance=self.instance)
        # A read to the tail ends on a committed transaction: every batch is whole.
        self.core.sealed_through = self.state.offset
        return True

    async def elect(self, stop: asyncio.Event | None = None) -> None:
        """Claim the next epoch; lead only if the projection accepted *this* claim.

        Two engines starting together both claim ``newest + 1``; the projection
        accepts the first one in ledger order and refuses the other ("not
        newer"). An engine leads only with an epoch whose accepted
        ``LeaderElected`` is its own record (its offset is not among the
        rejections, and the state names its instance as the holder). A loser
        follows: claiming again would fence a winner that may already be
        driving evictions, which the new leader would then drive a second time
        (DECISIONS 50). A claim that could not be appended (the ledger busy or
        unreachable) is retried after a randomized exponential backoff capped
        at ``elect_backoff_max_s``, until ``stop``.
        """
        delay = self.elect_backoff_s
        while True:
            epoch = self.state.leader_epoch + 1
            try:
                claimed = await unless_stopped(
                    self.append_applied([LeaderElected(epoch=epoch, instance=self.instance)]),
                    stop,
                )
                if claimed is None:
                    return  # stopped while the claim was on its way (DESIGN §9's bound)
                offset = claimed
            except ReadBackError:
                raise
            except LedgerError as exc:
                log.warning(
                    "engine %s could not claim epoch %d (%s); retrying in %.2f s",
                    self.instance,
                    epoch,
                    exc,
                    delay,
                )
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._rng.uniform(delay / 2, delay)):
                        await (stop or asyncio.Event()).wait()
                if stop is not None and stop.is_set():
                    return
                delay = min(delay * 2, self.elect_backoff_max_s)
                continue
            state = self.state
            if state.leader_epoch == epoch and state.leader_instance == self.instance:
                if not _rejected(state, offset):
                    self.core.epoch = epoch
                    log.info("engine %s leads with epoch %d", self.instance, epoch)
                    return
                if self.claims_under_lease:
                    # epoch was the newest + 1 when this claim began, so the
                    # accepted copy landed since: under the Lease, a retried
                    # append of this very claim (DECISIONS 303)
                    self.core.epoch = epoch
                    log.info(
                        "engine %s leads with epoch %d (its claim was appended twice;"
                        " the first copy was accepted)",
                        self.instance,
                        epoch,
                    )
                    return
            self.core.epoch = 0
            if state.leader_instance == self.instance:
                log.error(
                    "engine %s lost epoch %d to another engine named %s: give each engine"
                    " its own --instance; this one decides nothing",
                    self.instance,
                    epoch,
                    self.instance,
                )
            else:
                log.info(
                    "engine %s lost the election for epoch %d: %s leads with epoch %d",
                    self.instance,
                    epoch,
                    state.leader_instance,
                    state.leader_epoch,
                )
            return

    # ------------------------------------------------------------ tasks

    async def run(
        self, stop: asyncio.Event, ready: Callable[[], Awaitable[None]] | None = None
    ) -> None:
        """Run until ``stop`` is set; then cancel every task and return."""
        self._applied = asyncio.Condition()
        self._wake = asyncio.Event()
        self._checkpoint_due = asyncio.Event()
        self._rested = asyncio.Event()
        if not await self.restore(stop):
            return
        self._digest_through = self._snapshot_through = self.state.offset
        # At start-up, not at the first checkpoint: the state hash's first
        # computation builds what later ones update (DECISIONS 234, 242).
        state_hash(self.state)
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._follow())
                group.create_task(self._checkpoints(group))
                if self.election:
                    await self.elect(stop)
                    if stop.is_set():
                        raise _Stop
                if ready is not None:
                    await ready()
                group.create_task(self._reconcile(group))
                await stop.wait()
                raise _Stop
        except* _Stop:
            log.info("engine %s stopped at offset %d", self.instance, self.state.offset)

    async def _follow(self) -> None:
        async for batch in self.ledger.read(self.state.offset + 1, follow=True):
            self.fold.apply_all(batch)
            if self._readbacks:  # an append of this engine waits to read itself back
                self._kept.append(batch)
            # a backlog is read without suspending: let stop and the reconciler in
            await asyncio.sleep(0)
            async with self._applied:
                self._applied.notify_all()
            self._wake.set()
            if self._checkpoint_is_due():
                self._checkpoint_due.set()

    def _checkpoint_is_due(self) -> bool:
        offset = self.state.offset
        return (
            offset - self._digest_through >= self.digest_every
            or offset - self._snapshot_through >= self.snapshot_every
        )

    async def _checkpoints(self, group: asyncio.TaskGroup) -> None:
        """Take each checkpoint that falls due (DESIGN §9), after the reconciler.

        When the follower has folded ``digest_every`` records since the last
        ``LedgerDigest`` (``snapshot_every`` since the last snapshot), this task
        waits until the reconciler has looked at the state (fired what is due,
        started the evictions to drive) and no timer falls due while the
        checkpoint would block the loop, then takes the checkpoint of the state
        as it is then: ``through`` is that offset. A snapshot is then encoded
        and written by a task of its own while the engine goes on (one at a
        time: one falling due meanwhile waits for it to end).
        """
        while True:
            await self._checkpoint_due.wait()
            self._checkpoint_due.clear()
            await self._after_reconciler()
            await self._clear_of_deadlines()
            offset = self.state.offset
            snapshot = (
                offset - self._snapshot_through >= self.snapshot_every
                and self._snapshot_task is None
            )
            if not snapshot and offset - self._digest_through < self.digest_every:
                continue
            began = time.perf_counter()
            taken = self._take_checkpoint(snapshot=snapshot)
            self._checkpoint_s = time.perf_counter() - began
            if taken.copy is not None:
                self._snapshot_task = group.create_task(self._snapshot_in_background(taken))
            await self._append_digest(taken)

    async def _after_reconciler(self, wait_s: float = 0.05) -> None:
        """Until the reconciler waits for its next wake with none pending (at
        most ``wait_s``; at once when it does not run)."""
        loop = asyncio.get_running_loop()
        until = loop.time() + wait_s
        while self._reconciling and not (self._at_rest and not self._wake.is_set()):
            self._rested.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout_at(until):
                    await self._rested.wait()
            if loop.time() >= until:
                return

    async def _clear_of_deadlines(self, wait_s: float = 1.0) -> None:
        """Until no timer falls due while a checkpoint would block the loop (as
        long as the last one did, plus a margin): a timer due within that time
        is fired first (at most ``wait_s``; at once for an engine that does not
        decide)."""
        loop = asyncio.get_running_loop()
        until = loop.time() + wait_s
        while self._reconciling and self.is_leader() and loop.time() < until:
            deadline = self.core.next_deadline()
            if deadline is None:
                return
            ahead_s = (deadline - self.clock_ms()) / 1000
            if ahead_s > 1.5 * self._checkpoint_s + 0.005:
                return
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout_at(until):
                    await asyncio.sleep(max(0.0, ahead_s) + 0.001)
                    await self._after_reconciler()

    async def checkpoint(self, *, snapshot: bool) -> None:
        """DESIGN §9: append ``LedgerDigest{through, digest, state_hash}`` for the
        state just folded (only a writer that may append: the leader, or any
        engine with election off), and with ``snapshot`` store a snapshot
        carrying the same digest and state hash; returns once both are written.

        The running engine takes its checkpoints through :meth:`_checkpoints`
        (the same steps, the snapshot written in the background)."""
        taken = self._take_checkpoint(snapshot=snapshot)
        await self._append_digest(taken)
        if taken.copy is not None:
            await self._write_snapshot(taken)

    def _take_checkpoint(self, *, snapshot: bool) -> Checkpoint:
        """The checkpoint of the state as it is now, in one step (no await, so
        no record is folded in between): the chain's digest, the state hash and,
        with ``snapshot``, a copy of the persisted state (:func:`copy_persisted`,
        a few ms) that the snapshot is encoded from while folding goes on."""
        state = self.state
        taken = Checkpoint(
            through=state.offset,
            digest=self.fold.chain.hex,
            state_hash=state_hash(state),
            copy=copy_persisted(state) if snapshot else None,
        )
        self._digest_through = taken.through
        if snapshot:
            self._snapshot_through = taken.through
        return taken

    async def _append_digest(self, taken: Checkpoint) -> None:
        if self.is_leader():
            anchor = LedgerDigest(
                through=taken.through, digest=taken.digest, state_hash=taken.state_hash
            )
            await self.append([anchor])

    async def _write_snapshot(self, taken: Checkpoint) -> None:
        """Encode ``taken``'s copy at most ``snapshot_slice_s`` at a time, yielding
        to the loop in between; checksum it on a thread (hashlib releases the
        GIL); store it (the ledger writes it off the loop, without holding up
        appends). The blob is :func:`~quotaledger.projections.snapshot.dump` of
        the state at ``through``, byte for byte."""
        assert taken.copy is not None
        clock = time.perf_counter
        began = clock()
        blob = await encode_in_slices(taken.copy, self.snapshot_slice_s)
        encoded = clock()
        checksum = await asyncio.to_thread(Snapshot.checksum_of, blob)
        await self.ledger.save_snapshot(
            Snapshot(
                offset=taken.through,
                blob=blob,
                digest=taken.digest,
                state_hash=taken.state_hash,
                checksum=checksum,
            )
        )
        log.debug(
            "engine %s: snapshot at offset %d stored (%d bytes; encoded in %.3f s, written in"
            " %.3f s, now at offset %d)",
            self.instance,
            taken.through,
            len(blob),
            encoded - began,
            clock() - encoded,
            self.state.offset,
        )

    async def _snapshot_in_background(self, taken: Checkpoint) -> None:
        """:meth:`_write_snapshot`; a failure is logged (a snapshot is a cache,
        DESIGN §9) and the next one falls due as usual."""
        try:
            await self._write_snapshot(taken)
        except LedgerError as exc:
            log.warning(
                "engine %s: snapshot at offset %d not stored: %s", self.instance, taken.through, exc
            )
        finally:
            self._snapshot_task = None
            self._checkpoint_due.set()  # one that fell due meanwhile

    async def applied_through(self, offset: int) -> None:
        """Wait until the follower has applied ``offset``."""
        async with self._applied:
            await self._applied.wait_for(lambda: self.state.offset >= offset)

    async def append(self, events: Sequence[Event]) -> list[int]:
        return await self.ledger.append([Append(payload=encode_event(e)) for e in events])

    async def append_applied(self, events: Sequence[Event]) -> int:
        """Append ``events``, wait until the follower has applied them, and
        return the first one's offset.

        The batch's last offset ends a batch, so every batch up to it has been
        applied whole (``EngineCore.sealed_through``).

        The wait is over only when the records the follower applied at the
        offsets the ledger assigned are this append's own payloads, byte for
        byte (DECISIONS 201): a filler or any other record there means the
        state lacks this engine's own decisions, and :class:`ReadBackError`
        stops the engine rather than let it decide on that state.
        """
        payloads = [encode_event(e) for e in events]
        token = self._readback_token = self._readback_token + 1
        # Records at or before the state's offset existed before this append was
        # sent, so its own come later: the follower keeps what it applies from now.
        self._readbacks[token] = self.state.offset
        try:
            offsets = await self.ledger.append([Append(payload=p) for p in payloads])
            await self.applied_through(offsets[-1])
            check_read_back(self._kept, offsets, payloads, self.instance)
        finally:
            del self._readbacks[token]
            self._kept = trim_kept(self._kept, self._readbacks)
        self.core.sealed_through = max(self.core.sealed_through, offsets[-1])
        return offsets[0]

    def is_leader(self) -> bool:
        """May this engine decide now (fire timers, sample clocks, drive evictions)?

        With election: only while it holds the newest accepted epoch (won by
        its own ``LeaderElected``, see :meth:`elect`). Without: only while no
        instance holds any epoch; its decisions carry epoch 0, which the
        projection refuses as stale once an elected leader exists, so
        proposing them would only fill the ledger with refusals (DECISIONS 51).
        """
        if not self.election:
            return self.state.leader_epoch == 0
        return self.core.epoch > 0 and self.core.epoch == self.state.leader_epoch

    def _check_leading(self) -> bool:
        """:meth:`is_leader`, logging when it changes."""
        leading = self.is_leader()
        if leading != self._leading:
            self._leading = leading
            if leading:
                log.info("engine %s decides (epoch %d)", self.instance, self.core.epoch)
            else:
                log.warning(
                    "engine %s stops deciding: %s holds epoch %d (this engine: %d)",
                    self.instance,
                    self.state.leader_instance,
                    self.state.leader_epoch,
                    self.core.epoch,
                )
        return leading

    async def _reconcile(self, group: asyncio.TaskGroup) -> None:
        self._reconciling = True
        while True:
            timeout = self.idle_poll_s
            # A follower (not the leader) fires no timer: waking at a due deadline
            # it will not handle would spin.
            deadline = self.core.next_deadline() if self._check_leading() else None
            disarm = self._disarm_due() if self._leading else None
            if disarm is not None and (deadline is None or disarm < deadline):
                deadline = disarm
            if deadline is not None:
                timeout = max(0.0, min(timeout, (deadline - self.clock_ms()) / 1000))
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a
            # cancellation that arrives just as the event is set (gh-86296), and
            # the TaskGroup would then wait for this loop forever on stop.
            self._at_rest = True
            self._rested.set()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._wake.wait()
            self._at_rest = False
            self._wake.clear()
            if not self._check_leading():
                continue
            await self.step(group)

    async def step(self, group: asyncio.TaskGroup) -> None:
        """One round: sample the clocks (at most once a second), finish, drive
        evictions, fire due timers (a quota-decrease timer that found nothing
        to do on an older state is evaluated again), and carry the ledger's
        time past a passed deadline whose target is empty, so that the fold
        disarms it (§8 rule 21, DECISIONS 210)."""
        now = self.clock_ms()
        if now - self._observed_at >= self.observe_every_ms:
            self._observed_at = now
            observed = self.core.observe(now)
            if observed is not None:
                await self.append_applied([observed])
        finished = self.core.finished()
        if finished:
            await self.append_applied(finished)
        for eviction in self.core.outstanding(mine_only=True):
            if eviction.eviction_id not in self._inflight:
                self._inflight.add(eviction.eviction_id)
                group.create_task(self._drive(eviction))
        self.core.revisit()
        now = self.clock_ms()
        for timer in self.core.due(now):
            if not self.is_leader():
                return
            events = self.core.propose(timer)
            if events:
                await self.append_applied(events)
                self.core.reopen_if_refused(timer, events, now=self.clock_ms())
        disarm = self._disarm_due()
        now = self.clock_ms()
        if disarm is not None and now >= disarm and self.is_leader():
            self._observed_at = now
            await self.append_applied([self.core.disarm_record(now)])
            if self.state.ts < disarm:
                # the ledger stamped it before our clock (its clock is behind):
                # no later ts, no disarm; try again in a second rather than spin
                self._disarm_not_before = now + 1000

    def _disarm_due(self) -> int | None:
        """When to append the record that lets the fold disarm a passed,
        empty quota-decrease deadline (:meth:`EngineCore.disarm_at`)."""
        disarm = self.core.disarm_at()
        return None if disarm is None else max(disarm, self._disarm_not_before)

    async def _drive(self, eviction: EvictionRun) -> None:
        try:
            outcome = await self.executor.evict(eviction, self.state)
            if outcome:
                # Read the outcome back before leaving _inflight: the next step
                # must not see this eviction outstanding and drive it again.
                await self.append_applied(outcome)
        finally:
            self._inflight.discard(eviction.eviction_id)
            self._wake.set()


def _rejected(state: ProjectedState, offset: int) -> bool:
    """Was the record at ``offset`` refused by the projection? (newest first)"""
    for rejection in reversed(state.rejected):
        if rejection.offset == offset:
            return True
        if rejection.offset < offset:
            return False
    return False


class _Stop(Exception):
    """Raised inside the TaskGroup to cancel every task on ``stop``."""
