"""The per-quota dictionary recompute the projection used before its numbers
moved into columns (DECISIONS 153: kept as the reference, in the tests only).

:func:`reference` derives, from a state's facts alone (configurations, the
tree, active pods and their quotas, nodes, settings), every number the
projection keeps per quota, quota by quota on sparse dicts (DESIGN §5
"Request and used", "Runtime", "Available"; §8 rules 1, 2, 10, 16): the same
rules as ``projections.request``/``runtime``/``settle`` were written before,
with nothing shared with the column code but the configuration constants
(``Terms``) and the water-fill of ``projections.resources``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from quotaledger.projections.columns import DERIVED
from quotaledger.projections.resources import RL, add_into, water_fill_ordered
from quotaledger.projections.state import BUILTIN, DEFAULT, ROOT, SYSTEM, ProjectedState
from quotaledger.projections.terms import Terms, kept_local

FIELDS = ("pod_request", "pod_used", *DERIVED)


@dataclass
class Numbers:
    """One quota's numbers, as dicts (zeros left out)."""

    pod_request: RL = field(default_factory=dict)
    pod_used: RL = field(default_factory=dict)
    request: RL = field(default_factory=dict)
    limited_request: RL = field(default_factory=dict)
    used: RL = field(default_factory=dict)
    subtree: RL = field(default_factory=dict)
    local: RL = field(default_factory=dict)
    usage: RL = field(default_factory=dict)
    effective_min: RL = field(default_factory=dict)
    runtime: RL = field(default_factory=dict)


def _sparse(amounts: RL) -> RL:
    return {key: value for key, value in amounts.items() if value}


def reference(state: ProjectedState) -> dict[str, Any]:
    """Every quota's numbers, the cluster total and root's KEP-79 sums."""
    quotas = state.quotas
    numbers = {name: Numbers() for name in quotas}
    for uid, name in state.pod_quota.items():
        pod = state.pods[uid]
        add_into(numbers[name].pod_request, pod.requests)
        if pod.node is not None:
            add_into(numbers[name].pod_used, pod.requests)

    def children(name: str) -> list[str]:
        return sorted(child for child in state.children_of.get(name, set()) if child in quotas)

    # bottom-up, deepest first (a quota's children are one level deeper)
    for name in sorted(quotas, key=lambda q: (-quotas[q].depth, q)):
        config = quotas[name].config
        terms = Terms(config)
        mine = numbers[name]
        kids = [numbers[child] for child in children(name)] if config.is_parent else []
        if config.is_parent:
            request: RL = {}
            used: RL = {}
            for kid in kids:
                add_into(request, kid.limited_request)
                add_into(used, kid.used)
        else:
            mask = terms.mask
            request = {k: v for k, v in mine.pod_request.items() if mask is None or k in mask}
            used = dict(mine.pod_used)
        for key, value in terms.reserved.items():
            if request.get(key, 0) < value:
                request[key] = value
        limited: RL = {}
        for key, value in request.items():
            cap = terms.caps.get(key)
            limited[key] = value if cap is None or cap >= value else cap
        if config.is_parent:
            own = dict(config.min)
            for child in children(name):
                for key, value in quotas[child].config.min.items():
                    own[key] = own.get(key, 0) - value
            subtree: RL = {key: value for key, value in own.items() if value > 0}
            usage: RL = {}
            for kid in kids:
                for key, value in kid.subtree.items():
                    subtree[key] = subtree.get(key, 0) + value - kid.local.get(key, 0)
                for key, value in kid.usage.items():
                    charged = value - kid.local.get(key, 0)
                    if charged > 0:
                        usage[key] = usage.get(key, 0) + charged
            local = kept_local(subtree, terms.lending)
        else:
            subtree = dict(config.min)
            local = kept_local(subtree, terms.lending)
            usage = dict(used)
        mine.request, mine.limited_request, mine.used = request, limited, used
        mine.subtree, mine.local, mine.usage = subtree, local, usage

    total: RL = {}
    for key, value in state.allocatable.items():
        left = value - numbers[SYSTEM].used.get(key, 0) - numbers[DEFAULT].used.get(key, 0)
        if left > 0:
            total[key] = left
    tops = [
        name
        for name in sorted(state.children_of.get(ROOT, set()))
        if name in quotas and name not in BUILTIN and quotas[name].connected
    ]
    root_subtree: RL = {}
    root_usage: RL = {}
    for name in tops:
        top = numbers[name]
        for key, value in top.subtree.items():
            root_subtree[key] = root_subtree.get(key, 0) + value - top.local.get(key, 0)
        for key, value in top.usage.items():
            charged = value - top.local.get(key, 0)
            if charged > 0:
                root_usage[key] = root_usage.get(key, 0) + charged

    # top-down from root through connected parents
    shares = [(total, tops)]
    while shares:
        amount, names = shares.pop()
        _distribute(state, numbers, amount, names)
        for name in names:
            if quotas[name].config.is_parent:
                shares.append((numbers[name].runtime, children(name)))
    return {
        "quotas": {
            name: {item: _sparse(getattr(numbers[name], item)) for item in FIELDS}
            for name in quotas
        },
        "cluster_total": total,
        "root_subtree": _sparse(root_subtree),
        "root_usage": _sparse(root_usage),
    }


def _distribute(
    state: ProjectedState, numbers: dict[str, Numbers], total: RL, names: list[str]
) -> None:
    """One parent's water-fill (DESIGN §5 "Runtime" steps 1-3), names in name order."""
    configs = [state.quotas[name].config for name in names]
    kids = [numbers[name] for name in names]
    keys: set[str] = set()
    for kid, config in zip(kids, configs, strict=True):
        keys.update(kid.limited_request)
        keys.update(config.min)
    for key in sorted(keys):
        amount = total.get(key, 0)
        mins = [config.min.get(key, 0) for config in configs]
        min_sum = sum(mins)
        if state.settings.min_scaling and amount < min_sum:
            mins = [amount * value // min_sum for value in mins]
        borrowers: list[int] = []
        starts: list[int] = []
        caps: list[int] = []
        weights: list[int] = []
        pool = amount
        for i, kid in enumerate(kids):
            kid.effective_min[key] = mins[i]
            want = kid.limited_request.get(key, 0)
            if want > mins[i]:
                borrowers.append(i)
                starts.append(mins[i])
                caps.append(want)
                weights.append(Terms(configs[i]).weights.get(key, amount))
                pool -= mins[i]
            else:
                pool -= want
                kid.runtime[key] = want
        filled = water_fill_ordered(pool, starts, caps, weights) if pool > 0 else starts
        for i, value in zip(borrowers, filled, strict=True):
            kids[i].runtime[key] = value


def projected(state: ProjectedState) -> dict[str, Any]:
    """What the state holds of the same numbers (read through its quotas)."""
    return {
        "quotas": {
            name: {item: getattr(node, item) for item in FIELDS}
            for name, node in state.quotas.items()
        },
        "cluster_total": state.cluster_total,
        "root_subtree": state.root_subtree,
        "root_usage": state.root_usage,
    }
