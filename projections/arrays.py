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
the row path (``settle.recompute_all_rows``).
"""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import numpy as np

from quotaledger.events.model import QuotaUpserted

from .columns import KeyColumns, QuotaColumns
from .pods import flush_sums
from .recompute.totals import cluster_total, root_sums
from .request import terms_for
from .state import BUILTIN, ROOT, ProjectedState, QuotaNode

Column = Any  # a 1-D numpy array of Python ints (dtype object)

_FIELDS = ("request", "limited_request", "used", "subtree", "local", "usage")
#: Also kept per level: each quota's own min, summed by the level above.
_MIN = "min"


#: Below this, int64 holds every sum and difference of a resource's amounts.
_INT64_SUMS = 2**62
_INT64_MAX = 2**63 - 1


def _zeros(count: int, dtype: Any = object) -> Column:
    if dtype is object:
        out = np.empty(count, dtype=object)
        out.fill(0)
        return out
    return np.zeros(count, dtype=dtype)


def _column(values: list[int], dtype: Any = object) -> Column:
    if dtype is object:
        out = np.empty(len(values), dtype=object)
        out[:] = values
        return out
    return np.array(values, dtype=dtype)


def _segment_sums(values: Column, starts: Column, ends: Column) -> Column:
    """Σ values[starts[i]:ends[i]] for each i (cumulative-sum differences)."""
    total = _zeros(len(values) + 1, values.dtype if values.dtype != object else object)
    if len(values):
        total[1:] = np.cumsum(values)
    return total[ends] - total[starts]


def _peak(values: Column) -> int:
    return int(np.abs(values).max()) if len(values) else 0


def _mul_divmod(left: Column, right: Column, divisor: Column) -> tuple[Column, Column]:
    """(left·right // divisor, left·right % divisor), exact: in int64 when the
    maxima prove the product fits, else in Python integers (the quotient and
    remainder are brought back to the columns' dtype: both fit it)."""
    if left.dtype != object and _peak(left) * _peak(right) <= _INT64_MAX:
        product = left * right
        quotient = product // divisor
        return quotient, product - quotient * divisor
    if left.dtype != object:
        corrected = _estimate_divmod(left, right, divisor)
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


def _estimate_divmod(left: Column, right: Column, divisor: Column) -> tuple[Column, Column] | None:
    """``_mul_divmod`` of non-negative int64 columns whose product may leave
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
    if _peak(divisor) >= _INT64_SUMS:
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


class _Level:
    """The quotas of one breadth-first level, grouped by parent."""

    def __init__(self, nodes: list[QuotaNode]) -> None:
        self.nodes = nodes
        #: each node's row of the state's columns (stable while the shape is)
        self.rows = np.array([node.row for node in nodes], dtype=np.intp)
        # rows of each node's children in the next level
        self.child_start: list[int] = []
        self.child_end: list[int] = []
        self.starts = self.ends = np.zeros(0, dtype=np.intp)
        #: each node's parent's position in the level above (-1: none there)
        self.parent_at = np.full(len(nodes), -1, dtype=np.intp)

    def close(self) -> None:
        """The child ranges as arrays, once they are all known."""
        self.starts = np.array(self.child_start, dtype=np.intp)
        self.ends = np.array(self.child_end, dtype=np.intp)


class _Terms:
    """A level's configuration numbers per resource, as int64 columns (every
    configured amount is ≤ 2^62, DESIGN §9; caps are clipped there, which caps
    nothing more). Patched row by row when a quota's numbers change."""

    FIELDS = (
        "min",
        "masked",
        "reserved",
        "cap",
        "has_cap",
        "lend",
        "has_lend",
        "weight",
        "has_weight",
    )

    def __init__(self, nodes: list[QuotaNode], keys: list[str]) -> None:
        self.configs = [node.config for node in nodes]
        self.is_parent = np.array([node.is_parent for node in nodes], dtype=bool)
        #: for a resource no configuration names: a quota with a max masks it
        #: out of its pods' request, an allow_lent false quota keeps it all local
        self.has_max = np.array([node.config.max is not None for node in nodes], dtype=bool)
        self.no_lent = np.array([not node.config.allow_lent for node in nodes], dtype=bool)
        self.keys = keys
        every = [terms_for(node) for node in nodes]
        #: rows whose cap (max, or min + borrowing_limit) is above 2^62: a
        #: request (a sum of pods) may exceed that too, so a clipped cap would
        #: decide; such a tree takes the exact row path (``recompute_arrays``)
        self.clipped: set[int] = {
            row
            for row, terms in enumerate(every)
            if any(cap > _INT64_SUMS for cap in terms.caps.values())
        }
        self.columns: dict[str, dict[str, Any]] = {}
        for key in keys:
            caps = [terms.caps.get(key) for terms in every]
            lends = [terms.lending is not None and key in terms.lending for terms in every]
            weights = [terms.weights.get(key) for terms in every]
            int64 = {
                "min": [terms.config.min.get(key, 0) for terms in every],
                "reserved": [terms.reserved.get(key, 0) for terms in every],
                "cap": [0 if cap is None else min(cap, _INT64_SUMS) for cap in caps],
                "lend": [
                    terms.lending.get(key, 0) if lend and terms.lending is not None else 0
                    for terms, lend in zip(every, lends, strict=True)
                ],
                "weight": [0 if weight is None else weight for weight in weights],
            }
            flags = {
                "masked": [terms.mask is not None and key not in terms.mask for terms in every],
                "has_cap": [cap is not None for cap in caps],
                "has_lend": lends,
                "has_weight": [weight is not None for weight in weights],
            }
            columns = {name: np.array(values, dtype=np.int64) for name, values in int64.items()}
            columns.update({name: np.array(values, dtype=bool) for name, values in flags.items()})
            self.columns[key] = columns

    def _values(self, node: QuotaNode) -> dict[str, tuple[Any, ...]]:
        """Per resource, one row's values in :attr:`FIELDS` order."""
        terms = terms_for(node)
        mask, lending, config_min = terms.mask, terms.lending, node.config.min
        out: dict[str, tuple[Any, ...]] = {}
        for key in self.keys:
            cap = terms.caps.get(key)
            has_lend = lending is not None and key in lending
            weight = terms.weights.get(key)
            out[key] = (
                config_min.get(key, 0),
                mask is not None and key not in mask,
                terms.reserved.get(key, 0),
                0 if cap is None else min(cap, _INT64_SUMS),
                cap is not None,
                lending.get(key, 0) if has_lend and lending is not None else 0,
                has_lend,
                0 if weight is None else weight,
                weight is not None,
            )
        return out

    def patch(self, row: int, node: QuotaNode) -> None:
        """Bring one row up to date with its quota's configuration."""
        self.configs[row] = node.config
        self.has_max[row] = node.config.max is not None
        self.no_lent[row] = not node.config.allow_lent
        if any(cap > _INT64_SUMS for cap in terms_for(node).caps.values()):
            self.clipped.add(row)
        else:
            self.clipped.discard(row)
        for key, values in self._values(node).items():
            columns = self.columns[key]
            for name, value in zip(self.FIELDS, values, strict=True):
                columns[name][row] = value


class TreeArrays:
    """The tree's shape as :func:`recompute_arrays` walks it, and each level's
    configuration columns: kept on the state (``ProjectedState.tree_arrays``)
    while ``tree_version`` stays the same, patched when a quota's numbers
    change (its configuration object is another), rebuilt when the shape does."""

    def __init__(self, version: int, levels: list[_Level], keys: list[str]) -> None:
        self.version = version
        self.levels = levels
        self.keys = keys
        self.terms = [_Terms(level.nodes, keys) for level in levels]
        #: quota name -> (level, position in it)
        self.where = {
            node.name: (depth, row)
            for depth, level in enumerate(levels)
            for row, node in enumerate(level.nodes)
        }


def _config_keys(state: ProjectedState) -> list[str]:
    keys: set[str] = set()
    for node in state.quotas.values():
        config = node.config
        keys.update(config.min)
        for limits in (
            config.max,
            config.shared_weight,
            config.lending_limit,
            config.borrowing_limit,
        ):
            if limits is not None:
                keys.update(limits)
    return sorted(keys)


def _config_names(config: QuotaUpserted) -> set[str]:
    """Every resource a configuration names."""
    named = set(config.min)
    for limits in (config.max, config.shared_weight, config.lending_limit, config.borrowing_limit):
        if limits is not None:
            named.update(limits)
    return named


def _tree_arrays(state: ProjectedState) -> TreeArrays | None:
    """The state's :class:`TreeArrays`, brought up to date (None: a shape this path declines)."""
    cached = state.tree_arrays
    if isinstance(cached, TreeArrays) and cached.version == state.tree_version:
        # only a numbers-only edit (quota_tree.put_quota) gives a quota another
        # configuration without changing the shape
        keys = set(cached.keys)
        fresh = True
        for name in sorted(state.reconfigured):
            place = cached.where.get(name)
            if place is None:
                continue
            depth, row = place
            node = cached.levels[depth].nodes[row]
            if node.config is not cached.terms[depth].configs[row]:
                if not _config_names(node.config) <= keys:
                    fresh = False  # a new resource: rebuild
                    break
                cached.terms[depth].patch(row, node)
        state.reconfigured.clear()
        if fresh:
            return cached
    levels = _levels(state)
    if levels is None:
        state.tree_arrays = None
        return None
    built = TreeArrays(state.tree_version, levels, _config_keys(state))
    state.tree_arrays = built
    state.reconfigured.clear()
    return built


def _levels(state: ProjectedState) -> list[_Level] | None:
    quotas = state.quotas
    tops = sorted(
        name for name, node in quotas.items() if node.parent == ROOT or node.parent not in quotas
    )
    levels: list[_Level] = []
    current = [quotas[name] for name in tops]
    seen = len(current)
    while current:
        level = _Level(current)
        following: list[QuotaNode] = []
        for node in current:
            level.child_start.append(len(following))
            children = state.children_of.get(node.name)
            if children:
                if not node.is_parent:
                    return None
                following.extend(quotas[child] for child in sorted(children) if child in quotas)
            level.child_end.append(len(following))
        level.close()
        levels.append(level)
        seen += len(following)
        current = following
    if seen != len(quotas):
        return None
    for above, level in pairwise(levels):
        level.parent_at = np.repeat(np.arange(len(above.nodes)), above.ends - above.starts)
    levels[0].parent_at = np.array(
        [0 if node.parent == ROOT and node.name not in BUILTIN else -1 for node in levels[0].nodes],
        dtype=np.intp,
    )
    return levels


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
            bound[key] += 2 * _total(columns["min"])
    for sums in store.by_key:
        key = sums.key
        for name in ("pod_request", "pod_used"):
            column = getattr(sums, name)
            bound[key] = bound.get(key, 0) + (
                sum(column) if sums.wide else _total(np.frombuffer(column, dtype=np.int64))
            )
    return {key: (np.int64 if bound[key] < _INT64_SUMS else object) for key in sorted(bound)}


def _total(values: Any) -> int:
    """Σ of an int64 column, exact (in int64 when its peak proves the sum fits)."""
    if _peak(values) * len(values) < _INT64_SUMS:
        return int(values.sum())
    return int(values.sum(dtype=object))


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
    tree = _tree_arrays(state)
    if tree is None or any(terms.clipped for terms in tree.terms):
        return False
    levels = tree.levels
    quotas = state.quotas
    # a quota with unflushed pod changes is dirty (pods.mark_dirty)
    for name in state.dirty:
        node = quotas.get(name)
        if node is not None and (node.sum_log or node.sums_stale):
            flush_sums(state, node)
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
    level: _Level,
    terms: _Terms,
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
        zeros = _zeros(count, dtype)
        if config is not None:
            mins, reserved, caps, lend = (
                _as(config[name], dtype) for name in ("min", "reserved", "cap", "lend")
            )
            masked_out, has_cap, has_lending = (
                config["masked"],
                config["has_cap"],
                config["has_lend"],
            )
        else:
            mins = reserved = caps = lend = zeros
            masked_out = terms.has_max
            has_cap = np.zeros(count, dtype=bool)
            has_lending = terms.no_lent
        columns = store.columns[key]
        masked = np.where(masked_out, 0, _gather(columns, "pod_request", level.rows, dtype))
        pod_used = _gather(columns, "pod_used", level.rows, dtype)
        if below is not None:
            child_limited = _segment_sums(below["limited_request"][key], starts, ends)
            child_used = _segment_sums(below["used"][key], starts, ends)
            child_local = below["local"][key]
            contributed = _segment_sums(below["subtree"][key] - child_local, starts, ends)
            charged = below["usage"][key] - child_local
            charged = np.where(charged > 0, charged, 0)
            child_usage = _segment_sums(charged, starts, ends)
            child_mins = _segment_sums(below[_MIN][key], starts, ends)
        else:
            child_limited = child_used = contributed = child_usage = child_mins = zeros
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


def _as(column: Any, dtype: Any) -> Column:
    return column if dtype is not object else column.astype(object)


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
            runtime = _zeros(count, dtype)
            effective = _zeros(count, dtype)
            if len(rows):
                config = terms.columns.get(key)
                if config is not None:
                    configured = (_as(config["weight"][rows], dtype), config["has_weight"][rows])
                else:
                    configured = (_zeros(len(rows), dtype), np.zeros(len(rows), dtype=bool))
                total = totals[key]
                runtime[rows], effective[rows] = _distribute_key(
                    seg_of,
                    total if isinstance(total, np.ndarray) else _column(total, dtype),
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
        if _peak(weights) * len(weights) >= _INT64_SUMS:
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
    min_sum = _by_segment(mins, seg, segments)
    effective = mins.copy()
    if min_scaling:
        shrunk = np.flatnonzero(amount < min_sum[seg])
        if len(shrunk):
            effective[shrunk] = _mul_divmod(amount[shrunk], mins[shrunk], min_sum[seg][shrunk])[0]
    borrower = (limited > effective).astype(bool)
    runtime = np.where(borrower, effective, limited)
    pool = totals - _by_segment(runtime, seg, segments)
    weight = np.where(configured[1], configured[0], amount)
    active = borrower & (weight > 0).astype(bool) & (runtime < limited).astype(bool)
    while True:
        running = (pool > 0).astype(bool)
        eligible = active & running[seg]
        if not eligible.any():
            break
        rows = np.flatnonzero(eligible)
        row_seg = seg[rows]
        total_weight = _by_segment(weight[rows], row_seg, segments)
        share, remainder = _mul_divmod(weight[rows], pool[row_seg], total_weight[row_seg])
        leftover = pool - _by_segment(share, row_seg, segments)
        # the leftover units go one each to the largest remainders of each
        # segment, ties to the smaller row (name order): rank within segment
        order = _rank_order(row_seg, remainder)
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
        excess = _by_segment(np.where(hit, grown - cap, 0), row_seg, segments)
        runtime[rows] = np.where(hit, cap, grown)
        active[rows] = ~hit
        ran = np.zeros(segments, dtype=bool)
        ran[row_seg] = True
        pool = np.where(ran, excess, 0)
    return runtime, effective


def _rank_order(row_seg: Any, remainder: Column) -> Any:
    """Positions sorted by (segment, remainder descending, position): a stable
    sort on the remainder, then a stable sort on the segment."""
    if remainder.dtype == object:
        by_remainder = np.array(
            sorted(range(len(remainder)), key=lambda i: -remainder[i]), dtype=np.intp
        )
    else:
        by_remainder = np.argsort(-remainder, kind="stable")
    return by_remainder[np.argsort(row_seg[by_remainder], kind="stable")]


def _by_segment(values: Column, seg: Any, segments: int) -> Column:
    """Σ values per segment (``seg[i]`` the segment of row i)."""
    out = _zeros(segments, values.dtype if values.dtype != object else object)
    np.add.at(out, seg, values)
    return out
