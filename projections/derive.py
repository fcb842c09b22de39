"""Bring derived numbers up to date, incrementally (DESIGN §5).

A change marks quotas dirty (their pods or configuration changed) and parents
for *refill* (their children's runtime inputs changed). :func:`settle`:

1. recomputes request/used/KEP sums bottom-up along the dirty paths only;
2. recomputes the cluster total (§5, §8 rule 16) when nodes or the builtin
   quotas' usage changed;
3. water-fills runtime top-down under the parents whose inputs changed, and
   under every child parent whose own runtime changed as a result.

Every number is read from and written to the quotas' rows of the state's
columns (:mod:`.columns`, issue #11): per parent segment, in Python over the
rows, no per-quota dict. The result is identical to a full recomputation
(:func:`recompute_all`).
"""

from __future__ import annotations

import heapq
from typing import Any

from .columns import QuotaColumns
from .request import recompute_node
from .resources import RL
from .runtime import distribute
from .state import BUILTIN, DEFAULT, ROOT, SYSTEM, ProjectedState, QuotaNode
from .tree import flush_sums

_TOP_DOWN = ("runtime", "effective_min")

#: A settle of a tree of at least ``BULK_MIN_QUOTAS`` quotas with at least one
#: in ``BULK_FRACTION`` of them dirty recomputes everything on arrays instead of
#: along the dirty paths (DECISIONS 193): the same numbers, in a few ms.
BULK_MIN_QUOTAS = 1024
BULK_FRACTION = 8


def tree_cache(state: ProjectedState) -> dict[str, Any]:
    """``state.sorted_children``, emptied when the tree's shape changed: quota
    name -> its children in name order; ``ROOT`` -> the top quotas (see
    :func:`top_quotas`); ``""`` -> the version and quotas they were listed from."""
    cache = state.sorted_children
    stamp = cache.get("")
    if stamp is None or stamp[0] != state.tree_version or stamp[1] is not state.quotas:
        cache.clear()
        cache[""] = (state.tree_version, state.quotas)
    return cache


def top_quotas(state: ProjectedState) -> list[QuotaNode]:
    """The quotas at the top of a tree (root's children and the quotas whose
    parent does not exist), system and default aside; kept while the tree's
    shape is (§8 rule 31's free capacity subtracts their used)."""
    cache = tree_cache(state)
    out: list[QuotaNode] | None = cache.get(ROOT)
    if out is None:
        quotas = state.quotas
        out = cache[ROOT] = [
            quotas[name]
            for parent, names in state.children_of.items()
            if parent == ROOT or parent not in quotas
            for name in names
            if name not in BUILTIN
        ]
    return out


def _children(state: ProjectedState, name: str) -> list[QuotaNode]:
    """A quota's children in name order (kept while the tree's shape is)."""
    cache = tree_cache(state)
    out = cache.get(name)
    if out is None:
        quotas = state.quotas
        out = [quotas[child] for child in sorted(state.children(name))]
        for child in out:
            if child.store is not state.columns:
                state.attach(child)
        cache[name] = out
    return out


def settle(state: ProjectedState) -> None:
    """Make every derived number consistent with the facts folded so far.

    Along the dirty paths; or, when many quotas are dirty (a ``LedgerDigest``'s
    hash, a replay's end), by the full recompute on arrays, which gives the
    same numbers and marks every quota touched (the clocks re-check what did
    not change to the same result, ``clocks.sampled``)."""
    if not state.dirty and not state.refill and not state.total_dirty:
        return
    quotas = state.quotas
    if len(quotas) >= BULK_MIN_QUOTAS and len(state.dirty) * BULK_FRACTION >= len(quotas):
        recompute_all(state)
        return
    _settle_paths(state)


def _settle_paths(state: ProjectedState) -> None:
    """:func:`settle` along the dirty paths (steps 1-3 of the module docstring)."""
    quotas = state.quotas
    columns = state.columns
    path: set[str] = set()
    for name in state.dirty:
        current = name
        while current in quotas and current not in path:
            path.add(current)
            node = quotas[current]
            if node.store is not columns:
                state.attach(node)
            current = node.config.parent
    state.dirty.clear()
    state.touched |= path
    root_changed = False
    # parents to water-fill again for some resources only: those whose
    # children's limited requests moved (as the water-fill sees them) or whose
    # amount to share moved; ``state.refill`` holds those to fill whole
    partial: dict[str, set[str]] = {}
    for name in sorted(path, key=lambda q: (-quotas[q].depth, q)):
        node = quotas[name]
        if node.sum_log or node.sums_stale:
            flush_sums(state, node)
        children = _children(state, name) if node.config.is_parent else []
        changed, moved = recompute_node(state, node, children)
        if changed:
            parent = node.config.parent
            if parent == ROOT:
                root_changed = True
                if name in BUILTIN:
                    state.total_dirty = True
                elif moved:
                    partial.setdefault(ROOT, set()).update(moved)
            elif parent in quotas and moved:
                partial.setdefault(parent, set()).update(moved)
        if not node.connected:
            state.columns.clear(_TOP_DOWN, node.row)
    if state.total_dirty:
        total = _cluster_total(state)
        before = state.cluster_total
        if total != before:
            partial.setdefault(ROOT, set()).update(
                key for key in total.keys() | before.keys() if total.get(key) != before.get(key)
            )
            state.cluster_total = total
            root_changed = True
        state.total_dirty = False
    if root_changed or ROOT in state.refill:
        _root_sums(state)
    _refill(state, partial)


