"""Exact integer arithmetic on numpy columns, for the full recompute (:mod:`.arrays`).

No float ever decides a number: a column is int64 when a bound proves every
sum and difference fits (:data:`INT64_SUMS`), else Python integers (numpy
``object``); a product of two amounts is taken in int64 only when the
factors' maxima prove it fits, else estimated in float64 and corrected
exactly in integers, or computed in Python integers (DESIGN §9 bounds amounts
at 2^62; sums and products may go past int64).
"""

from __future__ import annotations

from typing import Any

import numpy as np

Column = Any  # a 1-D numpy array of Python ints (dtype object)

#: Below this, int64 holds every sum and difference of a resource's amounts.
INT64_SUMS = 2**62
INT64_MAX = 2**63 - 1


def zeros(count: int, dtype: Any = object) -> Column:
    """A column of ``count`` zeros of ``dtype`` (``object``: Python ints)."""
    if dtype is object:
        out = np.empty(count, dtype=object)
        out.fill(0)
        return out
    return np.zeros(count, dtype=dtype)


def column_of(values: list[int], dtype: Any = object) -> Column:
    """``values`` as a column of ``dtype`` (``object``: Python ints)."""
    if dtype is object:
        out = np.empty(len(values), dtype=object)
        out[:] = values
        return out
    return np.array(values, dtype=dtype)


def segment_sums(values: Column, starts: Column, ends: Column) -> Column:
    """Σ values[starts[i]:ends[i]] for each i (cumulative-sum differences)."""
    total = zeros(len(values) + 1, values.dtype if values.dtype != object else object)
    if len(values):
        total[1:] = np.cumsum(values)
    return total[ends] - total[starts]


def peak(values: Column) -> int:
    """The largest magnitude in a column (0 when empty)."""
    return int(np.abs(values).max()) if len(values) else 0


def mul_divmod(left: Column, right: Column, divisor: Column) -> tuple[Column, Column]:
    """(left·right // divisor, left·right % divisor), exact: in int64 when the
    maxima prove the product fits, else in Python integers (the quotient and
    remainder are brought back to the columns' dtype: both fit it)."""
    if left.dtype != object and peak(left) * peak(right) <= INT64_MAX:
        product = left * right
        quotient = product // divisor
        return quotient, product - quotient * divisor
    if left.dtype != object:
        corrected = estimate_divmod(left, right, divisor)
        if corrected is not None:
            return corrected
    product = left.astype(object) * right.astype(object)
    wide = divisor.astype(object)
    quotient = product // wide
    remainder = product - quotient * wide
    if left.dtype != object:
        return quotient.astype(np.int64), remainder.astype(np.int64)
    return quotient, remainder


#: Below this a quotient's float64 estimate is within 1 of it (relative error
#: of two conversions, a product and a division: < 5 · 2^-53).
_ESTIMATE_EXACT_BELOW = 2.0**49


def estimate_divmod(left: Column, right: Column, divisor: Column) -> tuple[Column, Column] | None:
    """``mul_divmod`` of non-negative int64 columns whose product may leave
    int64 but whose quotient is small: a float64 estimate of the quotient,
    corrected exactly in integer arithmetic (None when it does not apply).

    With the estimate ``q`` within 1 of ⌊l·r/d⌋ and 0 < d < 2^62, the true
    ``l·r − q·d`` lies in (−2d, 2d) ⊂ int64, so computing it with int64
    wrap-around (exact modulo 2^64) gives it exactly; one step up or down
    then makes 0 ≤ remainder < d. The float only proposes; integers decide.
    """
    if not len(left):
        return left.copy(), left.copy()
    if int(left.min()) < 0 or int(right.min()) < 0 or int(divisor.min()) <= 0:
        return None
    if peak(divisor) >= INT64_SUMS:
        return None
    estimate = np.floor(
        left.astype(np.float64) * right.astype(np.float64) / divisor.astype(np.float64)
    )
    if float(estimate.max()) >= _ESTIMATE_EXACT_BELOW:
        return None
    quotient = estimate.astype(np.int64)
    with np.errstate(over="ignore"):
        remainder = left * right - quotient * divisor  # exact: see above
    low = remainder < 0
    quotient[low] -= 1
    remainder[low] += divisor[low]
    high = remainder >= divisor
    quotient[high] += 1
    remainder[high] -= divisor[high]
    if bool((remainder < 0).any()) or bool((remainder >= divisor).any()):
        return None  # not reached while the estimate is within 1
    return quotient, remainder


def exact_sum(values: Any) -> int:
    """Σ of an int64 column, exact (in int64 when its peak proves the sum fits)."""
    if peak(values) * len(values) < INT64_SUMS:
        return int(values.sum())
    return int(values.sum(dtype=object))


def as_dtype(column: Any, dtype: Any) -> Column:
    """An int64 column as ``dtype`` (``object``: Python ints)."""
    return column if dtype is not object else column.astype(object)


def rank_order(row_seg: Any, remainder: Column) -> Any:
    """Positions sorted by (segment, remainder descending, position): a stable
    sort on the remainder, then a stable sort on the segment."""
    if remainder.dtype == object:
        by_remainder = np.array(
            sorted(range(len(remainder)), key=lambda i: -remainder[i]), dtype=np.intp
        )
        return by_remainder[np.argsort(row_seg[by_remainder], kind="stable")]
    if not len(remainder):
        return np.zeros(0, dtype=np.intp)
    # one stable sort on (segment, largest remainder first) as one int64 key
    # when the key fits (remainders are ≥ 0): the same order as the two sorts
    span = int(remainder.max()) + 1
    if int(remainder.min()) >= 0 and (int(row_seg.max()) + 1) * span < INT64_SUMS:
        return np.argsort(row_seg * span + (span - 1 - remainder), kind="stable")
    by_remainder = np.argsort(-remainder, kind="stable")
    return by_remainder[np.argsort(row_seg[by_remainder], kind="stable")]


def by_segment(values: Column, seg: Any, segments: int) -> Column:
    """Σ values per segment (``seg[i]`` the segment of row i)."""
    out = zeros(segments, values.dtype if values.dtype != object else object)
    np.add.at(out, seg, values)
    return out
