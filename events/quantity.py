"""Kubernetes quantities as canonical integers (DESIGN §2).

Every amount is an integer in canonical units: ``cpu`` in millicores, every
other resource in its base unit (bytes, count). Fractions are rounded *up*, as
Kubernetes rounds a request it has to represent in a coarser unit. An amount
above :data:`MAX_AMOUNT` (2^62, about 4.6 EiB) after canonicalisation is
refused (DESIGN §9 bounds): ``20Ei`` of memory or ``2**80`` cpu is an input
error naming its field, never a number the state has to carry.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from fractions import Fraction
from functools import lru_cache

#: The largest amount a resource list may hold, in canonical units (§9).
MAX_AMOUNT = 2**62

#: Resources whose canonical unit is a thousandth of the written unit.
MILLI_RESOURCES = frozenset({"cpu"})

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
_QUANTITY = re.compile(
    r"^(?P<num>[+]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
    r"(?:(?P<bin>Ki|Mi|Gi|Ti|Pi|Ei)|[eE](?P<exp>[+-]?[0-9]+)|(?P<dec>[numkMGTPE]?))$"
)


class QuantityError(ValueError):
    """An amount that is not a non-negative Kubernetes quantity."""


def _ceil(value: Fraction) -> int:
    return -((-value.numerator) // value.denominator)


@lru_cache(maxsize=4096)
def _parse_text(text: str) -> Fraction:
    """The exact value of a quantity string in its written unit (pure; memoised)."""
    match = _QUANTITY.match(text.strip())
    if match is None:
        raise QuantityError(f"unparsable quantity {text!r}")
    number = Fraction(match["num"])
    if match["bin"]:
        return number * _BINARY[match["bin"]]
    if match["exp"] is not None:
        exponent = int(match["exp"])
        if abs(exponent) > 30:
            raise QuantityError(f"quantity exponent out of range in {text!r}")
        return number * Fraction(10) ** exponent
    return number * _DECIMAL[match["dec"] or ""]


def canonical_amount(resource: str, value: int | float | str) -> int:
    """Convert one input amount to canonical units, rounding up (DESIGN §2).

    ``value`` is a Kubernetes quantity string or a JSON number in the written
    unit (``4`` cpu is 4000 millicores). Negative, non-finite and boolean values
    are refused with :class:`QuantityError`, and so is an amount above
    :data:`MAX_AMOUNT` in canonical units.
    """
    amount = _canonical_amount(resource, value)
    if amount > MAX_AMOUNT:
        written = repr(value)
        if len(written) > 40:
            written = written[:37] + "..."
        raise QuantityError(f"amount {written} is above the limit of 2^62 ({MAX_AMOUNT})")
    return amount


def _canonical_amount(resource: str, value: int | float | str) -> int:
    if isinstance(value, bool):
        raise QuantityError(f"expected a quantity, got {value!r}")
    scale = 1000 if resource in MILLI_RESOURCES else 1
    if isinstance(value, int):
        if value < 0:
            raise QuantityError(f"negative amount {value}")
        return value * scale
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise QuantityError(f"non-finite amount {value!r}")
        if value < 0:
            raise QuantityError(f"negative amount {value!r}")
        return _ceil(Fraction(repr(value)) * scale)
    if isinstance(value, str):
        return _canonical_text(value, scale)
    raise QuantityError(f"expected a quantity, got {type(value).__name__}")


@lru_cache(maxsize=16384)
def _canonical_text(text: str, scale: int) -> int:
    """A quantity string in canonical units (pure; memoised: workloads repeat
    a few hundred distinct strings)."""
    if text.strip().startswith("-"):
        raise QuantityError(f"negative amount {text!r}")
    return _ceil(_parse_text(text) * scale)


def canonical_list(field: str, raw: dict[str, int | float | str]) -> dict[str, int]:
    """Canonicalise a resource list, naming ``$.field.resource`` in any error.

    Lists whose amounts are all strings or integers (the wire's usual form) are
    memoised whole and the result is **shared** between every event that wrote
    the same list: nobody may mutate an event's resource list (the projection
    never does; it copies into its own sums). Floats and anything else go the
    uncached way, so ``True`` can never hit the entry of ``1``, nor ``1e21``
    the entry of the integer it equals.
    """
    for value in raw.values():
        kind = value.__class__
        if kind is not str and kind is not int:
            return _canonical_items(field, raw.items())
    return _canonical_memo(field, tuple(raw.items()))


@lru_cache(maxsize=65536)
def _canonical_memo(field: str, items: tuple[tuple[str, int | str], ...]) -> dict[str, int]:
    return _canonical_items(field, items)


def _canonical_items(field: str, items: Iterable[tuple[str, int | float | str]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for resource, value in items:
        try:
            out[resource] = canonical_amount(resource, value)
        except QuantityError as exc:
            raise ValueError(f"{exc} - at `$.{field}.{resource}`") from None
    return out


def format_amount(resource: str, amount: int) -> str:
    """Render a canonical amount in human units: ``4.5 cpu``, ``12Gi``, ``3``."""
    if resource in MILLI_RESOURCES:
        if amount % 1000 == 0:
            return f"{amount // 1000} {resource}"
        if amount % 100 == 0 or amount >= 10_000:
            # Exact decimal cores: a float with ``:g`` would round large amounts
            # (1000001m -> "1000 cpu") and switch to exponent notation.
            whole, milli = divmod(amount, 1000)
            return f"{whole}.{milli:03d}".rstrip("0") + f" {resource}"
        return f"{amount}m {resource}"
    if resource in ("memory", "ephemeral-storage", "storage") or resource.endswith("memory"):
        for suffix, size in (("Ei", 2**60), ("Pi", 2**50), ("Ti", 2**40), ("Gi", 2**30)):
            if amount >= size:
                text = f"{amount / size:.1f}".removesuffix(".0")
                return f"{text}{suffix}"
        for suffix, size in (("Mi", 2**20), ("Ki", 2**10)):
            if amount >= size:
                return f"{round(amount / size)}{suffix}"
        return str(amount)
    return str(amount)
