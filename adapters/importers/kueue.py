"""Kueue ``ClusterQueue``, ``Cohort``, ``LocalQueue``, ``ResourceFlavor`` → facts
(IMPORT.md §3). Pure: plain dicts in, facts out.

ClusterQueues are leaves, Cohorts parents. A queue's quota of resource ``r`` is
the sum over the flavors that list ``r``; a Cohort's min is its own nominal plus
its children's mins, so DESIGN's ``own = min − Σ children's min`` is the cohort's
own pool and ``available`` is KEP-79's. Tree roots neither lend nor borrow:
Kueue trees never share with each other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .common import (
    DEFAULT,
    RESERVED,
    RL,
    Draft,
    Invalid,
    SourceDocument,
    Translation,
    Warnings,
    amount,
    api_group,
    finish,
    mapping,
    name_or_unknown,
    object_name,
    sequence,
    text,
    warn_unknown_fields,
)

GROUP = "kueue.x-k8s.io"
#: Fields without an equivalent, warned by name when present (IMPORT.md §3).
WARNED = (
    "preemption",
    "flavorFungibility",
    "queueingStrategy",
    "stopPolicy",
    "admissionChecks",
    "admissionChecksStrategy",
    "admissionScope",
    "concurrentAdmissionPolicy",
    "namespaceSelector",
    "fairSharing",
)
FLAVOR_PLACEMENT = ("nodeLabels", "nodeTaints", "tolerations", "topologyName")


def is_kueue(body: dict[str, Any]) -> bool:
    """``kueue.x-k8s.io`` and its sub-groups (``config.kueue.x-k8s.io`` Configuration...)."""
    group = api_group(body)
    return group is not None and (group == GROUP or group.endswith("." + GROUP))


@dataclass
class _Node:
    """A ClusterQueue or Cohort as read, before naming and the tree sums."""

    kind: str
    name: str
    subject: str
    parent: str  # the Kueue name of its cohort ("" = none)
    quota: Draft
    named: set[str] = field(default_factory=set)  # resources its resource groups name


def _warn_fields(spec: dict[str, Any], subject: str, warnings: Warnings) -> None:
    for key in WARNED:
        if key not in spec:
            continue
        if key == "namespaceSelector" and spec[key] in ({}, None):
            continue  # {} selects every namespace: nothing lost
        warnings.add(key, subject, f"spec.{key} has no equivalent; not imported")


def _resource_groups(spec: dict[str, Any], node: _Node, warnings: Warnings) -> None:
    """min, borrowing_limit and lending_limit summed over flavors (IMPORT.md §3 Flavors)."""
    subject = node.subject
    nominal: RL = {}
    limits: dict[str, RL] = {"borrowingLimit": {}, "lendingLimit": {}}
    unset: dict[str, set[str]] = {"borrowingLimit": set(), "lendingLimit": set()}
    flavors_of: dict[str, list[str]] = {}
    for g, raw_group in enumerate(sequence(spec.get("resourceGroups"), "spec.resourceGroups")):
        gpath = f"spec.resourceGroups[{g}]"
        group = mapping(raw_group, gpath, optional=False)
        for index, covered in enumerate(
            sequence(group.get("coveredResources"), f"{gpath}.coveredResources")
        ):
            node.named.add(
                text(covered, f"{gpath}.coveredResources[{index}]", optional=False) or ""
            )
        for f, raw_flavor in enumerate(sequence(group.get("flavors"), f"{gpath}.flavors")):
            fpath = f"{gpath}.flavors[{f}]"
            flavor = mapping(raw_flavor, fpath, optional=False)
            flavor_name = text(flavor.get("name"), f"{fpath}.name") or "?"
            for r, raw_resource in enumerate(
                sequence(flavor.get("resources"), f"{fpath}.resources")
            ):
                rpath = f"{fpath}.resources[{r}]"
                resource = mapping(raw_resource, rpath, optional=False)
                name = text(resource.get("name"), f"{rpath}.name", optional=False) or ""
                node.named.add(name)
                flavors_of.setdefault(name, []).append(flavor_name)
                value = amount(
                    name,
                    resource.get("nominalQuota", 0),
                    f"{rpath}.nominalQuota",
                    subject,
                    warnings,
                )
                nominal[name] = nominal.get(name, 0) + (value or 0)
                for limit in ("borrowingLimit", "lendingLimit"):
                    if resource.get(limit) is None:
                        unset[limit].add(name)
                        continue
                    value = amount(name, resource[limit], f"{rpath}.{limit}", subject, warnings)
                    if value is None:
                        unset[limit].add(name)
                    else:
                        limits[limit][name] = limits[limit].get(name, 0) + value
    for name, flavors in sorted(flavors_of.items()):
        if len(flavors) > 1:
            warnings.add(
                "flavor",
                subject,
                f"{name} is summed over flavors {', '.join(flavors)}: the per-flavor split and"
                " node placement are lost",
            )
    node.quota.min = nominal
    for limit, target in (("borrowingLimit", "borrowing_limit"), ("lendingLimit", "lending_limit")):
        kept = {r: v for r, v in limits[limit].items() if r not in unset[limit]}
        setattr(node.quota, target, kept or None)


def _read(kind: str, body: dict[str, Any], warnings: Warnings) -> _Node:
    name = object_name(body)
    subject = f"{kind}/{name}"
    spec = mapping(body.get("spec"), "spec")
    parent_keys = ("cohort", "cohortName") if kind == "ClusterQueue" else ("parent", "parentName")
    parent = ""
    for key in parent_keys:
        parent = parent or text(spec.get(key), f"spec.{key}") or ""
    node = _Node(kind, name, subject, parent, Draft(name=name, subject=subject))
    node.quota.is_parent = kind == "Cohort"
    _warn_fields(spec, subject, warnings)
    warn_unknown_fields(spec, ("resourceGroups", *parent_keys, *WARNED), "spec", subject, warnings)
    _resource_groups(spec, node, warnings)
    return node


def _names(
    queues: dict[str, _Node], cohorts: dict[str, _Node], warnings: Warnings
) -> dict[tuple[str, str], str]:
    """quotaledger names (IMPORT.md §1 Names): renamed only on collision."""
    names: dict[tuple[str, str], str] = {}
    for name, node in queues.items():
        new = name
        if name in RESERVED or (name == DEFAULT and node.parent):
            new = f"clusterqueue/{name}"
        elif name == DEFAULT:
            warnings.add(
                "default-queue",
                node.subject,
                "becomes quotaledger's default (outside runtime and available)",
            )
        if new != name:
            warnings.add("renamed", node.subject, f"imported as {new!r}")
        names[("ClusterQueue", name)] = new
    for name, node in cohorts.items():
        new = f"cohort/{name}" if name in queues or name in RESERVED or name == DEFAULT else name
        if new != name:
            warnings.add("renamed", node.subject, f"imported as {new!r}")
        names[("Cohort", name)] = new
    return names


def translate(documents: Sequence[SourceDocument]) -> Translation:
    """Kueue objects → facts and warnings (IMPORT.md §3)."""
    warnings, rejected = Warnings(), Warnings()
    queues: dict[str, _Node] = {}
    cohorts: dict[str, _Node] = {}
    local_queues: list[tuple[str, str | None, str | None, str]] = []
    for document in documents:
        body = document.body
        kind = body.get("kind")
        subject = f"{kind}/{name_or_unknown(body)}"
        if api_group(body) != GROUP or kind not in (
            "ClusterQueue",
            "Cohort",
            "LocalQueue",
            "ResourceFlavor",
        ):
            warnings.add("skipped-kind", subject, "not read by the importer")
            continue
        try:
            if kind == "ResourceFlavor":
                _flavor(body, subject, warnings)
            elif kind == "LocalQueue":
                local_queues.append(_local_queue(body, subject, document.origin, warnings))
            else:
                node = _read(kind, body, warnings)
                table = queues if kind == "ClusterQueue" else cohorts
                if node.name in table:
                    warnings.add(
                        "duplicate-name",
                        subject,
                        "an object of this kind and name came earlier: skipped",
                    )
                else:
                    table[node.name] = node
        except Invalid as exc:
            rejected.add("invalid", subject, f"{document.origin}: {exc}; object not imported")
    for node in [*queues.values(), *cohorts.values()]:
        if node.parent and node.parent not in cohorts:
            subject = f"Cohort/{node.parent}"
            warnings.add(
                "implicit-cohort",
                subject,
                "named as a cohort but not defined: created without quota, under root",
            )
            cohorts[node.parent] = _Node(
                "Cohort",
                node.parent,
                subject,
                "",
                Draft(name=node.parent, subject=subject, is_parent=True),
            )
    names = _names(queues, cohorts, warnings)
    drafts: dict[str, Draft] = {}
    configured: dict[str, set[str]] = {}
    children: dict[str, list[_Node]] = {}
    for node in [*queues.values(), *cohorts.values()]:
        node.quota.name = names[(node.kind, node.name)]
        node.quota.parent = names[("Cohort", node.parent)] if node.parent else "root"
        drafts[node.quota.name] = node.quota
        configured[node.quota.name] = set(node.quota.min)
        if node.parent:
            children.setdefault(node.parent, []).append(node)
    _cohort_sums(cohorts, children)
    for node in [*queues.values(), *cohorts.values()]:
        if not node.parent:
            _tree_root(node, children)
    _namespaces(local_queues, queues, warnings)
    return finish(drafts, warnings, rejected, configured_min=configured)


def _cohort_sums(cohorts: dict[str, _Node], children: dict[str, list[_Node]]) -> None:
    """Cohort min = own nominal + Σ children's min, recursively (cycles left to finish)."""
    done: set[str] = set()
    visiting: set[str] = set()

    def total(name: str) -> RL:
        node = cohorts[name]
        if name in done or name in visiting:
            return node.quota.min
        visiting.add(name)
        for child in children.get(name, []):
            sums = total(child.name) if child.kind == "Cohort" else child.quota.min
            for resource, value in sums.items():
                node.quota.min[resource] = node.quota.min.get(resource, 0) + value
        visiting.discard(name)
        done.add(name)
        return node.quota.min

    for name in sorted(cohorts):
        total(name)


