"""``run`` on a cluster: Lease election, then engine + watcher while holding (DESIGN §12).

Every replica waits for the Lease. The holder runs the live engine (which appends its
``LeaderElected``) and, once the engine has caught up with the ledger and its election
record is folded, the cluster watcher, seeded with the state the ledger holds so that only
changes are appended. When the Lease is lost (no renew within ``--renew-deadline``) both are
stopped before any other replica can take the Lease, and the replica waits again. SIGTERM
stops everything and releases the Lease.

A term's engine appends through :class:`LeaseGatedLedger` and evicts only while the Lease
is held (DESIGN §12: only the holder appends facts and decisions): a replica paused past its
Lease and resumed (SIGSTOP, a long GC pause) gets :class:`NotLeader` at its first append
instead of writing as a zombie, and its term ends. A term also ends when its engine does
(an error it raised then ends ``run``, releasing the Lease, instead of a holder without an
engine keeping the Lease).

``run`` and ``serve`` both call :func:`run_on_cluster`. ``serve`` passes its one engine (its
reads come from that engine's state, so it lives across terms), a follower that keeps the
state fresh while the replica does not hold the Lease, and a hook for the start of each term
(DECISIONS 130).

The options (:class:`~.options.ClusterOptions`, built from the command line by each command)
are in :mod:`.options` (no client import, so ``--help`` stays fast).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any

from quotaledger.engine.executors import Executor, LogExecutor, SimulateExecutor
from quotaledger.engine.live import LiveEngine  # type: ignore[import-untyped,unused-ignore]
from quotaledger.engine.stopping import cancel_and_wait, unless_stopped
from quotaledger.events.ledger import Append, Ledger, LedgerError, Record, Snapshot

from .client import Cluster, connect
from .executor import KubernetesExecutor
from .lease import LeaseElector
from .options import ClusterOptions
from .watcher import Baseline, ClusterWatcher, LedgerSink, NotLeader, WatchOptions

log = logging.getLogger("quotaledger.kubernetes")


def _executor(
    args: ClusterOptions, cluster: Cluster, ledger: Ledger, may_evict: Callable[[], bool]
) -> Executor:
    if args.executor == "kubernetes":
        return KubernetesExecutor(
            cluster.core, ledger, retry_for_s=args.eviction_retry_for, may_evict=may_evict
        )
    if args.executor == "log":
        return LogExecutor()
    return SimulateExecutor()


@dataclass
class LeaseGatedLedger:
    """A ledger whose appends need ``holding()`` (the Lease, DESIGN §12); else
    :class:`NotLeader`. Reads, snapshots and the ledger itself are the shared ledger's."""

    inner: Ledger
    holding: Callable[[], bool]

    @property
    def ledger_id(self) -> str:
        return self.inner.ledger_id

    async def append(self, batch: Sequence[Append]) -> list[int]:
        if not self.holding():
            raise NotLeader("not the lease holder: decisions not appended")
        return await self.inner.append(batch)

    def read(self, from_offset: int = 0, *, follow: bool = False) -> AsyncIterator[list[Record]]:
        return self.inner.read(from_offset, follow=follow)

    async def last_offset(self) -> int:
        return await self.inner.last_offset()

    async def save_snapshot(self, snapshot: Snapshot) -> None:
        await self.inner.save_snapshot(snapshot)

    async def load_snapshot(self, at_most: int | None = None) -> Snapshot | None:
        return await self.inner.load_snapshot(at_most)

    async def close(self) -> None:
        """The shared ledger outlives a term: closed by its owner."""


#: runs while the replica waits for the Lease; returns soon after its event is set
BetweenTerms = Callable[[asyncio.Event], Coroutine[Any, Any, None]]


