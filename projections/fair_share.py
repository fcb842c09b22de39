"""Namespace fair share inside a leaf quota (DESIGN §5, §8 rule 18).

The namespaces of a leaf share the leaf's runtime by weighted water-filling
over their requests (min 0, weight from ``NamespaceWeighted``, default 1).
Namespace requests are masked like the quota's request.
"""

from __future__ import annotations

from collections.abc import Mapping

from .resources import RL, masked, water_fill
from .state import NamespaceUsage, ProjectedState, QuotaNode


def namespace_usage(state: ProjectedState, node: QuotaNode) -> dict[str, NamespaceUsage]:
    """Σ requests (and used: pods with a node, §8 rule 12) of a quota's active
    pods per namespace, sorted by namespace. Computed when read, from the
    quota's pods: only views need it, so the fold does not keep it. A quota
    whose pods are all in one namespace, with its pod sums up to date, has
    them as that namespace's usage (the same Σ over the same pods)."""
    if len(node.namespaces) == 1 and not node.sums_stale and not node.sum_log:
        (only,) = node.namespaces
        return {only: NamespaceUsage(request=node.pod_request, used=node.pod_used)}
    usage: dict[str, NamespaceUsage] = {}
    pods = state.pods
    for uid in node.pods:
        pod = pods[uid]
        entry = usage.get(pod.namespace)
        if entry is None:
            entry = usage[pod.namespace] = NamespaceUsage()
        request = entry.request
        for key, value in pod.requests.items():
            request[key] = request.get(key, 0) + value
        if pod.node is not None:
            used = entry.used
            for key, value in pod.requests.items():
                used[key] = used.get(key, 0) + value
    for entry in usage.values():  # sparse, as add_into keeps them
        for sums in (entry.request, entry.used):
            for key in [key for key, value in sums.items() if not value]:
                del sums[key]
    return dict(sorted(usage.items()))


def fair_shares(
    node: QuotaNode,
    usage: Mapping[str, NamespaceUsage],
    weights: Mapping[str, int],
    runtime: RL | None = None,
) -> dict[str, RL]:
    """Each namespace's share of ``node.runtime`` (empty for orphans); ``usage``
    is :func:`namespace_usage` of the node, ``runtime`` its runtime when the
    caller read it already.

    Water-filling gives every borrower its cap when all weights are positive
    and the caps fit in the pool together (each round hands the whole pool out
    and nobody passes its cap), and a lone borrower with a positive weight
    whose cap does not fit the whole pool: those cases skip the rounds."""
    names = sorted(usage)
    shares: dict[str, RL] = {ns: {} for ns in names}
    if not node.connected:
        return shares
    if runtime is None:
        runtime = node.runtime
    requests = {ns: masked(usage[ns].request, node.config.max) for ns in names}
    for key in sorted(runtime):
        pool = runtime[key]
        borrowers = [
            (ns, 0, requests[ns].get(key, 0), weights.get(ns, 1))
            for ns in names
            if requests[ns].get(key, 0) > 0
        ]
        if all(weight > 0 for _, _, _, weight in borrowers):
            if sum(cap for _, _, cap, _ in borrowers) <= pool:
                filled = {ns: cap for ns, _, cap, _ in borrowers}
            elif len(borrowers) == 1:  # the one borrower takes the whole pool
                filled = {borrowers[0][0]: pool}
            else:
                filled = water_fill(pool, borrowers)
        else:
            filled = water_fill(pool, borrowers)
        for ns, value in filled.items():
            if value:
                shares[ns][key] = value
    return shares
