"""What every importer shares (IMPORT.md §1): drafts, warnings, the validity fixes, the
order and the encoding of the facts.

Pure: no I/O, no clock. A peer module turns parsed objects (plain dicts, as
``yaml.safe_load`` or a Kubernetes watch gives them) into :class:`Draft` quotas
named with quotaledger names; :func:`finish` applies the validity fixes of
IMPORT.md §1 so that DESIGN §5 validation accepts every fact, and returns the
facts in the contract's order, encoded as JSON-ready dicts.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from quotaledger.events.quantity import QuantityError, canonical_amount

#: DESIGN §9: every amount after canonicalisation is at most 2^62.
MAX_AMOUNT = 2**62
#: DESIGN §9: delays are at most ten years.
MAX_DELAY_S = 315_360_000
#: Names quotaledger reserves (DESIGN §8 rule 9) and the one with a special role.
RESERVED = frozenset({"root", "system"})
DEFAULT = "default"

RL = dict[str, int]


@dataclass(frozen=True)
class ImportWarning:
    """``warning: <key>: <subject>: <free text>`` (IMPORT.md §1)."""

    key: str
    subject: str
    text: str

    def line(self) -> str:
        return f"warning: {self.key}: {self.subject}: {self.text}"


@dataclass(frozen=True)
class SourceDocument:
    """One parsed object and where it came from (``FILE document N``, a watch event...)."""

    origin: str
    body: Any


class Invalid(ValueError):
    """A field of an object has a type the importer cannot use; names the field."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


class Warnings:
    """Collects warnings, one per (key, subject): a repeat appends its text to the first."""

    def __init__(self) -> None:
        self._items: dict[tuple[str, str], list[str]] = {}

    def add(self, key: str, subject: str, text: str) -> None:
        texts = self._items.setdefault((key, subject), [])
        if text not in texts:
            texts.append(text)

    def items(self) -> list[ImportWarning]:
        return [ImportWarning(k, s, "; ".join(t)) for (k, s), t in self._items.items()]


@dataclass
class Draft:
    """One quota before the validity fixes; every name is a quotaledger name."""

    name: str
    subject: str
    parent: str = "root"
    is_parent: bool = False
    min: RL = field(default_factory=dict)
    max: RL | None = None
    shared_weight: RL | None = None
    allow_lent: bool = True
    lending_limit: RL | None = None
    borrowing_limit: RL | None = None
    namespaces: list[str] = field(default_factory=list)
    preemption_delay_s: float = 0


@dataclass
class Translation:
    """Facts in output order, warnings, and the objects that could not be used.

    ``rejected`` holds one warning per unusable object (key ``invalid``, or
    ``cycle`` for quotas in a parent cycle, which the command line treats as fatal:
    IMPORT.md §1 exit 2).
    """

    facts: list[dict[str, Any]]
    warnings: list[ImportWarning]
    rejected: list[ImportWarning]

    @property
    def cycle(self) -> list[ImportWarning]:
        return [item for item in self.rejected if item.key == "cycle"]


# ------------------------------------------------------------------ reading fields


def mapping(value: Any, path: str, *, optional: bool = True) -> dict[str, Any]:
    """A map field (absent/null → {} when optional), or :class:`Invalid`."""
    if value is None and optional:
        return {}
    if not isinstance(value, dict):
        raise Invalid(path, f"expected a map, got {type_name(value)}")
    for key in value:
        if not isinstance(key, str):
            raise Invalid(path, f"expected text keys, got {type_name(key)} {key!r}")
    return value


