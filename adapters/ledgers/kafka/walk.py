"""Kafka messages as ledger records: ts, the walk, holes, record 0 (DESIGN §3, §10).

* **ts** of a message is its value's ``at`` when present (and within the bounds
  of §9), else the Kafka record timestamp; then clamped up to the previous
  record's ts (:func:`sequence`, :func:`value_ts`). Every reader computes the
  same ts: it depends only on the values and timestamps of the records before it;
* **offsets follow each other**: :func:`sequence` walks record batches into
  records and stops at a skip unless a :class:`GapJudge` proves the missing
  offsets gone (DECISIONS 200); an offset going back is :class:`LedgerMismatch`;
* **record 0** is ``LedgerOpened`` (:func:`opened_id`).

Pure functions of the batches they are given: :mod:`.reader` fetches them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta

import msgspec

from quotaledger.events.codec import EventError, decode_event, encode_event
from quotaledger.events.ledger import LedgerError, LedgerGap, LedgerMismatch, Record
from quotaledger.events.model import FactRejected, LedgerOpened

from .fetch import Fetched, Message

__all__ = [
    "GapJudge",
    "first_message",
    "gap_filler",
    "ms_datetime",
    "opened_id",
    "sequence",
    "value_ts",
]

log = logging.getLogger("quotaledger.kafka")

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
#: §9: times lie in 1970-01-01 .. 9000-01-01; an `at` outside is not a ts.
_MAX_TS = (datetime(9000, 1, 1, tzinfo=UTC) - _EPOCH) // timedelta(milliseconds=1)


class _AtOnly(msgspec.Struct, gc=False):
    at: datetime | None = None


_AT_DECODER = msgspec.json.Decoder(_AtOnly)
_MS = timedelta(milliseconds=1)


def value_ts(value: bytes) -> int | None:
    """The ms of a message value's ``at``, or None when absent or unusable."""
    try:
        moment = _AT_DECODER.decode(value).at
    except msgspec.DecodeError:  # not JSON, or `at` not a time: the record timestamp
        return None
    if moment is None:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    ms = (moment - _EPOCH) // _MS
    return ms if 0 <= ms <= _MAX_TS else None


def ms_datetime(ms: int) -> datetime:
    """The UTC datetime of ``ms`` since the epoch (exact)."""
    return _EPOCH + timedelta(milliseconds=ms)


def gap_filler(offset: int) -> bytes:
    """The record a ``gaps="fill"`` reader puts where the partition has none."""
    return encode_event(
        FactRejected(
            offset=offset,
            reason=f"partition offset {offset} holds no record (a write the broker lost"
            " before acknowledging it; read with gaps=fill)",
        )
    )


class GapJudge:
    """Whether offsets a fetch skipped are gone for good (DECISIONS 200).

    A skip in the offsets proves nothing by itself: a broker may make a later
    batch readable before an earlier one (tansu with concurrent producers). The
    offsets ``first..nxt-1`` a reader found no record for are gone only when

    * the log starts after them (the broker's log start offset): deleted, a
      :class:`LedgerGap` whatever ``gaps`` says;
    * control batches (transaction markers) cover them: a marker is written
      with its offsets and never changes, so every reader sees the same
      thing there: filled with ``gaps=fill``, a :class:`LedgerGap` otherwise;
    * with ``gaps=fill``, the reader has seen them stay unreadable for
      ``gap_patience_s`` while later records were readable, and recorded that
      in ``judged`` (``first -> nxt``): filled.

    Otherwise the reader fetches again from ``first``. Offset 0 is never filled.

    A proven gap the reader must stop at is not raised mid-walk: the judge keeps
    it in :attr:`gap` and answers False, so the walk ends at the gap with the
    records before it; the reader hands those out and then raises the gap (DESIGN
    §10: a gap stops the reader with a clear error naming the offset, after the
    ledger up to it, which ``replay`` and ``audit`` show; DECISIONS 204).
    """

    __slots__ = ("fill", "gap", "judged", "log_start", "markers", "where")

    def __init__(self, where: str, fill: bool, judged: dict[int, int]) -> None:
        self.where = where
        self.fill = fill
        #: Holes this ledger handle has judged gone after waiting (``first -> nxt``).
        self.judged = judged
        #: ``(first, end)`` of control batches seen and not yet passed.
        self.markers: list[tuple[int, int]] = []
        self.log_start = -1
        #: The proven gap the last walk stopped at, for the reader to raise (None: none).
        self.gap: LedgerGap | None = None

    def saw(self, fetched: Fetched, expected: int) -> None:
        """Take in what a fetch response proves (before its records are walked)."""
        if fetched.log_start > self.log_start:
            self.log_start = fetched.log_start
        if fetched.markers or self.markers:
            self.markers = sorted(m for m in self.markers + fetched.markers if m[1] > expected)

    def __call__(self, first: int, nxt: int) -> bool:
        """True: fill ``first..nxt-1``; False: stop the walk there, either not
        proven (fetch again) or a proven gap the reader must stop at, then kept
        in :attr:`gap`."""
        if 0 <= first < self.log_start:
            self.gap = LedgerGap(
                f"{self.where}: offsets {first}..{nxt - 1} hold no record and the log now"
                f" starts at offset {self.log_start}: records were deleted (retention?);"
                " a ledger must be gap-free",
                missing=first,
                found=nxt,
            )
            return False
        if self.covered(first, nxt):
            if self.fill and first > 0:
                return True
            self.gap = LedgerGap(
                f"{self.where}: offset {first} is missing (the next record is at offset"
                f" {nxt}): offsets {first}..{nxt - 1} are transaction markers; a ledger"
                " must be gap-free (read with gaps=fill to fill them)",
                missing=first,
                found=nxt,
            )
            return False
        return self.fill and first > 0 and self.judged.get(first, -1) >= nxt

    def covered(self, first: int, nxt: int) -> bool:
        """Do the control batches seen cover every offset of ``first..nxt-1``?"""
        at = first
        for start, end in self.markers:
            if start <= at < end:
                at = end
            if at >= nxt:
                return True
        return at >= nxt


