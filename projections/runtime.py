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

from .columns import QuotaColumns
from .request import terms_for
from .resources import fill_rounds
from .state import ProjectedState, QuotaNode

#: Per resource, what a group's fill reads of its children's configurations:
#: their mins in name order, Σ of them, their configured shared weights (None:
#: not configured, the amount shared stands in, §8 rule 2) and whether every
#: configured weight is positive.
KeyFacts = tuple[list[int], int, list[int | None], bool]


class GroupFill:
    """One parent's children as its fill reads them, for as long as their
    configurations, the tree's shape and the state's columns stay the same
    (the settle drops it when the parent is filled whole): the children in
    name order, their rows, and per resource their :data:`KeyFacts`,
    computed on first use."""

    __slots__ = ("children", "facts", "mins", "rows", "store", "weights")

    def __init__(self, store: QuotaColumns, children: list[QuotaNode]) -> None:
        self.store = store
        self.children = children
        self.rows = [child.row for child in children]
        self.mins = [child.config.min for child in children]
        self.weights = [terms_for(child).weights for child in children]
        self.facts: dict[str, KeyFacts] = {}

    def key_facts(self, key: str) -> KeyFacts:
        facts = self.facts.get(key)
        if facts is None:
            mins = [amounts.get(key, 0) for amounts in self.mins]
            weights = [amounts.get(key) for amounts in self.weights]
            weighted = all(weight is None or weight > 0 for weight in weights)
            facts = self.facts[key] = (mins, sum(mins), weights, weighted)
        return facts


def distribute(
    state: ProjectedState,
    total: Mapping[str, int] | int,
    children: list[QuotaNode],
    min_scaling: bool,
    keys: Collection[str] | None = None,
    fill: GroupFill | None = None,
) -> list[dict[str, int] | None]:
    """Runtime and effective min of each child of one parent, into the
    children's rows of the state's columns.

    ``children`` must be sorted by name (the water-fill's tie-break). The
    amount shared is ``total`` per resource, or, as an int, the runtime row of
    the parent. Only the resources in ``keys`` are filled when given (the
    others' inputs did not change, so neither did their numbers). ``fill``
    is the group's :class:`GroupFill` if the caller keeps one (it must be of
    these children and the state's columns). Returns, aligned with
    ``children``, the resources whose runtime changed with the runtime each
    had before (None when none changed).
    """
    store = state.columns
    if fill is None or fill.store is not store:
        fill = GroupFill(store, children)
    count = len(children)
    rows = fill.rows
    changed: list[dict[str, int] | None] = [None] * count
    known = fill.facts
    for columns in store.by_key:
        key = columns.key
        if keys is not None and key not in keys:
            continue
        amount = columns.runtime[total] if isinstance(total, int) else total.get(key, 0)
        facts = known.get(key)
        if facts is None:
            facts = fill.key_facts(key)
        mins, min_sum, weight_list, weighted = facts
        limited = columns.limited_request
        wants = [limited[row] for row in rows]
        if min_scaling and amount < min_sum:
            mins = [amount * value // min_sum for value in mins]
        runtime: list[int]
        if min_sum == 0 and not any(wants):
            runtime = mins = wants  # nothing asked, nothing guaranteed: all 0
        elif amount >= sum(wants) and (
            (weighted and amount > 0)
            or all(
                (amount if weight_list[i] is None else weight_list[i]) > 0  # type: ignore[operator]
                for i in range(count)
                if wants[i] > mins[i]
            )
        ):
            # enough for every limited request and every borrower weighted:
            # the water-fill caps each borrower at its limited request (step 3)
            runtime = wants
        else:
            runtime = water_filled(amount, wants, mins, weight_list)
        # every value is ≤ a limited request or a min already stored: no widening
        runtime_col, effective_col = columns.runtime, columns.effective_min
        for i in range(count):
            row = rows[i]
            value = runtime[i]
            before = runtime_col[row]
            if before != value:
                runtime_col[row] = value
                moved = changed[i]
                if moved is None:
                    changed[i] = {key: before}
                else:
                    moved[key] = before
            value = mins[i]
            if effective_col[row] != value:
                effective_col[row] = value
    return changed


def water_filled(
    amount: int, wants: list[int], mins: list[int], weight_list: list[int | None]
) -> list[int]:
    """Steps 2-3 of the fill for one resource (DESIGN §5 "Runtime"): each
    child's runtime, from its limited request, its effective min and its
    configured weight (None: the amount). What ``water_fill_ordered`` gives
    the borrowers (tests/projections/test_water_fill.py pins it against the
    rule), fused with picking them: a borrower starts at its effective min,
    the pool is what is left, and the weighted borrowers are filled by
    rounds of largest-remainder splits (ties to the smaller position, i.e.
    name) until the pool is spent or all are capped at their requests."""
    runtime = list(wants)
    pool = amount
    active: list[int] = []
    weights: list[int] = []
    need = 0
    for i, want in enumerate(wants):
        eff = mins[i]
        if want > eff:
            runtime[i] = eff
            pool -= eff
            weight = weight_list[i]
            if weight is None:
                weight = amount
            if weight > 0:
                active.append(i)
                weights.append(weight)
                need += want - eff
        else:
            pool -= want
    if pool <= 0 or not active:
        return runtime
    if pool >= need:
        for i in active:
            runtime[i] = wants[i]
        return runtime
    return fill_rounds(pool, runtime, wants, active, weights)
