"""YuniKorn ``queues.yaml`` (raw, or a ConfigMap's ``data["queues.yaml"]``) → facts
(IMPORT.md §5). Pure: plain dicts (and the ConfigMap's text) in, facts out.

The queue ``root.a.b`` becomes the quota ``a.b`` with parent ``a``: top-level
queues keep their bare names, so tag-namespace placement (``root.<ns>``) matches
DESIGN §8 rule 7 by name. ``guaranteed`` is min (lifted over children) and, as
written, the shared weight; ``max`` is max; ``quota.preemption.delay`` is
inherited from the nearest ancestor that sets it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from fractions import Fraction
from typing import Any

from .common import (
    DEFAULT,
    MAX_DELAY_S,
    RESERVED,
    Draft,
    Invalid,
    SourceDocument,
    Translation,
    Warnings,
    finish,
    mapping,
    name_or_unknown,
    resource_list,
    sequence,
    text,
    warn_unknown_fields,
)

RENAME = {"vcore": "cpu"}
QUEUE_WARNED = ("submitacl", "adminacl", "maxapplications", "limits", "childtemplate")
QUEUE_READ = ("name", "parent", "resources", "properties", "queues")
PARTITION_WARNED = ("placementrules", "limits", "nodesortpolicy", "usergroupresolver")
PARTITION_READ = ("name", "queues", "preemption")
DELAY = "quota.preemption.delay"
#: Deeper trees are refused (a self-referencing YAML alias would never end).
MAX_DEPTH = 64
_UNITS = {
    "ns": Fraction(1, 10**9),
    "us": Fraction(1, 10**6),
    "µs": Fraction(1, 10**6),
    "μs": Fraction(1, 10**6),
    "ms": Fraction(1, 1000),
    "s": Fraction(1),
    "m": Fraction(60),
    "h": Fraction(3600),
}
_DURATION_PART = re.compile(r"([0-9]*\.?[0-9]*)(ns|us|µs|μs|ms|s|m|h)")


def is_yunikorn(body: dict[str, Any]) -> bool:
    """A raw queues.yaml (top-level ``partitions``) or a ConfigMap holding one."""
    if "partitions" in body:
        return True
    data = body.get("data")
    return body.get("kind") == "ConfigMap" and isinstance(data, dict) and "queues.yaml" in data


def go_duration_seconds(value: str) -> Fraction:
    """Go's ``time.ParseDuration`` in seconds; ValueError when it does not parse."""
    body = value.strip()
    sign = 1
    if body[:1] in "+-" and body:
        sign = -1 if body[0] == "-" else 1
        body = body[1:]
    if body == "0":
        return Fraction(0)
    if not body:
        raise ValueError(f"invalid duration {value!r}")
    total, position = Fraction(0), 0
    while position < len(body):
        match = _DURATION_PART.match(body, position)
        if match is None or match.group(1) in ("", "."):
            raise ValueError(f"invalid duration {value!r} (a Go duration such as 90s, 15m, 2h)")
        total += Fraction(match.group(1)) * _UNITS[match.group(2)]
        position = match.end()
    return sign * total


