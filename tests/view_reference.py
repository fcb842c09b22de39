"""The state JSON's per-quota body as it was read before the bulk reading of
``projections.view`` (kept as the reference, in the tests only).

Every number is read from its quota one at a time (``QuotaNode``'s sparse
dicts, available too), every namespace's usage is added up pod by pod and its
fair share goes through the full water-fill (DESIGN §5
"Available", "Namespace fair share"; §7). :func:`reference_body` must equal
``view._body`` on every state.
"""

from __future__ import annotations

from typing import Any

from quotaledger.projections.available import reported_available
from quotaledger.projections.resources import RL, add_into, masked, sparse, water_fill
from quotaledger.projections.settle import settle
from quotaledger.projections.state import (
    NamespaceUsage,
    ProjectedState,
    QuotaNode,
)
from quotaledger.projections.view import _config_rl, cluster_view, preemptions_view


def namespace_usage(state: ProjectedState, node: QuotaNode) -> dict[str, NamespaceUsage]:
    """Σ requests (and used: pods with a node) of the quota's active pods per
    namespace, added up pod by pod."""
    usage: dict[str, NamespaceUsage] = {}
    for uid in node.pods:
        pod = state.pods[uid]
        entry = usage.setdefault(pod.namespace, NamespaceUsage())
        add_into(entry.request, pod.requests)
        if pod.node is not None:
            add_into(entry.used, pod.requests)
    return dict(sorted(usage.items()))


def _quota(state: ProjectedState, name: str, memo: dict[str, RL]) -> dict[str, Any]:
    node = state.quotas[name]
    config = node.config
    usage_by_ns = namespace_usage(state, node)
    names = sorted(usage_by_ns)
    shares: dict[str, RL] = {ns: {} for ns in names}
    if node.connected:
        requests = {ns: masked(usage_by_ns[ns].request, config.max) for ns in names}
        for key in sorted(node.runtime):
            borrowers = [
                (ns, 0, requests[ns].get(key, 0), state.namespace_weights.get(ns, 1))
                for ns in names
                if requests[ns].get(key, 0) > 0
            ]
            for ns, value in water_fill(node.runtime[key], borrowers).items():
                if value:
                    shares[ns][key] = value
    return {
        "parent": config.parent,
        "is_parent": config.is_parent,
        "orphan": not node.connected,
        "min": _config_rl(config.min),
        "max": _config_rl(config.max),
        "effective_min": sparse(node.effective_min),
        "shared_weight": _config_rl(config.shared_weight),
        "allow_lent": config.allow_lent,
        "lending_limit": _config_rl(config.lending_limit),
        "borrowing_limit": _config_rl(config.borrowing_limit),
        "request": sparse(node.request),
        "limited_request": sparse(node.limited_request),
        "used": sparse(node.used),
        "runtime": sparse(node.runtime),
        "available": sparse(reported_available(state, name, memo)),
        "pods": sorted(node.pods),
        "children": sorted(state.children(name)),
        "namespaces": {
            ns: {
                "weight": state.namespace_weights.get(ns, 1),
                "request": sparse(usage.request),
                "used": sparse(usage.used),
                "fair_share": shares[ns],
            }
            for ns, usage in usage_by_ns.items()
        },
    }


def reference_body(state: ProjectedState) -> dict[str, Any]:
    """The derived part of the state JSON (DESIGN §7), read quota by quota."""
    settle(state)
    memo: dict[str, RL] = {}
    return {
        "cluster": cluster_view(state),
        "quotas": {name: _quota(state, name, memo) for name in sorted(state.quotas)},
        "preemptions": preemptions_view(state),
    }
