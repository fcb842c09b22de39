"""Snapshots: the persisted state as JSON, restored by recomputation (DESIGN §3, §5, §9).

A snapshot stores the persisted fields of the state (:mod:`.persisted`, the
one list the state hash also reads) and nothing else; every index and
derived number is rebuilt on restore, so snapshot + tail gives the same
state and hash as a full replay.

Format 2 is msgspec JSON (sorted keys), because sums of bounded amounts
(a preemption's target, a node total) may exceed 2^64 − 1, which MessagePack
cannot hold, while JSON integers have no bound (DESIGN §9; DECISIONS 61).
Format 1 (MessagePack) is refused with :class:`SnapshotError`: a snapshot is
a cache, so the caller replays instead.
"""

from __future__ import annotations

import copy as copy_module
import heapq
import itertools
import typing
from collections.abc import Callable, Iterator
from typing import Any

import msgspec

from quotaledger.events.model import PodUpserted, QuotaUpserted

from .persisted import FIELDS, PersistedField, StoredState, restore_fields, stored
from .pods import attach_pod, compact, is_active
from .quota_tree import refresh_connectivity
from .resources import add_into
from .settle import recompute_all
from .state import ProjectedState, QuotaNode

FORMAT = 2


class SnapshotError(ValueError):
    """A snapshot this version cannot read."""


class _Header(msgspec.Struct):
    format: int


class _Snapshot(msgspec.Struct, kw_only=True):
    format: int
    state: StoredState  # type: ignore[valid-type]


_ENCODER = msgspec.json.Encoder(order="sorted")
_HEADER = msgspec.json.Decoder(_Header)
_DECODER = msgspec.json.Decoder(_Snapshot)


def dump(state: ProjectedState) -> bytes:
    """Encode the persisted state (deterministic: every collection sorted)."""
    return _ENCODER.encode(_Snapshot(format=FORMAT, state=stored(state)))


def load(blob: bytes) -> ProjectedState:
    """Rebuild a state from :func:`dump`'s bytes, recomputing everything derived."""
    try:
        header = _HEADER.decode(blob)
    except msgspec.DecodeError:
        if blob[:1] != b"{":
            raise SnapshotError("snapshot format 1 (MessagePack) is not 2") from None
        raise SnapshotError("unreadable snapshot: no format") from None
    if header.format != FORMAT:
        raise SnapshotError(f"snapshot format {header.format} is not {FORMAT}")
    try:
        body = _DECODER.decode(blob)
    except msgspec.DecodeError as exc:
        raise SnapshotError(f"unreadable snapshot: {exc}") from None
    state = ProjectedState()
    restore_fields(state, body.state)
    rebuild_indexes(state)
    return state


def rebuild_indexes(state: ProjectedState) -> None:
    """Rebuild every index and derived number from the persisted fields alone:
    node totals, the tree's parent index, connectivity and namespace claims,
    pod association and the starvation indexes, the guard's occupied queues
    and evicting pods; then the full recompute (DESIGN §5)."""
    for allocatable in state.nodes.values():
        add_into(state.allocatable, allocatable)
    for name, node in state.quotas.items():
        state.children_of.setdefault(node.config.parent, set()).add(name)
        for ns in node.config.namespaces:
            state.namespace_claims[ns] = name
    for name in state.quotas:
        refresh_connectivity(state, name)
    for pod in state.pods.values():
        compact(pod, None)
        if is_active(pod):
            attach_pod(state, pod)
    for run in state.preemptions.values():
        for queue in run.occupied:
            state.occupied[queue] = run.preemption_id
    for eviction in state.evictions.values():
        if eviction.outcome is None:
            state.evicting_pods[eviction.pod_uid] = eviction.eviction_id
    recompute_all(state)


