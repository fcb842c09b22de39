"""Available headroom, the Kueue KEP-79 model (DESIGN §5 "Available", §8 rule 17).

``available(root) = subtree − usage``. For any other quota q, with P the
parent's available (capped, when q has a borrowing limit, at
``(subtree − local) − max(0, usage − local) + borrowing_limit``):
``available(q) = max(0, local − usage) + P``. A leaf reports max(0, ·); a
parent's value is raw and may be negative. A workload fits a leaf iff its
request ≤ available on every resource.
"""

from __future__ import annotations

from collections.abc import Callable

from .resources import RL
from .state import BUILTIN, ROOT, ProjectedState, QuotaNode

#: Reads one number list of a quota: ``(node, field) -> RL``, as
#: ``getattr(node, field)`` does (the default) or from rows read at once.
NumberReader = Callable[[QuotaNode, str], RL]


def root_available(state: ProjectedState) -> RL:
    """``subtree(root) − usage(root)`` per resource."""
    keys = state.root_subtree.keys() | state.root_usage.keys()
    out: RL = {}
    for key in keys:
        value = state.root_subtree.get(key, 0) - state.root_usage.get(key, 0)
        if value:
            out[key] = value
    return out


def available_of(
    state: ProjectedState, name: str, memo: dict[str, RL], numbers: NumberReader = getattr
) -> RL:
    """Raw available of a connected, non-builtin quota (memoised top-down)."""
    if name in memo:
        return memo[name]
    node = state.quotas[name]
    config = node.config
    if config.parent == ROOT:
        above = memo.get(ROOT)
        if above is None:
            above = memo[ROOT] = root_available(state)
    else:
        above = available_of(state, config.parent, memo, numbers)
    borrow = config.borrowing_limit
    subtree, local_of, usage_of = (
        numbers(node, "subtree"),
        numbers(node, "local"),
        numbers(node, "usage"),
    )
    keys = above.keys() | subtree.keys() | local_of.keys() | usage_of.keys()
    if borrow is not None:
        keys |= borrow.keys()
    out: RL = {}
    for key in keys:
        local = local_of.get(key, 0)
        usage = usage_of.get(key, 0)
        inherited = above.get(key, 0)
        if borrow is not None and key in borrow:
            cap = (subtree.get(key, 0) - local) - max(0, usage - local) + borrow[key]
            inherited = min(inherited, cap)
        value = max(0, local - usage) + inherited
        if value:
            out[key] = value
    memo[name] = out
    return out


def reported_available(
    state: ProjectedState, name: str, memo: dict[str, RL], numbers: NumberReader = getattr
) -> RL:
    """What the state JSON shows: empty for orphans and builtins, leaves ≥ 0."""
    node = state.quotas[name]
    if not node.connected or name in BUILTIN:
        return {}
    raw = available_of(state, name, memo, numbers)
    if node.config.is_parent:
        return raw
    return {key: value for key, value in raw.items() if value > 0}
