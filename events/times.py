"""Times: bounds of the input (DESIGN §9 "Bounds"), RFC 3339 output, the wall clock.

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

Times are written as RFC 3339 UTC (:func:`rfc3339`, DECISIONS 9: ``.mmm`` only
when the ts is not a whole second), by exact integer arithmetic for any
integer. :func:`wall_clock_ms` is the one wall clock of the ledgers and the
live engine.
"""

from __future__ import annotations

import time
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


def wall_clock_ms() -> int:
    """Milliseconds since the epoch by the wall clock: the one clock of the
    ledgers (a record appended without a ts) and of the live engine (DESIGN §3,
    §6). Whatever reads it is not a projection (DESIGN §1: projections read no
    clock); a simulation or a test passes its own ``clock_ms`` instead."""
    return time.time_ns() // 1_000_000


def rfc3339(ts_ms: int) -> str:
    """A ledger ts as RFC 3339 UTC; milliseconds only when not whole seconds.

    Exact integer arithmetic on the proleptic Gregorian calendar, for any
    integer: decoding bounds every time to 1970 .. 9000 (§9), but whatever ts a
    state holds (a deadline, a ledger written by something else), rendering it
    must not fail. A year outside 0000 .. 9999 is written with its sign and all
    its digits (the extended form of ISO 8601), so it is still unambiguous.
    """
    days, ms = divmod(ts_ms, 86_400_000)
    seconds, milli = divmod(ms, 1000)
    minutes, second = divmod(seconds, 60)
    hour, minute = divmod(minutes, 60)
    year, month, day = _civil(days)
    sign = "" if 0 <= year <= 9999 else ("+" if year > 0 else "-")
    text = f"{sign}{abs(year):04d}" if not sign else f"{sign}{abs(year):06d}"
    text += f"-{month:02d}-{day:02d}T{hour:02d}:{minute:02d}:{second:02d}"
    return text + (f".{milli:03d}Z" if milli else "Z")


def _civil(days: int) -> tuple[int, int, int]:
    """Year, month and day of ``days`` since 1970-01-01 (proleptic Gregorian;
    the civil-from-days algorithm over 400-year eras of 146,097 days)."""
    days += 719_468  # days from 0000-03-01 to 1970-01-01
    era, day_of_era = divmod(days, 146_097)
    year_of_era = (
        day_of_era - day_of_era // 1460 + day_of_era // 36_524 - day_of_era // 146_096
    ) // 365
    day_of_year = day_of_era - (365 * year_of_era + year_of_era // 4 - year_of_era // 100)
    shifted_month = (5 * day_of_year + 2) // 153  # March = 0
    day = day_of_year - (153 * shifted_month + 2) // 5 + 1
    month = shifted_month + 3 if shifted_month < 10 else shifted_month - 9
    year = year_of_era + era * 400 + (1 if month <= 2 else 0)
    return year, month, day
