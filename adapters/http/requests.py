"""Reading what a client sends ``serve`` (DESIGN §11, §9 bad input): bodies under a
size limit, NDJSON facts (all lines or none), JSON objects, query parameters.

Every problem is an :class:`~.documents.ApiError` naming the field (or the line)
that is wrong; nothing here touches the ledger or the state.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec
from aiohttp import web

from quotaledger.events.codec import EventError, decode_event
from quotaledger.events.ledger import Append
from quotaledger.events.model import is_fact, kind_of
from quotaledger.events.quantity import canonical_list

from ..jsonl import epoch_ms
from .documents import ApiError

#: Largest ``POST /v1/events`` body (DESIGN §11).
MAX_EVENTS_BYTES = 16 * 1024 * 1024
#: Largest JSON/NDJSON body of the other POST endpoints.
MAX_QUERY_BYTES = 1024 * 1024


async def read_limited(request: web.Request, limit: int) -> bytes:
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


def ndjson_lines(body: bytes) -> Iterable[tuple[int, bytes]]:
    for number, raw in enumerate(body.split(b"\n"), start=1):
        line = raw.strip()
        if line:
            yield number, line


def parse_facts(
    body: bytes,
) -> tuple[list[Append], list[dict[str, Any]], list[dict[str, Any]]]:
    """NDJSON → appends; every malformed line and every decision line, by number.

    A line's ``at`` becomes its record's ts (the ledger clamps it up to the
    previous record's); a line without one is stamped with the append time."""
    appends: list[Append] = []
    problems: list[dict[str, Any]] = []
    decisions: list[dict[str, Any]] = []
    for number, line in ndjson_lines(body):
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


async def json_body(request: web.Request) -> dict[str, Any]:
    body = await read_limited(request, MAX_QUERY_BYTES)
    try:
        document = msgspec.json.decode(body)
    except msgspec.DecodeError as exc:
        raise ApiError(400, f"malformed JSON: {exc}", "body") from None
    if not isinstance(document, dict):
        raise ApiError(400, "the body must be a JSON object", "body")
    return document


def resource_list(name: str, raw: dict[str, Any]) -> dict[str, int]:
    for resource, value in raw.items():
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise ApiError(400, f"{name}.{resource} must be a quantity", f"{name}.{resource}")
    try:
        return canonical_list(name, raw)
    except ValueError as exc:
        text = str(exc)
        field_name = text.rsplit("`$.", 1)[-1].rstrip("`") if "`$." in text else name
        raise ApiError(400, text, field_name) from None


def int_param(request: web.Request, name: str, default: int) -> int:
    text = request.query.get(name)
    if text is None:
        return default
    if not text.isdigit():
        raise ApiError(400, f"{name} must be a non-negative integer, not {text!r}", name)
    return int(text)
