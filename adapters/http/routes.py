"""The HTTP API's handlers (DESIGN §11): one method per route of :meth:`Routes.table`.

A handler reads the state the way :mod:`.server` offers: ``instant_read`` for a
read done on the loop without awaiting (a quota, an admission), ``read_settled``
for heavy work in a worker thread (the tree, the metrics); the state JSON, a
past state (``?at=``) and the ledger's audit are computed here, cached per
offset and shared by concurrent readers. Request bodies are read by
:mod:`.requests`, answers built by :mod:`.documents`, the stream by :mod:`.stream`.
"""

from __future__ import annotations

import asyncio
import hmac
import os
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from importlib import resources
from typing import Any, Protocol

from aiohttp import web
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from quotaledger.engine.audit import AuditReport, audit, report_json, report_text
from quotaledger.engine.fold_loop import Until, fold, parse_until
from quotaledger.engine.live import LiveEngine
from quotaledger.engine.whatif import ChangeError, parse_duration, whatif
from quotaledger.events.codec import peek_kind
from quotaledger.events.model import DECISION_KINDS
from quotaledger.events.times import rfc3339
from quotaledger.projections import ProjectedState, Projection, settle, state_json
from quotaledger.projections.available import reported_available
from quotaledger.projections.snapshot import dump, load
from quotaledger.projections.view import quota_view

from ..ledgers.sources import ledger_record_source
from .documents import ENCODER, JSON, ApiError, json_response, record_document, tree_document
from .gate import GatedLedger
from .metrics import LedgerPosition, StateCollector
from .options import ServeOptions
from .requests import (
    MAX_EVENTS_BYTES,
    MAX_QUERY_BYTES,
    int_param,
    json_body,
    parse_changes,
    parse_facts,
    read_limited,
    resource_list,
)
from .stream import STREAM_HEADERS, STREAM_RESUME_MAX, Feed, resume_from, send_stream

#: ``/v1/decisions``: default and largest page, and records scanned per request.
DECISIONS_PAGE = 100
DECISIONS_PAGE_MAX = 1000
DECISIONS_SCAN_MAX = 100_000

_PAGE_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css"}


class Host(Protocol):
    """What the handlers use of the running server (:class:`.server.Server`)."""

    @property
    def options(self) -> ServeOptions: ...
    @property
    def ledger(self) -> GatedLedger: ...
    @property
    def engine(self) -> LiveEngine: ...
    @property
    def feed(self) -> Feed: ...
    @property
    def position(self) -> LedgerPosition: ...
    @property
    def collector(self) -> StateCollector: ...
    @property
    def state(self) -> ProjectedState: ...
    @property
    def leader_known(self) -> bool: ...

    async def read_settled(self, work: Callable[[ProjectedState], Any]) -> Any: ...

    def instant_read(self) -> AbstractAsyncContextManager[ProjectedState]: ...


