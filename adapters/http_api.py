"""``quotaledger serve``: follower, engine and HTTP API in one process (DESIGN §11).

One ``asyncio.TaskGroup`` holds the engine (or, with ``--read-only``, a plain
follower) and the aiohttp server; SIGTERM/SIGINT set ``stop``, the server stops
listening, open streams end, and the engine drains, within 2 s (DESIGN §9).

State reads never race the fold: a reader takes the fold gate
(:mod:`.fold_gate`), settles the state on the loop (incremental, cheap), and
does the heavy part — the state JSON, the metrics text, a what-if fork, an
audit — in a worker thread, so the event loop keeps serving meanwhile. A read
that holds the gate pauses the fold, not the server.

Errors are JSON ``{"error": {"status", "message", "field"}}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import importlib
import itertools
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from importlib import metadata, resources
from typing import Any

import msgspec
from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from quotaledger.engine.audit import DECISION_KINDS, audit
from quotaledger.engine.audit_findings import AuditReport
from quotaledger.engine.audit_words import report_json, report_text
from quotaledger.engine.fold_loop import Until, fold, parse_until
from quotaledger.engine.live import LiveEngine, LogExecutor, SimulateExecutor, wall_clock_ms
from quotaledger.engine.whatif import ChangeError, parse_duration, whatif
from quotaledger.events.codec import EventError, decode_event, peek_kind
from quotaledger.events.ledger import Append, Ledger, LedgerError, Record
from quotaledger.events.model import is_fact, kind_of
from quotaledger.projections import ProjectedState, Projection, rfc3339, settle, state_json
from quotaledger.projections.available import reported_available
from quotaledger.projections.snapshot import dump, load
from quotaledger.projections.view import quota_view

from .feed import Feed, sse_event
from .fold_gate import GatedLedger
from .jsonl import epoch_ms
from .metrics import FoldStatistics, LedgerPosition, StateCollector

log = logging.getLogger("quotaledger.serve")

#: Largest ``POST /v1/events`` body (DESIGN §11).
MAX_EVENTS_BYTES = 16 * 1024 * 1024
#: Largest JSON/NDJSON body of the other POST endpoints.
MAX_QUERY_BYTES = 1024 * 1024
#: ``/v1/decisions``: default and largest page, and records scanned per request.
DECISIONS_PAGE = 100
DECISIONS_PAGE_MAX = 1000
DECISIONS_SCAN_MAX = 100_000
#: Most records a ``/v1/stream`` client may ask to resume from the ledger.
STREAM_RESUME_MAX = 100_000
#: Seconds between keep-alive comments on an idle stream.
STREAM_HEARTBEAT_S = 15.0
#: Seconds open connections get to finish once ``stop`` is set.
SHUTDOWN_GRACE_S = 0.5

_JSON = "application/json"
_ENCODER = msgspec.json.Encoder()


class ApiError(Exception):
    """An error answered as ``{"error": {"status", "message", "field"}}``."""

    def __init__(self, status: int, message: str, field: str | None = None, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.field = field
        self.extra = extra


def error_body(status: int, message: str, field: str | None, **extra: Any) -> bytes:
    return _ENCODER.encode(
        {"error": {"status": status, "message": message, "field": field, **extra}}
    )


def _json(document: Any, status: int = 200) -> web.Response:
    return web.Response(body=_ENCODER.encode(document), status=status, content_type=_JSON)


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


@dataclass(slots=True)
class ServeOptions:
    host: str = "127.0.0.1"
    port: int = 8080
    token: bytes | None = None
    executor: str = "simulate"
    read_only: bool = False
    instance: str = "serve"
    snapshot_every: int = 50_000
    #: the engine's clock (ms); ``demo --speed`` runs it faster than the wall clock
    clock_ms: Callable[[], int] | None = None
    #: longest the reconciler sleeps without news (seconds)
    idle_poll_s: float = 0.5
    #: the parsed ``--kubeconfig``/``--in-cluster`` options (DESIGN §12): engine and
    #: watcher only while holding the Lease, reads on every replica
    cluster: Any = None


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
        self._state_cache: tuple[int, bytes] | None = None
        self._state_inflight: asyncio.Future[tuple[int, bytes]] | None = None
        self._thread_readers = 0
        self._audit_lock = asyncio.Lock()
        self._audit_cache: tuple[int, AuditReport] | None = None
        self.collector = StateCollector(
            lambda: self.state,
            self.statistics,
            self.position,
            lambda: self.state.leader_epoch,
            version(),
        )
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.collector)

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
                group.create_task(self._on_cluster(stop))
            else:
                group.create_task(self.engine.run(stop, self._engine_ready))
            group.create_task(self._http(stop, announce))

    async def _engine_ready(self) -> None:
        self._restored = True
        self.leader_known = True

    async def _on_cluster(self, stop: asyncio.Event) -> None:
        """DESIGN §12: the engine (and watcher) of this replica while it holds the
        Lease; between terms it follows the ledger, so its reads stay fresh."""
        from .kubernetes.client import ClusterConfigError
        from .kubernetes.cluster import run_on_cluster
        from .serve_cli import ServeError

        try:
            await run_on_cluster(
                self.options.cluster,
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
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

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
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

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
        app = web.Application(middlewares=[_errors], client_max_size=MAX_QUERY_BYTES)
        routes = [
            web.post("/v1/events", self.post_events),
            web.get("/v1/state", self.get_state),
            web.get("/v1/quotas/{name}", self.get_quota),
            web.get("/v1/tree", self.get_tree),
            web.get("/v1/decisions", self.get_decisions),
            web.get("/v1/explain/pod/{uid}", self.get_explain),
            web.post("/v1/admission", self.post_admission),
            web.post("/v1/whatif", self.post_whatif),
            web.get("/v1/stream", self.get_stream),
            web.get("/healthz", self.healthz),
            web.get("/readyz", self.readyz),
            web.get("/metrics", self.get_metrics),
            web.get("/", self.index),
            web.get("/page/{file}", self.page_file),
        ]
        app.add_routes(routes)
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

    async def fold_until(self, until: Until) -> ProjectedState:
        """A private state of the ledger at ``until`` (snapshot + tail, in a thread)."""
        inner = self.ledger.inner
        projection = Projection()
        snapshot = await inner.load_snapshot(until.offset)
        if snapshot is not None:
            state = await asyncio.to_thread(load, snapshot.blob)
            if until.ts is None or state.ts <= until.ts:
                projection = Projection(state)
        start = projection.state.offset + 1
        async for batch in inner.read(start):
            done = await asyncio.to_thread(fold, projection, [batch], until)
            if done < len(batch):
                break
        return projection.state

    # ------------------------------------------------------------ handlers

    async def post_events(self, request: web.Request) -> web.Response:
        """Append NDJSON facts: all lines or none (DESIGN §11)."""
        self._authorize(request)
        body = await _read_limited(request, MAX_EVENTS_BYTES)
        appends, problems, decisions = _parse_facts(body)
        if problems:
            raise ApiError(
                400,
                f"{len(problems)} bad line(s); nothing appended",
                "body",
                lines=problems,
            )
        if decisions:
            raise ApiError(
                403,
                "decision kinds are written by the engine only; nothing appended",
                "body",
                lines=decisions,
            )
        if not appends:
            raise ApiError(400, "no events in the body", "body")
        offsets = await self.ledger.append(appends)
        return _json(
            {"appended": len(offsets), "first_offset": offsets[0], "last_offset": offsets[-1]}
        )

    def _authorize(self, request: web.Request) -> None:
        token = self.options.token
        if token is None:
            raise ApiError(
                403,
                "writes are disabled: no token configured (--token-file or QUOTALEDGER_TOKEN)",
                "Authorization",
            )
        header = request.headers.get("Authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(
            given.strip().encode("utf-8", "replace"), token
        ):
            raise ApiError(401, "missing or wrong bearer token", "Authorization")
        if self.options.read_only:
            raise ApiError(403, "this server is read-only (--read-only)", None)

    async def get_state(self, request: web.Request) -> web.Response:
        text = request.query.get("at")
        if text is not None:
            try:
                until = parse_until(text)
            except ValueError as exc:
                raise ApiError(400, str(exc).replace("--until", "at"), "at") from None
            if until.offset is not None and until.offset > await self.ledger.last_offset():
                raise ApiError(404, f"offset {until.offset} is past the end of the ledger", "at")
            state = await self.fold_until(until)
            if state.offset < 0:
                raise ApiError(404, await self._before_opening(text), "at")
            body = await asyncio.to_thread(lambda: _ENCODER.encode(state_json(state)))
            return web.Response(body=body, content_type=_JSON)
        return web.Response(body=await self.current_state_json(), content_type=_JSON)

    async def _before_opening(self, text: str) -> str:
        """``?at=`` before the ledger's first record: there is no state then (an
        error, not a silently empty state at offset -1; DECISIONS 266)."""
        async for batch in self.ledger.inner.read(0):
            if batch:
                opened = rfc3339(batch[0].ts)
                return f"at {text}: before the ledger opened (offset 0 at {opened}): no state then"
        return f"at {text}: the ledger holds no record"

    async def current_state_json(self) -> bytes:
        """The state JSON now: cached per offset, and computed by one reader at a
        time (concurrent readers share the computation in flight)."""
        cache = self._state_cache
        if cache is not None and cache[0] == self.state.offset:
            return cache[1]
        if self._state_inflight is None:
            self._state_inflight = asyncio.ensure_future(
                self.read_settled(lambda state: (state.offset, _ENCODER.encode(state_json(state))))
            )
        inflight = self._state_inflight
        try:
            offset, body = await asyncio.shield(inflight)
        finally:
            if self._state_inflight is inflight and inflight.done():
                self._state_inflight = None
        self._state_cache = (offset, body)
        return body

    async def get_quota(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        async with self.instant_read() as state:
            if name not in state.quotas:
                raise ApiError(404, f"no quota named {name!r}", "name")
            view = quota_view(state, name, {})
            return _json({"name": name, "offset": state.offset, **view})

    async def get_tree(self, request: web.Request) -> web.Response:
        return _json(await self.read_settled(tree_document))

    async def get_decisions(self, request: web.Request) -> web.Response:
        since = _int_param(request, "since", 0)
        limit = _int_param(request, "limit", DECISIONS_PAGE)
        if limit < 1 or limit > DECISIONS_PAGE_MAX:
            raise ApiError(400, f"limit must be between 1 and {DECISIONS_PAGE_MAX}", "limit")
        found: list[dict[str, Any]] = []
        scanned = 0
        next_offset = since
        async for batch in self.ledger.inner.read(since):
            for record in batch:
                next_offset = record.offset + 1
                scanned += 1
                kind = peek_kind(record.payload)
                if kind in DECISION_KINDS and kind != "LedgerOpened":
                    found.append(record_document(record))
                if len(found) >= limit or scanned >= DECISIONS_SCAN_MAX:
                    break
            else:
                continue
            break
        return _json({"decisions": found, "next": next_offset})

    async def get_explain(self, request: web.Request) -> web.Response:
        uid = request.match_info["uid"]
        report = await self.ledger_audit()
        mine = report.for_pod(uid)
        pod = self.state.pods.get(uid)
        if pod is None and not mine.findings:
            raise ApiError(404, f"no pod with uid {uid!r} in the ledger", "uid")
        return _json(
            {
                "pod": uid,
                "quota": self.state.pod_quota.get(uid),
                "phase": None if pod is None else pod.phase,
                **report_json(mine),
                "text": report_text(mine),
            }
        )

    async def ledger_audit(self) -> AuditReport:
        """The audit of the whole ledger (``engine/audit.py``, in a thread), kept
        until the ledger grows; concurrent callers share one run."""
        async with self._audit_lock:
            tail = await self.ledger.last_offset()
            if self._audit_cache is not None and self._audit_cache[0] == tail:
                return self._audit_cache[1]
            inner = self.ledger.inner
            iter_batches = getattr(inner, "iter_batches", None)
            if iter_batches is not None:

                def source(start: int) -> Iterable[Record]:
                    return itertools.chain.from_iterable(iter_batches(start))

                report: AuditReport = await asyncio.to_thread(audit, source)
            else:
                records = [r async for batch in inner.read(0) for r in batch]
                report = await asyncio.to_thread(audit, lambda start: records[start:])
            if report.records == tail + 1:
                self._audit_cache = (tail, report)
            return report

    async def post_admission(self, request: web.Request) -> web.Response:
        document = await _json_body(request)
        name = document.get("quota")
        if not isinstance(name, str):
            raise ApiError(400, "quota must be a string", "quota")
        raw = document.get("requests")
        if not isinstance(raw, dict):
            raise ApiError(400, "requests must be an object of resource amounts", "requests")
        requests = _resource_list("requests", raw)
        async with self.instant_read() as state:
            node = state.quotas.get(name)
            if node is None:
                raise ApiError(404, f"no quota named {name!r}", "quota")
            if node.config.is_parent:
                raise ApiError(400, f"{name} is a parent quota: pods run in leaf quotas", "quota")
            available = reported_available(state, name, {})
            limits = node.config.max
            per_resource: dict[str, Any] = {}
            for resource in sorted(requests):
                amount = requests[resource]
                room = available.get(resource, 0)
                cap = None if limits is None else limits.get(resource)
                under_max = cap is None or node.used.get(resource, 0) + amount <= cap
                per_resource[resource] = {
                    "request": amount,
                    "available": room,
                    "max": cap,
                    "fits": amount <= room and under_max,
                }
            fits = all(item["fits"] for item in per_resource.values())
            return _json(
                {"quota": name, "offset": state.offset, "fits": fits, "per_resource": per_resource}
            )

    async def post_whatif(self, request: web.Request) -> web.Response:
        try:
            horizon = parse_duration(request.query.get("horizon", "1h"))
        except ValueError as exc:
            raise ApiError(400, str(exc), "horizon") from None
        if horizon < 0:
            raise ApiError(400, "horizon must not be negative", "horizon")
        body = await _read_limited(request, MAX_QUERY_BYTES)
        changes: list[tuple[int, bytes]] = []
        problems: list[dict[str, Any]] = []
        for number, line in _lines(body):
            try:
                event = decode_event(line)
            except EventError as exc:
                problems.append({"line": number, "kind": exc.kind, "reason": exc.reason})
                continue
            at = getattr(event, "at", None)
            changes.append((0 if at is None else epoch_ms(at), line))
        if problems:
            raise ApiError(400, f"{len(problems)} bad change line(s)", "body", lines=problems)
        async with self.ledger.gate:
            settle(self.state)
            blob = dump(self.state)

        def run() -> bytes:
            return _ENCODER.encode(whatif(load(blob), changes, horizon_ms=horizon))

        try:
            return web.Response(body=await asyncio.to_thread(run), content_type=_JSON)
        except ChangeError as exc:
            raise ApiError(400, str(exc), "body") from None

    async def get_stream(self, request: web.Request) -> web.StreamResponse:
        """Server-sent events: one ``record`` event per folded record, ``id`` its offset.

        ``?kinds=decisions`` sends only decision records (DESIGN §4). A client that
        reconnects with ``Last-Event-ID`` (browsers do) or asks ``?since=OFFSET``
        first gets the folded records after that point from the ledger, then the
        live ones, without a gap or a repeat (at most ``STREAM_RESUME_MAX`` back)."""
        decisions_only = request.query.get("kinds") == "decisions"
        start: int | None = None
        last_id = request.headers.get("Last-Event-ID", "").strip()
        if last_id.isdigit():
            start = int(last_id) + 1
        elif "since" in request.query:
            start = _int_param(request, "since", 0)
        subscription = self.feed.subscribe()  # before the backlog: nothing falls between
        upto = self.state.offset
        if start is not None and upto - start >= STREAM_RESUME_MAX:
            self.feed.unsubscribe(subscription)
            raise ApiError(
                400,
                f"more than {STREAM_RESUME_MAX} records to resume: page /v1/decisions instead",
                "since",
            )
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no",
            }
        )

        def events(batch: Sequence[Record], after: int) -> bytes:
            chunks = []
            for record in batch:
                if record.offset <= after:
                    continue
                kind = peek_kind(record.payload)
                if decisions_only and kind not in DECISION_KINDS:
                    continue
                chunks.append(sse_event(record, kind))
            return b"".join(chunks)

        try:
            await response.prepare(request)
            await response.write(f"retry: 2000\n: offset {upto}\n\n".encode())
            sent = upto
            if start is not None and start <= upto:
                async for batch in self.ledger.inner.read(start):
                    chunk = events([r for r in batch if r.offset <= upto], start - 1)
                    if chunk:
                        await response.write(chunk)
                    if batch[-1].offset >= upto:
                        break
            while True:
                try:
                    async with asyncio.timeout(STREAM_HEARTBEAT_S):
                        live = await subscription.get()
                except TimeoutError:
                    await response.write(b": keep-alive\n\n")
                    continue
                if live is None:
                    break
                chunk = events(live, sent)
                sent = max(sent, live[-1].offset) if live else sent
                if chunk:
                    await response.write(chunk)
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            self.feed.unsubscribe(subscription)
        return response

    async def healthz(self, request: web.Request) -> web.Response:
        return _json({"status": "ok"})

    async def readyz(self, request: web.Request) -> web.Response:
        """200 once caught up with the ledger tail and the leader state is known."""
        tail = await self.ledger.last_offset()
        self.position.tail = tail
        offset = self.state.offset
        ready = self.leader_known and offset >= tail
        document = {
            "ready": ready,
            "offset": offset,
            "tail": tail,
            "leader_known": self.leader_known,
            "leader_epoch": self.state.leader_epoch,
            "leader": self.leader_known and not self.options.read_only and self.engine.is_leader(),
        }
        return _json(document, 200 if ready else 503)

    async def get_metrics(self, request: web.Request) -> web.Response:
        self.position.tail = await self.ledger.last_offset()
        text = await self.read_settled(lambda state: self.collector.render())
        return web.Response(body=text, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def index(self, request: web.Request) -> web.Response:
        return _page_response("index.html")

    async def page_file(self, request: web.Request) -> web.Response:
        return _page_response(request.match_info["file"])


# --------------------------------------------------------------------- helpers

_PAGE_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css"}


def _page_response(name: str) -> web.Response:
    suffix = os.path.splitext(name)[1]
    if "/" in name or name.startswith(".") or suffix not in _PAGE_TYPES:
        raise ApiError(404, f"no page file {name!r}", "file")
    item = resources.files("quotaledger.adapters").joinpath("page", name)
    if not item.is_file():
        raise ApiError(404, f"no page file {name!r}", "file")
    return web.Response(body=item.read_bytes(), content_type=_PAGE_TYPES[suffix], charset="utf-8")


@web.middleware
async def _errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as exc:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        return web.Response(
            body=error_body(exc.status, exc.message, exc.field, **exc.extra),
            status=exc.status,
            content_type=_JSON,
            headers=headers,
        )
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return web.Response(
            body=error_body(exc.status, exc.reason, None),
            status=exc.status,
            content_type=_JSON,
        )
    except LedgerError as exc:
        log.error("%s %s: %s", request.method, request.path, exc)
        return web.Response(
            body=error_body(503, f"ledger unavailable: {exc}", None),
            status=503,
            content_type=_JSON,
        )
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception:
        log.exception("%s %s failed", request.method, request.path)
        return web.Response(
            body=error_body(500, "internal error (logged by the server)", None),
            status=500,
            content_type=_JSON,
        )


async def _read_limited(request: web.Request, limit: int) -> bytes:
    """The body, refused with 413 beyond ``limit`` bytes (before reading it all)."""
    length = request.content_length
    if length is not None and length > limit:
        raise ApiError(413, f"body of {length} bytes exceeds the limit of {limit}", "body")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.content.iter_chunked(1 << 16):
        size += len(chunk)
        if size > limit:
            raise ApiError(413, f"body exceeds the limit of {limit} bytes", "body")
        chunks.append(chunk)
    return b"".join(chunks)


def _lines(body: bytes) -> Iterable[tuple[int, bytes]]:
    for number, raw in enumerate(body.split(b"\n"), start=1):
        line = raw.strip()
        if line:
            yield number, line


def _parse_facts(
    body: bytes,
) -> tuple[list[Append], list[dict[str, Any]], list[dict[str, Any]]]:
    """NDJSON → appends; every malformed line and every decision line, by number.

    A line's ``at`` becomes its record's ts (the ledger clamps it up to the
    previous record's); a line without one is stamped with the append time."""
    appends: list[Append] = []
    problems: list[dict[str, Any]] = []
    decisions: list[dict[str, Any]] = []
    for number, line in _lines(body):
        try:
            event = decode_event(line)
        except EventError as exc:
            problems.append({"line": number, "kind": exc.kind, "reason": exc.reason})
            continue
        if not is_fact(event):
            kind = kind_of(event)
            decisions.append({"line": number, "kind": kind, "reason": f"{kind} is a decision kind"})
            continue
        at = getattr(event, "at", None)
        appends.append(Append(payload=line, ts=None if at is None else epoch_ms(at)))
    return appends, problems, decisions


async def _json_body(request: web.Request) -> dict[str, Any]:
    body = await _read_limited(request, MAX_QUERY_BYTES)
    try:
        document = msgspec.json.decode(body)
    except msgspec.DecodeError as exc:
        raise ApiError(400, f"malformed JSON: {exc}", "body") from None
    if not isinstance(document, dict):
        raise ApiError(400, "the body must be a JSON object", "body")
    return document


def _resource_list(name: str, raw: dict[str, Any]) -> dict[str, int]:
    from quotaledger.events.quantity import canonical_list

    for resource, value in raw.items():
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise ApiError(400, f"{name}.{resource} must be a quantity", f"{name}.{resource}")
    try:
        return canonical_list(name, raw)
    except ValueError as exc:
        text = str(exc)
        field_name = text.rsplit("`$.", 1)[-1].rstrip("`") if "`$." in text else name
        raise ApiError(400, text, field_name) from None


def _int_param(request: web.Request, name: str, default: int) -> int:
    text = request.query.get(name)
    if text is None:
        return default
    if not text.isdigit():
        raise ApiError(400, f"{name} must be a non-negative integer, not {text!r}", name)
    return int(text)


def record_document(record: Record) -> dict[str, Any]:
    """A record as JSON: its event's fields plus ``offset`` and ``at`` (as ``simulate``)."""
    document = msgspec.json.decode(record.payload)
    if not isinstance(document, dict):
        document = {"raw": document}
    document["offset"] = record.offset
    document["at"] = rfc3339(record.ts)
    return document


def tree_document(state: ProjectedState) -> dict[str, Any]:
    """The quota tree for drawing: per quota min, max, runtime, used, request
    (canonical integers), children nested under root (orphans listed apart)."""

    def node_doc(name: str) -> dict[str, Any]:
        node = state.quotas[name]
        config = node.config
        return {
            "name": name,
            "is_parent": config.is_parent,
            "min": dict(sorted(config.min.items())),
            "max": None if config.max is None else dict(sorted(config.max.items())),
            "effective_min": dict(sorted(node.effective_min.items())),
            "request": dict(sorted(node.request.items())),
            "used": dict(sorted(node.used.items())),
            "runtime": dict(sorted(node.runtime.items())),
            "pods": len(node.pods),
            "running": state.occupied.get(name),
            "children": [node_doc(child) for child in sorted(state.children(name))],
        }

    roots = sorted(state.children("root"))
    orphans = sorted(
        name for name, node in state.quotas.items() if not node.connected and node.parent != "root"
    )
    top_orphans = [name for name in orphans if state.quotas[name].parent not in state.quotas]
    return {
        "offset": state.offset,
        "time": rfc3339(state.ts),
        "cluster": {
            "allocatable": dict(sorted(state.allocatable.items())),
            "total": dict(sorted(state.cluster_total.items())),
        },
        "root": {"name": "root", "children": [node_doc(name) for name in roots]},
        "orphans": [node_doc(name) for name in top_orphans],
    }


# ---------------------------------------------------------------- running it


async def open_ledger_url(
    text: str, *, snapshots: str | None = None, read_only: bool = False
) -> Ledger:
    """The ledger named by a LEDGER argument (DESIGN §10 URLs), created when empty.

    ``read_only`` (``serve --read-only``) opens an existing ledger without writing
    to it, as ``replay`` and ``audit`` do, so a ledger on a read-only medium or
    another user's file can be served (DESIGN §9); it never creates one.

    The one hook for the Kafka backend: when ``quotaledger.adapters.ledger_url``
    (its ``open_ledger(url, create=..., snapshots=...)``) is installed, every URL
    goes through it; without it, paths and ``sqlite:///PATH`` open a SQLite ledger
    and ``kafka://`` is refused with a clear error."""
    try:
        urls: Any = importlib.import_module("quotaledger.adapters.ledger_url")
    except ModuleNotFoundError:
        urls = None
    if urls is not None:
        ledger: Ledger = await urls.open_ledger(
            text, create=not read_only, snapshots=snapshots, read_only=read_only
        )
        return ledger
    from .sqlite_ledger import SqliteLedger

    if text.startswith("kafka://"):
        raise LedgerError(f"{text}: the Kafka ledger is not available in this build")
    if snapshots is not None:
        raise LedgerError("--snapshots is for Kafka ledgers; a SQLite ledger keeps its own")
    path = text.removeprefix("sqlite://") if text.startswith("sqlite:///") else text
    return await SqliteLedger.open(path, create=not read_only, read_only=read_only)


async def serve(
    ledger_url: str,
    options: ServeOptions,
    *,
    stop: asyncio.Event | None = None,
    announce: Callable[[Server], None] | None = None,
    signals: bool = True,
    snapshots: str | None = None,
) -> None:
    """Open the ledger and run a :class:`Server` until SIGTERM/SIGINT or ``stop``."""
    import signal

    ledger = await open_ledger_url(ledger_url, snapshots=snapshots, read_only=options.read_only)
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
