"""Overuse clocks (DESIGN §6 rule 2, §8 rules 28-29).

A leaf quota is *owing* while ``min(used, max) > runtime`` on some resource its
max lists (all of them when max is null): other quotas are entitled to what it
holds. The fold samples owing once per second of ledger time — when a record
opens a later second, the state at the end of the previous one is observed —
so clocks are a function of the records alone, whatever the batching. A quota
owing at a sample starts (or keeps) its clock at that sample's ts; one that
stops owing loses it. After a revoke the quota's clock is held until the next
fact, which restarts it if the quota still owes.
"""

from __future__ import annotations

from .derive import settle
from .resources import RL
from .state import BUILTIN, ProjectedState, QuotaNode


def owed(node: QuotaNode) -> RL:
    """``min(used, max) − runtime`` per compared resource, where positive (§8 rule 30
    takes ``used − runtime`` as the revoke target; this is the entitlement gap)."""
    cap = node.config.max
    keys = cap.keys() if cap is not None else node.used.keys() | node.runtime.keys()
    out: RL = {}
    for key in keys:
        held = node.used.get(key, 0)
        if cap is not None and cap[key] < held:
            held = cap[key]
        gap = held - node.runtime.get(key, 0)
        if gap > 0:
            out[key] = gap
    return out


def is_owing(node: QuotaNode) -> bool:
    """A connected leaf (not system/default) holding more than its runtime."""
    config = node.config
    if config.is_parent or not node.connected or config.name in BUILTIN:
        return False
    return bool(owed(node))


def sampled(state: ProjectedState) -> dict[str, int]:
    """The owing clocks as a sample taken now would leave them (no mutation
    besides settling derived numbers). The engine reads this at the tail."""
    settle(state)
    quotas = state.quotas
    clocks = dict(state.owing_since)
    for name in state.touched | set(state.owing_since):
        node = quotas.get(name)
        if node is None or not is_owing(node):
            clocks.pop(name, None)
        elif name not in state.owing_held:
            clocks.setdefault(name, state.ts)
    return clocks


def observe(state: ProjectedState) -> None:
    """Take the sample at ``state.ts`` (the end of the current second)."""
    state.owing_since = dict(sorted(sampled(state).items()))
    state.touched = set()


def release_holds(state: ProjectedState) -> None:
    """A fact arrived: held quotas may start their clocks again at the next sample."""
    if state.owing_held:
        state.touched |= state.owing_held
        state.owing_held = set()