def _cluster_total(state: ProjectedState) -> RL:
    """Σ allocatable − used of system and default, floored at 0 (§8 rule 16)."""
    store = state.columns
    system, default = state.quotas[SYSTEM].row, state.quotas[DEFAULT].row
    out: RL = {}
    for key, value in state.allocatable.items():
        columns = store.columns.get(key)
        if columns is not None:
            value -= columns.used[system] + columns.used[default]
        if value > 0:
            out[key] = value
    return out


def _root_children(state: ProjectedState) -> list[QuotaNode]:
    out = [
        state.quotas[name]
        for name in sorted(state.children(ROOT))
        if name not in BUILTIN and state.quotas[name].connected
    ]
    for child in out:
        if child.store is not state.columns:
            state.attach(child)
    return out


def _root_sums(state: ProjectedState) -> None:
    rows = [child.row for child in _root_children(state)]
    subtree: RL = {}
    usage: RL = {}
    for columns in state.columns.by_key:
        subtree_col, local_col, usage_col = columns.subtree, columns.local, columns.usage
        contributed = 0
        charged = 0
        for row in rows:
            local = local_col[row]
            contributed += subtree_col[row] - local
            over = usage_col[row] - local
            if over > 0:
                charged += over
        if contributed:
            subtree[columns.key] = contributed
        if charged:
            usage[columns.key] = charged
    state.root_subtree = subtree
    state.root_usage = usage


def _refill(state: ProjectedState, partial: dict[str, set[str]] | None = None) -> None:
    """Water-fill, top-down, every parent in ``state.refill`` (all resources)
    and in ``partial`` (the resources named), then every child parent whose
    runtime moved as a result, for the resources that moved. A parent's
    runtime is an input of its children's fill only for the same resource,
    so the resources left out keep numbers equal to a fill's (DECISIONS 250)."""
    quotas = state.quotas
    whole = state.refill
    partial = {} if partial is None else partial
    heap = [
        (0 if name == ROOT else quotas[name].depth, name)
        for name in whole | partial.keys()
        if name == ROOT or (name in quotas and quotas[name].connected)
    ]
    state.refill = set()
    heapq.heapify(heap)
    done: set[str] = set()
    min_scaling = state.settings.min_scaling
    while heap:
        _, name = heapq.heappop(heap)
        if name in done:
            continue
        done.add(name)
        total: RL | int
        if name == ROOT:
            total, children = state.cluster_total, _root_children(state)
        else:
            node = quotas[name]
            if not node.config.is_parent:
                continue
            total, children = node.row, _children(state, name)
        if not children:
            continue
        keys = None if name in whole else partial[name]
        changed = distribute(state, total, children, min_scaling, keys)
        for child, moved in zip(children, changed, strict=True):
            if moved:
                child_name = child.config.name
                state.touched.add(child_name)
                if child.config.is_parent:
                    partial.setdefault(child_name, set()).update(moved)
                    heapq.heappush(heap, (child.depth, child_name))


def recompute_all(state: ProjectedState) -> None:
    """Recompute everything from the pod sums (snapshot restore, benchmarks), on
    arrays (:mod:`.arrays`, issue #11); on a tree that path declines, with
    :func:`recompute_all_rows`. Both give the same numbers."""
    from .arrays import recompute_arrays

    attach_all(state)
    if not recompute_arrays(state):
        recompute_all_rows(state)


def attach_all(state: ProjectedState) -> None:
    """Give every quota its row, in name order (a restored state's quotas come
    without); rows of quotas the state no longer holds are dropped."""
    columns = state.columns
    quotas = state.quotas
    # the fold adds quotas to the same dict with their rows (tree.put_quota);
    # a restore installs another dict of quotas without
    if quotas is columns.verified and columns.live == len(quotas):
        return
    if columns.live == len(quotas) and all(node.store is columns for node in quotas.values()):
        columns.verified = quotas
        return
    # start afresh: the sums were charged into rows some of which are stale
    pending = [node for node in quotas.values() if node.store is not columns]
    if columns.live + len(pending) != len(quotas):
        state.columns = columns = QuotaColumns()
        state.tree_arrays = None
        for name in sorted(quotas):
            node = quotas[name]
            node.store = None
            state.attach(node)
            node.sum_log.clear()
            node.sums_stale = True
        state.dirty.update(quotas)
    else:
        for node in sorted(pending, key=lambda item: item.config.name):
            state.attach(node)
            node.sum_log.clear()
            node.sums_stale = True
            state.dirty.add(node.config.name)
    columns.verified = quotas


def recompute_all_rows(state: ProjectedState) -> None:
    """Recompute everything from the pod sums, quota by quota along the paths of ``settle``.

    Every quota is recomputed bottom-up and every parent (root included)
    re-filled, which assigns each derived number of each connected quota; an
    orphan's runtime and effective min are cleared by ``settle``, and
    system/default never get one (DECISIONS 6). So nothing needs resetting first.
    """
    attach_all(state)
    state.dirty.update(state.quotas)
    state.refill.update(state.quotas)
    state.cluster_total = {}
    state.total_dirty = True
    state.refill.add(ROOT)
    _settle_paths(state)
