"""What a reconciler would decide, as pure functions of the state (DESIGN §6, §8 19-34).

The engine proposes these plans as decisions; ``audit`` re-derives them from
the facts before each decision and compares. Nothing here reads a clock.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import msgspec

from quotaledger.events.model import PodUpserted, PreemptionCause
from quotaledger.events.times import as_utc, epoch_us

from .clocks import owed
from .derive import settle
from .resources import RL, add_into, largest_remainder, sparse
from .state import ProjectedState, QuotaNode
from .tree import ancestors


class Victim(msgspec.Struct, frozen=True):
    """A pod chosen for eviction and the numbers that justified it."""

    pod_uid: str
    queue: str
    requests: RL
    explain: dict[str, Any]


class Plan(msgspec.Struct):
    """A preemption to start: its target and victims (possibly none)."""

    queue: str
    cause: PreemptionCause
    target: RL
    victims: list[Victim]
    reason: str = ""
    pod_uid: str | None = None


def _younger_first(pod: PodUpserted) -> tuple[int, int]:
    """Sort key putting younger pods (later ``created_at``) first; a null
    ``created_at`` counts as oldest (§8 rule 25). Exact integer microseconds, a
    time without offset being UTC (§9): never the machine's local zone, so the
    order is the same on every machine."""
    if pod.created_at is None:
        return (1, 0)
    return (0, -epoch_us(pod.created_at))


def created_text(pod: PodUpserted) -> str | None:
    """A pod's ``created_at`` as recorded in a victim's ``explain``: RFC 3339 in UTC
    with ``Z`` (DECISIONS 9; the microseconds the input gave, when not zero), or null."""
    if not pod.created_at:
        return None
    return as_utc(pod.created_at).astimezone(UTC).isoformat().removesuffix("+00:00") + "Z"


def comparable_explain(explain: Mapping[str, Any]) -> dict[str, Any]:
    """An explain as ``audit`` compares a recorded one with the re-derived one:
    ``sort_key.created_at`` as an instant, so an explain written before created_at was
    written with ``Z`` (``+00:00``, DECISIONS 264) still matches."""
    out = dict(explain)
    key = out.get("sort_key")
    created = key.get("created_at") if isinstance(key, Mapping) else None
    if isinstance(key, Mapping) and isinstance(created, str):
        try:
            instant: Any = epoch_us(datetime.fromisoformat(created))
        except ValueError:
            instant = created
        out["sort_key"] = {**key, "created_at": instant}
    return out


def decrease_sort_key(pod: PodUpserted) -> tuple[Any, ...]:
    """Rule 1 victim order: non-originator, lower priority, allow_preemption
    first, younger, uid."""
    return (
        pod.originator,
        pod.priority,
        not pod.allow_preemption,
        _younger_first(pod),
        pod.uid,
    )


def revoke_sort_key(pod: PodUpserted) -> tuple[Any, ...]:
    """Rule 2 order, least important first: lower priority, later start, uid."""
    return (pod.priority, _younger_first(pod), pod.uid)


def _evictable(state: ProjectedState, node: QuotaNode) -> list[PodUpserted]:
    """Running pods with a node, not daemonset, not already being evicted (§8 rule 12)."""
    out = []
    for uid in node.pods:
        pod = state.pods[uid]
        if (
            pod.phase == "Running"
            and pod.node is not None
            and not pod.daemonset
            and uid not in state.evicting_pods
            and uid not in state.evicted_pods
        ):
            out.append(pod)
    return out


def _shares_resource(pod: PodUpserted, target: Mapping[str, int]) -> bool:
    return any(pod.requests.get(key, 0) > 0 for key, value in target.items() if value > 0)


def _path(state: ProjectedState, name: str) -> list[QuotaNode]:
    return [state.quotas[name], *(state.quotas[a] for a in ancestors(state, name))]


def breaks_guarantee(
    state: ProjectedState, leaf: str, pod: PodUpserted, chosen: Mapping[str, RL]
) -> bool:
    """§8 rule 23: evicting ``pod`` after ``chosen`` would take the leaf or an
    ancestor with a positive min below that min, for a resource it requests."""
    for node in _path(state, leaf):
        taken = chosen.get(node.config.name, {})
        for key, amount in pod.requests.items():
            floor = node.config.min.get(key, 0)
            if amount > 0 and floor > 0:
                left = node.used.get(key, 0) - taken.get(key, 0) - amount
                if left < floor:
                    return True
    return False


def met(claimed: Mapping[str, int], target: Mapping[str, int], miss_percent: float) -> bool:
    """Target reached, or what is left is within ``miss_percent`` of it (§8 rule 22)."""
    return all(
        (value - claimed.get(key, 0)) * 100 <= value * miss_percent for key, value in target.items()
    )


# ------------------------------------------------------------ quota decrease


def decrease_target(state: ProjectedState, queue: str) -> RL:
    """Preemptable amount: used − new max where positive, never taking the
    queue or an ancestor below its min (DESIGN §6 rule 1; the seed's table)."""
    settle(state)
    node = state.quotas[queue]
    cap = node.config.max
    if cap is None:
        return {}
    target: RL = {}
    for key in sorted(cap):
        over = node.used.get(key, 0) - cap[key]
        for holder in _path(state, queue):
            floor = holder.config.min.get(key, 0)
            if floor > 0:
                over = min(over, holder.used.get(key, 0) - floor)
        if over > 0:
            target[key] = over
    return target


def split_target(state: ProjectedState, queue: str, target: RL) -> list[tuple[str, RL]]:
    """Leaf targets under ``queue``: a parent splits each resource among its
    children by releasable usage (used above min; all of it where no min),
    skipping children with no usage or a running preemption; largest remainder
    with the name tie-break; depth-first, children in name order (§8 rule 24)."""
    node = state.quotas[queue]
    if not node.config.is_parent:
        return [(queue, target)]
    children = [
        state.quotas[name]
        for name in sorted(state.children(queue))
        if state.quotas[name].connected and state.quotas[name].used and name not in state.occupied
    ]
    releasable = {
        child.config.name: {
            key: max(0, value - child.config.min.get(key, 0)) for key, value in child.used.items()
        }
        for child in children
    }
    shares: dict[str, RL] = {child.config.name: {} for child in children}
    for key, amount in sorted(target.items()):
        weights = [(name, releasable[name].get(key, 0)) for name in sorted(shares)]
        for name, share in largest_remainder(amount, weights).items():
            if share:
                shares[name][key] = share
    out: list[tuple[str, RL]] = []
    for child in children:
        name = child.config.name
        if shares[name]:
            out.extend(split_target(state, name, shares[name]))
    return out


def decrease_plan(state: ProjectedState, queue: str) -> Plan | None:
    """The quota-decrease preemption at the deadline, or None when the target
    is empty (§8 rule 21: nothing recorded)."""
    target = decrease_target(state, queue)
    if not target:
        return None
    miss = state.settings.preemption_miss_percent
    chosen: dict[str, RL] = {}
    victims: list[Victim] = []
    node = state.quotas[queue]
    for leaf, leaf_target in split_target(state, queue, target):
        leaf_node = state.quotas[leaf]
        candidates = [
            pod for pod in _evictable(state, leaf_node) if _shares_resource(pod, leaf_target)
        ]
        candidates.sort(key=decrease_sort_key)
        claimed: RL = {}
        for rank, pod in enumerate(candidates):
            if met(claimed, leaf_target, miss):
                break
            if breaks_guarantee(state, leaf, pod, chosen):
                continue
            add_into(claimed, pod.requests)
            for holder in _path(state, leaf):
                add_into(chosen.setdefault(holder.config.name, {}), pod.requests)
            victims.append(
                Victim(
                    pod_uid=pod.uid,
                    queue=leaf,
                    requests=sparse(pod.requests),
                    explain={
                        "rule": "quota-decrease",
                        "queue": queue,
                        "leaf": leaf,
                        "used": sparse(leaf_node.used),
                        "max": node.config.max,
                        "guaranteed": sparse(leaf_node.config.min),
                        "target": leaf_target,
                        "rank": rank,
                        "sort_key": {
                            "originator": pod.originator,
                            "priority": pod.priority,
                            "allow_preemption": pod.allow_preemption,
                            "created_at": created_text(pod),
                            "uid": pod.uid,
                        },
                    },
                )
            )
    reason = "" if victims else "no victim possible without breaking a guarantee"
    return Plan(queue=queue, cause="quota-decrease", target=target, victims=victims, reason=reason)


# ------------------------------------------------------------ overuse revoke


def compared_keys(node: QuotaNode) -> list[str]:
    """§8 rule 28: the resources max lists (all of them when max is null)."""
    if node.config.max is not None:
        return sorted(node.config.max)
    return sorted(node.used.keys() | node.runtime.keys())


def _fits_runtime(used: Mapping[str, int], runtime: Mapping[str, int], keys: list[str]) -> bool:
    return all(used.get(key, 0) <= runtime.get(key, 0) for key in keys)


def revoke_target(node: QuotaNode) -> RL:
    """§8 rule 30: used − runtime per compared resource, where positive."""
    out: RL = {}
    for key in compared_keys(node):
        gap = node.used.get(key, 0) - node.runtime.get(key, 0)
        if gap > 0:
            out[key] = gap
    return out


def overuse_plan(state: ProjectedState, queue: str) -> Plan | None:
    """Take an owing leaf down to used ≤ runtime: remove its preemptible running
    pods least important first until it fits, then add back the most important
    that still fit; evict the rest (DESIGN §6 rule 2). None if it no longer owes."""
    settle(state)
    node = state.quotas[queue]
    if not owed(node):
        return None
    keys = compared_keys(node)
    target = revoke_target(node)
    candidates = [pod for pod in _evictable(state, node) if pod.preemptible]
    candidates.sort(key=revoke_sort_key)
    remaining = dict(node.used)
    runtime = node.runtime
    removed: list[tuple[int, PodUpserted]] = []
    for rank, pod in enumerate(candidates):
        if _fits_runtime(remaining, runtime, keys):
            break
        removed.append((rank, pod))
        for key, value in pod.requests.items():
            remaining[key] = remaining.get(key, 0) - value
    kept: set[str] = set()
    for _, pod in reversed(removed):
        trial = dict(remaining)
        add_into(trial, pod.requests)
        if _fits_runtime(trial, runtime, keys):
            remaining = trial
            kept.add(pod.uid)
    used, runtime = sparse(node.used), sparse(runtime)
    victims = [
        Victim(
            pod_uid=pod.uid,
            queue=queue,
            requests=sparse(pod.requests),
            explain={
                "rule": "overuse",
                "queue": queue,
                "used": dict(used),
                "runtime": dict(runtime),
                "max": node.config.max,
                "guaranteed": sparse(node.config.min),
                "target": target,
                "rank": rank,
                "sort_key": {
                    "priority": pod.priority,
                    "created_at": created_text(pod),
                    "uid": pod.uid,
                },
            },
        )
        for rank, pod in removed
        if pod.uid not in kept
    ]
    reason = "" if victims else "no preemptible running pod to revoke"
    return Plan(queue=queue, cause="overuse", target=target, victims=victims, reason=reason)


# ------------------------------------------------------------ starvation reclaim


def _depth_of_common_ancestor(state: ProjectedState, a: str, b: str) -> int:
    """Depth of the lowest common ancestor of two quotas (root is 0)."""
    above_a = [a, *ancestors(state, a)]
    above_b = {b, *ancestors(state, b)}
    for name in above_a:
        if name in above_b:
            return state.quotas[name].depth
    return 0


def reclaim_target(state: ProjectedState, uid: str) -> RL:
    """§8 rule 32: the starving pod's request − free capacity, where positive."""
    from .clocks import free_capacity

    settle(state)
    free = free_capacity(state)
    pod = state.pods[uid]
    out: RL = {}
    for key in sorted(pod.requests):
        short = pod.requests[key] - max(0, free.get(key, 0))
        if short > 0:
            out[key] = short
    return out


def reclaim_plan(state: ProjectedState, uid: str) -> Plan | None:
    """Reclaim for a starving pod from owing quotas, nearest in the tree first,
    then lower priority, later start, uid; an owing quota gives at most what it
    owed at the start; the last victim may overshoot (§8 rules 32-33). None
    when there is nothing to take or no victim is possible (nothing recorded)."""
    from .clocks import free_capacity, is_starving, owing_quotas

    settle(state)
    if uid not in state.pending_pods or not is_starving(state, uid, free_capacity(state)):
        return None
    queue = state.pod_quota[uid]
    target = reclaim_target(state, uid)
    if not target:
        return None
    budgets: dict[str, RL] = {}
    ranked: list[tuple[tuple[Any, ...], PodUpserted, str]] = []
    # the owing quotas (the others give nothing), in name order
    for name in sorted(owing_quotas(state)):
        node = state.quotas[name]
        if name == queue or name in state.occupied:
            continue
        gap = {key: value for key, value in owed(node).items() if key in target}
        if not gap:
            continue
        budgets[name] = gap
        depth = _depth_of_common_ancestor(state, name, queue)
        for pod in _evictable(state, node):
            if pod.preemptible and _shares_resource(pod, gap):
                key = (-depth, pod.priority, _younger_first(pod), pod.uid)
                ranked.append((key, pod, name))
    ranked.sort(key=lambda item: item[0])
    claimed: RL = {}
    taken: dict[str, RL] = {}
    victims: list[Victim] = []
    for rank, (sort_key, pod, name) in enumerate(ranked):
        if met(claimed, target, 0.0):
            break
        budget = budgets[name]
        given = taken.setdefault(name, {})
        if all(given.get(key, 0) >= value for key, value in budget.items()):
            continue
        add_into(given, pod.requests)
        add_into(claimed, pod.requests)
        node = state.quotas[name]
        victims.append(
            Victim(
                pod_uid=pod.uid,
                queue=name,
                requests=sparse(pod.requests),
                explain={
                    "rule": "reclaim",
                    "queue": name,
                    "for_pod": uid,
                    "for_queue": queue,
                    "used": sparse(node.used),
                    "runtime": sparse(node.runtime),
                    "owed": budget,
                    "target": target,
                    "rank": rank,
                    "sort_key": {
                        "common_ancestor_depth": -sort_key[0],
                        "priority": pod.priority,
                        "created_at": created_text(pod),
                        "uid": pod.uid,
                    },
                },
            )
        )
    if not victims:
        return None
    return Plan(queue=queue, cause="reclaim", target=target, victims=victims, pod_uid=uid)
