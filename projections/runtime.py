"""Runtime: top-down weighted water-filling (DESIGN §5 "Runtime", §8 rules 2, 16).

For one parent and one resource: with min scaling on and the total short of
Σ mins, each child's effective min is ⌊total·min_i/Σmin⌋; a child whose
limited request exceeds its effective min borrows from there, any other gets
its limited request; the rest of the total is water-filled among borrowers by
shared weight (largest remainder, name tie-break). Invariants: a child's
runtime never exceeds its limited request; with min scaling on, Σ children's
runtime ≤ the amount shared.
"""

from __future__ import annotations

from collections.abc import Mapping

from .request import terms_for
from .resources import RL, water_fill_ordered
from .state import QuotaNode


def distribute(
    total: Mapping[str, int], children: list[QuotaNode], min_scaling: bool
) -> tuple[list[RL], list[RL]]:
    """Runtime and effective min of each child of one parent.

    ``children`` must be sorted by name (the water-fill's tie-break); returns
    two lists aligned with them: runtimes and effective mins.
    """
    count = len(children)
    runtime: list[RL] = [{} for _ in range(count)]
    effective: list[RL] = [{} for _ in range(count)]
    keys: set[str] = set()
    weight_maps: list[RL] = []
    for child in children:
        keys.update(child.limited_request)
        keys.update(key for key, value in child.config.min.items() if value)
        weight_maps.append(terms_for(child).weights)
    for key in sorted(keys):
        amount = total.get(key, 0)
        mins = [child.config.min.get(key, 0) for child in children]
        min_sum = sum(mins)
        if min_scaling and amount < min_sum:
            mins = [amount * value // min_sum for value in mins]
        borrowers: list[int] = []
        starts: list[int] = []
        caps: list[int] = []
        weights: list[int] = []
        pool = amount
        for i in range(count):
            eff = mins[i]
            if eff:
                effective[i][key] = eff
            want = children[i].limited_request.get(key, 0)
            if want > eff:
                borrowers.append(i)
                starts.append(eff)
                caps.append(want)
                weights.append(weight_maps[i].get(key, amount))
                pool -= eff
            else:
                pool -= want
                if want:
                    runtime[i][key] = want
        if not borrowers:
            continue
        filled = water_fill_ordered(pool, starts, caps, weights) if pool > 0 else starts
        for i, value in zip(borrowers, filled, strict=True):
            if value:
                runtime[i][key] = value
    return runtime, effective
