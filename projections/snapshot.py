"""Snapshots: the fold's facts as MessagePack, restored by recomputation (DESIGN §3, §5).

A snapshot stores only what facts and decisions determine (configurations,
pods, nodes, settings, weights, the guard's and timers' state, rejections);
every derived number is recomputed on restore, so snapshot + tail gives the
same hash as a full replay.
"""

from __future__ import annotations

import msgspec

from quotaledger.events.model import PodUpserted, QuotaUpserted

from .derive import recompute_all
from .resources import add_into
from .state import (
    BUILTIN,
    EvictionRun,
    PreemptionRun,
    ProjectedState,
    QuotaNode,
    Rejection,
    Settings,
)
from .tree import attach_pod, compact, is_active, refresh_connectivity

FORMAT = 1


class SnapshotBody(msgspec.Struct, kw_only=True):
    format: int
    ledger_id: str | None
    offset: int
    ts: int
    settings: Settings
    leader_epoch: int
    nodes: dict[str, dict[str, int]]
    quotas: list[QuotaUpserted]
    pods: list[PodUpserted]
    namespace_weights: dict[str, int]
    rejected: list[Rejection]
    decrease_deadlines: dict[str, int]
    preemptions: list[PreemptionRun]
    evictions: list[EvictionRun]
    finished_preemptions: list[str]
    owing_since: dict[str, int]
    owing_held: list[str]
    evicted_pods: dict[str, str]
    starving_since: dict[str, int]
    starving_held: list[str]
    leader_instance: str = ""  # last: snapshots written before it still load


_DECODER = msgspec.msgpack.Decoder(SnapshotBody)
_ENCODER = msgspec.msgpack.Encoder()


class SnapshotError(ValueError):
    """A snapshot this version cannot read."""


def dump(state: ProjectedState) -> bytes:
    """Encode the state's facts (deterministic: every collection sorted)."""
    body = SnapshotBody(
        format=FORMAT,
        ledger_id=state.ledger_id,
        offset=state.offset,
        ts=state.ts,
        settings=state.settings,
        leader_epoch=state.leader_epoch,
        nodes={name: state.nodes[name] for name in sorted(state.nodes)},
        quotas=[state.quotas[name].config for name in sorted(state.quotas)],
        pods=[state.pods[uid] for uid in sorted(state.pods)],
        namespace_weights=dict(sorted(state.namespace_weights.items())),
        rejected=list(state.rejected),
        decrease_deadlines=dict(sorted(state.decrease_deadlines.items())),
        preemptions=[state.preemptions[key] for key in sorted(state.preemptions)],
        evictions=[state.evictions[key] for key in sorted(state.evictions)],
        finished_preemptions=sorted(state.finished_preemptions),
        owing_since=dict(sorted(state.owing_since.items())),
        owing_held=sorted(state.owing_held),
        evicted_pods=dict(sorted(state.evicted_pods.items())),
        starving_since=dict(sorted(state.starving_since.items())),
        starving_held=sorted(state.starving_held),
        leader_instance=state.leader_instance,
    )
    return _ENCODER.encode(body)


def load(blob: bytes) -> ProjectedState:
    """Rebuild a state from :func:`dump`'s bytes, recomputing derived numbers."""
    try:
        body = _DECODER.decode(blob)
    except msgspec.DecodeError as exc:
        raise SnapshotError(f"unreadable snapshot: {exc}") from None
    if body.format != FORMAT:
        raise SnapshotError(f"snapshot format {body.format} is not {FORMAT}")
    state = ProjectedState.empty()
    state.ledger_id, state.offset, state.ts = body.ledger_id, body.offset, body.ts
    state.settings, state.leader_epoch = body.settings, body.leader_epoch
    state.leader_instance = body.leader_instance
    for name, allocatable in body.nodes.items():
        state.nodes[name] = allocatable
        add_into(state.allocatable, allocatable)
    for config in body.quotas:
        if config.name in BUILTIN and config.name in state.quotas:
            state.quotas[config.name].config = config
        else:
            state.quotas[config.name] = QuotaNode(config=config)
            state.children_of.setdefault(config.parent, set()).add(config.name)
        for ns in config.namespaces:
            state.namespace_claims[ns] = config.name
    for name in state.quotas:
        refresh_connectivity(state, name)
    for pod in body.pods:
        compact(pod, None)
        state.pods[pod.uid] = pod
        if is_active(pod):
            attach_pod(state, pod)
    state.namespace_weights = dict(body.namespace_weights)
    state.rejected = list(body.rejected)
    state.decrease_deadlines = dict(body.decrease_deadlines)
    for run in body.preemptions:
        state.preemptions[run.preemption_id] = run
        for queue in run.occupied:
            state.occupied[queue] = run.preemption_id
    for eviction in body.evictions:
        state.evictions[eviction.eviction_id] = eviction
        if eviction.outcome is None:
            state.evicting_pods[eviction.pod_uid] = eviction.eviction_id
    state.finished_preemptions = set(body.finished_preemptions)
    state.owing_since = dict(body.owing_since)
    state.owing_held = set(body.owing_held)
    state.evicted_pods = dict(body.evicted_pods)
    state.starving_since = dict(body.starving_since)
    state.starving_held = set(body.starving_held)
    recompute_all(state)
    return state