async def run_on_cluster(
    args: ClusterOptions,
    ledger: Ledger,
    stop: asyncio.Event,
    *,
    engine: LiveEngine | None = None,
    between_terms: BetweenTerms | None = None,
    on_term: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Until ``stop``: wait for the Lease, lead while holding it, repeat.

    ``engine``: the one engine of every term (its executor is set per term); without
    it each term builds its own. ``between_terms(taken)`` runs while waiting for the
    Lease (a follower) and must return once ``taken`` is set; ``on_term()`` runs when
    a term's engine has caught up and claimed its epoch.
    """
    cluster = await connect(args.kubeconfig, args.in_cluster)
    elector = LeaseElector(
        cluster.coordination,
        cluster.namespace,
        args.lease_name,
        args.instance,
        args.lease_duration,
        args.renew_deadline,
        args.retry_period,
    )
    _say(f"engine {args.instance} waiting for lease {cluster.namespace}/{args.lease_name}")
    try:
        while not stop.is_set():
            if not await _wait_for_lease(elector, stop, between_terms):
                break
            await _lead(args, cluster, ledger, elector, stop, engine, on_term)
            if not stop.is_set():
                _say(f"engine {args.instance} lost the lease; following")
    finally:
        await elector.release()
        await cluster.close()


async def _first(work: Awaitable[Any], stop: asyncio.Event) -> bool:
    """Run ``work`` until it ends (True; its error is raised) or ``stop`` is set first
    (False: ``work`` cancelled and waited for)."""

    async def whole() -> bool:
        await work
        return True

    return await unless_stopped(whole(), stop) is not None


async def _wait_for_lease(
    elector: LeaseElector, stop: asyncio.Event, between_terms: BetweenTerms | None
) -> bool:
    """Wait for the Lease (True) or ``stop`` (False), ``between_terms`` running meanwhile;
    an error of ``between_terms`` (the ledger unreadable) ends the wait with that error.

    ``between_terms`` is over before this returns: told by ``taken``, then cancelled until
    it ends (:func:`cancel_and_wait`; its follower must not fold beside the term's engine,
    and a cancellation swallowed inside it must not hold the term or a stop up, DECISIONS
    300)."""
    if between_terms is None:
        return await _first(elector.acquire(), stop)
    taken = asyncio.Event()
    follower = asyncio.create_task(between_terms(taken))
    waiting = asyncio.ensure_future(_first(elector.acquire(), stop))
    try:
        await asyncio.wait({follower, waiting}, return_when=asyncio.FIRST_COMPLETED)
        if follower.done():
            follower.result()  # raises its error
        return await waiting
    finally:
        taken.set()
        await cancel_and_wait(waiting)
        await cancel_and_wait(follower)


async def _lead(
    args: ClusterOptions,
    cluster: Cluster,
    ledger: Ledger,
    elector: LeaseElector,
    stop: asyncio.Event,
    engine: LiveEngine | None = None,
    on_term: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """One term: the engine and the watcher, until the Lease is lost, the engine ends or
    ``stop``."""
    gated = LeaseGatedLedger(ledger, elector.holding)
    leading: list[LiveEngine] = []
    given: Ledger | None = None

    def may_evict() -> bool:
        return elector.holding() and all(e.is_leader() for e in leading)

    if engine is None:
        engine = LiveEngine(
            gated,
            _executor(args, cluster, ledger, may_evict),
            instance=args.instance,
            election=True,
            snapshot_every=args.snapshot_every,
            claims_under_lease=True,
        )
    else:
        given = engine.ledger
        engine.ledger = gated
        engine.executor = _executor(args, cluster, ledger, may_evict)
        engine.claims_under_lease = True
    leading.append(engine)
    term_over = asyncio.Event()
    namespace, name = args.settings_configmap.split("/")
    options = WatchOptions(args.quota_source, (namespace, name), args.watch_timeout)
    watcher_task: asyncio.Task[None] | None = None

    async def ready() -> None:
        nonlocal watcher_task
        if term_over.is_set() or not elector.holding():
            term_over.set()  # the term ended while the engine caught up: no watcher
            return
        watcher = ClusterWatcher(
            cluster.core,
            cluster.custom,
            LedgerSink(ledger, elector.holding),
            options,
            Baseline.of(engine.state),
        )
        watcher_task = asyncio.create_task(watcher.run())
        watcher_task.add_done_callback(lambda _: term_over.set())
        if on_term is not None:
            await on_term()
        _say(
            f"engine {args.instance} leading (epoch {engine.state.leader_epoch})"
            f" at offset {engine.state.offset}"
        )

    async def guard() -> None:
        await _first(elector.keep(), stop)
        term_over.set()

    guard_task = asyncio.create_task(guard())
    engine_task = asyncio.create_task(engine.run(term_over, ready))
    engine_task.add_done_callback(lambda _: term_over.set())

    async def stop_watcher() -> None:
        if watcher_task is not None:
            with contextlib.suppress(NotLeader):
                await cancel_and_wait(watcher_task)

    try:
        await term_over.wait()
    finally:
        term_over.set()
        await stop_watcher()
        await cancel_and_wait(guard_task)
        try:
            # the engine ends on term_over (its stop); waited for with asyncio.wait, so a
            # cancellation of this term is raised, not swallowed with the engine's
            await asyncio.wait({engine_task})
        finally:
            if not engine_task.done():  # this term was cancelled: so is its engine
                await cancel_and_wait(engine_task)
        if not engine_task.cancelled():
            try:
                engine_task.result()
            except* NotLeader:
                log.warning("engine %s: the Lease was lost before it noticed", args.instance)
            except* LedgerError as group:
                # one clear error (a broker that lost its log), not a group's traceback
                raise first_error(group) from None
        await stop_watcher()  # ready() may have started one while the engine stopped
        if engine.ledger is gated:
            engine.ledger = given if given is not None else ledger


def first_error(group: BaseExceptionGroup[LedgerError]) -> LedgerError:
    """The first error of a (nested) exception group."""
    first: BaseException = group
    while isinstance(first, BaseExceptionGroup):
        first = first.exceptions[0]
    assert isinstance(first, LedgerError)
    return first


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)
