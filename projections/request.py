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

from collections.abc import Mapping

from quotaledger.events.model import QuotaUpserted

from .resources import RL, add_into, masked
from .state import QuotaNode


def lending_limit(config: QuotaUpserted) -> Mapping[str, int] | None:
    """The effective lending limit: ``allow_lent false`` means 0 everywhere."""
    if not config.allow_lent:
        return _ZERO_EVERYWHERE
    return config.lending_limit


class _ZeroEverywhere(dict[str, int]):
    """A limit list that lists every resource at 0 (allow_lent false)."""

    def __contains__(self, key: object) -> bool:
        return True

    def get(self, key: str, default: int | None = None) -> int:  # type: ignore[override]
        return 0

    def __getitem__(self, key: str) -> int:
        return 0


_ZERO_EVERYWHERE = _ZeroEverywhere()


def reserved(config: QuotaUpserted) -> RL:
    """``max(0, min − lending_limit)`` per resource (0 where no limit)."""
    limit = lending_limit(config)
    if limit is None:
        return {}
    out: RL = {}
    for key, value in config.min.items():
        if key in limit:
            kept = value - limit.get(key, 0)
            if kept > 0:
                out[key] = kept
    return out


def limited(config: QuotaUpserted, request: Mapping[str, int]) -> RL:
    """``min(request, max, min + borrowing_limit)``; absent caps do not cap."""
    out: RL = {}
    cap_max = config.max
    borrow = config.borrowing_limit
    for key, value in request.items():
        if cap_max is not None and key in cap_max and cap_max[key] < value:
            value = cap_max[key]
        if borrow is not None and key in borrow:
            ceiling = config.min.get(key, 0) + borrow[key]
            if ceiling < value:
                value = ceiling
        if value:
            out[key] = value
    return out


def recompute_node(node: QuotaNode, children: list[QuotaNode]) -> bool:
    """Refresh one quota's bottom-up numbers from its pods or children.

    Returns True when anything its parent reads (limited request, used,
    subtree, local, usage, min) may have changed.
    """
    config = node.config
    if config.is_parent:
        request: RL = {}
        used: RL = {}
        for child in children:
            add_into(request, child.limited_request)
            add_into(used, child.used)
    else:
        request = masked(node.pod_request, config.max)
        used = dict(node.pod_used)
    for key, value in reserved(config).items():
        if request.get(key, 0) < value:
            request[key] = value
    limited_request = limited(config, request)

    own = dict(config.min)
    usage: RL = {}
    subtree: RL = {}
    if config.is_parent:
        for child in children:
            for key, value in child.config.min.items():
                own[key] = own.get(key, 0) - value
        own = {key: value for key, value in own.items() if value > 0}
        subtree = dict(own)
        for child in children:
            for key in child.subtree.keys() | child.local.keys():
                contributed = child.subtree.get(key, 0) - child.local.get(key, 0)
                if contributed:
                    subtree[key] = subtree.get(key, 0) + contributed
            for key in child.usage:
                charged = child.usage[key] - child.local.get(key, 0)
                if charged > 0:
                    usage[key] = usage.get(key, 0) + charged
    else:
        subtree = {key: value for key, value in own.items() if value}
        usage = dict(used)
    local: RL = {}
    limit = lending_limit(config)
    if limit is not None:
        for key, value in subtree.items():
            if key in limit:
                kept = value - limit.get(key, 0)
                if kept > 0:
                    local[key] = kept

    changed = (
        limited_request != node.limited_request
        or used != node.used
        or subtree != node.subtree
        or local != node.local
        or usage != node.usage
        or request != node.request
    )
    node.request = {k: v for k, v in request.items() if v}
    node.limited_request = limited_request
    node.used = used
    node.subtree = subtree
    node.local = local
    node.usage = usage
    return changed