def sequence(
    where: str,
    batches: Iterable[Iterable[Message]],
    expected: int,
    prev_ts: int,
    from_offset: int = 0,
    gone: Callable[[int, int], bool] | None = None,
) -> tuple[list[Record], int, int, int]:
    """Kafka record batches (messages with ``offset``, ``value``, ``timestamp``)
    as ledger records (§10).

    ``expected`` is the next offset, ``prev_ts`` the ts of the record before it.
    Offsets must follow each other; when they go back, :class:`LedgerMismatch`.
    ts is the value's ``at`` or the Kafka timestamp, clamped up to the previous
    ts. Records before ``from_offset`` only advance the ts.

    At a skip (the next record at ``nxt`` > ``expected``) the walk asks
    ``gone(expected, nxt)`` (a :class:`GapJudge`): True fills the missing
    offsets, one by one, with a ``FactRejected`` saying so (at the previous
    ts), so every reader still sees the same gap-free ledger; False (or no
    ``gone``) stops the walk there: the offsets may still become readable
    (DECISIONS 200), or the judge proved them gone (its ``gap``). Returns the
    records, the next expected offset, the last ts, and ``nxt`` when the walk
    stopped at a skip (else -1). It never raises at a skip: the records before
    it are always returned (only offsets going back raise).
    """
    records: list[Record] = []
    append = records.append
    decode = _AT_DECODER.decode
    for batch in batches:
        for message in batch:
            offset = message.offset
            if offset != expected:
                if offset < expected:
                    _broken(where, offset, expected)
                if gone is None or not gone(expected, offset):
                    return records, expected, prev_ts, offset
                log.warning(
                    "%s: offsets %d..%d hold no record; filled", where, expected, offset - 1
                )
                for missing in range(expected, offset):
                    if missing >= from_offset:
                        append(Record(missing, prev_ts, gap_filler(missing)))
            value = message.value
            if value is None:
                value = b""
            # value_ts(), inlined: this loop runs for every record read
            ts = message.timestamp
            try:
                moment = decode(value).at
            except msgspec.DecodeError:
                moment = None
            if moment is not None:
                if moment.tzinfo is None:
                    moment = moment.replace(tzinfo=UTC)
                at_ms = (moment - _EPOCH) // _MS
                if 0 <= at_ms <= _MAX_TS:
                    ts = at_ms
            if ts < prev_ts:
                ts = prev_ts
            prev_ts = ts
            expected = offset + 1
            if offset >= from_offset:
                append(Record(offset, ts, value))
    return records, expected, prev_ts, -1


def first_message(batches: list[Iterable[Message]]) -> Message | None:
    """The first record of fetched batches (None when they hold none). aiokafka's
    batch readers iterate once: a batch looked into becomes a list, so the walk
    still sees all of it."""
    for index, batch in enumerate(batches):
        messages = batches[index] = list(batch)
        if messages:
            return messages[0]
    return None


def _broken(where: str, offset: int, expected: int) -> None:
    raise LedgerMismatch(
        f"{where}: expected offset {expected} but the broker returned offset"
        f" {offset}: the log was reset (a broker that lost its data?); refusing to mix"
        " two histories"
    )


def opened_id(record: Record, where: str) -> str:
    """The ledger id of a record 0, or a clear error when it is no ``LedgerOpened``."""
    if record.offset != 0:
        raise LedgerGap(
            f"{where}: the first record is at offset {record.offset}, not 0: records were"
            " deleted (retention?); a ledger must start with LedgerOpened at offset 0",
            missing=0,
            found=record.offset,
        )
    try:
        event = decode_event(record.payload)
    except EventError as exc:
        raise LedgerError(
            f"{where}: offset 0 is not LedgerOpened ({exc}); not a quotaledger ledger"
        ) from None
    if not isinstance(event, LedgerOpened):
        raise LedgerError(
            f"{where}: offset 0 is {type(event).__name__}, not LedgerOpened; not a"
            " quotaledger ledger (run `quotaledger init` on a new topic)"
        )
    return event.ledger_id
