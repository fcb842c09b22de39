"""The live feed of ``GET /v1/stream`` (DESIGN §11): every folded record, fanned
out to the connected clients, and its server-sent-event encoding.

A client whose queue holds more than ``STREAM_BACKLOG`` records (it reads slower
than the ledger grows) is cut off: its queue gets the end mark and it is dropped;
it may reconnect with ``Last-Event-ID`` to resume (:mod:`.server`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

import msgspec

from quotaledger.events.ledger import Record
from quotaledger.projections import rfc3339

#: Records a slow ``/v1/stream`` client may fall behind before it is cut off.
STREAM_BACKLOG = 10_000

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
