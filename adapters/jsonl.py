"""JSONL event files: one event per line, the same JSON as a Kafka message value (DESIGN §3).

Line n becomes offset n (offset 0 is ``LedgerOpened``); a line's ``at`` becomes
its ts, a line without ``at`` takes the previous line's ts (the first: the
epoch), so a file replays the same on every machine. Blank lines are skipped
and take no offset.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import msgspec

from quotaledger.events.codec import EventError, decode_event, encode_event
from quotaledger.events.ledger import Record
from quotaledger.events.model import FactRejected, LedgerOpened

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class JsonlError(ValueError):
    """A line that is not a valid event, in strict mode."""

    def __init__(self, path: str, line: int, reason: str) -> None:
        super().__init__(f"{path}:{line}: {reason}")
        self.line = line
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Line:
    number: int
    ts: int
    payload: bytes


def ts_of(event: object, previous: int) -> int:
    """The ms timestamp of an event's ``at``, or ``previous`` when absent."""
    at = getattr(event, "at", None)
    if at is None:
        return previous
    return epoch_ms(at)


def epoch_ms(moment: datetime) -> int:
    """Exact milliseconds since the epoch (a naive time is UTC).

    Integer arithmetic: ``int(moment.timestamp() * 1000)`` loses a millisecond
    for about one time in 150 (``...47.472Z`` became ``...47.471Z``).
    """
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return (moment - _EPOCH) // timedelta(milliseconds=1)


def ledger_id_for(path: Path) -> str:
    """A deterministic ledger id for a file: its content hash."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return "jsonl-" + digest.hexdigest()[:16]


def read_lines(path: Path, *, skip_invalid: bool, first_offset: int = 1) -> Iterator[Line]:
    """Validated lines with their ts. Strict mode raises :class:`JsonlError` at
    the first bad line; with ``skip_invalid`` a bad line becomes a
    ``FactRejected`` carrying the raw text and the reason, and the offset its
    record will have (``first_offset``: the offset of the first line's record)."""
    ts = 0
    number = 0
    with path.open("rb") as handle:
        for physical, raw in enumerate(handle, start=1):
            text = raw.strip()
            if not text:
                continue
            number += 1
            try:
                event = decode_event(text)
            except EventError as exc:
                if not skip_invalid:
                    raise JsonlError(str(path), physical, exc.reason) from None
                rejected = FactRejected(
                    offset=first_offset + number - 1,
                    reason=f"line {physical}: {exc.reason}",
                    rejected_kind=exc.kind,
                    raw=text.decode("utf-8", "replace"),
                )
                yield Line(physical, ts, encode_event(rejected))
                continue
            new_ts = ts_of(event, ts)
            ts = max(ts, new_ts)
            yield Line(physical, new_ts, text)


def records(path: Path, *, skip_invalid: bool) -> Iterator[Record]:
    """The file as ledger records: ``LedgerOpened`` then one record per line.

    ts is clamped to be non-decreasing, as a ledger does (DESIGN §3).
    """
    opened = LedgerOpened(ledger_id=ledger_id_for(path))
    yield Record(offset=0, ts=0, payload=msgspec.json.encode(opened))
    last = 0
    for offset, line in enumerate(read_lines(path, skip_invalid=skip_invalid), start=1):
        last = max(last, line.ts)
        yield Record(offset=offset, ts=last, payload=line.payload)
