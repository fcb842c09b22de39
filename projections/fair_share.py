"""Namespace fair share inside a leaf quota (DESIGN §5, §8 rule 18).

The namespaces of a leaf share the leaf's runtime by weighted water-filling
over their requests (min 0, weight from ``NamespaceWeighted``, default 1).
Namespace requests are masked like the quota's request.
"""

from __future__ import annotations

from collections.abc import Mapping

from .resources import RL, add_into, masked, water_fill
from .state import NamespaceUsage, ProjectedState, QuotaNode


def namespace_usage(state: ProjectedState, node: QuotaNode) -> dict[str, NamespaceUsage]:
    """Σ requests (and used: pods with a node, §8 rule 12) of a quota's active
    pods per namespace, sorted by namespace. Computed when read, from the
    quota's pods: only views need it, so the fold does not keep it."""
    usage: dict[str, NamespaceUsage] = {}
    pods = state.pods
    for uid in node.pods:
        pod = pods[uid]
        entry = usage.get(pod.namespace)
        if entry is None:
            entry = usage[pod.namespace] = NamespaceUsage()
        add_into(entry.request, pod.requests)
        if pod.node is not None:
            add_into(entry.used, pod.requests)
    return dict(sorted(usage.items()))


def fair_shares(
    node: QuotaNode, usage: Mapping[str, NamespaceUsage], weights: Mapping[str, int]
) -> dict[str, RL]:
    """Each namespace's share of ``node.runtime`` (empty for orphans); ``usage``
    is :func:`namespace_usage` of the node."""
    names = sorted(usage)
    shares: dict[str, RL] = {ns: {} for ns in names}
    if not node.connected:
        return shares
    requests = {ns: masked(usage[ns].request, node.config.max) for ns in names}
    for key in sorted(node.runtime):
        borrowers = [
            (ns, 0, requests[ns].get(key, 0), weights.get(ns, 1))
            for ns in names
            if requests[ns].get(key, 0) > 0
        ]
        for ns, value in water_fill(node.runtime[key], borrowers).items():
            if value:
                shares[ns][key] = value
    return shares