class Routes:
    """The handlers over one server (see module docstring)."""

    def __init__(self, host: Host) -> None:
        self.host = host
        self._state_cache: tuple[int, bytes] | None = None
        self._state_inflight: asyncio.Future[tuple[int, bytes]] | None = None
        self._audit_lock = asyncio.Lock()
        self._audit_cache: tuple[int, AuditReport] | None = None

    def table(self) -> list[web.RouteDef]:
        return [
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

    # ------------------------------------------------------------ reads

    async def fold_until(self, until: Until) -> ProjectedState:
        """A private state of the ledger at ``until`` (snapshot + tail, in a thread)."""
        inner = self.host.ledger.inner
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

    async def current_state_json(self) -> bytes:
        """The state JSON now: cached per offset, and computed by one reader at a
        time (concurrent readers share the computation in flight)."""
        cache = self._state_cache
        if cache is not None and cache[0] == self.host.state.offset:
            return cache[1]
        if self._state_inflight is None:
            self._state_inflight = asyncio.ensure_future(
                self.host.read_settled(
                    lambda state: (state.offset, ENCODER.encode(state_json(state)))
                )
            )
        inflight = self._state_inflight
        try:
            offset, body = await asyncio.shield(inflight)
        finally:
            if self._state_inflight is inflight and inflight.done():
                self._state_inflight = None
        self._state_cache = (offset, body)
        return body

    async def ledger_audit(self) -> AuditReport:
        """The audit of the whole ledger (``engine/audit/``, in a thread), kept
        until the ledger grows; concurrent callers share one run."""
        async with self._audit_lock:
            tail = await self.host.ledger.last_offset()
            if self._audit_cache is not None and self._audit_cache[0] == tail:
                return self._audit_cache[1]
            source = await ledger_record_source(self.host.ledger.inner)
            report: AuditReport = await asyncio.to_thread(audit, source)
            if report.records == tail + 1:
                self._audit_cache = (tail, report)
            return report

    async def _before_opening(self, text: str) -> str:
        """``?at=`` before the ledger's first record: there is no state then (an
        error, not a silently empty state at offset -1; DECISIONS 266)."""
        async for batch in self.host.ledger.inner.read(0):
            if batch:
                opened = rfc3339(batch[0].ts)
                return f"at {text}: before the ledger opened (offset 0 at {opened}): no state then"
        return f"at {text}: the ledger holds no record"

    # ------------------------------------------------------------ handlers

    async def post_events(self, request: web.Request) -> web.Response:
        """Append NDJSON facts: all lines or none (DESIGN §11)."""
        self._authorize(request)
        body = await read_limited(request, MAX_EVENTS_BYTES)
        appends, problems, decisions = parse_facts(body)
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
        offsets = await self.host.ledger.append(appends)
        return json_response(
            {"appended": len(offsets), "first_offset": offsets[0], "last_offset": offsets[-1]}
        )

    def _authorize(self, request: web.Request) -> None:
        options = self.host.options
        token = options.token
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
        if options.read_only:
            raise ApiError(403, "this server is read-only (--read-only)", None)

    async def get_state(self, request: web.Request) -> web.Response:
        text = request.query.get("at")
        if text is not None:
            try:
                until = parse_until(text)
            except ValueError as exc:
                raise ApiError(400, str(exc).replace("--until", "at"), "at") from None
            if until.offset is not None and until.offset > await self.host.ledger.last_offset():
                raise ApiError(404, f"offset {until.offset} is past the end of the ledger", "at")
            state = await self.fold_until(until)
            if state.offset < 0:
                raise ApiError(404, await self._before_opening(text), "at")
            body = await asyncio.to_thread(lambda: ENCODER.encode(state_json(state)))
            return web.Response(body=body, content_type=JSON)
        return web.Response(body=await self.current_state_json(), content_type=JSON)

    async def get_quota(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        async with self.host.instant_read() as state:
            if name not in state.quotas:
                raise ApiError(404, f"no quota named {name!r}", "name")
            view = quota_view(state, name, {})
            return json_response({"name": name, "offset": state.offset, **view})

    async def get_tree(self, request: web.Request) -> web.Response:
        return json_response(await self.host.read_settled(tree_document))

    async def get_decisions(self, request: web.Request) -> web.Response:
        since = int_param(request, "since", 0)
        limit = int_param(request, "limit", DECISIONS_PAGE)
        if limit < 1 or limit > DECISIONS_PAGE_MAX:
            raise ApiError(400, f"limit must be between 1 and {DECISIONS_PAGE_MAX}", "limit")
        found: list[dict[str, Any]] = []
        scanned = 0
        next_offset = since
        async for batch in self.host.ledger.inner.read(since):
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
        return json_response({"decisions": found, "next": next_offset})

    async def get_explain(self, request: web.Request) -> web.Response:
        uid = request.match_info["uid"]
        report = await self.ledger_audit()
        mine = report.for_pod(uid)
        state = self.host.state
        pod = state.pods.get(uid)
        if pod is None and not mine.findings:
            raise ApiError(404, f"no pod with uid {uid!r} in the ledger", "uid")
        return json_response(
            {
                "pod": uid,
                "quota": state.pod_quota.get(uid),
                "phase": None if pod is None else pod.phase,
                **report_json(mine),
                "text": report_text(mine),
            }
        )

    async def post_admission(self, request: web.Request) -> web.Response:
        document = await json_body(request)
        name = document.get("quota")
        if not isinstance(name, str):
            raise ApiError(400, "quota must be a string", "quota")
        raw = document.get("requests")
        if not isinstance(raw, dict):
            raise ApiError(400, "requests must be an object of resource amounts", "requests")
        requests = resource_list("requests", raw)
        async with self.host.instant_read() as state:
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
            return json_response(
                {"quota": name, "offset": state.offset, "fits": fits, "per_resource": per_resource}
            )

    async def post_whatif(self, request: web.Request) -> web.Response:
        try:
            horizon = parse_duration(request.query.get("horizon", "1h"))
        except ValueError as exc:
            raise ApiError(400, str(exc), "horizon") from None
        if horizon < 0:
            raise ApiError(400, "horizon must not be negative", "horizon")
        body = await read_limited(request, MAX_QUERY_BYTES)
        changes, problems = parse_changes(body)
        if problems:
            raise ApiError(400, f"{len(problems)} bad change line(s)", "body", lines=problems)
        async with self.host.ledger.gate:
            settle(self.host.state)
            blob = dump(self.host.state)

        def run() -> bytes:
            return ENCODER.encode(whatif(load(blob), changes, horizon_ms=horizon))

        try:
            return web.Response(body=await asyncio.to_thread(run), content_type=JSON)
        except ChangeError as exc:
            raise ApiError(400, str(exc), "body") from None

    async def get_stream(self, request: web.Request) -> web.StreamResponse:
        """Server-sent events: one ``record`` event per folded record, ``id`` its offset.

        ``?kinds=decisions`` sends only decision records (DESIGN §4). A client that
        reconnects with ``Last-Event-ID`` (browsers do) or asks ``?since=OFFSET``
        first gets the folded records after that point from the ledger, then the
        live ones, without a gap or a repeat (at most ``STREAM_RESUME_MAX`` back)."""
        decisions_only = request.query.get("kinds") == "decisions"
        start = resume_from(request)
        feed = self.host.feed
        subscription = feed.subscribe()  # before the backlog: nothing falls between
        upto = self.host.state.offset
        if start is not None and upto - start >= STREAM_RESUME_MAX:
            feed.unsubscribe(subscription)
            raise ApiError(
                400,
                f"more than {STREAM_RESUME_MAX} records to resume: page /v1/decisions instead",
                "since",
            )
        response = web.StreamResponse(headers=STREAM_HEADERS)
        try:
            await response.prepare(request)
            await send_stream(
                response, subscription, self.host.ledger.inner, start, upto, decisions_only
            )
        except (ConnectionResetError, asyncio.CancelledError):
            pass
        finally:
            feed.unsubscribe(subscription)
        return response

    async def healthz(self, request: web.Request) -> web.Response:
        return json_response({"status": "ok"})

    async def readyz(self, request: web.Request) -> web.Response:
        """200 once caught up with the ledger tail and the leader state is known."""
        host = self.host
        tail = await host.ledger.last_offset()
        host.position.tail = tail
        offset = host.state.offset
        ready = host.leader_known and offset >= tail
        document = {
            "ready": ready,
            "offset": offset,
            "tail": tail,
            "leader_known": host.leader_known,
            "leader_epoch": host.state.leader_epoch,
            "leader": host.leader_known and not host.options.read_only and host.engine.is_leader(),
        }
        return json_response(document, 200 if ready else 503)

    async def get_metrics(self, request: web.Request) -> web.Response:
        host = self.host
        host.position.tail = await host.ledger.last_offset()
        text = await host.read_settled(lambda state: host.collector.render())
        return web.Response(body=text, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def index(self, request: web.Request) -> web.Response:
        return page_response("index.html")

    async def page_file(self, request: web.Request) -> web.Response:
        return page_response(request.match_info["file"])


def page_response(name: str) -> web.Response:
    """A file of ``page/`` (the page at ``/``, DESIGN §11); nothing else is served."""
    suffix = os.path.splitext(name)[1]
    if "/" in name or name.startswith(".") or suffix not in _PAGE_TYPES:
        raise ApiError(404, f"no page file {name!r}", "file")
    item = resources.files("quotaledger.adapters.http").joinpath("page", name)
    if not item.is_file():
        raise ApiError(404, f"no page file {name!r}", "file")
    return web.Response(body=item.read_bytes(), content_type=_PAGE_TYPES[suffix], charset="utf-8")
