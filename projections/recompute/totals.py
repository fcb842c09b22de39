"""The cluster-level sums above the top quotas (DESIGN §5 "Runtime", §8 rule 16).

Computed the same way by the incremental settle
(:mod:`quotaledger.projections.settle`) and by the full recompute on arrays
(:mod:`.arrays`), from the quotas' rows of the state's columns.
"""

from __future__ import annotations

from ..resources import RL
from ..state import BUILTIN, DEFAULT, ROOT, SYSTEM, ProjectedState, QuotaNode


def cluster_total(state: ProjectedState) -> RL:
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


def root_children(state: ProjectedState) -> list[QuotaNode]:
    """Root's connected children in name order, system and default aside
    (the quotas that share the cluster total), each with its row."""
    out = [
        state.quotas[name]
        for name in sorted(state.children(ROOT))
        if name not in BUILTIN and state.quotas[name].connected
    ]
    for child in out:
        if child.store is not state.columns:
            state.attach(child)
    return out


def root_sums(state: ProjectedState) -> None:
    """Root's KEP-79 sums: ``root_subtree`` (Σ what its children contribute
    above their local part) and ``root_usage`` (Σ their usage above it)."""
    rows = [child.row for child in root_children(state)]
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
