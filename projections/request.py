"""Request, used and limited request, bottom-up (DESIGN §5 "Request and used").

Leaf ``request`` = Σ requests of its active pods masked to its max's keys;
``used`` = Σ requests of its active pods with a node. A quota that does not
lend, or has a lending limit, reserves ``max(0, min − lending_limit)`` and its
request is at least that. ``limited_request = min(request, max, min +
borrowing_limit)``. A parent's request is Σ children's limited requests, its
used Σ children's used.

Also the KEP-79 nominal sums used by ``available`` (DESIGN §5 "Available"):
``own`` (a parent's min minus its children's, ≥ 0), ``subtree = own +
Σ(subtree(c) − local(c))``, ``local = max(0, subtree − lending_limit)``, and
the charged ``usage``.
"""

from __future__ import annotations

from .columns import KeyColumns
from .state import ProjectedState, QuotaNode
from .terms import Terms


def terms_for(node: QuotaNode) -> Terms:
    """The node's :class:`Terms`, rebuilt when its configuration changed."""
    terms = node.terms
    if terms is None or terms.config is not node.config:
        terms = node.terms = Terms(node.config)
    return terms


def recompute_node(
    state: ProjectedState, node: QuotaNode, children: list[QuotaNode]
) -> tuple[bool, list[str]]:
    """Refresh one quota's bottom-up numbers, in its row of the state's
    columns, from its pod sums or its children's rows.

    Returns whether any of them changed (its parent reads the limited
    request, used, subtree, local and usage; min only changes with a
    configuration, which marks the parent itself), and the resources whose
    limited request changed in a way the parent's water-fill sees. A quota
    that borrowed and stayed below its limited request before and after the
    change (its runtime under both the old and the new one) is given the same
    runtime whatever that limited request is, and so is every sibling (§5
    Runtime step 3: a borrower is capped only where it reaches its limited
    request), so those resources are left out (DECISIONS 250).
    """
    config = node.config
    terms = terms_for(node)
    store = state.columns
    store.add_keys(config.min)
    row = node.row
    is_parent = config.is_parent
    rows = [child.row for child in children]
    mask, reserved, caps, lending = terms.mask, terms.reserved, terms.caps, terms.lending
    config_min = config.min
    child_mins = [child.config.min for child in children] if is_parent else []
    changed = False
    moved: list[str] = []
    for columns in store.by_key:
        key = columns.key
        if is_parent:
            limited_col, used_col = columns.limited_request, columns.used
            subtree_col, local_col, usage_col = columns.subtree, columns.local, columns.usage
            request = 0
            used = 0
            contributed = 0
            usage = 0
            for child in rows:
                request += limited_col[child]
                used += used_col[child]
                child_local = local_col[child]
                contributed += subtree_col[child] - child_local
                charged = usage_col[child] - child_local
                if charged > 0:
                    usage += charged
            own = config_min.get(key, 0)
            for amounts in child_mins:
                own -= amounts.get(key, 0)
            subtree = own + contributed if own > 0 else contributed
        else:
            request = columns.pod_request[row] if mask is None or key in mask else 0
            used = usage = columns.pod_used[row]
            subtree = config_min.get(key, 0)
        floor = reserved.get(key)
        if floor is not None and request < floor:
            request = floor
        cap = caps.get(key)
        limited = cap if cap is not None and cap < request else request
        local = 0
        if lending is not None and key in lending:
            kept = subtree - lending.get(key, 0)
            if kept > 0:
                local = kept
        before = columns.limited_request[row]
        if (
            columns.request[row] != request
            or before != limited
            or columns.used[row] != used
            or columns.subtree[row] != subtree
            or columns.local[row] != local
            or columns.usage[row] != usage
        ):
            changed = True
            if before != limited:
                runtime = columns.runtime[row]
                if not (runtime < before and runtime < limited):
                    moved.append(key)
            try:
                _store(columns, row, request, limited, used, subtree, local, usage)
            except OverflowError:
                store.widen(columns)
                _store(columns, row, request, limited, used, subtree, local, usage)
    return changed, moved


def _store(
    columns: KeyColumns,
    row: int,
    request: int,
    limited: int,
    used: int,
    subtree: int,
    local: int,
    usage: int,
) -> None:
    columns.request[row] = request
    columns.limited_request[row] = limited
    columns.used[row] = used
    columns.subtree[row] = subtree
    columns.local[row] = local
    columns.usage[row] = usage