class _Reader:
    """Walks one partition's queue tree into drafts."""

    def __init__(self, warnings: Warnings) -> None:
        self.warnings = warnings
        self.drafts: dict[str, Draft] = {}
        self.configured: dict[str, set[str]] = {}

    def queue(self, raw: Any, path: str, parent: str | None, delay: float, top: bool) -> None:
        """Read the queue at ``path`` (``root`` or ``root.a``); ``parent`` is the parent's
        quotaledger name (None for root) and ``delay`` the inherited delay."""
        subject = f"queue/{path}"
        if path.count(".") > MAX_DEPTH:
            raise Invalid(subject, f"queues nested more than {MAX_DEPTH} levels deep")
        spec = mapping(raw, subject, optional=False)
        for key in QUEUE_WARNED:
            if spec.get(key) not in (None, "", [], {}, 0):
                self.warnings.add(key, subject, f"{key} has no equivalent; not imported")
        warn_unknown_fields(spec, (*QUEUE_READ, *QUEUE_WARNED), subject, subject, self.warnings)
        properties = mapping(spec.get("properties"), f"{subject}.properties")
        delay = self._properties(properties, subject, delay)
        resources = mapping(spec.get("resources"), f"{subject}.resources")
        children = sequence(spec.get("queues"), f"{subject}.queues")
        name = self._name(path, top, bool(children) or spec.get("parent") is True, subject)
        if parent is None:
            if resources:
                self.warnings.add(
                    "resources", subject, "root's resources are the cluster's: not imported"
                )
        else:
            self._draft(
                name,
                parent,
                subject,
                resources,
                bool(children) or spec.get("parent") is True,
                delay,
            )
        seen: set[str] = set()
        for index, child in enumerate(children):
            child_spec = mapping(child, f"{subject}.queues[{index}]", optional=False)
            child_name = text(
                child_spec.get("name"), f"{subject}.queues[{index}].name", optional=False
            )
            lowered = (child_name or "").lower()
            if not lowered:
                raise Invalid(f"{subject}.queues[{index}].name", "empty")
            if lowered in seen:
                self.warnings.add(
                    "duplicate-name",
                    f"queue/{path}.{lowered}",
                    "a sibling of this name came earlier: skipped",
                )
                continue
            seen.add(lowered)
            self.queue(child_spec, f"{path}.{lowered}", name, delay, parent is None)

    def _name(self, path: str, top: bool, is_parent: bool, subject: str) -> str:
        if path == "root":
            return "root"
        name = path.removeprefix("root.")
        if top and (name in RESERVED or (name == DEFAULT and is_parent)):
            self.warnings.add("renamed", subject, f"imported as {path!r}")
            return path
        if top and name == DEFAULT:
            self.warnings.add(
                "default-queue",
                subject,
                "becomes quotaledger's default (outside runtime and available)",
            )
        return name

    def _properties(self, properties: dict[str, Any], subject: str, inherited: float) -> float:
        delay = inherited
        for key in sorted(properties):
            value = text(properties[key], f"{subject}.properties.{key}") or ""
            if key == DELAY:
                delay = self._delay(value, subject)
            elif key == "preemption.delay":
                self.warnings.add(
                    key,
                    subject,
                    "the guaranteed-preemption delay; quotaledger's reclaim_after_s is global",
                )
            else:
                self.warnings.add(key, subject, f"property {key}={value!r} has no equivalent")
        return delay

    def _delay(self, value: str, subject: str) -> float:
        try:
            seconds = go_duration_seconds(value)
            if seconds < 0 or seconds > MAX_DELAY_S:
                raise ValueError(f"{value!r} is out of range (0 .. 10 years)")
        except ValueError as exc:
            self.warnings.add(DELAY, subject, f"{exc}: delay 0")
            return 0
        return int(seconds) if seconds.denominator == 1 else float(seconds)

    def _draft(
        self,
        name: str,
        parent: str,
        subject: str,
        resources: dict[str, Any],
        is_parent: bool,
        delay: float,
    ) -> None:
        warn_unknown_fields(
            resources, ("guaranteed", "max"), f"{subject}.resources", subject, self.warnings
        )
        guaranteed = resource_list(
            resources.get("guaranteed"),
            f"{subject}.resources.guaranteed",
            subject,
            self.warnings,
            rename=RENAME,
        )
        maximum = resource_list(
            resources.get("max"), f"{subject}.resources.max", subject, self.warnings, rename=RENAME
        )
        draft = Draft(name=name, subject=subject, parent=parent, is_parent=is_parent)
        draft.min = dict(guaranteed)
        draft.max = maximum if any(maximum.values()) else None
        draft.shared_weight = dict(guaranteed) or None
        draft.preemption_delay_s = delay
        self.drafts[name] = draft
        self.configured[name] = set(guaranteed)


