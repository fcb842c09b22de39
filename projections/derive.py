"""Bring derived numbers up to date, incrementally (DESIGN §5).

A change marks quotas dirty (their pods or configuration changed) and parents
for *refill* (their children's runtime inputs changed). :func:`settle`:

1. recomputes request/used/KEP sums bottom-up along the dirty paths only;
2. recomputes the cluster total (§5, §8 rule 16) when nodes or the builtin
   quotas' usage changed;
3. water-fills runtime top-down under the parents whose inputs changed, and
   under every child parent whose own runtime changed as a result.

The result is identical to a full recomputation (:func:`recompute_all`).
"""

from __future__ import annotations

import heapq

from .request import recompute_node
from .resources import RL
from .runtime import distribute
from .state import BUILTIN, DEFAULT, ROOT, SYSTEM, ProjectedState, QuotaNode
from .tree import flush_sums


def _children(state: ProjectedState, name: str) -> list[QuotaNode]:
    return [state.quotas[child] for child in sorted(state.children(name))]


def settle(state: ProjectedState) -> None:
    """Make every derived number consistent with the facts folded so far."""
    if not state.dirty and not state.refill and not state.total_dirty:
        return
    quotas = state.quotas
    path: set[str] = set()
    for name in state.dirty:
        current = name
        while current in quotas and current not in path:
            path.add(current)
            current = quotas[current].config.parent
    state.dirty.clear()
    state.touched |= path
    root_changed = False
    for name in sorted(path, key=lambda q: (-quotas[q].depth, q)):
        node = quotas[name]
        if node.sum_log or node.sums_stale:
            flush_sums(state, node)
        children = _children(state, name) if node.config.is_parent else []
        if recompute_node(node, children):
            parent = node.config.parent
            if parent == ROOT:
                root_changed = True
                if name in BUILTIN:
                    state.total_dirty = True
            elif parent in quotas:
                state.refill.add(parent)
        if not node.connected:
            node.runtime, node.effective_min = {}, {}
    if state.total_dirty:
        total = _cluster_total(state)
        if total != state.cluster_total:
            state.cluster_total = total
            root_changed = True
        state.total_dirty = False
    if root_changed or ROOT in state.refill:
        _root_sums(state)
        state.refill.add(ROOT)
    _refill(state)


def _cluster_total(state: ProjectedState) -> RL:
    """Σ allocatable − used of system and default, floored at 0 (§8 rule 16)."""
    system = state.quotas[SYSTEM].used
    default = state.quotas[DEFAULT].used
    out: RL = {}
    for key, value in state.allocatable.items():
        left = value - system.get(key, 0) - default.get(key, 0)
        if left > 0:
            out[key] = left
    return out


def _root_children(state: ProjectedState) -> list[QuotaNode]:
    return [
        state.quotas[name]
        for name in sorted(state.children(ROOT))
        if name not in BUILTIN and state.quotas[name].connected
    ]


def _root_sums(state: ProjectedState) -> None:
    subtree: RL = {}
    usage: RL = {}
    for child in _root_children(state):
        for key in child.subtree.keys() | child.local.keys():
            value = child.subtree.get(key, 0) - child.local.get(key, 0)
            if value:
                subtree[key] = subtree.get(key, 0) + value
        for key, value in child.usage.items():
            charged = value - child.local.get(key, 0)
            if charged > 0:
                usage[key] = usage.get(key, 0) + charged
    state.root_subtree = {k: v for k, v in subtree.items() if v}
    state.root_usage = usage


def _refill(state: ProjectedState) -> None:
    quotas = state.quotas
    heap = [
        (0 if name == ROOT else quotas[name].depth, name)
        for name in state.refill
        if name == ROOT or (name in quotas and quotas[name].connected)
    ]
    state.refill.clear()
    heapq.heapify(heap)
    done: set[str] = set()
    min_scaling = state.settings.min_scaling
    while heap:
        _, name = heapq.heappop(heap)
        if name in done:
            continue
        done.add(name)
        if name == ROOT:
            total, children = state.cluster_total, _root_children(state)
        else:
            node = quotas[name]
            if not node.config.is_parent:
                continue
            total, children = node.runtime, _children(state, name)
        if not children:
            continue
        runtimes, effectives = distribute(total, children, min_scaling)
        for child, runtime, effective in zip(children, runtimes, effectives, strict=True):
            child.effective_min = effective
            if runtime != child.runtime:
                child.runtime = runtime
                state.touched.add(child.config.name)
                if child.config.is_parent:
                    heapq.heappush(heap, (child.depth, child.config.name))


def recompute_all(state: ProjectedState) -> None:
    """Recompute everything from the pod sums (snapshot restore, benchmarks), on
    arrays (:mod:`.arrays`, issue #11); on a tree shape that path declines,
    with :func:`recompute_all_dicts`. Both give the same numbers."""
    from .arrays import recompute_arrays

    if not recompute_arrays(state):
        recompute_all_dicts(state)


def recompute_all_dicts(state: ProjectedState) -> None:
    """Recompute everything from the pod sums, quota by quota through ``settle``
    (the reference the array path is tested against).

    Every quota is recomputed bottom-up and every parent (root included)
    re-filled, which assigns each derived field of each connected quota; an
    orphan's runtime and effective min are cleared by ``settle``, and
    system/default never get one (DECISIONS 6). So nothing needs resetting first.
    """
    state.dirty.update(state.quotas)
    state.refill.update(state.quotas)
    state.cluster_total = {}
    state.total_dirty = True
    state.refill.add(ROOT)
    settle(state)
