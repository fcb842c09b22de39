"""Times and bounds of the input (DESIGN §9 "Bounds").

A time without a UTC offset is UTC, everywhere: decoding replaces a naive
``at``/``created_at`` by the same wall time in UTC, so no naive datetime exists
after decoding, and :func:`epoch_ms`/:func:`epoch_us` read a naive time (a
struct built in Python) as UTC too. Both are exact integer arithmetic: a float
``timestamp()`` loses a millisecond now and then, and reads a naive time in the
machine's local zone.

The bounds keep every later computation representable: a time is within
1970-01-01T00:00:00Z .. 9000-01-01T00:00:00Z, a delay at most ten years, so a
deadline (time + delay) is always a valid date, and every amount ≤ 2^62
(:data:`quotaledger.events.quantity.MAX_AMOUNT`).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

#: The earliest and latest time an event may carry (inclusive; §9).
MIN_TIME = datetime(1970, 1, 1, tzinfo=UTC)
MAX_TIME = datetime(9000, 1, 1, tzinfo=UTC)
#: The longest delay (``preemption_delay_s``, ``revoke_after_s``,
#: ``reclaim_after_s``): ten years of 365 days, in seconds (§9).
MAX_DELAY_S = 315_360_000
#: The largest integer a non-amount integer field may hold (epochs, offsets,
#: weights, ms times): well inside the signed 64-bit range snapshots encode.
MAX_INT = 2**62

_EPOCH = MIN_TIME
_MS = timedelta(milliseconds=1)
_US = timedelta(microseconds=1)


def as_utc(moment: datetime) -> datetime:
    """A naive time read as UTC; an aware time unchanged."""
    if moment.tzinfo is None:
        return moment.replace(tzinfo=UTC)
    return moment


def epoch_ms(moment: datetime) -> int:
    """Exact whole milliseconds since the epoch, rounded down (a naive time is UTC)."""
    return (as_utc(moment) - _EPOCH) // _MS


def epoch_us(moment: datetime) -> int:
    """Exact microseconds since the epoch (a naive time is UTC): an order key
    that keeps every digit the input gave."""
    return (as_utc(moment) - _EPOCH) // _US


def bounded_time(field: str, moment: datetime) -> datetime:
    """``moment`` as an aware time within the bounds, or ValueError naming ``$.field``."""
    if moment.tzinfo is not None and 1970 < moment.year < 9000:
        return moment  # the usual case, decided without arithmetic (offsets are < 1 day)
    moment = as_utc(moment)
    if not MIN_TIME <= moment <= MAX_TIME:
        raise ValueError(
            f"time {moment.isoformat()} is out of range"
            " (1970-01-01T00:00:00Z .. 9000-01-01T00:00:00Z)"
            f" - at `$.{field}`"
        )
    return moment


def seconds_ms(seconds: float) -> int:
    """A delay in seconds as ``round(seconds × 1000)`` ms (§8 rule 3), clamped to
    ``0 .. MAX_DELAY_S`` (NaN is 0): decoding refuses anything outside, and
    whatever state a projection holds, a deadline stays a valid time."""
    if not seconds > 0:  # also NaN
        return 0
    if seconds >= MAX_DELAY_S:
        return MAX_DELAY_S * 1000
    return round(seconds * 1000)
