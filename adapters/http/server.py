"""``quotaledger serve``: follower, engine and HTTP API in one process (DESIGN §11).

One ``asyncio.TaskGroup`` holds the engine (or, with ``--read-only``, a plain
follower; on a cluster, the engine while this replica holds the Lease) and the
aiohttp server; SIGTERM/SIGINT set ``stop``, the server stops listening, open
streams end, and the engine drains, within 2 s (DESIGN §9).

State reads never race the fold: a reader takes the fold gate
(:mod:`.gate`), settles the state on the loop (incremental, cheap), and
does the heavy part — the state JSON, the metrics text, a what-if fork, an
audit — in a worker thread, so the event loop keeps serving meanwhile. A read
that holds the gate pauses the fold, not the server. The handlers are
:mod:`.routes`; errors are JSON ``{"error": {"status", "message", "field"}}``
(:mod:`.documents`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry

from quotaledger.engine.executors import LogExecutor, SimulateExecutor
from quotaledger.engine.live import LiveEngine
from quotaledger.engine.stopping import cancel_and_wait
from quotaledger.events.ledger import Ledger, Record
from quotaledger.events.times import wall_clock_ms
from quotaledger.projections import ProjectedState, settle

from ..kubernetes.options import ClusterOptions
from ..ledgers.url import open_ledger
from .documents import errors
from .gate import GatedLedger
from .metrics import FoldStatistics, LedgerPosition, StateCollector
from .options import ServeError, ServeOptions
from .requests import MAX_QUERY_BYTES
from .routes import Routes
from .stream import Feed

log = logging.getLogger("quotaledger.serve")

#: Seconds open connections get to finish once ``stop`` is set.
SHUTDOWN_GRACE_S = 0.5


def version() -> str:
    try:
        return metadata.version("quotaledger")
    except metadata.PackageNotFoundError:
        return "unknown"


@dataclass(slots=True)
class _Observers:
    """The fold gate's observer: statistics for the metrics, records for the feed."""

    statistics: FoldStatistics
    feed: Feed

    def before_fold(self, batch: Sequence[Record], state: ProjectedState) -> None:
        self.statistics.before_fold(batch, state)

    def after_fold(self, batch: Sequence[Record], state: ProjectedState, seconds: float) -> None:
        self.statistics.after_fold(batch, state, seconds)
        if self.feed.subscribers:
            self.feed.publish(batch)


# ------------------------------------------------------------------- the server