def _tree_root(node: _Node, children: dict[str, list[_Node]]) -> None:
    """A tree root neither lends nor borrows: borrowing_limit 0 on every resource its
    subtree names (IMPORT.md §3)."""
    named: set[str] = set()
    stack, seen = [node], set()
    while stack:
        item = stack.pop()
        if (item.kind, item.name) in seen:
            continue
        seen.add((item.kind, item.name))
        named |= item.named
        if item.kind == "Cohort":
            stack.extend(children.get(item.name, []))
    named.discard("")
    node.quota.allow_lent = False
    node.quota.lending_limit = None
    node.quota.borrowing_limit = dict.fromkeys(sorted(named), 0) or None


def _flavor(body: dict[str, Any], subject: str, warnings: Warnings) -> None:
    spec = mapping(body.get("spec"), "spec")
    for key in FLAVOR_PLACEMENT:
        if spec.get(key):
            warnings.add(
                "flavor", subject, f"spec.{key}: node placement by flavor has no equivalent"
            )
    warn_unknown_fields(spec, FLAVOR_PLACEMENT, "spec", subject, warnings)


def _local_queue(
    body: dict[str, Any], subject: str, origin: str, warnings: Warnings
) -> tuple[str, str | None, str | None, str]:
    metadata = mapping(body.get("metadata"), "metadata")
    namespace = text(metadata.get("namespace"), "metadata.namespace")
    spec = mapping(body.get("spec"), "spec")
    queue = text(spec.get("clusterQueue"), "spec.clusterQueue")
    _warn_fields(spec, subject, warnings)
    warn_unknown_fields(spec, ("clusterQueue", *WARNED), "spec", subject, warnings)
    return subject, namespace or None, queue or None, origin


def _namespaces(
    local_queues: list[tuple[str, str | None, str | None, str]],
    queues: dict[str, _Node],
    warnings: Warnings,
) -> None:
    """A LocalQueue's namespace joins its ClusterQueue's namespaces; a namespace pointing
    to two ClusterQueues goes to neither (DESIGN §8 rule 8)."""
    targets: dict[str, set[str]] = {}
    for subject, namespace, queue, _origin in local_queues:
        if namespace is None:
            warnings.add("localqueue", subject, "no metadata.namespace: nothing to associate")
        elif queue is None or queue not in queues:
            warnings.add("localqueue", subject, f"clusterQueue {queue!r} is not in the input")
        else:
            targets.setdefault(namespace, set()).add(queue)
    for namespace, found in sorted(targets.items()):
        if len(found) > 1:
            warnings.add(
                "localqueue",
                f"namespace/{namespace}",
                f"LocalQueues point to {', '.join(sorted(found))}: given to none"
                " (DESIGN §8 rule 8)",
            )
            continue
        queues[next(iter(found))].quota.namespaces.append(namespace)
