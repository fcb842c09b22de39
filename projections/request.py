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

from .resources import RL, add_into
from .state import QuotaNode
from .terms import Terms, kept_local


def terms_for(node: QuotaNode) -> Terms:
    """The node's :class:`Terms`, rebuilt when its configuration changed."""
    terms = node.terms
    if terms is None or terms.config is not node.config:
        terms = node.terms = Terms(node.config)
    return terms


def recompute_node(node: QuotaNode, children: list[QuotaNode]) -> bool:
    """Refresh one quota's bottom-up numbers from its pods or children.

    Returns True when anything its parent reads (limited request, used,
    subtree, local, usage, min) may have changed.
    """
    config = node.config
    terms = terms_for(node)
    if config.is_parent:
        request: RL = {}
        used: RL = {}
        for child in children:
            add_into(request, child.limited_request)
            add_into(used, child.used)
    else:
        mask = terms.mask
        if mask is None:
            request = dict(node.pod_request)
        else:
            request = {key: value for key, value in node.pod_request.items() if key in mask}
        used = dict(node.pod_used)
    for key, value in terms.reserved.items():
        if request.get(key, 0) < value:
            request[key] = value
    caps = terms.caps
    limited_request: RL = {}
    for key, value in request.items():
        cap = caps.get(key)
        if cap is not None and cap < value:
            value = cap
        if value:
            limited_request[key] = value

    if config.is_parent:
        own = dict(config.min)
        for child in children:
            for key, value in child.config.min.items():
                own[key] = own.get(key, 0) - value
        subtree: RL = {key: value for key, value in own.items() if value > 0}
        usage: RL = {}
        for child in children:
            child_local = child.local
            # local ⊆ subtree key-wise (local is computed from subtree's items)
            for key, value in child.subtree.items():
                contributed = value - child_local.get(key, 0)
                if contributed:
                    subtree[key] = subtree.get(key, 0) + contributed
            for key, value in child.usage.items():
                charged = value - child_local.get(key, 0)
                if charged > 0:
                    usage[key] = usage.get(key, 0) + charged
        local = kept_local(subtree, terms.lending)
    else:
        subtree = terms.leaf_subtree
        local = terms.leaf_local
        usage = used

    changed = (
        limited_request != node.limited_request
        or used != node.used
        or subtree != node.subtree
        or local != node.local
        or usage != node.usage
        or request != node.request
    )
    node.request = request
    node.limited_request = limited_request
    node.used = used
    node.subtree = subtree
    node.local = local
    node.usage = usage
    return changed
