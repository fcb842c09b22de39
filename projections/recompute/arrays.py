"""Full recompute of the derived numbers on arrays (DESIGN §5 "Request and used",
"Runtime", "Available"; DECISIONS 122, 150, 156, 157).

The same rules as :mod:`.request` (bottom-up) and :mod:`.runtime` (top-down
water-filling), computed for every quota at once: quotas in breadth-first order
with each parent's children contiguous and in name order, one array per
resource per field; a level's sums are cumulative-sum differences over its
children's rows, and the water-fill of every (parent, resource) segment of a
level runs at once, round by round, the largest remainders broken by a stable
sort within each segment.

Exact, and no float is ever involved: a resource's arrays are int64 when a
bound on every sum of that resource (Σ pod sums, mins and allocatable) is
below 2^62, else Python integers (numpy ``object``); a product of two amounts
(min scaling, the water-fill's shares) is taken in int64 only when the
factors' maxima prove it fits, else in Python integers, its quotient and
remainder fitting the column again (DESIGN §9 bounds amounts at 2^62; sums
and products may go past int64). The pod sums are read from, and the results
written into, the state's quota columns (:mod:`.columns`) through each
level's row index: no per-quota dict is read or built (a resource whose
bound is past int64 has its columns widened to Python integers first).

:func:`recompute_arrays` declines (returns False, touching nothing) on a tree it
does not handle — a quota not reachable from a top (a cycle), or a child under
a quota that is not a parent, or a cap above 2^62 — and the caller then takes
the row path (``settle.recompute_all_rows``). The tree's walk and configuration
columns are :mod:`.shape`'s; exact integer arithmetic on columns, :mod:`.exact`'s.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..columns import KeyColumns, QuotaColumns
from ..pods import flush_all
from ..state import ProjectedState
from .exact import (
    INT64_SUMS,
    Column,
    as_dtype,
    by_segment,
    column_of,
    exact_sum,
    mul_divmod,
    peak,
    rank_order,
    segment_sums,
    zeros,
)
from .shape import Level, LevelTerms, TreeArrays, tree_arrays
from .totals import cluster_total, root_sums

_FIELDS = ("request", "limited_request", "used", "subtree", "local", "usage")
#: Also kept per level: each quota's own min, summed by the level above.
_MIN = "min"


def _keys(state: ProjectedState, tree: TreeArrays) -> dict[str, Any]:
    """Every resource named anywhere, sorted, with its columns' dtype: int64
    when Σ of its pod sums, twice its mins and allocatable (which bounds every
    sum and difference the recompute forms) is below 2^62."""
    store = state.columns
    bound: dict[str, int] = dict.fromkeys(tree.keys, 0)
    for key, value in state.allocatable.items():
        bound[key] = bound.get(key, 0) + value
    for terms in tree.terms:
        for key, columns in terms.columns.items():
            bound[key] += 2 * exact_sum(columns["min"])
    for sums in store.by_key:
        key = sums.key
        for name in ("pod_request", "pod_used"):
            column = getattr(sums, name)
            bound[key] = bound.get(key, 0) + (
                sum(column) if sums.wide else exact_sum(np.frombuffer(column, dtype=np.int64))
            )
    return {key: (np.int64 if bound[key] < INT64_SUMS else object) for key in sorted(bound)}


def _gather(columns: KeyColumns, name: str, rows: Any, dtype: Any) -> Column:
    """One field of one resource at ``rows``, as a column of ``dtype``."""
    column = getattr(columns, name)
    if columns.wide:
        return np.array(column, dtype=dtype)[rows]
    values = np.frombuffer(column, dtype=np.int64)[rows]
    return values if dtype is not object else values.astype(object)


def _scatter(columns: KeyColumns, name: str, rows: Any, values: Column) -> None:
    """``name[rows] = values`` in the state's columns (a wide resource: one by one)."""
    column = getattr(columns, name)
    if columns.wide:
        for row, value in zip(rows.tolist(), values.tolist(), strict=True):
            column[row] = value
    else:
        np.frombuffer(column, dtype=np.int64)[rows] = values


