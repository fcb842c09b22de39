"""Validation of quota configuration (DESIGN §5 Validation, §8 rules 8-10, 13-15).

Each function returns the reason a change is invalid, or None. An invalid
change is recorded in ``state.rejected`` and the last valid configuration
stays in force.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from quotaledger.events.model import QuotaRemoved, QuotaUpserted

from .state import BUILTIN, DEFAULT, ROOT, SYSTEM, ProjectedState


def _sum_mins(configs: Iterable[QuotaUpserted]) -> dict[str, int]:
    total: dict[str, int] = {}
    for config in configs:
        for key, value in config.min.items():
            total[key] = total.get(key, 0) + value
    return total


def _uncovered(parent_min: Mapping[str, int], children_min: Mapping[str, int]) -> str | None:
    for key in sorted(children_min):
        if children_min[key] > parent_min.get(key, 0):
            return f"{key}: {parent_min.get(key, 0)} < {children_min[key]}"
    return None


def check_upsert(state: ProjectedState, config: QuotaUpserted) -> str | None:
    """Why ``config`` may not be installed, or None when it is valid."""
    name = config.name
    if name in (ROOT, SYSTEM):
        return f"quota {name!r} is built in and cannot be upserted"
    if name == DEFAULT and (config.parent != ROOT or config.is_parent):
        return "quota 'default' must have parent root and is_parent false"
    if not name:
        return "name: must not be empty"
    if config.max is not None:
        for key in sorted(config.min):
            if config.min[key] > 0 and key not in config.max:
                return f"min.{key} is positive but max does not list {key}"
        for key in sorted(config.max):
            if config.min.get(key, 0) > config.max[key]:
                return f"min.{key} {config.min[key]} exceeds max.{key} {config.max[key]}"
        if config.preemption_delay_s > 0:
            for key in sorted(config.min):
                if config.min[key] > 0 and key in config.max and config.max[key] <= config.min[key]:
                    return (
                        f"preemption_delay_s > 0 needs max.{key} > min.{key}"
                        f" ({config.max[key]} <= {config.min[key]})"
                    )
    parent = config.parent
    if parent == name:
        return f"parent: quota {name!r} cannot be its own parent"
    if parent != ROOT and parent in state.quotas:
        above = state.quotas[parent].config
        if not above.is_parent:
            return f"parent: {parent!r} is not a parent quota (is_parent false)"
        chain = parent
        while chain != ROOT and chain in state.quotas:
            if chain == name:
                return f"parent: making {parent!r} the parent of {name!r} creates a cycle"
            chain = state.quotas[chain].config.parent
        current = state.quotas.get(name)
        unchanged = (
            current is not None
            and current.config.parent == parent
            and current.config.min == config.min
        )
        # An existing parent's min always covers its children's (checked on
        # both sides), so a child keeping its parent and min cannot break it.
        if not unchanged:
            siblings = [
                state.quotas[child].config for child in state.children(parent) if child != name
            ]
            short = _uncovered(above.min, _sum_mins([*siblings, config]))
            if short:
                return f"min: parent {parent!r} min does not cover its children's mins ({short})"
    children = [state.quotas[child].config for child in state.children(name)]
    if children:
        if not config.is_parent:
            return f"is_parent: {name!r} has children {sorted(c.name for c in children)}"
        short = _uncovered(config.min, _sum_mins(children))
        if short:
            return f"min: {name!r} min does not cover its children's mins ({short})"
    node = state.quotas.get(name)
    if config.is_parent and node is not None and not node.config.is_parent and node.pods:
        return f"is_parent: {name!r} still has {len(node.pods)} active pods"
    for ns in config.namespaces:
        owner = state.namespace_claims.get(ns)
        if owner is not None and owner != name:
            return f"namespaces: {ns!r} already belongs to quota {owner!r}"
    if len(set(config.namespaces)) != len(config.namespaces):
        return "namespaces: listed twice"
    return None


def check_remove(state: ProjectedState, event: QuotaRemoved) -> str | None:
    """Why a quota may not be removed, or None (DESIGN §5, §8 rule 4)."""
    name = event.name
    if name == ROOT or name in BUILTIN:
        return f"quota {name!r} is built in and cannot be removed"
    node = state.quotas.get(name)
    if node is None:
        return f"name: unknown quota {name!r}"
    if state.children(name):
        return f"quota {name!r} has children {sorted(state.children(name))}"
    if node.pods:
        return f"quota {name!r} still has {len(node.pods)} active pods"
    return None
