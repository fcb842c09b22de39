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

import msgspec

from .derive import recompute_all
from .persisted import StoredState, restore_fields, stored
from .resources import add_into
from .state import ProjectedState
from .tree import attach_pod, compact, is_active, refresh_connectivity

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
