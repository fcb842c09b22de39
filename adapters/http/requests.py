"""Reading what a client sends ``serve`` (DESIGN §11, §9 bad input): bodies under a
size limit, NDJSON facts (all lines or none), JSON objects, query parameters.

Every problem is an :class:`~.documents.ApiError` naming the field (or the line)
that is wrong; nothing here touches the ledger or the state.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import msgspec
from aiohttp import web

from quotaledger.events.codec import EventError, decode_event
from quotaledger.events.ledger import Append
from quotaledger.events.model import Event, is_fact, kind_of
from quotaledger.events.quantity import canonical_list

from ..ledgers.jsonl import epoch_ms
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


class EventLine(NamedTuple):
    """One decoded NDJSON line: its number (from 1), its bytes, its event."""

    number: int
    payload: bytes
    event: Event

    def at_ms(self) -> int | None:
        """The event's own ``at`` (epoch ms), if it has one."""
        at = getattr(self.event, "at", None)
        return None if at is None else epoch_ms(at)


def event_lines(body: bytes) -> tuple[list[EventLine], list[dict[str, Any]]]:
    """Every non-blank NDJSON line of ``body`` decoded (DESIGN §4), by number, and
    a problem naming the line, the kind and the reason for each line that is no
    event (DESIGN §9: all of them, not only the first)."""
    lines: list[EventLine] = []
    problems: list[dict[str, Any]] = []
    for number, raw in enumerate(body.split(b"\n"), start=1):
        payload = raw.strip()
        if not payload:
            continue
        try:
            event = decode_event(payload)
        except EventError as exc:
            problems.append({"line": number, "kind": exc.kind, "reason": exc.reason})
            continue
        lines.append(EventLine(number, payload, event))
    return lines, problems


def parse_facts(
    body: bytes,
) -> tuple[list[Append], list[dict[str, Any]], list[dict[str, Any]]]:
    """NDJSON → appends; every malformed line and every decision line, by number.

    A line's ``at`` becomes its record's ts (the ledger clamps it up to the
    previous record's); a line without one is stamped with the append time."""
    lines, problems = event_lines(body)
    appends: list[Append] = []
    decisions: list[dict[str, Any]] = []
    for line in lines:
        if not is_fact(line.event):
            kind = kind_of(line.event)
            decisions.append(
                {"line": line.number, "kind": kind, "reason": f"{kind} is a decision kind"}
            )
            continue
        appends.append(Append(payload=line.payload, ts=line.at_ms()))
    return appends, problems, decisions


def parse_changes(body: bytes) -> tuple[list[tuple[int, bytes]], list[dict[str, Any]]]:
    """NDJSON → what-if changes ``(at_ms, line)`` (a line without ``at``: 0, i.e.
    now), and every malformed line, by number."""
    lines, problems = event_lines(body)
    return [(line.at_ms() or 0, line.payload) for line in lines], problems


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