def recompute_arrays(state: ProjectedState) -> bool:
    """Recompute every derived number, as ``settle.recompute_all`` does; False
    (nothing changed) when the tree's shape is one this path declines."""
    tree = tree_arrays(state)
    if tree is None or any(terms.clipped for terms in tree.terms):
        return False
    levels = tree.levels
    quotas = state.quotas
    # a quota with unflushed pod changes is dirty (pods.mark_dirty)
    flush_all(state, state.dirty)
    keys = _keys(state, tree)
    store = state.columns
    store.add_keys(keys)
    for key, dtype in keys.items():
        if dtype is object:
            # sums may leave int64: this resource's columns hold Python ints
            store.widen(store.columns[key])
    # per level: field -> key -> column
    results: list[dict[str, dict[str, Column]]] = []
    below: dict[str, dict[str, Column]] | None = None
    for depth in range(len(levels) - 1, -1, -1):
        derived = _bottom_up(levels[depth], tree.terms[depth], store, keys, below)
        results.append(derived)
        below = derived
    results.reverse()
    for level, derived in zip(levels, results, strict=True):
        for name in _FIELDS:
            for key, column in derived[name].items():
                _scatter(store.columns[key], name, level.rows, column)
    # the cluster total and root's sums, as settle computes them
    state.cluster_total = cluster_total(state)
    root_sums(state)
    _top_down(state, tree, results, keys)
    state.touched.update(quotas)
    state.dirty.clear()
    state.refill.clear()
    state.total_dirty = False
    return True


def _bottom_up(
    level: Level,
    terms: LevelTerms,
    store: QuotaColumns,
    keys: dict[str, Any],
    below: dict[str, dict[str, Column]] | None,
) -> dict[str, dict[str, Column]]:
    nodes = level.nodes
    count = len(nodes)
    is_parent = terms.is_parent
    starts, ends = level.starts, level.ends
    out: dict[str, dict[str, Column]] = {name: {} for name in (*_FIELDS, _MIN)}
    for key, dtype in keys.items():
        config = terms.columns.get(key)
        nothing = zeros(count, dtype)
        if config is not None:
            mins, reserved, caps, lend = (
                as_dtype(config[name], dtype) for name in ("min", "reserved", "cap", "lend")
            )
            masked_out, has_cap, has_lending = (
                config["masked"],
                config["has_cap"],
                config["has_lend"],
            )
        else:
            mins = reserved = caps = lend = nothing
            masked_out = terms.has_max
            has_cap = np.zeros(count, dtype=bool)
            has_lending = terms.no_lent
        columns = store.columns[key]
        masked = np.where(masked_out, 0, _gather(columns, "pod_request", level.rows, dtype))
        pod_used = _gather(columns, "pod_used", level.rows, dtype)
        if below is not None:
            child_limited = segment_sums(below["limited_request"][key], starts, ends)
            child_used = segment_sums(below["used"][key], starts, ends)
            child_local = below["local"][key]
            contributed = segment_sums(below["subtree"][key] - child_local, starts, ends)
            charged = below["usage"][key] - child_local
            charged = np.where(charged > 0, charged, 0)
            child_usage = segment_sums(charged, starts, ends)
            child_mins = segment_sums(below[_MIN][key], starts, ends)
        else:
            child_limited = child_used = contributed = child_usage = child_mins = nothing
        summed: Column = np.where(is_parent, child_limited, masked)
        used = np.where(is_parent, child_used, pod_used)
        request: Column = np.where(summed < reserved, reserved, summed)
        limited = np.where(has_cap & (caps < request), caps, request)
        own = mins - child_mins
        subtree = np.where(is_parent, np.where(own > 0, own, 0) + contributed, mins)
        kept = subtree - lend
        local = np.where(has_lending & (kept > 0), kept, 0)
        usage = np.where(is_parent, child_usage, used)
        for name, column in zip(
            _FIELDS, (request, limited, used, subtree, local, usage), strict=True
        ):
            out[name][key] = column
        out[_MIN][key] = mins
    return out