def _configs(
    documents: Sequence[SourceDocument], warnings: Warnings, rejected: Warnings
) -> list[tuple[str, dict[str, Any]]]:
    """(origin, queues.yaml content) of every document; other kinds are skipped."""
    from .yaml_text import UnreadableInput, parse_text  # PyYAML only when a ConfigMap needs it

    configs: list[tuple[str, dict[str, Any]]] = []
    for document in documents:
        body = document.body
        if "partitions" in body:
            configs.append((document.origin, body))
            continue
        subject = f"{body.get('kind')}/{name_or_unknown(body)}"
        if not is_yunikorn(body):
            warnings.add("skipped-kind", subject, "not read by the importer")
            continue
        content = body["data"]["queues.yaml"]
        origin = f"{document.origin} data[queues.yaml]"
        if not isinstance(content, str):
            rejected.add("invalid", subject, f"{origin}: expected text; not imported")
            continue
        try:
            inner = [d for d in parse_text(content, origin) if d.body is not None]
        except UnreadableInput as exc:
            rejected.add("unreadable", subject, str(exc))
            continue
        if inner and isinstance(inner[0].body, dict):
            configs.append((origin, inner[0].body))
        elif inner:
            rejected.add("invalid", subject, f"{origin}: expected a map; not imported")
    return configs


def translate(documents: Sequence[SourceDocument]) -> Translation:
    """queues.yaml documents → facts and warnings (IMPORT.md §5)."""
    warnings, rejected = Warnings(), Warnings()
    partitions: list[tuple[str, dict[str, Any]]] = []
    for origin, config in _configs(documents, warnings, rejected):
        try:
            for key in config:
                if key not in ("partitions", "checksum"):
                    warnings.add(key, "queues.yaml", f"{origin}: top-level {key} has no equivalent")
            for index, raw in enumerate(sequence(config.get("partitions"), "partitions")):
                partitions.append(
                    (
                        f"{origin} partitions[{index}]",
                        mapping(raw, f"partitions[{index}]", optional=False),
                    )
                )
        except Invalid as exc:
            rejected.add("invalid", "queues.yaml", f"{origin}: {exc}; not imported")
    names = [str(p.get("name", "")).lower() for _, p in partitions]
    chosen = names.index("default") if "default" in names else 0
    settings: dict[str, Any] = {}
    drafts: dict[str, Draft] = {}
    configured: dict[str, set[str]] = {}
    for index, (origin, partition) in enumerate(partitions):
        subject = f"partition/{names[index] or '?'}"
        if index != chosen:
            warnings.add(
                "partition", subject, "the Kubernetes shim serves only one partition: not imported"
            )
            continue
        try:
            reader = _Reader(warnings)
            _partition(partition, subject, settings, warnings)
            queues = sequence(partition.get("queues"), f"{subject}.queues")
            single_root = (
                len(queues) == 1
                and isinstance(queues[0], dict)
                and str(queues[0].get("name", "")).lower() == "root"
            )
            root = queues[0] if single_root else {"name": "root", "queues": queues}
            reader.queue(root, "root", None, 0, False)
        except Invalid as exc:
            rejected.add("invalid", subject, f"{origin}: {exc}; partition not imported")
            continue
        drafts, configured = reader.drafts, reader.configured
    return finish(drafts, warnings, rejected, configured_min=configured, settings=settings)


def _partition(
    partition: dict[str, Any], subject: str, settings: dict[str, Any], warnings: Warnings
) -> None:
    for key in PARTITION_WARNED:
        if partition.get(key) not in (None, "", [], {}):
            detail = (
                "only static queues are imported; pods of dynamic queues go to default"
                if key == "placementrules"
                else "has no equivalent; not imported"
            )
            warnings.add(key, subject, f"{key}: {detail}")
    warn_unknown_fields(partition, (*PARTITION_READ, *PARTITION_WARNED), subject, subject, warnings)
    preemption = mapping(partition.get("preemption"), f"{subject}.preemption")
    for key, setting in (
        ("quotapreemptionenabled", "quota_preemption_enabled"),
        ("enabled", "reclaim_enabled"),
    ):
        if key not in preemption or preemption[key] is None:
            continue
        if isinstance(preemption[key], bool):
            settings[setting] = preemption[key]
        else:
            warnings.add(
                "preemption",
                subject,
                f"preemption.{key}={preemption[key]!r} is not true/false: ignored",
            )
    warn_unknown_fields(
        preemption,
        ("quotapreemptionenabled", "enabled"),
        f"{subject}.preemption",
        subject,
        warnings,
    )
