"""The live feed of ``GET /v1/stream`` (DESIGN §11): every folded record, fanned
out to the connected clients, its server-sent-event encoding, and the stream one
client gets (:func:`send_stream`).

A client whose queue holds more than ``STREAM_BACKLOG`` records (it reads slower
than the ledger grows) is cut off: its queue gets the end mark and it is dropped;
it may reconnect with ``Last-Event-ID`` to resume (:func:`resume_from`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

import msgspec
from aiohttp import web

from quotaledger.events.codec import peek_kind
from quotaledger.events.ledger import Ledger, Record
from quotaledger.events.model import DECISION_KINDS
from quotaledger.events.times import rfc3339

from .requests import int_param

#: Records a slow ``/v1/stream`` client may fall behind before it is cut off.
STREAM_BACKLOG = 10_000
#: Most records a ``/v1/stream`` client may ask to resume from the ledger.
STREAM_RESUME_MAX = 100_000
#: Seconds between keep-alive comments on an idle stream.
STREAM_HEARTBEAT_S = 15.0
#: The response headers of a stream (no caching, no proxy buffering).
STREAM_HEADERS = {
    "Content-Type": "text/event-stream",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}

_ENCODER = msgspec.json.Encoder()


@dataclass(slots=True, eq=False)
class Subscription:
    """One client's queue of folded batches; ``None`` ends it."""

    queue: asyncio.Queue[list[Record] | None] = field(default_factory=asyncio.Queue)
    pending: int = 0  # records queued and not taken yet

    async def get(self) -> list[Record] | None:
        batch = await self.queue.get()
        if batch is not None:
            self.pending -= len(batch)
        return batch


@dataclass(slots=True)
class Feed:
    """Every folded record, fanned out to ``GET /v1/stream`` subscribers."""

    subscribers: set[Subscription] = field(default_factory=set)
    closed: bool = False

    def subscribe(self) -> Subscription:
        subscription = Subscription()
        if self.closed:
            subscription.queue.put_nowait(None)
        self.subscribers.add(subscription)
        return subscription

    def unsubscribe(self, subscription: Subscription) -> None:
        self.subscribers.discard(subscription)

    def publish(self, batch: Sequence[Record]) -> None:
        for subscription in list(self.subscribers):
            if subscription.pending + len(batch) > STREAM_BACKLOG:
                self.subscribers.discard(subscription)
                subscription.queue.put_nowait(None)
            else:
                subscription.pending += len(batch)
                subscription.queue.put_nowait(list(batch))

    def close(self) -> None:
        self.closed = True
        for subscription in self.subscribers:
            subscription.queue.put_nowait(None)


def sse_event(record: Record, kind: str | None) -> bytes:
    """One server-sent event: ``id`` is the offset, ``data`` one line of JSON."""
    payload = record.payload.replace(b"\r", b" ").replace(b"\n", b" ")
    head = f'{{"offset":{record.offset},"at":"{rfc3339(record.ts)}","kind":'
    kind_json = _ENCODER.encode(kind)
    return (
        f"id: {record.offset}\nevent: record\ndata: ".encode()
        + head.encode()
        + kind_json
        + b',"event":'
        + payload
        + b"}\n\n"
    )


def resume_from(request: web.Request) -> int | None:
    """The first offset a reconnecting client asks for: after its ``Last-Event-ID``
    (browsers send it), else ``?since=OFFSET``; None for live records only."""
    last_id = request.headers.get("Last-Event-ID", "").strip()
    if last_id.isdigit():
        return int(last_id) + 1
    if "since" in request.query:
        return int_param(request, "since", 0)
    return None


def sse_events(batch: Sequence[Record], after: int, decisions_only: bool) -> bytes:
    """The events of ``batch``'s records past offset ``after`` (decisions only if asked)."""
    chunks = []
    for record in batch:
        if record.offset <= after:
            continue
        kind = peek_kind(record.payload)
        if decisions_only and kind not in DECISION_KINDS:
            continue
        chunks.append(sse_event(record, kind))
    return b"".join(chunks)


async def send_stream(
    response: web.StreamResponse,
    subscription: Subscription,
    ledger: Ledger,
    start: int | None,
    upto: int,
    decisions_only: bool,
) -> None:
    """One client's stream: the records ``start..upto`` read back from ``ledger``,
    then the live ones of ``subscription`` (subscribed before ``upto`` was read, so
    nothing falls between and nothing is sent twice), until the feed ends it."""
    await response.write(f"retry: 2000\n: offset {upto}\n\n".encode())
    sent = upto
    if start is not None and start <= upto:
        async for batch in ledger.read(start):
            chunk = sse_events([r for r in batch if r.offset <= upto], start - 1, decisions_only)
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
        chunk = sse_events(live, sent, decisions_only)
        sent = max(sent, live[-1].offset) if live else sent
        if chunk:
            await response.write(chunk)
