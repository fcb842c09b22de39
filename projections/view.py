"""The state JSON of DESIGN §7 (and the state hash it carries, :mod:`.state_digest`)."""

from __future__ import annotations

from typing import Any

from quotaledger.events.times import rfc3339

from .available import NumberReader, reported_available
from .derive import settle
from .fair_share import fair_shares, namespace_usage
from .resources import RL, sparse
from .state import DEFAULT, SYSTEM, NamespaceUsage, ProjectedState, QuotaNode
from .state_digest import state_hash


def _config_rl(amounts: RL | None) -> RL | None:
    return None if amounts is None else {key: amounts[key] for key in sorted(amounts)}


def quota_view(state: ProjectedState, name: str, memo: dict[str, RL]) -> dict[str, Any]:
    """One quota as in ``state.quotas[name]`` (call after ``settle``)."""
    node = state.quotas[name]
    return _quota_view(state, name, memo, getattr, namespace_usage(state, node))


def _quota_view(
    state: ProjectedState,
    name: str,
    memo: dict[str, RL],
    numbers: NumberReader,
    usage_by_ns: dict[str, NamespaceUsage],
) -> dict[str, Any]:
    """:func:`quota_view` with the quota's numbers read through ``numbers``
    (sparse dicts in key order already, as ``QuotaNode`` builds them) and
    its namespaces' usage given."""
    node = state.quotas[name]
    config = node.config
    runtime = numbers(node, "runtime")
    shares = fair_shares(node, usage_by_ns, state.namespace_weights, runtime)
    namespaces = {
        ns: {
            "weight": state.namespace_weights.get(ns, 1),
            "request": sparse(usage.request),
            "used": sparse(usage.used),
            "fair_share": shares[ns],
        }
        for ns, usage in usage_by_ns.items()
    }
    return {
        "parent": config.parent,
        "is_parent": config.is_parent,
        "orphan": not node.connected,
        "min": _config_rl(config.min),
        "max": _config_rl(config.max),
        "effective_min": numbers(node, "effective_min"),
        "shared_weight": _config_rl(config.shared_weight),
        "allow_lent": config.allow_lent,
        "lending_limit": _config_rl(config.lending_limit),
        "borrowing_limit": _config_rl(config.borrowing_limit),
        "request": numbers(node, "request"),
        "limited_request": numbers(node, "limited_request"),
        "used": numbers(node, "used"),
        "runtime": runtime,
        "available": sparse(reported_available(state, name, memo, numbers)),
        "pods": sorted(node.pods),
        "children": sorted(state.children(name)),
        "namespaces": namespaces,
    }


class _SettledNumbers:
    """Every quota's numbers read at once, field by field, as the sparse
    dicts ``QuotaNode`` builds one at a time (the state must stay unchanged
    while this is used: it is for one reading of a settled state)."""

    def __init__(self, state: ProjectedState) -> None:
        self.store = state.columns
        self.fields: dict[str, list[RL]] = {}

    def __call__(self, node: QuotaNode, field: str) -> RL:
        if node.store is not self.store:
            return {}
        rows = self.fields.get(field)
        if rows is None:
            rows = self.fields[field] = self.store.read_rows(field)
        return rows[node.row]


def _body(state: ProjectedState) -> dict[str, Any]:
    settle(state)
    memo: dict[str, RL] = {}
    numbers = _SettledNumbers(state)
    return {
        "cluster": cluster_view(state),
        "quotas": {
            name: _quota_view(
                state, name, memo, numbers, namespace_usage(state, state.quotas[name])
            )
            for name in sorted(state.quotas)
        },
        "preemptions": preemptions_view(state),
    }


def cluster_view(state: ProjectedState) -> dict[str, RL]:
    """The state JSON's ``cluster`` (DESIGN §7; call after ``settle``)."""
    return {
        "allocatable": sparse(state.allocatable),
        "system_used": sparse(state.quotas[SYSTEM].used),
        "default_used": sparse(state.quotas[DEFAULT].used),
        "total": sparse(state.cluster_total),
    }


def preemptions_view(state: ProjectedState) -> dict[str, dict[str, Any]]:
    """The state JSON's ``preemptions``: each queue with a deadline or a
    running preemption (DESIGN §7)."""
    queues = sorted(set(state.decrease_deadlines) | set(state.occupied))
    return {
        queue: {
            "deadline": (
                rfc3339(state.decrease_deadlines[queue])
                if queue in state.decrease_deadlines
                else None
            ),
            "running": state.occupied.get(queue),
        }
        for queue in queues
    }


def state_json(state: ProjectedState) -> dict[str, Any]:
    """The whole state JSON of DESIGN §7."""
    body = _body(state)
    return {
        "offset": state.offset,
        "time": rfc3339(state.ts),
        "hash": state_hash(state),
        **body,
        "rejected": [
            {"offset": item.offset, "kind": item.kind, "reason": item.reason}
            for item in state.rejected
        ],
    }
