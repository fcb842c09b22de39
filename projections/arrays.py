"""Full recompute of the derived numbers on arrays (DESIGN §5 "Request and used",
"Runtime", "Available"; issue #11).

The same rules as :mod:`.request` (bottom-up) and :mod:`.runtime` (top-down
water-filling), computed for every quota at once: quotas in breadth-first order
with each parent's children contiguous and in name order, one array per
resource per field; a level's sums are cumulative-sum differences over its
children's rows, and the water-fill of every (parent, resource) segment of a
level runs at once, round by round, the largest remainders broken by a stable
sort within each segment.

Exact: every array holds Python integers (numpy ``object`` dtype), so no sum or
product can overflow (amounts are bounded at 2^62, DESIGN §9; products of two
are not) and no float is ever involved. The results are written back to the
quotas' dictionaries, which stay the store every reader uses.

:func:`recompute_arrays` declines (returns False, touching nothing) on a tree it
does not handle — a quota not reachable from a top (a cycle), or a child under
a quota that is not a parent — and the caller then takes the dictionary path.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .derive import _cluster_total, _root_sums
from .request import terms_for
from .resources import RL
from .state import BUILTIN, ROOT, ProjectedState, QuotaNode
from .tree import flush_sums

Column = Any  # a 1-D numpy array of Python ints (dtype object)

_FIELDS = ("request", "limited_request", "used", "subtree", "local", "usage")
#: Also kept per level: each quota's own min, summed by the level above.
_MIN = "min"


def _zeros(count: int) -> Column:
    out = np.empty(count, dtype=object)
    out.fill(0)
    return out


def _column(values: list[int]) -> Column:
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def _segment_sums(values: Column, starts: Column, ends: Column) -> Column:
    """Σ values[starts[i]:ends[i]] for each i (cumulative-sum differences)."""
    total = _zeros(len(values) + 1)
    if len(values):
        total[1:] = np.cumsum(values)
    return total[ends] - total[starts]


class _Level:
    """The quotas of one breadth-first level, grouped by parent."""

    def __init__(self, nodes: list[QuotaNode]) -> None:
        self.nodes = nodes
        # rows of each node's children in the next level
        self.child_start: list[int] = []
        self.child_end: list[int] = []


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
        levels.append(level)
        seen += len(following)
        current = following
    if seen != len(quotas):
        return None
    return levels


def _keys(state: ProjectedState) -> list[str]:
    keys: set[str] = set(state.allocatable)
    for node in state.quotas.values():
        config = node.config
        keys.update(node.pod_request, node.pod_used, config.min)
        for limits in (config.max, config.shared_weight, config.lending_limit):
            if limits is not None:
                keys.update(limits)
        if config.borrowing_limit is not None:
            keys.update(config.borrowing_limit)
    return sorted(keys)


def recompute_arrays(state: ProjectedState) -> bool:
    """Recompute every derived number, as ``derive.recompute_all`` does; False
    (nothing changed) when the tree's shape is one this path declines."""
    levels = _levels(state)
    if levels is None:
        return False
    quotas = state.quotas
    for node in quotas.values():
        if node.sum_log or node.sums_stale:
            flush_sums(state, node)
    keys = _keys(state)
    # per level: field -> key -> column
    results: list[dict[str, dict[str, Column]]] = []
    below: dict[str, dict[str, Column]] | None = None
    for depth in range(len(levels) - 1, -1, -1):
        level = levels[depth]
        derived = _bottom_up(level, keys, below)
        results.append(derived)
        below = derived
    results.reverse()
    for level, derived in zip(levels, results, strict=True):
        lists = {name: {key: derived[name][key].tolist() for key in keys} for name in _FIELDS}
        for row, node in enumerate(level.nodes):
            node.request = _sparse(keys, lists["request"], row)
            node.limited_request = _sparse(keys, lists["limited_request"], row)
            node.used = _sparse(keys, lists["used"], row)
            node.subtree = _sparse(keys, lists["subtree"], row)
            node.local = _sparse(keys, lists["local"], row)
            node.usage = _sparse(keys, lists["usage"], row)
    # the cluster total and root's sums, as settle computes them
    state.cluster_total = _cluster_total(state)
    _root_sums(state)
    _top_down(state, levels, results, keys)
    state.touched.update(quotas)
    state.dirty.clear()
    state.refill.clear()
    state.total_dirty = False
    return True


