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

from .columns import KeyColumns, QuotaColumns
from .state import ProjectedState, QuotaNode
from .terms import Terms


def terms_for(node: QuotaNode) -> Terms:
    """The node's :class:`Terms`, rebuilt when its configuration changed."""
    terms = node.terms
    if terms is None or terms.config is not node.config:
        terms = node.terms = Terms(node.config)
    return terms


#: What a parent reads of one child for one resource, as changes:
#: ``[limited request, used, subtree − local, max(0, usage − local)]``.
Change = list[int]


def recompute_node(
    state: ProjectedState, node: QuotaNode, children: list[QuotaNode]
) -> tuple[bool, list[str], dict[str, Change]]:
    """Refresh one quota's bottom-up numbers, in its row of the state's
    columns, from its pod sums or its children's rows.

    Returns whether any of them changed (its parent reads the limited
    request, used, subtree, local and usage; min only changes with a
    configuration, which marks the parent itself); the resources whose
    limited request changed in a way the parent's water-fill sees; and, per
    resource, how what the parent reads of it changed (:func:`apply_changes`).

    A quota that borrowed and stayed below its limited request before and
    after the change (its runtime under both the old and the new one) is given
    the same runtime whatever that limited request is, and so is every sibling
    (§5 Runtime step 3: a borrower is capped only where it reaches its limited
    request), so those resources are left out of the second (DECISIONS 250).
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
    changes: dict[str, Change] = {}
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
        if _stored(store, columns, row, request, limited, used, subtree, local, usage, changes):
            changed = True
            delta = changes[key][0]
            if delta:
                runtime = columns.runtime[row]
                if not (runtime < limited - delta and runtime < limited):
                    moved.append(key)
    return changed, moved, changes


def apply_changes(
    state: ProjectedState, node: QuotaNode, children_changes: dict[str, Change]
) -> tuple[bool, list[str], dict[str, Change]] | None:
    """:func:`recompute_node` for a parent whose own configuration and children
    stayed the same, from how its children's numbers changed: its sums move
    by those changes (each is a sum over the children; ``subtree`` is its own
    nominal, a constant, plus one), so only the resources that moved cost
    anything and no child is read. None when that cannot be done: a request
    floored at the reserve does not tell the sum under it."""
    terms = terms_for(node)
    reserved = terms.reserved
    if reserved and any(key in reserved for key in children_changes):
        return None
    store = state.columns
    row = node.row
    caps, lending = terms.caps, terms.lending
    changed = False
    moved: list[str] = []
    changes: dict[str, Change] = {}
    for key in sorted(children_changes):
        d_limited, d_used, d_contributed, d_charged = children_changes[key]
        columns = store.columns[key]
        request = columns.request[row] + d_limited
        used = columns.used[row] + d_used
        subtree = columns.subtree[row] + d_contributed
        usage = columns.usage[row] + d_charged
        cap = caps.get(key)
        limited = cap if cap is not None and cap < request else request
        local = 0
        if lending is not None and key in lending:
            kept = subtree - lending.get(key, 0)
            if kept > 0:
                local = kept
        if _stored(store, columns, row, request, limited, used, subtree, local, usage, changes):
            changed = True
            delta = changes[key][0]
            if delta:
                runtime = columns.runtime[row]
                if not (runtime < limited - delta and runtime < limited):
                    moved.append(key)
    return changed, moved, changes


def _stored(
    store: QuotaColumns,
    columns: KeyColumns,
    row: int,
    request: int,
    limited: int,
    used: int,
    subtree: int,
    local: int,
    usage: int,
    changes: dict[str, Change],
) -> bool:
    """Store one resource's bottom-up numbers in ``row``; when any changed,
    record in ``changes`` how what the parent reads moved, and return True."""
    old_limited = columns.limited_request[row]
    old_used = columns.used[row]
    old_subtree = columns.subtree[row]
    old_local = columns.local[row]
    old_usage = columns.usage[row]
    if (
        columns.request[row] == request
        and old_limited == limited
        and old_used == used
        and old_subtree == subtree
        and old_local == local
        and old_usage == usage
    ):
        return False
    try:
        _store(columns, row, request, limited, used, subtree, local, usage)
    except OverflowError:
        store.widen(columns)
        _store(columns, row, request, limited, used, subtree, local, usage)
    old_charged = old_usage - old_local
    charged = usage - local
    changes[columns.key] = [
        limited - old_limited,
        used - old_used,
        (subtree - local) - (old_subtree - old_local),
        (charged if charged > 0 else 0) - (old_charged if old_charged > 0 else 0),
    ]
    return True


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
