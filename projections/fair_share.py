"""Namespace fair share inside a leaf quota (DESIGN §5, §8 rule 18).

The namespaces of a leaf share the leaf's runtime by weighted water-filling
over their requests (min 0, weight from ``NamespaceWeighted``, default 1).
Namespace requests are masked like the quota's request.
"""

from __future__ import annotations

from collections.abc import Mapping

from .resources import RL, masked, water_fill
from .state import QuotaNode


def fair_shares(node: QuotaNode, weights: Mapping[str, int]) -> dict[str, RL]:
    """Each namespace's share of ``node.runtime`` (empty for orphans)."""
    names = sorted(node.namespaces)
    shares: dict[str, RL] = {ns: {} for ns in names}
    if not node.connected:
        return shares
    requests = {ns: masked(node.namespaces[ns].request, node.config.max) for ns in names}
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