def _bottom_up(
    level: _Level, keys: list[str], below: dict[str, dict[str, Column]] | None
) -> dict[str, dict[str, Column]]:
    nodes = level.nodes
    count = len(nodes)
    terms = [terms_for(node) for node in nodes]
    is_parent = _column([1 if node.is_parent else 0 for node in nodes]).astype(bool)
    starts = np.array(level.child_start, dtype=np.intp)
    ends = np.array(level.child_end, dtype=np.intp)
    out: dict[str, dict[str, Column]] = {name: {} for name in (*_FIELDS, _MIN)}
    for key in keys:
        mins = _column([node.config.min.get(key, 0) for node in nodes])
        masked = _column(
            [
                node.pod_request.get(key, 0) if term.mask is None or key in term.mask else 0
                for node, term in zip(nodes, terms, strict=True)
            ]
        )
        pod_used = _column([node.pod_used.get(key, 0) for node in nodes])
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
            child_limited = child_used = contributed = child_usage = child_mins = _zeros(count)
        summed: Column = np.where(is_parent, child_limited, masked)
        used = np.where(is_parent, child_used, pod_used)
        reserved = _column([term.reserved.get(key, 0) for term in terms])
        request: Column = np.where(summed < reserved, reserved, summed)
        capped = [term.caps.get(key) for term in terms]
        has_cap = np.array([cap is not None for cap in capped], dtype=bool)
        caps = _column([0 if cap is None else cap for cap in capped])
        limited = np.where(has_cap & (caps < request), caps, request)
        own = mins - child_mins
        subtree = np.where(is_parent, np.where(own > 0, own, 0) + contributed, mins)
        lending = [term.lending for term in terms]
        has_lending = np.array(
            [limit is not None and key in limit for limit in lending], dtype=bool
        )
        lend = _column([limit.get(key, 0) if limit is not None else 0 for limit in lending])
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
    levels: list[_Level],
    results: list[dict[str, dict[str, Column]]],
    keys: list[str],
) -> None:
    """Runtime and effective min of every connected quota but the builtins,
    level by level from root (:func:`.runtime.distribute` on every segment at
    once); disconnected quotas get none (DESIGN §8 rule 10)."""
    min_scaling = state.settings.min_scaling
    # level 0: root's segment is its non-builtin children (all connected)
    tops = levels[0].nodes
    in_segment = [node.parent == ROOT and node.name not in BUILTIN for node in tops]
    segment = [0 if member else -1 for member in in_segment]
    totals = {key: [state.cluster_total.get(key, 0)] for key in keys}
    parent_runtime: dict[str, list[int]] | None = None
    above_member: list[bool] = []  # rows of the level above whose children share its runtime
    for depth, level in enumerate(levels):
        nodes = level.nodes
        if depth > 0:
            above = levels[depth - 1]
            assert parent_runtime is not None
            segment = [-1] * len(nodes)
            seg_totals: dict[str, list[int]] = {key: [] for key in keys}
            count = 0
            for row, (start, end) in enumerate(
                zip(above.child_start, above.child_end, strict=True)
            ):
                if start == end or not above_member[row]:
                    continue
                for child in range(start, end):
                    segment[child] = count
                for key in keys:
                    seg_totals[key].append(parent_runtime[key][row])
                count += 1
            totals = seg_totals
        member = [seg >= 0 for seg in segment]
        runtime_lists: dict[str, list[int]] = {}
        effective_lists: dict[str, list[int]] = {}
        rows = [row for row, seg in enumerate(segment) if seg >= 0]
        if rows:
            derived = results[depth]
            weights = [terms_for(nodes[row]).weights for row in rows]
            seg_of = np.array([segment[row] for row in rows], dtype=np.intp)
            for key in keys:
                limited = derived["limited_request"][key][rows]
                mins = derived[_MIN][key][rows]
                runtime, effective = _distribute_key(
                    seg_of,
                    _column(totals[key]),
                    mins,
                    limited,
                    [weight.get(key) for weight in weights],
                    min_scaling,
                )
                full_runtime = [0] * len(nodes)
                full_effective = [0] * len(nodes)
                for i, row in enumerate(rows):
                    full_runtime[row] = runtime[i]
                    full_effective[row] = effective[i]
                runtime_lists[key] = full_runtime
                effective_lists[key] = full_effective
        else:
            for key in keys:
                runtime_lists[key] = [0] * len(nodes)
                effective_lists[key] = [0] * len(nodes)
        for row, node in enumerate(nodes):
            if member[row]:
                node.runtime = _sparse(keys, runtime_lists, row)
                node.effective_min = _sparse(keys, effective_lists, row)
            elif node.name not in BUILTIN or node.parent != ROOT:
                node.runtime, node.effective_min = {}, {}
        # a child is in a segment when its parent is a member (root's children are)
        above_member = [member[row] and nodes[row].is_parent for row in range(len(nodes))]
        parent_runtime = runtime_lists