def sequence(value: Any, path: str) -> list[Any]:
    """A list field (absent/null → []), or :class:`Invalid`."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise Invalid(path, f"expected a list, got {type_name(value)}")
    return value


def text(value: Any, path: str, *, optional: bool = True) -> str | None:
    """A string field (numbers and booleans are read as their YAML text)."""
    if value is None:
        if optional:
            return None
        raise Invalid(path, "missing")
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    if not isinstance(value, str):
        raise Invalid(path, f"expected text, got {type_name(value)}")
    return value


def type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, dict):
        return "map"
    if isinstance(value, list):
        return "list"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "text"
    return type(value).__name__


def object_name(body: dict[str, Any]) -> str:
    """``metadata.name`` of a Kubernetes object, or :class:`Invalid`."""
    metadata = mapping(body.get("metadata"), "metadata")
    name = metadata.get("name")
    if not isinstance(name, str) or not name:
        raise Invalid("metadata.name", "missing or not text")
    return name


def name_or_unknown(body: Mapping[str, Any]) -> str:
    """``metadata.name`` for a warning's subject, ``?`` when there is none."""
    metadata = body.get("metadata")
    name = metadata.get("name") if isinstance(metadata, dict) else None
    return name if isinstance(name, str) and name else "?"


def resource_list(
    raw: Any,
    path: str,
    subject: str,
    warnings: Warnings,
    *,
    rename: Mapping[str, str] | None = None,
) -> RL:
    """Canonicalise a resource list (DESIGN §2); an amount that does not parse, is
    negative or exceeds 2^62 is dropped with a ``quantity`` warning (IMPORT.md §1).
    ``rename`` maps a peer's resource names to Kubernetes ones (YuniKorn ``vcore``)."""
    out: RL = {}
    for key, value in mapping(raw, path).items():
        resource = rename.get(key, key) if rename else key
        try:
            if isinstance(value, str):
                value = value.strip()
            amount = canonical_amount(resource, value)
        except QuantityError as exc:
            warnings.add("quantity", subject, f"{path}.{key}: {exc}; entry dropped")
            continue
        if amount > MAX_AMOUNT:
            warnings.add("quantity", subject, f"{path}.{key}: {value!r} exceeds 2^62; dropped")
            continue
        out[resource] = out.get(resource, 0) + amount
    return out


def amount(resource: str, value: Any, path: str, subject: str, warnings: Warnings) -> int | None:
    """One amount in canonical units, or None with a ``quantity`` warning naming
    ``path`` (the field holding the amount)."""
    probe = Warnings()
    found = resource_list({resource: value}, "", subject, probe)
    for item in probe.items():
        warnings.add(
            item.key, subject, f"{path} ({resource}){item.text.removeprefix('.' + resource)}"
        )
    return found.get(resource)


def api_group(body: Mapping[str, Any]) -> str | None:
    """The API group of ``apiVersion`` (``""`` for the core group, None when absent)."""
    api = body.get("apiVersion")
    if not isinstance(api, str):
        return None
    return api.rsplit("/", 1)[0] if "/" in api else ""


def warn_unknown_fields(
    spec: Mapping[str, Any], known: Iterable[str], path: str, subject: str, warnings: Warnings
) -> None:
    """Every field the mapping neither reads nor names gets a warning named by the field:
    nothing is dropped silently (IMPORT.md §1)."""
    known_set = set(known)
    for key in spec:
        if key not in known_set:
            warnings.add(key, subject, f"{path}.{key} has no equivalent; not imported")


# -------------------------------------------------------------- the validity fixes


def _children(drafts: Mapping[str, Draft]) -> dict[str, list[str]]:
    children: dict[str, list[str]] = {}
    for draft in drafts.values():
        children.setdefault(draft.parent, []).append(draft.name)
    for names in children.values():
        names.sort()
    return children


def find_cycles(parent_of: Mapping[str, str]) -> set[str]:
    """The names that lie on a parent cycle (names absent from the map end a chain)."""
    state: dict[str, int] = {}
    on_cycle: set[str] = set()
    for start in sorted(parent_of):
        path: list[str] = []
        node = start
        while node in parent_of and state.get(node, 0) == 0:
            state[node] = 1
            path.append(node)
            node = parent_of[node]
        if node in parent_of and state.get(node) == 1:
            on_cycle.update(path[path.index(node) :])
        for item in path:
            state[item] = 2
    return on_cycle


