"""The live feed behind ``GET /v1/stream``: fan-out, end mark, slow clients cut off."""

from __future__ import annotations

import json

from quotaledger.adapters.http.stream import STREAM_BACKLOG, Feed, sse_event
from quotaledger.events.ledger import Record


def records(start: int, count: int) -> list[Record]:
    return [
        Record(offset=n, ts=1000 * n, payload=b'{"kind": "NodeRemoved",\n "name": "n"}')
        for n in range(start, start + count)
    ]


async def test_every_subscriber_gets_every_batch_then_the_end() -> None:
    feed = Feed()
    first, second = feed.subscribe(), feed.subscribe()
    feed.publish(records(0, 3))
    feed.publish(records(3, 2))
    feed.close()
    for subscription in (first, second):
        got = []
        while (batch := await subscription.get()) is not None:
            got.extend(record.offset for record in batch)
        assert got == [0, 1, 2, 3, 4]
        assert subscription.pending == 0
    late = feed.subscribe()
    assert await late.get() is None


async def test_a_client_too_far_behind_is_cut_off() -> None:
    feed = Feed()
    slow, fast = feed.subscribe(), feed.subscribe()
    offset = 0
    for _ in range(2 * STREAM_BACKLOG // 100):
        if slow not in feed.subscribers:
            break
        feed.publish(records(offset, 100))
        offset += 100
        while fast.pending:  # the fast client keeps up
            await fast.get()
    assert slow not in feed.subscribers
    assert fast in feed.subscribers
    assert offset > STREAM_BACKLOG
    taken = 0
    while (batch := await slow.get()) is not None:
        taken += len(batch)
    assert taken <= STREAM_BACKLOG


def test_sse_event_is_one_data_line_of_json() -> None:
    (record,) = records(7, 1)
    text = sse_event(record, "NodeRemoved").decode()
    lines = text.split("\n")
    assert lines[0] == "id: 7" and lines[1] == "event: record"
    assert lines[2].startswith("data: ") and lines[3:] == ["", ""]
    data = json.loads(lines[2][6:])
    assert data == {
        "offset": 7,
        "at": "1970-01-01T00:00:07Z",
        "kind": "NodeRemoved",
        "event": {"kind": "NodeRemoved", "name": "n"},
    }