def _top_down(
    state: ProjectedState,
    tree: TreeArrays,
    results: list[dict[str, dict[str, Column]]],
    keys: dict[str, Any],
) -> None:
    """Runtime and effective min of every connected quota but the builtins,
    level by level from root (:func:`.runtime.distribute` on every segment at
    once); disconnected quotas get none (DESIGN §8 rule 10)."""
    min_scaling = state.settings.min_scaling
    levels = tree.levels
    # level 0: root's segment is its non-builtin children (all connected)
    totals = {key: [state.cluster_total.get(key, 0)] for key in keys}
    parent_runtime: dict[str, Column] = {}
    above_member = np.zeros(0, dtype=bool)  # rows whose children share their runtime
    for depth, level in enumerate(levels):
        count = len(level.nodes)
        if depth == 0:
            # root's segment is its non-builtin children (all connected)
            segment = level.parent_at
        else:
            owners = np.flatnonzero(above_member)
            rank = np.cumsum(above_member) - 1
            parent_at = level.parent_at
            segment = np.where(above_member[parent_at], rank[parent_at], -1)
            totals = {key: parent_runtime[key][owners] for key in keys}
        member = segment >= 0
        rows = np.flatnonzero(member)
        runtimes: dict[str, Column] = {}
        effectives: dict[str, Column] = {}
        derived = results[depth]
        terms = tree.terms[depth]
        seg_of = segment[rows]
        for key, dtype in keys.items():
            runtime = zeros(count, dtype)
            effective = zeros(count, dtype)
            if len(rows):
                config = terms.columns.get(key)
                if config is not None:
                    configured = (
                        as_dtype(config["weight"][rows], dtype),
                        config["has_weight"][rows],
                    )
                else:
                    configured = (zeros(len(rows), dtype), np.zeros(len(rows), dtype=bool))
                total = totals[key]
                runtime[rows], effective[rows] = _distribute_key(
                    seg_of,
                    total if isinstance(total, np.ndarray) else column_of(total, dtype),
                    derived[_MIN][key][rows],
                    derived["limited_request"][key][rows],
                    configured,
                    min_scaling,
                )
            runtimes[key] = runtime
            effectives[key] = effective
        # non-members (orphans; system and default) get none (DECISIONS 6)
        for key in keys:
            columns = state.columns.columns[key]
            _scatter(columns, "runtime", level.rows, runtimes[key])
            _scatter(columns, "effective_min", level.rows, effectives[key])
        # a child is in a segment when its parent is a member (root's children are)
        above_member = member & terms.is_parent
        parent_runtime = runtimes


def _distribute_key(
    seg: Any,
    totals: Column,
    mins: Column,
    limited: Column,
    configured: tuple[Column, Any],
    min_scaling: bool,
) -> tuple[Column, Column]:
    """One resource of every segment of a level: ``seg[i]`` is row i's segment
    (rows of a segment contiguous, in name order), ``totals[s]`` the amount
    shared in segment s. Returns (runtime, effective min) per row, as
    :func:`.runtime.distribute` gives them."""
    if mins.dtype != object:
        weights = np.where(configured[1], configured[0], totals[seg])
        if peak(weights) * len(weights) >= INT64_SUMS:
            # configured weights (each ≤ 2^62) may sum past int64 in a segment:
            # this resource's level in Python integers; the runtimes and
            # effective mins (≤ a limited request or a min) fit int64 again
            wide_runtime, wide_effective = _distribute_key(
                seg,
                totals.astype(object),
                mins.astype(object),
                limited.astype(object),
                (configured[0].astype(object), configured[1]),
                min_scaling,
            )
            return wide_runtime.astype(np.int64), wide_effective.astype(np.int64)
    segments = len(totals)
    amount = totals[seg]
    min_sum = by_segment(mins, seg, segments)
    effective = mins.copy()
    if min_scaling:
        shrunk = np.flatnonzero(amount < min_sum[seg])
        if len(shrunk):
            effective[shrunk] = mul_divmod(amount[shrunk], mins[shrunk], min_sum[seg][shrunk])[0]
    borrower = (limited > effective).astype(bool)
    runtime = np.where(borrower, effective, limited)
    pool = totals - by_segment(runtime, seg, segments)
    weight = np.where(configured[1], configured[0], amount)
    active = borrower & (weight > 0).astype(bool) & (runtime < limited).astype(bool)
    while True:
        running = (pool > 0).astype(bool)
        eligible = active & running[seg]
        if not eligible.any():
            break
        rows = np.flatnonzero(eligible)
        row_seg = seg[rows]
        total_weight = by_segment(weight[rows], row_seg, segments)
        share, remainder = mul_divmod(weight[rows], pool[row_seg], total_weight[row_seg])
        leftover = pool - by_segment(share, row_seg, segments)
        # the leftover units go one each to the largest remainders of each
        # segment, ties to the smaller row (name order): rank within segment
        order = rank_order(row_seg, remainder)
        sorted_seg = row_seg[order]
        index = np.arange(len(order))
        first = np.ones(len(order), dtype=bool)
        first[1:] = sorted_seg[1:] != sorted_seg[:-1]
        rank = index - np.maximum.accumulate(np.where(first, index, 0))
        lucky = order[((rank < leftover[sorted_seg]) & (remainder[order] > 0)).astype(bool)]
        share[lucky] += 1
        grown = runtime[rows] + share
        cap = limited[rows]
        hit = (grown >= cap).astype(bool)
        excess = by_segment(np.where(hit, grown - cap, 0), row_seg, segments)
        runtime[rows] = np.where(hit, cap, grown)
        active[rows] = ~hit
        ran = np.zeros(segments, dtype=bool)
        ran[row_seg] = True
        pool = np.where(ran, excess, 0)
    return runtime, effective