# ------------------------------------------------------------------ in pieces
#
# A live engine snapshots a state of ~100k pods (a ~40 MB blob) while it keeps
# folding and deciding (DESIGN §6, §9; DECISIONS 240). msgspec holds the GIL for
# a whole ``encode`` call, so neither one call on the event loop nor one in a
# thread leaves the loop free for that long. Instead: a cheap copy of the
# persisted fields, taken at one offset (:func:`copy_persisted`), then
# :func:`dump_pieces` encodes it a bounded amount of work at a time; the pieces
# joined are exactly :func:`dump`'s bytes for the state at that offset.

#: Entries of a large map (or list) encoded per piece by :func:`dump_pieces`.
PIECE_ENTRIES = 1000
#: Keys sorted per step by :func:`dump_pieces` (then merged lazily).
SORT_RUN = 8192


class PersistedCopy(msgspec.Struct, frozen=True):
    """The persisted fields of a state at one offset, shielded from the folds
    that follow: each field's container is copied, and each value that the
    projection changes in place is copied too (a preemption's lists, an
    eviction's outcome, the settings). Pods and quota configurations are facts
    the projection replaces but never changes (``pods.compact`` shrinks a pod
    before it is stored): they are shared. ``quotas`` holds each quota's
    configuration, its stored form."""

    offset: int
    values: dict[str, Any]


def copy_persisted(state: ProjectedState) -> PersistedCopy:
    """:class:`PersistedCopy` of ``state`` (linear, no sorting: ~2 ms for 100k pods)."""
    return PersistedCopy(
        offset=state.offset,
        values={item.name: _COPIERS[item.name](getattr(state, item.name)) for item in FIELDS},
    )


def dump_pieces(
    copy: PersistedCopy, entries: int = PIECE_ENTRIES, run: int = SORT_RUN
) -> Iterator[bytes]:
    """:func:`dump` of the state ``copy`` was taken from, in pieces.

    Each step does a bounded amount of work (encodes at most ``entries``
    entries of a map, set or list, or sorts at most ``run`` keys) and yields a
    piece (possibly empty); ``b"".join`` of all pieces is byte for byte what
    :func:`dump` gave at the copy's offset. A map or set is split by its keys in
    code-point order, the order of the encoder's sort and of
    :mod:`.persisted`'s stored forms, and each part goes through the field's own
    stored form (``PersistedField.stored``), so the parts join into the stored
    form of the whole.
    """
    yield _TOP[0]
    for index, item in enumerate(_ORDERED):
        yield _SEPARATORS[index]
        value = copy.values[item.name]
        stored_part = _tree_stored(item) if item.name in _TREES else item.stored
        if isinstance(value, dict | set) and len(value) > entries:
            if item.name in _FLAT_MAPS:
                stored_part = _in_order  # the parts come in key order: their stored form
            yield from _keyed_pieces(value, stored_part, entries, run)
        elif isinstance(value, list) and len(value) > entries:
            yield from _listed_pieces(value, stored_part, entries)
        else:
            yield _ENCODER.encode(stored_part(value))
    yield _TOP[1]


def _keyed_pieces(
    value: dict[str, Any] | set[str],
    stored_part: Callable[[Any], Any],
    entries: int,
    run: int,
) -> Iterator[bytes]:
    keys = list(value)
    runs: list[list[str]] = []
    for start in range(0, len(keys), run):
        runs.append(sorted(keys[start : start + run]))
        yield b""
    ordered: Iterator[str]
    if all(a[-1] < b[0] for a, b in itertools.pairwise(runs)):
        ordered = itertools.chain.from_iterable(runs)  # runs already in order
    else:
        ordered = heapq.merge(*runs)
    is_map = isinstance(value, dict)
    first = True
    while chunk := list(itertools.islice(ordered, entries)):
        part: Any = {key: value[key] for key in chunk} if is_map else set(chunk)  # type: ignore[index]
        encoded = _ENCODER.encode(stored_part(part))
        yield (b"{" if is_map else b"[") if first else b","
        first = False
        yield encoded[1:-1]
    yield b"}" if is_map else b"]"