def _distribute_key(
    seg: Any,
    totals: Column,
    mins: Column,
    limited: Column,
    configured: list[int | None],
    min_scaling: bool,
) -> tuple[list[int], list[int]]:
    """One resource of every segment of a level: ``seg[i]`` is row i's segment,
    ``totals[s]`` the amount shared in segment s. Returns (runtime, effective
    min) per row, as :func:`.runtime.distribute` gives them."""
    count = len(seg)
    segments = len(totals)
    amount = totals[seg]
    min_sum = _by_segment(mins, seg, segments)
    scaled = np.zeros(count, dtype=bool)
    if min_scaling:
        scaled = (amount < min_sum[seg]).astype(bool)
    effective = mins.copy()
    if scaled.any():
        shrunk = np.nonzero(scaled)[0]
        effective[shrunk] = (amount[shrunk] * mins[shrunk]) // min_sum[seg][shrunk]
    borrower = (limited > effective).astype(bool)
    runtime = np.where(borrower, effective, limited)
    pool = totals - _by_segment(runtime, seg, segments)
    weight = _column([amount[i] if value is None else value for i, value in enumerate(configured)])
    active = borrower & (weight > 0).astype(bool) & (runtime < limited).astype(bool)
    while True:
        running = (pool > 0).astype(bool)
        eligible = active & running[seg]
        if not eligible.any():
            break
        total_weight = _by_segment(np.where(eligible, weight, 0), seg, segments)
        rows = np.nonzero(eligible)[0]
        product = weight[rows] * pool[seg[rows]]
        share = product // total_weight[seg[rows]]
        remainder = product - share * total_weight[seg[rows]]
        given = _by_segment_rows(share, seg[rows], segments)
        leftover = (pool - given).tolist()
        ranked = sorted(
            (int(seg[row]), -rem, int(row))
            for row, rem in zip(rows.tolist(), remainder.tolist(), strict=True)
            if rem
        )
        extra = np.zeros(len(rows), dtype=object)
        extra.fill(0)
        position = {int(row): i for i, row in enumerate(rows.tolist())}
        for segment_id, _, row in ranked:
            if leftover[segment_id] > 0:
                leftover[segment_id] -= 1
                extra[position[row]] = 1
        share = share + extra
        grown = runtime[rows] + share
        cap = limited[rows]
        hit = (grown >= cap).astype(bool)
        excess = _by_segment_rows(np.where(hit, grown - cap, 0), seg[rows], segments)
        runtime[rows] = np.where(hit, cap, grown)
        still = active.copy()
        still[rows] = ~hit
        active = still
        ran = np.zeros(segments, dtype=bool)
        ran[seg[rows]] = True
        pool = np.where(ran, excess, 0)
    return runtime.tolist(), effective.tolist()


def _by_segment(values: Column, seg: Any, segments: int) -> Column:
    """Σ values per segment (rows of a segment are contiguous, in order)."""
    return _by_segment_rows(values, seg, segments)


def _by_segment_rows(values: Column, seg: Any, segments: int) -> Column:
    out = _zeros(segments)
    np.add.at(out, seg, values)
    return out


def _sparse(keys: list[str], columns: dict[str, list[int]], row: int) -> RL:
    return {key: value for key in keys if (value := columns[key][row])}
