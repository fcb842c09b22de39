"""Available headroom, the Kueue KEP-79 model (DESIGN §5 "Available", §8 rule 17).

``available(root) = subtree − usage``. For any other quota q, with P the
parent's available (capped, when q has a borrowing limit, at
``(subtree − local) − max(0, usage − local) + borrowing_limit``):
``available(q) = max(0, local − usage) + P``. A leaf reports max(0, ·); a
parent's value is raw and may be negative. A workload fits a leaf iff its
request ≤ available on every resource.
"""

from __future__ import annotations

from .resources import RL
from .state import BUILTIN, ROOT, ProjectedState


def root_available(state: ProjectedState) -> RL:
    """``subtree(root) − usage(root)`` per resource."""
    keys = state.root_subtree.keys() | state.root_usage.keys()
    out: RL = {}
    for key in keys:
        value = state.root_subtree.get(key, 0) - state.root_usage.get(key, 0)
        if value:
            out[key] = value
    return out


def available_of(state: ProjectedState, name: str, memo: dict[str, RL]) -> RL:
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
        above = available_of(state, config.parent, memo)
    borrow = config.borrowing_limit
    keys = above.keys() | node.subtree.keys() | node.local.keys() | node.usage.keys()
    if borrow is not None:
        keys |= borrow.keys()
    out: RL = {}
    for key in keys:
        local = node.local.get(key, 0)
        usage = node.usage.get(key, 0)
        inherited = above.get(key, 0)
        if borrow is not None and key in borrow:
            cap = (node.subtree.get(key, 0) - local) - max(0, usage - local) + borrow[key]
            inherited = min(inherited, cap)
        value = max(0, local - usage) + inherited
        if value:
            out[key] = value
    memo[name] = out
    return out


def reported_available(state: ProjectedState, name: str, memo: dict[str, RL]) -> RL:
    """What the state JSON shows: empty for orphans and builtins, leaves ≥ 0."""
    node = state.quotas[name]
    if not node.connected or name in BUILTIN:
        return {}
    raw = available_of(state, name, memo)
    if node.config.is_parent:
        return raw
    return {key: value for key, value in raw.items() if value > 0}
