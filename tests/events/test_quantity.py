"""Quantities as canonical integers (DESIGN §2): parsing, rounding up, rendering."""

from __future__ import annotations

import math
from decimal import Decimal
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quotaledger.events.quantity import (
    MAX_AMOUNT,
    QuantityError,
    canonical_amount,
    canonical_list,
    format_amount,
)

# No timing in assertions: a loaded CI machine must not fail a property.
NO_DEADLINE = settings(deadline=None)

GI = 2**30
BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
DECIMAL = {"k": 10**3, "M": 10**6, "G": 10**9}
SUFFIXES = {**BINARY, **DECIMAL}
RESOURCES = ["cpu", "memory", "nvidia.com/gpu", "pods", "ephemeral-storage"]


def scale(resource: str) -> int:
    return 1000 if resource == "cpu" else 1


# ------------------------------------------------------------------ examples


@pytest.mark.parametrize(
    ("resource", "value", "expected"),
    [
        ("cpu", "500m", 500),
        ("memory", "1Gi", 1073741824),
        ("cpu", "1.5", 1500),
        ("count", "2e3", 2000),
        ("cpu", 4, 4000),
        ("cpu", "4", 4000),
        ("memory", "1.5", 2),  # rounded up
        ("memory", "100m", 1),  # a tenth of a byte is still a byte
        ("cpu", "0.1m", 1),
        ("cpu", 0.5, 500),
        ("cpu", 0.1, 100),  # the JSON text 0.1, not its binary approximation
        ("memory", 1.5, 2),
        ("memory", 0, 0),
        ("cpu", "0", 0),
        ("memory", "8Gi", 8 * GI),
        ("memory", "256Mi", 256 * 2**20),
        ("memory", "1k", 1000),
        ("memory", "1M", 10**6),
        ("memory", "2G", 2 * 10**9),
        ("memory", "1Ti", 2**40),
        ("memory", "1.5Gi", 3 * 2**29),
        ("nvidia.com/gpu", 60, 60),
        ("nvidia.com/gpu", "2e0", 2),
        ("cpu", "1e-3", 1),
        ("memory", "1e3", 1000),
        ("memory", "1E3", 1000),
        ("cpu", "2500u", 3),  # 2.5 millicores -> 3
        ("cpu", "1n", 1),
    ],
)
def test_canonical_amount_examples(resource: str, value: object, expected: int) -> None:
    result = canonical_amount(resource, value)  # type: ignore[arg-type]
    assert result == expected
    assert type(result) is int


@pytest.mark.parametrize(
    "value",
    [
        *["-1", -1, -0.5, "-500m", "-1Gi", " -1", True, False, "abc", "1.5.5", "", "Gi", "m"],
        *["1 Gi", "1gi", "0x10", "1_000", "NaN", "inf", float("nan"), float("inf"), None, [1]],
    ],
)
@pytest.mark.parametrize("resource", ["cpu", "memory"])
def test_canonical_amount_rejects(resource: str, value: object) -> None:
    with pytest.raises(QuantityError):
        canonical_amount(resource, value)  # type: ignore[arg-type]


def test_quantity_error_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="negative"):
        canonical_amount("cpu", "-1")


def test_canonical_list_canonicalises_every_resource() -> None:
    raw = {"cpu": "500m", "memory": "1Gi", "nvidia.com/gpu": 2, "pods": "1.5"}
    assert canonical_list("requests", raw) == {
        "cpu": 500,
        "memory": GI,
        "nvidia.com/gpu": 2,
        "pods": 2,
    }
    assert canonical_list("min", {}) == {}


def test_canonical_list_does_not_mutate_its_input() -> None:
    raw = {"cpu": "2"}
    canonical_list("max", raw)
    assert raw == {"cpu": "2"}


@pytest.mark.parametrize(
    ("field", "raw", "path"),
    [
        ("requests", {"cpu": "1", "memory": "-1Gi"}, "$.requests.memory"),
        ("max", {"cpu": "abc"}, "$.max.cpu"),
        ("allocatable", {"nvidia.com/gpu": -1}, "$.allocatable.nvidia.com/gpu"),
        ("min", {"memory": True}, "$.min.memory"),
    ],
)
def test_canonical_list_error_names_field_and_resource(
    field: str, raw: dict[str, object], path: str
) -> None:
    with pytest.raises(ValueError) as info:
        canonical_list(field, raw)  # type: ignore[arg-type]
    assert path in str(info.value)


# ---------------------------------------------------------------- properties


