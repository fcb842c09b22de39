"""Folding a stream of records into a projection, with a stop point (DESIGN §7 replay).

``--until`` takes an offset (inclusive) or a time (records with ts ≤ it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from quotaledger.events.ledger import Record
from quotaledger.events.times import epoch_ms


@dataclass(frozen=True, slots=True)
class Until:
    """Where a replay stops: an offset, a ts in ms, or nowhere."""

    offset: int | None = None
    ts: int | None = None

    @property
    def endless(self) -> bool:
        """No stop point: every record is folded."""
        return self.offset is None and self.ts is None

    def reached(self, record: Record) -> bool:
        if self.offset is not None and record.offset > self.offset:
            return True
        return self.ts is not None and record.ts > self.ts


def parse_until(text: str | None, option: str = "--until") -> Until:
    """``123`` is an offset; anything else must be an RFC 3339 time (UTC when it
    has no offset). Errors name ``option`` (``--until``, ``--at``)."""
    if text is None:
        return Until()
    spec = text.strip()
    if spec.isascii() and spec.isdigit():
        return Until(offset=int(spec))
    if spec.startswith("-") and spec[1:].isascii() and spec[1:].isdigit():
        raise ValueError(f"{option} {text}: an offset must not be negative")
    try:
        moment = datetime.fromisoformat(spec)
    except ValueError:
        raise ValueError(f"{option}: {text!r} is neither an offset nor an RFC 3339 time") from None
    # Exact integer milliseconds, as the JSONL reader computes a record's ts
    # (float ``timestamp() * 1000`` is off by one for some times).
    return Until(ts=epoch_ms(moment))


class RecordFold(Protocol):
    """What records are folded into: a :class:`Projection`, or a projection
    with the digest chain (:class:`quotaledger.engine.restore.ChainedFold`)."""

    def apply_record(self, record: Record) -> object: ...


def fold(
    projection: RecordFold,
    batches: Iterable[Iterable[Record]],
    until: Until = Until(),
    progress: Callable[[int], None] | None = None,
) -> int:
    """Apply records until the stop point (not past it); return how many were applied."""
    applied = 0
    apply_record = projection.apply_record
    endless = until.endless  # the usual replay: no check per record
    for batch in batches:
        for record in batch:
            if not endless and until.reached(record):
                return applied
            apply_record(record)
            applied += 1
        if progress is not None:
            progress(applied)
    return applied
