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
  decisions;
* deadlines come from ledger ``ts``: after a restart an overdue timer fires at
  once, never later than its original deadline plus the restart;
* with election on, it appends ``LeaderElected{epoch+1}`` at start and
  proposes only while its epoch is the newest (a stale writer is fenced by the
  projection anyway).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from quotaledger.events.codec import encode_event
from quotaledger.events.ledger import Append, Ledger, Snapshot
from quotaledger.events.model import (
    Event,
    EvictionFailed,
    EvictionSucceeded,
    LeaderElected,
    LedgerDigest,
    PodRemoved,
)
from quotaledger.projections import Projection, state_hash
from quotaledger.projections.snapshot import dump
from quotaledger.projections.state import EvictionRun, ProjectedState

from .core import EngineCore
from .restore import ChainedFold
from .restore import restore as restore_ledger

log = logging.getLogger("quotaledger.engine")


class Executor(Protocol):
    """Carries out one accepted eviction; returns the facts/decisions to append.

    Must be idempotent by ``eviction_id``: after a restart the same eviction
    may be driven again.
    """

    async def evict(self, eviction: EvictionRun, state: ProjectedState) -> list[Event]: ...


class SimulateExecutor:
    """The pod is removed at once: ``EvictionSucceeded`` and ``PodRemoved``."""

    async def evict(self, eviction: EvictionRun, state: ProjectedState) -> list[Event]:
        return [
            EvictionSucceeded(eviction_id=eviction.eviction_id),
            PodRemoved(uid=eviction.pod_uid),
        ]


class LogExecutor:
    """Dry run: logs the eviction and records it as not executed."""

    async def evict(self, eviction: EvictionRun, state: ProjectedState) -> list[Event]:
        log.warning(
            "dry run: would evict pod %s from %s (%s)",
            eviction.pod_uid,
            eviction.queue,
            eviction.eviction_id,
        )
        return [EvictionFailed(eviction_id=eviction.eviction_id, error="dry run (log executor)")]


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


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
    _since_snapshot: int = 0
    _since_digest: int = 0
    fold: ChainedFold = field(init=False)
    observe_every_ms: int = 1000
    _observed_at: int = 0

    def __post_init__(self) -> None:
        self.core = EngineCore(self.projection, instance=self.instance)
        self.fold = ChainedFold(self.projection, on_mismatch=log.warning)

    @property
    def state(self) -> ProjectedState:
        return self.projection.state

    # ------------------------------------------------------------ start-up

    async def restore(self) -> None:
        """The state at the ledger's tail, through the one restore path
        (:func:`quotaledger.engine.restore.restore`: a verified snapshot or a
        full replay, with the digest chain)."""
        restored = await restore_ledger(self.ledger, warn=log.warning)
        self.fold = restored.fold
        self.fold.on_mismatch = log.warning
        self.projection = restored.projection
        self.core = EngineCore(self.projection, instance=self.instance)
        # A read to the tail ends on a committed transaction: every batch is whole.
        self.core.sealed_through = self.state.offset

    async def elect(self) -> None:
        """Claim the next epoch; the projection decides who is newest."""
        epoch = self.state.leader_epoch + 1
        await self.append_applied([LeaderElected(epoch=epoch, instance=self.instance)])
        self.core.epoch = epoch if self.state.leader_epoch == epoch else self.state.leader_epoch

    # ------------------------------------------------------------ tasks

    async def run(
        self, stop: asyncio.Event, ready: Callable[[], Awaitable[None]] | None = None
    ) -> None:
        """Run until ``stop`` is set; then cancel every task and return."""
        self._applied = asyncio.Condition()
        self._wake = asyncio.Event()
        await self.restore()
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._follow())
                if self.election:
                    await self.elect()
                if ready is not None:
                    await ready()
                group.create_task(self._reconcile(group))
                await stop.wait()
                raise _Stop
        except* _Stop:
            log.info("engine %s stopped at offset %d", self.instance, self.state.offset)

    async def _follow(self) -> None:
        async for batch in self.ledger.read(self.state.offset + 1, follow=True):
            apply = self.fold.apply
            for record in batch:
                apply(record)
            self._since_snapshot += len(batch)
            self._since_digest += len(batch)
            async with self._applied:
                self._applied.notify_all()
            self._wake.set()
            if self._since_snapshot >= self.snapshot_every:
                await self.checkpoint(snapshot=True)
            elif self._since_digest >= self.digest_every:
                await self.checkpoint(snapshot=False)

    async def checkpoint(self, *, snapshot: bool) -> None:
        """DESIGN §9: append ``LedgerDigest{through, digest, state_hash}`` for the
        state just folded (only a writer that may append: the leader, or any
        engine with election off), and with ``snapshot`` store a snapshot
        carrying the same digest and state hash."""
        self._since_digest = 0
        if snapshot:
            self._since_snapshot = 0
        state = self.state
        through, digest, hashed = state.offset, self.fold.chain.hex, state_hash(state)
        if self.is_leader():
            anchor = LedgerDigest(through=through, digest=digest, state_hash=hashed)
            await self.append([anchor])
        if snapshot:
            await self.ledger.save_snapshot(
                Snapshot(
                    offset=through,
                    blob=(blob := dump(state)),
                    digest=digest,
                    state_hash=hashed,
                    checksum=Snapshot.checksum_of(blob),
                )
            )

    async def applied_through(self, offset: int) -> None:
        """Wait until the follower has applied ``offset``."""
        async with self._applied:
            await self._applied.wait_for(lambda: self.state.offset >= offset)

    async def append(self, events: Sequence[Event]) -> list[int]:
        return await self.ledger.append([Append(payload=encode_event(e)) for e in events])

    async def append_applied(self, events: Sequence[Event]) -> None:
        """Append ``events`` and wait until the follower has applied them.

        The batch's last offset ends a batch, so every batch up to it has been
        applied whole (``EngineCore.sealed_through``).
        """
        offsets = await self.append(events)
        await self.applied_through(offsets[-1])
        self.core.sealed_through = max(self.core.sealed_through, offsets[-1])

    def is_leader(self) -> bool:
        return not self.election or self.core.epoch == self.state.leader_epoch

    async def _reconcile(self, group: asyncio.TaskGroup) -> None:
        while True:
            timeout = self.idle_poll_s
            # A follower (not the leader) fires no timer: waking at a due deadline
            # it will not handle would spin.
            deadline = self.core.next_deadline() if self.is_leader() else None
            if deadline is not None:
                timeout = max(0.0, min(timeout, (deadline - self.clock_ms()) / 1000))
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a
            # cancellation that arrives just as the event is set (gh-86296), and
            # the TaskGroup would then wait for this loop forever on stop.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._wake.wait()
            self._wake.clear()
            if not self.is_leader():
                continue
            await self.step(group)

    async def step(self, group: asyncio.TaskGroup) -> None:
        """One round: sample the clocks (at most once a second), finish, drive
        evictions, fire due timers."""
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
        now = self.clock_ms()
        for timer in self.core.due(now):
            if not self.is_leader():
                return
            events = self.core.propose(timer)
            if events:
                await self.append_applied(events)
                self.core.reopen_if_refused(timer, events)

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


class _Stop(Exception):
    """Raised inside the TaskGroup to cancel every task on ``stop``."""
