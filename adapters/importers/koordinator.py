"""Koordinator ``ElasticQuota`` → facts (IMPORT.md §2). Pure: plain dicts in, facts out.

One ElasticQuota is one quota named by ``metadata.name`` (names are global in
Koordinator); the tree comes from the ``quota.scheduling.koordinator.sh/parent``
label. Koordinator masks requests to the keys of max, so a quota without max
gets ``max: {}`` (it manages no resource), not null.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from .common import (
    DEFAULT,
    Draft,
    Invalid,
    SourceDocument,
    Translation,
    Warnings,
    finish,
    mapping,
    name_or_unknown,
    object_name,
    resource_list,
    warn_unknown_fields,
)

PREFIX = "quota.scheduling.koordinator.sh/"
QUEUE_PREFIX = "koord-queue/"
ROOT_NAMES = frozenset({"koordinator-root-quota", "root"})
SYSTEM_NAMES = frozenset({"koordinator-system-quota", "system"})
DEFAULT_NAMES = frozenset({"koordinator-default-quota", DEFAULT})
#: Written by the scheduler and controllers: state, silently ignored.
SILENT = frozenset(
    {
        "tree-id",
        "profile",
        "runtime",
        "request",
        "child-request",
        "guaranteed",
        "allocated",
        "non-preemptible-request",
        "non-preemptible-used",
        "total-resource",
        "unschedulable-resource",
        "resource-keys",
    }
)
#: Configuration without an equivalent, warned by the key suffix.
WARNED = frozenset(
    {"allow-force-update", "ignore-default-tree", "max-strict-check-resource-keys", "admission"}
)
READ_LABELS = frozenset({"parent", "is-parent", "allow-lent-resource", "is-root"})
READ_ANNOTATIONS = frozenset({"shared-weight", "namespaces"})


def is_koordinator(body: dict[str, Any]) -> bool:
    """ElasticQuota of ``scheduling.sigs.k8s.io`` (``apiVersion`` may be absent), or an
    object of Koordinator's own quota group (``quota.koordinator.sh``)."""
    api = body.get("apiVersion")
    group = api.split("/")[0] if isinstance(api, str) and "/" in api else ""
    if group in ("scheduling.sigs.k8s.io", "quota.koordinator.sh"):
        return True
    return api is None and body.get("kind") == "ElasticQuota"


def _keys(
    raw: Any, path: str, subject: str, warnings: Warnings
) -> tuple[dict[str, str], dict[str, Any]]:
    """The peer's own keys (suffix → string value) and the koord-queue keys of a label or
    annotation map; a boolean or number is read as its text, a map or list ignored."""
    own: dict[str, str] = {}
    queue: dict[str, Any] = {}
    for key, value in mapping(raw, path).items():
        if key.startswith(QUEUE_PREFIX):
            queue[key] = value
            continue
        if not key.startswith(PREFIX):
            continue  # other prefixes: not the peer's configuration (IMPORT.md §1)
        if isinstance(value, str):
            own[key[len(PREFIX) :]] = value
        elif isinstance(value, bool | int | float) and value is not None:
            text = ("true" if value else "false") if isinstance(value, bool) else str(value)
            warnings.add("value-type", subject, f"{path}.{key} is not text: read as {text!r}")
            own[key[len(PREFIX) :]] = text
        else:
            warnings.add("value-type", subject, f"{path}.{key} is not text: ignored")
    return own, queue


def _json_rl(raw: str, path: str, subject: str, warnings: Warnings) -> dict[str, int] | None:
    try:
        parsed = json.loads(raw)
        if not isinstance(parsed, dict):
            raise ValueError("not a JSON object")
        probe = Warnings()
        rl = resource_list(parsed, path, subject, probe)
        if probe.items():
            raise ValueError(probe.items()[0].text)
    except (ValueError, Invalid) as exc:
        warnings.add("shared-weight", subject, f"{path}: unparsable ({exc}): default weights")
        return None
    return rl if any(rl.values()) else None


def _json_names(raw: str, path: str, subject: str, warnings: Warnings) -> list[str]:
    try:
        parsed = json.loads(raw)
    except ValueError as exc:
        warnings.add("namespaces", subject, f"{path}: unparsable ({exc}): none imported")
        return []
    if not isinstance(parsed, list) or not all(isinstance(item, str) for item in parsed):
        warnings.add("namespaces", subject, f"{path}: not a JSON list of names: none imported")
        return []
    return list(parsed)