class Server:
    """One ``serve`` process over one ledger (see module docstring)."""

    def __init__(self, ledger: Ledger, options: ServeOptions) -> None:
        self.options = options
        self.statistics = FoldStatistics()
        self.feed = Feed()
        self.position = LedgerPosition()
        self.ledger = GatedLedger(
            ledger, lambda: self.state, _Observers(self.statistics, self.feed)
        )
        executor = SimulateExecutor() if options.executor == "simulate" else LogExecutor()
        self.engine = LiveEngine(
            self.ledger,
            executor,
            instance=options.instance,
            election=not options.read_only,
            snapshot_every=options.snapshot_every,
            idle_poll_s=options.idle_poll_s,
            clock_ms=options.clock_ms or wall_clock_ms,
        )
        self.leader_known = False
        self._restored = False
        self.port: int | None = None
        self.listening = asyncio.Event()
        self._thread_readers = 0
        self.collector = StateCollector(
            lambda: self.state,
            self.statistics,
            self.position,
            lambda: self.state.leader_epoch,
            version(),
        )
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.collector)
        self.routes = Routes(self)

    @property
    def state(self) -> ProjectedState:
        return self.engine.state

    # ------------------------------------------------------------ running

    async def run(
        self, stop: asyncio.Event, announce: Callable[[Server], None] | None = None
    ) -> None:
        """Engine (or follower) and HTTP in one TaskGroup, until ``stop``;
        ``announce(self)`` once the server listens."""
        async with asyncio.TaskGroup() as group:
            if self.options.read_only:
                group.create_task(self._follow_only(stop))
            elif self.options.cluster is not None:
                group.create_task(self._on_cluster(self.options.cluster, stop))
            else:
                group.create_task(self.engine.run(stop, self._engine_ready))
            group.create_task(self._http(stop, announce))

    async def _engine_ready(self) -> None:
        self._restored = True
        self.leader_known = True

    async def _on_cluster(self, cluster: ClusterOptions, stop: asyncio.Event) -> None:
        """DESIGN §12: the engine (and watcher) of this replica while it holds the
        Lease; between terms it follows the ledger, so its reads stay fresh."""
        from ..kubernetes.client import ClusterConfigError
        from ..kubernetes.cluster import run_on_cluster

        try:
            await run_on_cluster(
                cluster,
                self.ledger,
                stop,
                engine=self.engine,
                between_terms=self._follow_between_terms,
                on_term=self._engine_ready,
            )
        except ClusterConfigError as exc:
            raise ServeError(str(exc)) from None

    async def _follow_between_terms(self, taken: asyncio.Event) -> None:
        """A replica without the Lease: fold the ledger (restored once) and follow
        its tail until ``taken``; the leader state is known once restored."""

        async def follow() -> None:
            if not self._restored:
                await self.engine.restore()
                settle(self.state)
                self._restored = True
            self.leader_known = True
            async for batch in self.ledger.read(self.state.offset + 1, follow=True):
                apply = self.engine.fold.apply
                for record in batch:
                    apply(record)

        task = asyncio.create_task(follow())
        waiter = asyncio.create_task(taken.wait())
        try:
            await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
            # until it has ended: a cancellation swallowed inside the read (aiokafka's
            # client close did) must not leave it folding beside the term's engine, nor
            # hold the term up (DECISIONS 300)
            await cancel_and_wait(task)

    async def _follow_only(self, stop: asyncio.Event) -> None:
        """``--read-only``: fold the ledger and follow its tail; no decisions."""
        await self.engine.restore()
        # Settle once before reporting ready: the first reader would otherwise
        # pay the full recompute on the loop.
        settle(self.state)
        self.leader_known = True
        projection = self.engine.projection

        async def follow() -> None:
            async for batch in self.ledger.read(self.state.offset + 1, follow=True):
                for record in batch:
                    projection.apply_record(record)

        task = asyncio.create_task(follow())
        try:
            await stop.wait()
        finally:
            await cancel_and_wait(task)

    async def _http(self, stop: asyncio.Event, announce: Callable[[Server], None] | None) -> None:
        runner = web.AppRunner(self.app(), access_log=None, shutdown_timeout=SHUTDOWN_GRACE_S)
        await runner.setup()
        site = web.TCPSite(runner, self.options.host, self.options.port)
        try:
            await site.start()
            sockets = getattr(site._server, "sockets", None) or []
            self.port = sockets[0].getsockname()[1] if sockets else self.options.port
            self.listening.set()
            if announce is not None:
                announce(self)
            await stop.wait()
        finally:
            self.feed.close()
            await runner.cleanup()

    def app(self) -> web.Application:
        app = web.Application(middlewares=[errors], client_max_size=MAX_QUERY_BYTES)
        app.add_routes(self.routes.table())
        return app

    # ------------------------------------------------------------ reading

    async def read_settled(self, work: Callable[[ProjectedState], Any]) -> Any:
        """``work(state)`` in a worker thread, the fold paused and the state settled."""
        async with self.ledger.gate:
            settle(self.state)
            self._thread_readers += 1
            try:
                return await asyncio.to_thread(work, self.state)
            finally:
                self._thread_readers -= 1

    @contextlib.asynccontextmanager
    async def instant_read(self) -> AsyncIterator[ProjectedState]:
        """The state for a read done on the loop without awaiting (a quota, an
        admission). While a reader thread holds the gate the state cannot change
        and is settled, so such a read proceeds at once beside it; otherwise it
        takes the gate (waits for the batch being folded)."""
        if self._thread_readers and self.ledger.gate.locked():
            yield self.state
            return
        async with self.ledger.gate:
            settle(self.state)
            yield self.state


# ---------------------------------------------------------------- running it


async def serve(
    ledger_url: str,
    options: ServeOptions,
    *,
    stop: asyncio.Event | None = None,
    announce: Callable[[Server], None] | None = None,
    signals: bool = True,
    snapshots: str | None = None,
) -> None:
    """Open the ledger (DESIGN §10 URLs; created when empty, except ``--read-only``,
    which opens an existing one without writing to it, DESIGN §9) and run a
    :class:`Server` until SIGTERM/SIGINT or ``stop``."""
    import signal

    ledger = await open_ledger(
        ledger_url,
        create=not options.read_only,
        snapshots=snapshots,
        read_only=options.read_only,
    )
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    if signals:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
    try:
        await Server(ledger, options).run(stop, announce)
    finally:
        if signals:
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(signum)
        await ledger.close()
