"""The persisted state: one list for snapshots and the state hash (DESIGN §5 "State hash", §9).

The fields of :class:`~.state.ProjectedState` with ``HASHED`` or ``UNHASHED``
metadata are what the facts and decisions determine. This
module reads that declaration once and gives each field its *stored form*:
a canonical value (collections sorted) that msgspec encodes and decodes.

- :mod:`.snapshot` stores the stored form of every persisted field and sets
  them back on restore;
- :mod:`.state_digest` hashes every *hashed* field (all but ``ledger_id``,
  ``offset``, ``ts`` and ``rejected``: DECISIONS 60) in a canonical form.

So a field added to ``ProjectedState`` with that metadata round-trips and
hashes with no other change. The stored form follows the field's type:

- ``set[T]`` is stored as a sorted ``list[T]``;
- ``dict[str, V]`` as a dict sorted by key (and a ``V`` that is a dict with
  more than :data:`SMALL_DICT` keys sorted too);
- ``dict[str, QuotaNode]`` (the tree) as each quota's configuration, by name;
- anything else (scalars, Structs, lists) as it is.

Every dict in the stored form with more than :data:`SMALL_DICT` keys is sorted
by us (the snapshot's encoder sorts too, DECISIONS 232): the maps here, and a
pod's labels and requests (``pods.compact`` keeps large ones sorted).
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable
from typing import Any

import msgspec

from quotaledger.events.model import QuotaUpserted

from .state import PERSISTED, Persisted, ProjectedState, QuotaNode


@dataclasses.dataclass(frozen=True, slots=True)
class PersistedField:
    """One persisted field: its stored type and the two conversions."""

    name: str
    hashed: bool
    stored_type: Any
    stored: Callable[[Any], Any]  # state value -> stored form
    restored: Callable[[Any], Any]  # decoded stored form -> state value
    hash_keys_only: bool = False

    def hash_form(self, value: Any) -> Any:
        """What the state hash covers of the field's value: the value itself,
        or the sorted keys of a dict hashed by its keys only (the hash puts
        it in canonical form: :mod:`.state_digest`)."""
        if self.hash_keys_only:
            return sorted(value)
        return value


#: A dict of at most this many keys may reach an encoder that sorts (msgspec's
#: ``order="sorted"``) unsorted: its sort is then at most 120 comparisons. A
#: larger one is sorted by us first (DECISIONS 232: msgspec's quicksort is
#: quadratic on a sorted map with a few keys appended out of order).
SMALL_DICT = 16


def presorted_rl(value: dict[str, Any]) -> dict[str, Any]:
    """``value``, sorted by key first when it has more than :data:`SMALL_DICT` keys."""
    if len(value) <= SMALL_DICT:
        return value
    return {key: value[key] for key in sorted(value)}


def _sorted_list(value: set[Any]) -> list[Any]:
    return sorted(value)


def _sorted_dict(value: dict[str, Any]) -> dict[str, Any]:
    return {key: value[key] for key in sorted(value)}


def _sorted_dict_of_dicts(value: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {key: presorted_rl(value[key]) for key in sorted(value)}


def _configs(value: dict[str, QuotaNode]) -> dict[str, QuotaUpserted]:
    return {name: value[name].config for name in sorted(value)}


def _nodes(value: dict[str, QuotaUpserted]) -> dict[str, QuotaNode]:
    return {name: QuotaNode(config=config) for name, config in value.items()}


def _same(value: Any) -> Any:
    return value


def _describe(name: str, hint: Any, marker: Persisted) -> PersistedField:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is set:
        return PersistedField(name, marker.hashed, list[args[0]], _sorted_list, set)  # type: ignore[valid-type]
    if origin is dict and args[1] is QuotaNode:
        return PersistedField(name, marker.hashed, dict[str, QuotaUpserted], _configs, _nodes)
    if origin is dict:
        nested = typing.get_origin(args[1]) is dict
        return PersistedField(
            name,
            marker.hashed,
            hint,
            _sorted_dict_of_dicts if nested else _sorted_dict,
            dict,
            hash_keys_only=marker.hash_keys_only,
        )
    return PersistedField(name, marker.hashed, hint, _same, _same)


def _persisted_fields() -> tuple[PersistedField, ...]:
    hints = typing.get_type_hints(ProjectedState)
    out: list[PersistedField] = []
    for item in dataclasses.fields(ProjectedState):
        marker = item.metadata.get(PERSISTED)
        if isinstance(marker, Persisted):
            out.append(_describe(item.name, hints[item.name], marker))
    return tuple(out)


#: Every persisted field, in declaration order (the order of restore).
FIELDS = _persisted_fields()


def _stored_field(item: PersistedField) -> tuple[Any, ...]:
    """A stored attribute; one a snapshot may lack (``absent_is_empty``) defaults empty."""
    hint = typing.get_type_hints(ProjectedState)[item.name]
    marker = next(
        f.metadata[PERSISTED] for f in dataclasses.fields(ProjectedState) if f.name == item.name
    )
    if marker.absent_is_empty:
        empty = typing.get_origin(hint) or hint
        return (item.name, item.stored_type, msgspec.field(default_factory=empty))
    return (item.name, item.stored_type)


#: The stored state: one attribute per persisted field.
StoredState: type[msgspec.Struct] = msgspec.defstruct(
    "StoredState", [_stored_field(item) for item in FIELDS], kw_only=True
)


def stored(state: ProjectedState) -> msgspec.Struct:
    """The stored form of every persisted field of ``state``."""
    return StoredState(**{item.name: item.stored(getattr(state, item.name)) for item in FIELDS})


def restore_fields(state: ProjectedState, body: msgspec.Struct) -> None:
    """Set every persisted field of ``state`` from a decoded :data:`StoredState`
    (indexes and derived numbers are the caller's: :func:`.snapshot.load`)."""
    for item in FIELDS:
        setattr(state, item.name, item.restored(getattr(body, item.name)))
