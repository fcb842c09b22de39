"""What ``serve`` answers (DESIGN §11): the JSON documents built from records and
the state, and the error body ``{"error": {"status", "message", "field"}}`` that
every failed request gets (:func:`errors`, the app's middleware).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from aiohttp import web

from quotaledger.events.ledger import LedgerError, Record
from quotaledger.events.times import rfc3339
from quotaledger.projections import ProjectedState

log = logging.getLogger("quotaledger.serve")

JSON = "application/json"
ENCODER = msgspec.json.Encoder()


class ApiError(Exception):
    """An error answered as ``{"error": {"status", "message", "field"}}``."""

    def __init__(self, status: int, message: str, field: str | None = None, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.field = field
        self.extra = extra


def error_body(status: int, message: str, field: str | None, **extra: Any) -> bytes:
    return ENCODER.encode(
        {"error": {"status": status, "message": message, "field": field, **extra}}
    )


def json_response(document: Any, status: int = 200) -> web.Response:
    return web.Response(body=ENCODER.encode(document), status=status, content_type=JSON)


@web.middleware
async def errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Every error as its JSON body: :class:`ApiError` as raised, aiohttp's own
    4xx/5xx, an unreadable ledger as 503, anything else as a logged 500."""
    try:
        return await handler(request)
    except ApiError as exc:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        return web.Response(
            body=error_body(exc.status, exc.message, exc.field, **exc.extra),
            status=exc.status,
            content_type=JSON,
            headers=headers,
        )
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return web.Response(
            body=error_body(exc.status, exc.reason, None),
            status=exc.status,
            content_type=JSON,
        )
    except LedgerError as exc:
        log.error("%s %s: %s", request.method, request.path, exc)
        return web.Response(
            body=error_body(503, f"ledger unavailable: {exc}", None),
            status=503,
            content_type=JSON,
        )
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception:
        log.exception("%s %s failed", request.method, request.path)
        return web.Response(
            body=error_body(500, "internal error (logged by the server)", None),
            status=500,
            content_type=JSON,
        )


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
