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

from collections.abc import Collection, Mapping

from .request import terms_for
from .resources import water_fill_ordered
from .state import ProjectedState, QuotaNode


def distribute(
    state: ProjectedState,
    total: Mapping[str, int] | int,
    children: list[QuotaNode],
    min_scaling: bool,
    keys: Collection[str] | None = None,
) -> list[dict[str, int] | None]:
    """Runtime and effective min of each child of one parent, into the
    children's rows of the state's columns.

    ``children`` must be sorted by name (the water-fill's tie-break). The
    amount shared is ``total`` per resource, or, as an int, the runtime row of
    the parent. Only the resources in ``keys`` are filled when given (the
    others' inputs did not change, so neither did their numbers). Returns,
    aligned with ``children``, the resources whose runtime changed with the
    runtime each had before (None when none changed).
    """
    store = state.columns
    count = len(children)
    rows = [child.row for child in children]
    changed: list[dict[str, int] | None] = [None] * count
    config_mins = [child.config.min for child in children]
    weight_maps = [terms_for(child).weights for child in children]
    for columns in store.by_key:
        key = columns.key
        if keys is not None and key not in keys:
            continue
        amount = columns.runtime[total] if isinstance(total, int) else total.get(key, 0)
        limited = columns.limited_request
        wants = [limited[row] for row in rows]
        mins = [amounts.get(key, 0) for amounts in config_mins]
        min_sum = sum(mins)
        if min_scaling and amount < min_sum:
            mins = [amount * value // min_sum for value in mins]
        runtime_col, effective_col = columns.runtime, columns.effective_min
        if min_sum == 0 and not any(wants):
            runtime = mins = wants  # nothing asked, nothing guaranteed: all 0
        elif amount >= sum(wants) and all(
            weight_maps[i].get(key, amount) > 0 for i in range(count) if wants[i] > mins[i]
        ):
            # enough for every limited request and every borrower weighted:
            # the water-fill caps each borrower at its limited request (step 3)
            runtime = wants
        else:
            runtime = list(wants)
            borrowers: list[int] = []
            starts: list[int] = []
            caps: list[int] = []
            weights: list[int] = []
            pool = amount
            for i in range(count):
                eff = mins[i]
                want = wants[i]
                if want > eff:
                    borrowers.append(i)
                    starts.append(eff)
                    caps.append(want)
                    weights.append(weight_maps[i].get(key, amount))
                    runtime[i] = eff
                    pool -= eff
                else:
                    pool -= want
            if borrowers:
                filled = water_fill_ordered(pool, starts, caps, weights) if pool > 0 else starts
                for i, value in zip(borrowers, filled, strict=True):
                    runtime[i] = value
        # every value is ≤ a limited request or a min already stored: no widening
        if [runtime_col[row] for row in rows] != runtime:
            for i, row in enumerate(rows):
                before = runtime_col[row]
                if before != runtime[i]:
                    runtime_col[row] = runtime[i]
                    moved = changed[i]
                    if moved is None:
                        changed[i] = {key: before}
                    else:
                        moved[key] = before
        if [effective_col[row] for row in rows] != mins:
            for i, row in enumerate(rows):
                effective_col[row] = mins[i]
    return changed
