"""The quota tree's shape (DESIGN §5 Tree, §8 rules 7, 10).

Only this module changes the tree's shape: it installs and removes quota
configurations and keeps the parent index, the namespace claims, each quota's
connectivity and depth (an orphan's chain of parents does not reach root, §8
rule 10) and ``tree_version`` in step; the pods a configuration change moves
are re-associated by :mod:`.pods` (§8 rule 7).
"""

from __future__ import annotations

from quotaledger.events.model import QuotaUpserted

from .pods import discard_member, mark_dirty, reassociate
from .state import ROOT, ProjectedState, QuotaNode


def refresh_connectivity(state: ProjectedState, name: str) -> None:
    """Recompute ``connected`` and ``depth`` for ``name``'s subtree (§8 rule 10):
    a quota is connected when its chain of parents reaches root."""
    node = state.quotas[name]
    parent = node.config.parent
    if parent == ROOT:
        connected, depth = True, 1
    elif parent in state.quotas:
        above = state.quotas[parent]
        connected, depth = above.connected, above.depth + 1
    else:
        connected, depth = False, 1
    stack = [(name, connected, depth)]
    while stack:
        current, connected, depth = stack.pop()
        node = state.quotas[current]
        node.connected, node.depth = connected, depth
        mark_dirty(state, current)
        state.hash_quotas.add(current)
        state.refill.add(current)
        for child in state.children(current):
            stack.append((child, connected, depth + 1))


def put_quota(state: ProjectedState, config: QuotaUpserted) -> QuotaUpserted | None:
    """Install a validated configuration; return the previous one.

    Keeps the parent index, namespace claims and pod association in step, and
    marks the old and new paths dirty.
    """
    name = config.name
    node = state.quotas.get(name)
    previous = node.config if node is not None else None
    state.hash_quotas.add(name)
    if (
        node is not None
        and node.config.parent == config.parent
        and node.config.is_parent == config.is_parent
        and node.config.namespaces == config.namespaces
    ):
        # Same place in the tree and same claims: connectivity, depth and every
        # pod's association (rule 7) stay as they are; only numbers move.
        node.config = config
        state.reconfigured.add(name)
        mark_dirty(state, name)
        state.refill.add(name)
        _mark_parent_refill(state, config.parent)
        return previous
    state.tree_version += 1
    if node is None:
        node = state.quotas[name] = QuotaNode(config=config)
        state.attach(node)
    else:
        if previous is not None and previous.parent != config.parent:
            discard_member(state.children_of, previous.parent, name)
            _mark_parent_refill(state, previous.parent)
        node.config = config
    state.children_of.setdefault(config.parent, set()).add(name)
    old_namespaces = previous.namespaces if previous is not None else []
    for ns in old_namespaces:
        if state.namespace_claims.get(ns) == name:
            del state.namespace_claims[ns]
    for ns in config.namespaces:
        state.namespace_claims[ns] = name
    refresh_connectivity(state, name)
    _mark_parent_refill(state, config.parent)
    reassociate(state, {name, *old_namespaces, *config.namespaces}, {name})
    return previous


def drop_quota(state: ProjectedState, name: str) -> None:
    """Remove a validated-removable quota (no children, no pods)."""
    node = state.quotas.pop(name)
    state.tree_version += 1
    state.hash_quotas.add(name)
    if node.store is state.columns:
        state.columns.release_row(node.row)
        node.store = None
    discard_member(state.children_of, node.config.parent, name)
    for ns in node.config.namespaces:
        if state.namespace_claims.get(ns) == name:
            del state.namespace_claims[ns]
    _mark_parent_refill(state, node.config.parent)
    state.reconfigured.discard(name)
    state.decrease_deadlines.pop(name, None)
    state.owing_since.pop(name, None)
    state.owing_held.discard(name)
    reassociate(state, {name, *node.config.namespaces}, {name})


def _mark_parent_refill(state: ProjectedState, parent: str) -> None:
    if parent == ROOT:
        state.refill.add(ROOT)
    elif parent in state.quotas:
        mark_dirty(state, parent)
        state.refill.add(parent)


def ancestors(state: ProjectedState, name: str) -> list[str]:
    """Existing ancestors of a quota, nearest first (root excluded)."""
    out: list[str] = []
    parent = state.quotas[name].config.parent
    while parent != ROOT and parent in state.quotas and parent not in out:
        out.append(parent)
        parent = state.quotas[parent].config.parent
    return out
