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

from .resources import RL, water_fill
from .state import QuotaNode


def shared_weight(node: QuotaNode, key: str, shared: int) -> int:
    """§8 rule 2: shared_weight, else max, else the amount being shared."""
    config = node.config
    if config.shared_weight is not None and key in config.shared_weight:
        return config.shared_weight[key]
    if config.max is not None and key in config.max:
        return config.max[key]
    return shared


def distribute(
    total: Mapping[str, int], children: list[QuotaNode], min_scaling: bool
) -> dict[str, tuple[RL, RL]]:
    """Runtime and effective min of each child of one parent.

    ``children`` must be sorted by name; returns name -> (runtime, effective_min).
    """
    runtime: dict[str, RL] = {child.config.name: {} for child in children}
    effective: dict[str, RL] = {child.config.name: {} for child in children}
    keys: set[str] = set()
    for child in children:
        keys.update(child.limited_request)
        keys.update(key for key, value in child.config.min.items() if value)
    for key in sorted(keys):
        amount = total.get(key, 0)
        mins = [child.config.min.get(key, 0) for child in children]
        min_sum = sum(mins)
        if min_scaling and amount < min_sum:
            mins = [amount * value // min_sum for value in mins]
        borrowers: list[tuple[str, int, int, int]] = []
        pool = amount
        for child, eff in zip(children, mins, strict=True):
            name = child.config.name
            if eff:
                effective[name][key] = eff
            want = child.limited_request.get(key, 0)
            if want > eff:
                borrowers.append((name, eff, want, shared_weight(child, key, amount)))
                pool -= eff
            else:
                pool -= want
                if want:
                    runtime[name][key] = want
        filled = water_fill(pool, borrowers) if pool > 0 else {b[0]: b[1] for b in borrowers}
        for name, value in filled.items():
            if value:
                runtime[name][key] = value
    return {name: (runtime[name], effective[name]) for name in runtime}
