"""Weighted water-filling (DESIGN §5 "Runtime" step 3) against a literal reference.

The projection's water-fill works on parallel lists in name order; this checks
it against a direct transcription of the rule with names: split the pool by
weight, ⌊w·pool/W⌋ each, leftover units one each to the largest remainders
(ties to the smaller name), cap at the limited request, re-split the excess.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from quotaledger.projections.resources import water_fill, water_fill_ordered
from quotaledger.projections.runtime import water_filled


def reference(pool: int, borrowers: list[tuple[str, int, int, int]]) -> dict[str, int]:
    result = {name: start for name, start, _, _ in borrowers}
    caps = {name: cap for name, _, cap, _ in borrowers}
    weights = {name: weight for name, _, _, weight in borrowers}
    active = sorted(name for name in result if weights[name] > 0 and result[name] < caps[name])
    while pool > 0 and active:
        total = sum(weights[name] for name in active)
        shares = {name: weights[name] * pool // total for name in active}
        order = sorted(active, key=lambda name: (-(weights[name] * pool % total), name))
        for name in order[: pool - sum(shares.values())]:
            shares[name] += 1
        excess = 0
        still = []
        for name in active:
            grown = result[name] + shares[name]
            if grown >= caps[name]:
                excess += grown - caps[name]
                result[name] = caps[name]
            else:
                result[name] = grown
                still.append(name)
        pool, active = excess, still
    return result


@st.composite
def fills(draw: st.DrawFn) -> tuple[int, list[tuple[str, int, int, int]]]:
    names = draw(st.lists(st.text("abcdef", min_size=1, max_size=3), unique=True, max_size=8))
    borrowers = []
    for name in names:
        start = draw(st.integers(0, 50))
        cap = start + draw(st.integers(0, 200))
        borrowers.append((name, start, cap, draw(st.integers(0, 30))))
    return draw(st.integers(0, 1000)), borrowers


@settings(max_examples=500, deadline=None)
@given(fills())
def test_water_fill_equals_the_reference(case: tuple[int, list[tuple[str, int, int, int]]]) -> None:
    pool, borrowers = case
    assert water_fill(pool, borrowers) == reference(pool, borrowers)


@settings(max_examples=300, deadline=None)
@given(fills())
def test_ordered_lists_give_the_same_amounts(
    case: tuple[int, list[tuple[str, int, int, int]]],
) -> None:
    pool, borrowers = case
    ordered = sorted(borrowers)
    filled = water_fill_ordered(
        pool, [b[1] for b in ordered], [b[2] for b in ordered], [b[3] for b in ordered]
    )
    expected = reference(pool, borrowers)
    assert filled == [expected[b[0]] for b in ordered]
    for (_, start, cap, _), value in zip(ordered, filled, strict=True):
        assert start <= value <= max(start, cap)
    assert sum(filled) - sum(b[1] for b in ordered) <= pool


def test_seed_example_borrowers() -> None:
    """DESIGN §5: total 100, mins 10/15/20/15, requests 5/20/40/70, weights
    40/60/50/80: A takes its request (5), the borrowers B/C/D start at their
    mins and share the remaining 100 - 5 - 15 - 20 - 15 = 45 -> 20/35/40."""
    filled = water_fill(45, [("B", 15, 20, 60), ("C", 20, 40, 50), ("D", 15, 70, 80)])
    assert filled == {"B": 20, "C": 35, "D": 40}


@st.composite
def groups(draw: st.DrawFn) -> tuple[int, list[int], list[int], list[int | None]]:
    """One parent's children for one resource: limited requests, effective
    mins and configured weights (None: not configured), and the amount."""
    count = draw(st.integers(0, 8))
    wants = draw(st.lists(st.integers(0, 300), min_size=count, max_size=count))
    mins = draw(st.lists(st.integers(0, 60), min_size=count, max_size=count))
    weights = draw(st.lists(st.none() | st.integers(0, 40), min_size=count, max_size=count))
    return draw(st.integers(-50, 1500)), wants, mins, weights


@settings(max_examples=500, deadline=None)
@given(groups())
def test_fused_fill_equals_steps_2_and_3(
    case: tuple[int, list[int], list[int], list[int | None]],
) -> None:
    """``runtime.water_filled`` (borrowers picked and filled in one pass)
    gives what §5 Runtime steps 2-3 give: a child asking more than its
    effective min starts there, any other gets its request, and the rest of
    the amount is water-filled among the borrowers (the reference above,
    positions standing for names in order; an unconfigured weight is the
    amount)."""
    amount, wants, mins, weights = case
    names = [f"q{i}" for i in range(len(wants))]
    expected = list(wants)
    pool = amount
    borrowers = []
    for i, name in enumerate(names):
        if wants[i] > mins[i]:
            weight = weights[i]
            borrowers.append((name, mins[i], wants[i], amount if weight is None else weight))
            expected[i] = mins[i]
            pool -= mins[i]
        else:
            pool -= wants[i]
    if borrowers and pool > 0:
        filled = reference(pool, borrowers)
        expected = [filled.get(name, value) for name, value in zip(names, expected, strict=True)]
    assert water_filled(amount, wants, mins, weights) == expected
