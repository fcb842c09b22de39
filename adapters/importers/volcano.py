"""Volcano ``Queue`` (capacity plugin semantics) and namespace-weight ``ResourceQuota`` →
facts (IMPORT.md §4). Pure: plain dicts in, facts out.

A queue's min is Volcano's effective deserved, max(deserved, guarantee); the
guarantee is never lent (``lending_limit = min − guarantee``); max is the
capability after Volcano's inheritance from the parent; surplus is shared in
proportion to deserved.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
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
    resource_list,
    text,
    warn_unknown_fields,
)

GROUP = "scheduling.volcano.sh"
WEIGHT_KEY = "volcano.sh/namespace.weight"
ANNOTATION_PREFIX = "volcano.sh/"
HDRF = frozenset({"volcano.sh/hierarchy", "volcano.sh/hierarchy-weights"})
SPEC_READ = ("parent", "deserved", "guarantee", "capability")
SPEC_WARNED = (
    "weight",
    "priority",
    "reclaimable",
    "affinity",
    "extendClusters",
    "type",
    "dequeueStrategy",
)
#: Resources whose capability ≤ 0 means "inherit" (the rest inherit only when missing).
BASIC = ("cpu", "memory")


def is_volcano(body: dict[str, Any]) -> bool:
    if api_group(body) == GROUP:
        return True
    spec = body.get("spec")
    hard = spec.get("hard") if isinstance(spec, dict) else None
    return body.get("kind") == "ResourceQuota" and isinstance(hard, dict) and WEIGHT_KEY in hard


@dataclass
class _Queue:
    name: str
    subject: str
    parent: str  # Volcano name; "" = root
    draft: Draft
    capability: RL | None


def _warn_spec(spec: dict[str, Any], subject: str, warnings: Warnings) -> None:
    """Fields capacity does not use or quotaledger cannot express (IMPORT.md §4)."""
    defaults: dict[str, Any] = {
        "weight": 1,
        "priority": 0,
        "reclaimable": True,
        "dequeueStrategy": "traverse",
    }
    for key in SPEC_WARNED:
        if key not in spec or spec[key] is None:
            continue
        if key in defaults and spec[key] == defaults[key]:
            continue
        if key == "reclaimable":
            reason = "no quota is exempt from revoke/reclaim; mark pods preemptible: false instead"
        elif key == "weight":
            reason = (
                "ignored by capacity; the proportion plugin's scalar weight has no"
                " per-resource equivalent"
            )
        else:
            reason = "has no equivalent; not imported"
        warnings.add(key, subject, f"spec.{key}={_shown(spec[key])}: {reason}")
    warn_unknown_fields(spec, (*SPEC_READ, *SPEC_WARNED), "spec", subject, warnings)


def _shown(value: Any) -> str:
    """A field's value for a warning (JSON; a self-referencing YAML alias is not)."""
    try:
        return json.dumps(value, sort_keys=True)
    except (TypeError, ValueError, RecursionError):
        return f"<{type(value).__name__}>"


def _annotations(metadata: dict[str, Any], subject: str, warnings: Warnings) -> None:
    for key in sorted(mapping(metadata.get("annotations"), "metadata.annotations")):
        if key in HDRF:
            warnings.add("hdrf", subject, f"{key}: the DRF plugin's hierarchy is not imported")
        elif key.startswith(ANNOTATION_PREFIX) and key != "volcano.sh/closed-by-parent":
            warnings.add("annotation", subject, f"{key} has no equivalent")


def _read_queue(body: dict[str, Any], warnings: Warnings) -> _Queue:
    name = object_name(body)
    subject = f"Queue/{name}"
    metadata = mapping(body.get("metadata"), "metadata")
    spec = mapping(body.get("spec"), "spec")
    _annotations(metadata, subject, warnings)
    _warn_spec(spec, subject, warnings)
    deserved = resource_list(spec.get("deserved"), "spec.deserved", subject, warnings)
    guarantee_spec = mapping(spec.get("guarantee"), "spec.guarantee")
    for key in guarantee_spec:
        if key != "resource":
            warnings.add(
                "guarantee",
                subject,
                f"spec.guarantee.{key}: pruned by the API server, ignored by Volcano",
            )
    guarantee = resource_list(
        guarantee_spec.get("resource"), "spec.guarantee.resource", subject, warnings
    )
    capability = None
    if spec.get("capability") is not None:
        capability = resource_list(spec.get("capability"), "spec.capability", subject, warnings)
    parent = text(spec.get("parent"), "spec.parent") or ""
    draft = Draft(name=name, subject=subject)
    draft.min = {
        r: max(deserved.get(r, 0), guarantee.get(r, 0)) for r in sorted({*deserved, *guarantee})
    }
    lending = {r: draft.min[r] - g for r, g in guarantee.items() if g > 0}
    draft.lending_limit = lending or None
    draft.shared_weight = dict(draft.min) or None
    return _Queue(name, subject, "" if parent == "root" else parent, draft, capability)