def _post_order(drafts: Mapping[str, Draft], children: Mapping[str, list[str]]) -> list[str]:
    """Children before parents, over every subtree in the input (orphans included)."""
    order: list[str] = []
    tops = sorted(name for name, d in drafts.items() if d.parent not in drafts)
    for top in tops:
        stack: list[tuple[str, bool]] = [(top, False)]
        while stack:
            name, expanded = stack.pop()
            if expanded:
                order.append(name)
                continue
            stack.append((name, True))
            stack.extend((child, False) for child in reversed(children.get(name, [])))
    return order


def _fix_parents(drafts: dict[str, Draft], warnings: Warnings) -> None:
    """§5: a parent must be a parent quota or root. A quota named as parent becomes one
    (``is-parent``); a quota whose parent is ``system`` or ``default``, which cannot hold
    quotas (§8 rule 9), moves under root (``missing-parent``)."""
    for name in sorted(drafts):
        draft = drafts[name]
        if draft.parent in (DEFAULT, "system"):
            warnings.add(
                "missing-parent",
                draft.subject,
                f"parent {draft.parent!r} cannot hold quotas in quotaledger: placed under root",
            )
            draft.parent = "root"
    for name, kids in sorted(_children(drafts).items()):
        parent = drafts.get(name)
        if parent is not None and not parent.is_parent:
            warnings.add(
                "is-parent",
                parent.subject,
                f"not marked as a parent but {', '.join(kids)} name it as theirs: made a parent",
            )
            parent.is_parent = True


def _lift(drafts: dict[str, Draft], configured: Mapping[str, set[str]], warnings: Warnings) -> None:
    """Fix 1 (§8 rule 14): a parent's min[r] becomes Σ children's min[r] where smaller;
    ``min-lifted`` only when a value the input configured was raised. Root is no quota."""
    children = _children(drafts)
    for name in _post_order(drafts, children):
        kids = children.get(name)
        if not kids:
            continue
        draft = drafts[name]
        sums: RL = {}
        for kid in kids:
            for resource, amount in drafts[kid].min.items():
                sums[resource] = sums.get(resource, 0) + amount
        for resource, total in sorted(sums.items()):
            own = draft.min.get(resource, 0)
            if total > own:
                draft.min[resource] = total
                if resource in configured.get(name, set()):
                    warnings.add(
                        "min-lifted",
                        draft.subject,
                        f"min {resource} raised from {own} to {total}, the sum of its"
                        " children's (DESIGN §8 rule 14)",
                    )


def _fix_max(draft: Draft, warnings: Warnings) -> None:
    """Fix 2 (§8 rule 13) and min ≤ max: a set max lacking a resource with positive min,
    or below min, is raised to min."""
    if draft.max is None:
        return
    for resource, amount in sorted(draft.min.items()):
        if amount <= 0:
            continue
        if resource not in draft.max:
            draft.max[resource] = amount
            warnings.add(
                "max-missing-key",
                draft.subject,
                f"max lists no {resource} but min has {amount}: capped at the guarantee",
            )
        elif draft.max[resource] < amount:
            warnings.add(
                "max-below-min",
                draft.subject,
                f"max {resource} {draft.max[resource]} is below min {amount}: raised to min",
            )
            draft.max[resource] = amount


def _fix_delay(draft: Draft, warnings: Warnings) -> None:
    """Fix 3 (§8 rule 15): a delay needs max > min in every resource with positive min
    that max lists; otherwise the delay becomes 0."""
    if draft.preemption_delay_s <= 0 or draft.max is None:
        return
    for resource, amount in sorted(draft.min.items()):
        if amount > 0 and resource in draft.max and draft.max[resource] <= amount:
            warnings.add(
                "quota.preemption.delay",
                draft.subject,
                f"max {resource} does not exceed min, which a delay requires (DESIGN §8"
                " rule 15): delay set to 0",
            )
            draft.preemption_delay_s = 0
            return