@NO_DEADLINE
@given(
    n=st.integers(min_value=0, max_value=10**9),
    suffix=st.sampled_from(sorted(SUFFIXES)),
    resource=st.sampled_from(RESOURCES),
)
def test_suffixes_multiply_exactly(n: int, suffix: str, resource: str) -> None:
    expected = n * SUFFIXES[suffix] * scale(resource)
    if expected <= MAX_AMOUNT:
        assert canonical_amount(resource, f"{n}{suffix}") == expected
    else:  # DESIGN §9: above 2^62 is refused
        with pytest.raises(QuantityError, match="2\\^62"):
            canonical_amount(resource, f"{n}{suffix}")


@NO_DEADLINE
@given(amount=st.integers(min_value=0, max_value=10**24))
def test_integer_string_round_trip(amount: int) -> None:
    if amount > MAX_AMOUNT:  # DESIGN §9: above 2^62 is refused, whatever the form
        for resource, value in (("memory", str(amount)), ("gpu", str(amount)), ("memory", amount)):
            with pytest.raises(QuantityError, match="above the limit"):
                canonical_amount(resource, value)
        return
    assert canonical_amount("memory", str(amount)) == amount
    assert canonical_amount("nvidia.com/gpu", str(amount)) == amount
    assert canonical_amount("memory", amount) == amount


@pytest.mark.parametrize(
    ("resource", "value"),
    [("memory", "20Ei"), ("cpu", 2**80), ("cpu", "4611686018427388"), ("memory", 2**62 + 1)],
)
def test_amounts_above_2_62_are_refused_naming_the_field(resource: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"`\\$.allocatable.{resource}`"):
        canonical_list("allocatable", {resource: value})  # type: ignore[dict-item]


def test_the_largest_amount_is_accepted() -> None:
    assert canonical_amount("memory", 2**62) == MAX_AMOUNT
    assert canonical_amount("memory", "4Ei") == MAX_AMOUNT
    assert canonical_amount("cpu", "4611686018427387904m") == MAX_AMOUNT


@NO_DEADLINE
@given(millicores=st.integers(min_value=0, max_value=10**15))
def test_cpu_millicore_round_trip(millicores: int) -> None:
    assert canonical_amount("cpu", f"{millicores}m") == millicores
    assert canonical_amount("cpu", millicores) == millicores * 1000


decimals = st.decimals(
    min_value=0, max_value=10**9, places=6, allow_nan=False, allow_infinity=False
)


def decimal_text(value: Decimal) -> str:
    return format(value, "f")


@NO_DEADLINE
@given(a=decimals, b=decimals, resource=st.sampled_from(RESOURCES))
def test_parsing_is_monotonic(a: Decimal, b: Decimal, resource: str) -> None:
    if a < b:
        a, b = b, a
    assert canonical_amount(resource, decimal_text(a)) >= canonical_amount(
        resource, decimal_text(b)
    )


@NO_DEADLINE
@given(
    value=decimals,
    suffix=st.sampled_from(["", "n", "u", "m", "k", "M", "G", "Ki", "Mi", "Gi"]),
    resource=st.sampled_from(RESOURCES),
)
def test_rounds_up_to_the_next_integer(value: Decimal, suffix: str, resource: str) -> None:
    multiplier = {
        "": Fraction(1),
        "n": Fraction(1, 10**9),
        "u": Fraction(1, 10**6),
        "m": Fraction(1, 10**3),
        **{k: Fraction(v) for k, v in SUFFIXES.items()},
    }[suffix]
    exact = Fraction(decimal_text(value)) * multiplier * scale(resource)
    if math.ceil(exact) > MAX_AMOUNT:  # DESIGN §9 bound
        with pytest.raises(QuantityError, match="above the limit"):
            canonical_amount(resource, decimal_text(value) + suffix)
        return
    result = canonical_amount(resource, decimal_text(value) + suffix)
    assert exact <= result < exact + 1
    assert result == math.ceil(exact)


@NO_DEADLINE
@given(
    mantissa=st.integers(min_value=0, max_value=10**6),
    exponent=st.integers(min_value=-9, max_value=12),
    resource=st.sampled_from(RESOURCES),
)
def test_exponent_form(mantissa: int, exponent: int, resource: str) -> None:
    exact = math.ceil(Fraction(mantissa) * Fraction(10) ** exponent * scale(resource))
    if exact > MAX_AMOUNT:  # DESIGN §9 bound
        with pytest.raises(QuantityError, match="above the limit"):
            canonical_amount(resource, f"{mantissa}e{exponent}")
        return
    assert canonical_amount(resource, f"{mantissa}e{exponent}") == exact


