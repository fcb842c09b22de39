"""Resource-list arithmetic and weighted water-filling (DESIGN §2, §5).

A resource list (RL) maps a resource name to a canonical integer. In ``min``
and ``requests`` an absent key is 0; in ``max``, ``lending_limit`` and
``borrowing_limit`` an absent key, or a null list, is "no limit" (§8 rule 1).
Derived lists are kept *sparse*: a zero amount is not stored.
"""

from __future__ import annotations

from collections.abc import Mapping

RL = dict[str, int]


def add_into(total: RL, amounts: Mapping[str, int]) -> None:
    """``total += amounts``, dropping keys that reach 0."""
    for key, value in amounts.items():
        if value:
            new = total.get(key, 0) + value
            if new:
                total[key] = new
            else:
                del total[key]


def sub_into(total: RL, amounts: Mapping[str, int]) -> None:
    """``total -= amounts``, dropping keys that reach 0."""
    for key, value in amounts.items():
        if value:
            new = total.get(key, 0) - value
            if new:
                total[key] = new
            else:
                del total[key]


def sparse(amounts: Mapping[str, int]) -> RL:
    """The same list without zero amounts, keys sorted (a canonical form)."""
    return {key: amounts[key] for key in sorted(amounts) if amounts[key]}


def masked(amounts: Mapping[str, int], keys: Mapping[str, int] | None) -> RL:
    """Keep only the resources ``keys`` lists; ``None`` keeps everything (§8 rule 1)."""
    if keys is None:
        return dict(amounts)
    return {key: value for key, value in amounts.items() if key in keys}


def fits(amounts: Mapping[str, int], limit: Mapping[str, int] | None) -> bool:
    """True when no resource exceeds a limit list (absent key: no limit)."""
    if limit is None:
        return True
    return all(amounts.get(key, 0) <= cap for key, cap in limit.items())


def largest_remainder(amount: int, weights: list[tuple[str, int]]) -> dict[str, int]:
    """Split ``amount`` by integer weights, exactly: each name gets
    ⌊w·amount/W⌋ and the leftover units go one each to the largest remainders,
    ties to the lexicographically smaller name (DESIGN §5 runtime step 3).

    Names with weight 0 get 0; if every weight is 0 nothing is handed out.
    The result lists the names in the order given.
    """
    ordered = sorted(weights)
    shares = split_ordered(amount, [weight for _, weight in ordered])
    by_name = {name: share for (name, _), share in zip(ordered, shares, strict=True)}
    return {name: by_name[name] for name, _ in weights}


def split_ordered(amount: int, weights: list[int]) -> list[int]:
    """:func:`largest_remainder` over weights whose positions are in name
    order: leftover units go to the largest remainders, ties to the smaller
    position. Nothing is handed out when ``amount`` or every weight is 0."""
    total_weight = 0
    for weight in weights:
        total_weight += weight
    if amount <= 0 or total_weight <= 0:
        return [0] * len(weights)
    shares: list[int] = []
    remainders: list[tuple[int, int]] = []
    given = 0
    for i, weight in enumerate(weights):
        share, remainder = divmod(weight * amount, total_weight)
        shares.append(share)
        given += share
        if remainder:
            remainders.append((-remainder, i))
    leftover = amount - given
    if leftover:
        remainders.sort()
        for _, i in remainders[:leftover]:
            shares[i] += 1
    return shares


def water_fill(pool: int, borrowers: list[tuple[str, int, int, int]]) -> dict[str, int]:
    """Weighted water-filling of one resource (DESIGN §5 runtime step 3).

    ``borrowers`` are ``(name, start, cap, weight)``: each starts at ``start``
    and may grow up to ``cap`` (its limited request). While ``pool > 0`` and a
    borrower below its cap has weight > 0, the pool is split by weight with
    largest-remainder rounding (ties to the smaller name); a borrower reaching
    its cap keeps the cap and its excess becomes the next pool. Invariants:
    nobody ends above its cap, and Σ(result − start) ≤ pool.
    """
    ordered = sorted(borrowers)
    filled = water_fill_ordered(
        pool,
        [start for _, start, _, _ in ordered],
        [cap for _, _, cap, _ in ordered],
        [weight for _, _, _, weight in ordered],
    )
    return {entry[0]: value for entry, value in zip(ordered, filled, strict=True)}


def water_fill_ordered(
    pool: int, starts: list[int], caps: list[int], weights: list[int]
) -> list[int]:
    """:func:`water_fill` over parallel lists whose positions are in name
    order, so the largest-remainder tie-break goes to the smaller position.
    Returns each borrower's final amount (a new list).

    A pool that covers every weighted borrower's way to its cap fills them
    all to their caps: each round hands out the whole pool and what a capped
    borrower does not take comes back, so the pool stays at least the
    borrowers' remaining way up until all are capped. That case is taken
    at once, without the rounds (the same result)."""
    result = list(starts)
    active: list[int] = []
    need = 0
    for i, weight in enumerate(weights):
        if weight > 0:
            gap = caps[i] - result[i]
            if gap > 0:
                active.append(i)
                need += gap
    if pool >= need:
        for i in active:
            result[i] = caps[i]
        return result
    if pool <= 0 or not active:
        return result
    return fill_rounds(pool, result, caps, active, [weights[i] for i in active])


def fill_rounds(
    pool: int, result: list[int], caps: list[int], active: list[int], weights: list[int]
) -> list[int]:
    """The rounds of a water-fill, in place on ``result``: ``active`` are the
    positions (in name order) still below their ``caps``, ``weights`` theirs
    (aligned with ``active``, each > 0), ``pool`` > 0 what is left to hand
    out. Each round splits the pool as :func:`split_ordered` does (largest
    remainders, ties to the smaller position); a borrower reaching its cap
    keeps the cap and its excess is the next round's pool. Returns ``result``."""
    while True:
        total_weight = 0
        for weight in weights:
            total_weight += weight
        given = 0
        shares: list[int] = []
        remainders: list[tuple[int, int]] = []
        for j, weight in enumerate(weights):
            share, remainder = divmod(weight * pool, total_weight)
            if remainder:
                remainders.append((-remainder, j))
            shares.append(share)
            given += share
        leftover = pool - given
        if leftover:
            remainders.sort()
            for _, j in remainders[:leftover]:
                shares[j] += 1
        excess = 0
        still: list[int] = []
        still_weights: list[int] = []
        for j, i in enumerate(active):
            grown = result[i] + shares[j]
            cap = caps[i]
            if grown >= cap:
                excess += grown - cap
                result[i] = cap
            else:
                result[i] = grown
                still.append(i)
                still_weights.append(weights[j])
        if excess <= 0 or not still:
            return result
        pool, active, weights = excess, still, still_weights