def _fix_namespaces(drafts: Mapping[str, Draft], warnings: Warnings) -> None:
    """§8 rule 8: a namespace listed by two quotas goes to neither."""
    owners: dict[str, list[str]] = {}
    for draft in drafts.values():
        for namespace in set(draft.namespaces):
            owners.setdefault(namespace, []).append(draft.name)
    for namespace, names in sorted(owners.items()):
        if len(names) > 1:
            warnings.add(
                "namespaces",
                f"namespace/{namespace}",
                f"listed by {', '.join(sorted(names))}: given to none (DESIGN §8 rule 8)",
            )
            for name in names:
                drafts[name].namespaces = [n for n in drafts[name].namespaces if n != namespace]


# -------------------------------------------------------------------- the output


def encode_rl(rl: Mapping[str, int], *, drop_zero: bool) -> dict[str, int | str]:
    """Keys sorted; cpu as ``"<millicores>m"``, the rest as integers (IMPORT.md §1)."""
    out: dict[str, int | str] = {}
    for resource in sorted(rl):
        amount = rl[resource]
        if drop_zero and amount == 0:
            continue
        out[resource] = f"{amount}m" if resource == "cpu" else amount
    return out


def _optional_rl(rl: RL | None) -> dict[str, int | str] | None:
    return None if rl is None else encode_rl(rl, drop_zero=False)


def encode_quota(draft: Draft) -> dict[str, Any]:
    """A ``QuotaUpserted`` with every field written (IMPORT.md §1 Encoding)."""
    delay = draft.preemption_delay_s
    return {
        "kind": "QuotaUpserted",
        "name": draft.name,
        "parent": draft.parent,
        "is_parent": draft.is_parent,
        "min": encode_rl(draft.min, drop_zero=True),
        "max": _optional_rl(draft.max),
        "shared_weight": _optional_rl(draft.shared_weight),
        "allow_lent": draft.allow_lent,
        "lending_limit": _optional_rl(draft.lending_limit),
        "borrowing_limit": _optional_rl(draft.borrowing_limit),
        "namespaces": sorted(set(draft.namespaces)),
        "preemption_delay_s": int(delay) if float(delay).is_integer() else delay,
    }


def _pre_order(drafts: Mapping[str, Draft], children: Mapping[str, list[str]]) -> Iterator[str]:
    """Depth-first pre-order from root, siblings by name; then orphan subtrees sorted by
    (missing parent, name) (IMPORT.md §1 Facts and order)."""
    tops = [("", name) for name in children.get("root", [])]
    orphans = sorted(
        (d.parent, d.name) for d in drafts.values() if d.parent != "root" and d.parent not in drafts
    )
    for _, top in tops + orphans:
        stack = [top]
        while stack:
            name = stack.pop()
            yield name
            stack.extend(reversed(children.get(name, [])))


def finish(
    drafts: Mapping[str, Draft],
    warnings: Warnings,
    rejected: Warnings,
    *,
    configured_min: Mapping[str, set[str]] | None = None,
    settings: Mapping[str, Any] | None = None,
    namespace_weights: Mapping[str, int] | None = None,
) -> Translation:
    """Apply the validity fixes and produce the facts in order (IMPORT.md §1).

    ``configured_min`` names, per quota, the resources whose min the input set itself
    (a lift of anything else is silent). Quotas on a parent cycle are not emitted;
    each is rejected with key ``cycle``.
    """
    pool = dict(drafts)
    for name in sorted(find_cycles({n: d.parent for n, d in pool.items()})):
        rejected.add(
            "cycle", pool[name].subject, f"its parent chain returns to it (via {pool[name].parent})"
        )
        del pool[name]
    _fix_parents(pool, warnings)
    _lift(pool, configured_min or {}, warnings)
    for name in sorted(pool):
        _fix_max(pool[name], warnings)
        _fix_delay(pool[name], warnings)
    _fix_namespaces(pool, warnings)
    facts: list[dict[str, Any]] = []
    if settings:
        facts.append({"kind": "SettingsChanged", **dict(sorted(settings.items()))})
    for namespace, weight in sorted((namespace_weights or {}).items()):
        facts.append({"kind": "NamespaceWeighted", "namespace": namespace, "weight": weight})
    children = _children(pool)
    facts.extend(encode_quota(pool[name]) for name in _pre_order(pool, children))
    return Translation(facts=facts, warnings=warnings.items(), rejected=rejected.items())