def _listed_pieces(
    value: list[Any], stored_part: Callable[[Any], Any], entries: int
) -> Iterator[bytes]:
    for start in range(0, len(value), entries):
        encoded = _ENCODER.encode(stored_part(value[start : start + entries]))
        yield b"[" if start == 0 else b","
        yield encoded[1:-1]
    yield b"]"


class _Configured:
    """What the tree's stored form reads of a quota: its configuration."""

    __slots__ = ("config",)

    def __init__(self, config: QuotaUpserted) -> None:
        self.config = config


def _tree_stored(item: PersistedField) -> Callable[[dict[str, QuotaUpserted]], Any]:
    """The stored form of part of the tree, from the configurations the copy holds."""

    def stored_part(configs: dict[str, QuotaUpserted]) -> Any:
        return item.stored({name: _Configured(config) for name, config in configs.items()})

    return stored_part


def _shared(hint: Any) -> bool:
    """Are values of type ``hint`` never changed in place once in the state?"""
    if hint in (int, str, bool, float, PodUpserted, QuotaUpserted):
        return True
    return (
        isinstance(hint, type)
        and issubclass(hint, msgspec.Struct)
        and bool(hint.__struct_config__.frozen)
    )


def _copier(hint: Any) -> Callable[[Any], Any]:
    """How :func:`copy_persisted` copies a field of type ``hint``."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is dict:
        value = args[1]
        if value is QuotaNode:
            return lambda nodes: {name: node.config for name, node in nodes.items()}
        if _shared(value):
            return dict.copy  # clones the table: much cheaper than dict(value)
        if typing.get_origin(value) is dict and _shared(typing.get_args(value)[1]):
            return lambda maps: {key: dict(inner) for key, inner in maps.items()}
        return copy_module.deepcopy
    if origin is set and _shared(args[0]):
        return set.copy
    if origin is list and _shared(args[0]):
        return list.copy
    if _shared(hint):
        return lambda value: value
    return copy_module.deepcopy


def _layout() -> tuple[tuple[bytes, bytes], list[bytes], list[PersistedField]]:
    """Where each field goes in :func:`dump`'s bytes, read off the encoder
    itself: a state whose field values are distinct numbers, encoded."""
    names = [item.name for item in FIELDS]
    template = StoredState(**{name: index for index, name in enumerate(names)})
    text = _ENCODER.encode(_Snapshot(format=FORMAT, state=template))
    document = msgspec.json.decode(text)
    order = list(document["state"])
    assert sorted(order) == sorted(names), order
    prefix = text[: text.index(b'"state":{') + len(b'"state":{')]
    suffix = text[text.index(b"}", len(prefix)) :]  # the template's values hold no brace
    by_name = {item.name: item for item in FIELDS}
    separators = [
        (b"" if index == 0 else b",") + _ENCODER.encode(name) + b":"
        for index, name in enumerate(order)
    ]
    return (prefix, suffix), separators, [by_name[name] for name in order]


def _in_order(part: dict[str, Any]) -> dict[str, Any]:
    return part


def _flat_map(hint: Any) -> bool:
    """A ``dict[str, V]`` whose stored form is itself sorted by key (``V`` neither
    a dict, sorted inside, nor a quota, stored as its configuration)."""
    if typing.get_origin(hint) is not dict:
        return False
    value = typing.get_args(hint)[1]
    return value is not QuotaNode and typing.get_origin(value) is not dict


_COPIERS: dict[str, Callable[[Any], Any]] = {
    item.name: _copier(typing.get_type_hints(ProjectedState)[item.name]) for item in FIELDS
}
#: Fields whose copy holds each quota's configuration (the tree).
_TREES = frozenset(
    item.name
    for item in FIELDS
    if typing.get_type_hints(ProjectedState)[item.name] == dict[str, QuotaNode]
)
#: Fields whose stored form is the map sorted by key and nothing else.
_FLAT_MAPS = frozenset(
    item.name for item in FIELDS if _flat_map(typing.get_type_hints(ProjectedState)[item.name])
)
_TOP, _SEPARATORS, _ORDERED = _layout()