def _draft(body: dict[str, Any], name: str, subject: str, warnings: Warnings) -> tuple[Draft, str]:
    """One ElasticQuota → a draft and the Koordinator name of its parent."""
    metadata = mapping(body.get("metadata"), "metadata")
    spec = mapping(body.get("spec"), "spec")
    labels, queue_labels = _keys(metadata.get("labels"), "metadata.labels", subject, warnings)
    notes, queue_notes = _keys(
        metadata.get("annotations"), "metadata.annotations", subject, warnings
    )
    for key in sorted({**queue_labels, **queue_notes}):
        warnings.add("koord-queue", subject, f"{key}: queue policy has no equivalent")
    for where, keys, read in (
        ("labels", labels, READ_LABELS),
        ("annotations", notes, READ_ANNOTATIONS),
    ):
        for suffix in sorted(keys):
            if suffix in read or suffix in SILENT:
                continue
            if suffix in WARNED:
                warnings.add(suffix, subject, f"{where} {PREFIX}{suffix} has no equivalent")
            else:
                warnings.add("unknown-key", subject, f"{where} {PREFIX}{suffix} is not imported")
    warn_unknown_fields(spec, ("min", "max"), "spec", subject, warnings)
    draft = Draft(name=name, subject=subject)
    draft.min = resource_list(spec.get("min"), "spec.min", subject, warnings)
    draft.max = resource_list(spec.get("max"), "spec.max", subject, warnings)
    draft.is_parent = labels.get("is-parent") == "true"
    draft.allow_lent = labels.get("allow-lent-resource") != "false"
    if "shared-weight" in notes:
        draft.shared_weight = _json_rl(
            notes["shared-weight"], f"annotations {PREFIX}shared-weight", subject, warnings
        )
    if "namespaces" in notes:
        draft.namespaces = _json_names(
            notes["namespaces"], f"annotations {PREFIX}namespaces", subject, warnings
        )
    if labels.get("is-root") == "true":
        draft.allow_lent = False
        draft.borrowing_limit = dict.fromkeys(draft.min, 0)
        warnings.add(
            "multi-tree",
            subject,
            "root of a separate quota tree: neither lends nor borrows (ElasticQuotaProfile"
            " node selection is not reproduced)",
        )
    parent = labels.get("parent", "")
    return draft, parent


def translate(documents: Sequence[SourceDocument]) -> Translation:
    """ElasticQuota objects → ``QuotaUpserted`` facts and warnings (IMPORT.md §2)."""
    warnings, rejected = Warnings(), Warnings()
    drafts: dict[str, Draft] = {}
    parents: dict[str, str] = {}
    for document in documents:
        body = document.body
        kind = body.get("kind")
        if kind != "ElasticQuota":
            warnings.add(
                "skipped-kind", f"{kind}/{name_or_unknown(body)}", "not read by the importer"
            )
            continue
        subject = f"ElasticQuota/{name_or_unknown(body)}"
        try:
            name = object_name(body)
            if name in ROOT_NAMES or name in SYSTEM_NAMES:
                warnings.add(
                    "builtin", subject, "quotaledger's root and system are built in: not emitted"
                )
                continue
            draft, parent = _draft(body, name, subject, warnings)
        except Invalid as exc:
            rejected.add("invalid", subject, f"{document.origin}: {exc}; object not imported")
            continue
        if name in DEFAULT_NAMES:
            draft.name, draft.is_parent, parent = DEFAULT, False, ""
        if draft.name in drafts:
            warnings.add(
                "duplicate-name", subject, f"a quota named {draft.name!r} came earlier: skipped"
            )
            continue
        drafts[draft.name] = draft
        parents[draft.name] = parent
    for name, parent in parents.items():
        if parent == "" or parent in ROOT_NAMES:
            drafts[name].parent = "root"
        elif parent in SYSTEM_NAMES or parent in DEFAULT_NAMES:
            drafts[name].parent = "system" if parent in SYSTEM_NAMES else DEFAULT
        else:
            drafts[name].parent = parent
            if parent not in drafts:
                warnings.add(
                    "missing-parent",
                    drafts[name].subject,
                    f"parent {parent!r} is not in the input: imported as an orphan",
                )
    configured = {name: set(d.min) for name, d in drafts.items()}
    return finish(drafts, warnings, rejected, configured_min=configured)