@NO_DEADLINE
@given(
    value=st.floats(min_value=0, max_value=1e15, allow_nan=False, allow_infinity=False).filter(
        lambda x: x == 0 or x >= 1e-20  # the text form caps exponents at |30|
    ),
    resource=st.sampled_from(RESOURCES),
)
def test_json_float_equals_its_text(value: float, resource: str) -> None:
    # A JSON number is taken as written (msgspec gives the float whose repr is
    # the shortest text for it), never as its binary approximation.
    assert canonical_amount(resource, value) == canonical_amount(resource, repr(value))
    exact = Fraction(repr(value)) * scale(resource)
    assert exact <= canonical_amount(resource, value) < exact + 1


@NO_DEADLINE
@given(value=st.integers(min_value=1, max_value=10**12), suffix=st.sampled_from(["", "m", "Gi"]))
def test_negative_text_is_always_refused(value: int, suffix: str) -> None:
    with pytest.raises(QuantityError):
        canonical_amount("memory", f"-{value}{suffix}")


# ----------------------------------------------------------------- rendering


@pytest.mark.parametrize(
    ("resource", "amount", "text"),
    [
        ("cpu", 4500, "4.5 cpu"),
        ("cpu", 4000, "4 cpu"),
        ("cpu", 0, "0 cpu"),
        ("cpu", 250, "250m cpu"),
        ("cpu", 1, "1m cpu"),
        ("cpu", 12345, "12.345 cpu"),
        ("cpu", 128000, "128 cpu"),
        ("memory", 12 * GI, "12Gi"),
        ("memory", 3 * 2**29, "1.5Gi"),
        ("memory", 256 * GI, "256Gi"),
        ("memory", 2 * 2**40, "2Ti"),
        ("memory", 512 * 2**20, "512Mi"),
        ("memory", 4 * 2**10, "4Ki"),
        ("memory", 100, "100"),
        ("memory", 0, "0"),
        ("ephemeral-storage", 20 * GI, "20Gi"),
        ("nvidia.com/gpu", 3, "3"),
        ("pods", 110, "110"),
    ],
)
def test_format_amount_examples(resource: str, amount: int, text: str) -> None:
    assert format_amount(resource, amount) == text


@NO_DEADLINE
@given(millicores=st.integers(min_value=0, max_value=10**15))
def test_cpu_rendering_is_exact(millicores: int) -> None:
    text = format_amount("cpu", millicores)
    number, unit = text.split(" ")
    assert unit == "cpu"
    assert "e" not in number
    assert canonical_amount("cpu", number) == millicores


@NO_DEADLINE
@given(amount=st.integers(min_value=0, max_value=10**18))
def test_count_rendering_is_the_plain_integer(amount: int) -> None:
    assert format_amount("nvidia.com/gpu", amount) == str(amount)


@NO_DEADLINE
@given(n=st.integers(min_value=1, max_value=1023), suffix=st.sampled_from(sorted(BINARY)))
def test_memory_whole_binary_units_render_exactly(n: int, suffix: str) -> None:
    text = format_amount("memory", n * BINARY[suffix])
    assert canonical_amount("memory", text) == n * BINARY[suffix]


_AMOUNTS = st.one_of(
    st.integers(0, 10**6),
    st.sampled_from([True, False, 1.0, 0.0, 2.0**70, 2**70, 1, 0, "1", "1.0", "500m", "1Gi"]),
    st.floats(0, 1e6, allow_nan=False),
    st.sampled_from(["2e3", "0.1", "-1", "x"]),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.dictionaries(st.sampled_from(["cpu", "memory", "gpu"]), _AMOUNTS), max_size=6))
def test_memoised_lists_equal_the_uncached_conversion(lists: list[dict[str, object]]) -> None:
    """``canonical_list`` memoises whole lists of strings and integers and shares
    the results; mixing in ``True`` (== 1), ``1.0`` and a float equal to a huge
    integer in one process must never return another list's cached result."""
    for raw in lists:
        try:
            expected: dict[str, int] | str = {
                key: canonical_amount(key, value)  # type: ignore[arg-type]
                for key, value in raw.items()
            }
        except QuantityError as exc:
            expected = str(exc)
        try:
            got: dict[str, int] | str = canonical_list("requests", raw)  # type: ignore[arg-type]
        except ValueError as exc:
            got = str(exc).split(" - at ")[0]
        assert got == expected