def _inherit(own: RL | None, parent: RL | None) -> RL | None:
    """Volcano's capability inheritance: cpu/memory missing or ≤ 0, and missing scalar
    resources, come from the parent's effective capability."""
    if own is None:
        return dict(parent) if parent is not None else None
    out = dict(own)
    for resource in BASIC:
        if out.get(resource, 0) <= 0:
            if parent is not None and resource in parent:
                out[resource] = parent[resource]
            else:
                out.pop(resource, None)
    for resource, value in (parent or {}).items():
        out.setdefault(resource, value)
    return out


def translate(documents: Sequence[SourceDocument]) -> Translation:
    """Volcano Queues and ResourceQuotas → facts and warnings (IMPORT.md §4)."""
    warnings, rejected = Warnings(), Warnings()
    queues: dict[str, _Queue] = {}
    root_capability: RL | None = None
    weights: dict[str, int] = {}
    for document in documents:
        body = document.body
        kind = body.get("kind")
        subject = f"{kind}/{name_or_unknown(body)}"
        try:
            if kind == "ResourceQuota" and api_group(body) in ("", None):
                _resource_quota(body, subject, weights, warnings)
                continue
            if kind != "Queue" or api_group(body) != GROUP:
                warnings.add("skipped-kind", subject, "not read by the importer")
                continue
            queue = _read_queue(body, warnings)
        except Invalid as exc:
            rejected.add("invalid", subject, f"{document.origin}: {exc}; object not imported")
            continue
        if queue.name == "root":
            if queue.capability:
                warnings.add(
                    "root-capability",
                    subject,
                    "inherited into children's max; the cap over root's children together is"
                    " not enforced (quotaledger's root is the cluster)",
                )
                root_capability = queue.capability
            continue
        if queue.name in queues:
            warnings.add("duplicate-name", subject, "a Queue of this name came earlier: skipped")
            continue
        queues[queue.name] = queue
    parents = {q.parent for q in queues.values() if q.parent}
    names: dict[str, str] = {}
    for name, queue in queues.items():
        new = name
        if name in RESERVED or (name == DEFAULT and (queue.parent or name in parents)):
            new = f"queue/{name}"
            warnings.add("renamed", queue.subject, f"imported as {new!r}")
        elif name == DEFAULT:
            warnings.add(
                "default-queue",
                queue.subject,
                "becomes quotaledger's default (outside runtime and available)",
            )
        names[name] = new
    drafts: dict[str, Draft] = {}
    for name, queue in queues.items():
        queue.draft.name = names[name]
        queue.draft.is_parent = name in parents
        if not queue.parent:
            queue.draft.parent = "root"
        elif queue.parent in queues:
            queue.draft.parent = names[queue.parent]
        else:
            queue.draft.parent = queue.parent
            warnings.add(
                "missing-parent",
                queue.subject,
                f"parent {queue.parent!r} is not in the input: imported as an orphan",
            )
        drafts[queue.draft.name] = queue.draft
    _capabilities(queues, root_capability)
    configured = {d.name: set(d.min) for d in drafts.values()}
    return finish(drafts, warnings, rejected, configured_min=configured, namespace_weights=weights)


def _capabilities(queues: dict[str, _Queue], root_capability: RL | None) -> None:
    """Effective capability top-down from root (a cycle keeps its own capability)."""
    effective: dict[str, RL | None] = {}
    visiting: set[str] = set()

    def resolve(name: str) -> RL | None:
        if name in effective:
            return effective[name]
        queue = queues[name]
        if name in visiting:
            return queue.capability
        visiting.add(name)
        if not queue.parent:
            parent = root_capability
        elif queue.parent in queues:
            parent = resolve(queue.parent)
        else:
            parent = None
        effective[name] = _inherit(queue.capability, parent)
        visiting.discard(name)
        return effective[name]

    for name in sorted(queues):
        queues[name].draft.max = resolve(name)


def _resource_quota(
    body: dict[str, Any], subject: str, weights: dict[str, int], warnings: Warnings
) -> None:
    """``volcano.sh/namespace.weight`` → the namespace's weight: the largest over its
    ResourceQuotas, at least 1, as Volcano read it."""
    metadata = mapping(body.get("metadata"), "metadata")
    spec = mapping(body.get("spec"), "spec")
    hard = mapping(spec.get("hard"), "spec.hard")
    for key in sorted(hard):
        if key != WEIGHT_KEY:
            warnings.add(
                "resourcequota", subject, f"spec.hard.{key}: Kubernetes quota, not imported"
            )
    if WEIGHT_KEY not in hard:
        return
    namespace = text(metadata.get("namespace"), "metadata.namespace")
    if not namespace:
        warnings.add(
            "resourcequota", subject, "no metadata.namespace: the weight belongs to no namespace"
        )
        return
    value = amount(
        "namespace.weight", hard[WEIGHT_KEY], f"spec.hard.{WEIGHT_KEY}", subject, warnings
    )
    if value is None:
        return
    weights[namespace] = max(weights.get(namespace, 1), value, 1)
