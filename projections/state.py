"""The projected state: plain data the pure folds read and write (DESIGN §5).

Nothing here does I/O or reads a clock; times are ledger ``ts`` values in
milliseconds. Derived numbers (request, runtime, available, ...) are
recomputed lazily: a change marks quotas *dirty*, and
:func:`quotaledger.projections.settle.settle` brings them up to date before
anything reads them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal

import msgspec

from quotaledger.events.model import PodUpserted, PreemptionCause, QuotaUpserted

from .columns import QuotaColumns
from .resources import RL
from .terms import Terms

ROOT = "root"
SYSTEM = "system"
DEFAULT = "default"
BUILTIN = frozenset({SYSTEM, DEFAULT})
ACTIVE_PHASES = frozenset({"Pending", "Running"})

#: How an eviction ended (DESIGN §6): the executor's answer, or the pod seen gone.
EvictionOutcome = Literal["succeeded", "failed"]

#: How many finished preemption ids the guard remembers (DECISIONS 62): a
#: ``PreemptionStarted`` re-using one of them is refused as a duplicate.
FINISHED_KEPT = 4096

#: Key of a dataclass field's metadata marking it persisted (``HASHED``/``UNHASHED``).
PERSISTED = "quotaledger.persisted"


class Persisted(msgspec.Struct, frozen=True):
    """A :class:`ProjectedState` field the facts and decisions determine.

    Snapshots store every persisted field and nothing else; the state hash
    covers those with ``hashed`` (DESIGN §5 "State hash"; DECISIONS 60).
    Every other field is derived or bookkeeping, rebuilt on restore.
    """

    hashed: bool = True
    #: Only the keys of a dict are hashed: its values are ledger positions
    #: (where a record happens to sit), not what the records say.
    hash_keys_only: bool = False
    #: Added after snapshots were first written: a snapshot without it restores
    #: the field empty (its type's empty value) instead of being refused.
    absent_is_empty: bool = False


#: Field metadata of a persisted field, in the state hash or outside it.
HASHED = MappingProxyType({PERSISTED: Persisted(hashed=True)})
UNHASHED = MappingProxyType({PERSISTED: Persisted(hashed=False)})
#: Persisted, and hashed by its keys only (see ``Persisted.hash_keys_only``).
HASHED_KEYS = MappingProxyType({PERSISTED: Persisted(hashed=True, hash_keys_only=True)})
#: Persisted outside the hash; restored empty from a snapshot that predates it.
UNHASHED_LATER = MappingProxyType({PERSISTED: Persisted(hashed=False, absent_is_empty=True)})


class Settings(msgspec.Struct, kw_only=True):
    """Engine settings in force (DESIGN §4 ``SettingsChanged`` defaults)."""

    min_scaling: bool = True
    revoke_enabled: bool = True
    revoke_after_s: float = 120.0
    reclaim_enabled: bool = True
    reclaim_after_s: float = 30.0
    quota_preemption_enabled: bool = False
    preemption_miss_percent: float = 0.0


class NodeMeta(msgspec.Struct, frozen=True):
    """What a ``NodeUpserted`` says besides allocatable, for a node whose labels or
    ``unschedulable`` are not the defaults (DECISIONS 260)."""

    labels: dict[str, str] = msgspec.field(default_factory=dict)
    unschedulable: bool = False


class Rejection(msgspec.Struct, frozen=True):
    """A refused fact or decision, as listed in ``state.rejected`` (§8 rule 5)."""

    offset: int
    kind: str | None
    reason: str


class NamespaceUsage(msgspec.Struct):
    """Σ requests of one namespace's active pods inside one leaf quota
    (computed when read: :func:`quotaledger.projections.fair_share.namespace_usage`)."""

    request: RL = msgspec.field(default_factory=dict)
    used: RL = msgspec.field(default_factory=dict)


class _RowNumbers:
    """A per-quota number list read from the quota's row of the state's
    columns (:mod:`.columns`), built as a sparse dict when read; empty for a
    quota no state holds. Assigning one stores it in the row."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, node: QuotaNode | None, owner: type[QuotaNode]) -> RL:
        if node is None or node.store is None:
            return {}
        return node.store.read(self.name, node.row)

    def __set__(self, node: QuotaNode, amounts: RL) -> None:
        if node.store is None:
            raise RuntimeError(f"quota {node.name} is in no state's columns")
        node.store.write(self.name, node.row, amounts)


@dataclass(slots=True, eq=False)
class QuotaNode:
    """One quota: its configuration, its pods, and its row of numbers.

    The numbers live in the state's columns (:class:`.columns.QuotaColumns`;
    DECISIONS 150-152), in row ``row``: ``pod_request``/``pod_used`` are Σ requests of
    the quota's active pods (unmasked; used only for pods with a node, §8
    rule 12) once :func:`quotaledger.projections.pods.flush_sums` has run
    (``settle`` does); the derived ones (request, limited_request, used,
    subtree, local, usage, effective_min, runtime) are valid after ``settle``.
    Each reads as a fresh sparse dict.
    """

    config: QuotaUpserted
    pods: set[str] = field(default_factory=set)
    # namespace -> how many of ``pods`` it holds (a view of one namespace
    # takes its sums from the row: fair_share.namespace_usage)
    namespaces: dict[str, int] = field(default_factory=dict)
    # in-place pod changes not yet in the sums: (old requests, new requests,
    # old bound, new bound); or, once longer than the pods, ``sums_stale``
    # (rebuild from the pods). See pods.flush_sums.
    sum_log: list[tuple[RL, RL, bool, bool]] = field(default_factory=list)
    sums_stale: bool = False
    connected: bool = True
    depth: int = 1
    terms: Terms | None = None  # constants of ``config`` (rebuilt when it changes)
    # where the numbers are: the state's columns, and this quota's row there
    store: QuotaColumns | None = None
    row: int = -1

    pod_request = _RowNumbers("pod_request")
    pod_used = _RowNumbers("pod_used")
    # derived, bottom-up
    request = _RowNumbers("request")
    limited_request = _RowNumbers("limited_request")
    used = _RowNumbers("used")
    subtree = _RowNumbers("subtree")
    local = _RowNumbers("local")
    usage = _RowNumbers("usage")
    # derived, top-down
    effective_min = _RowNumbers("effective_min")
    runtime = _RowNumbers("runtime")

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def parent(self) -> str:
        return self.config.parent

    @property
    def is_parent(self) -> bool:
        return self.config.is_parent


class PreemptionRun(msgspec.Struct, kw_only=True):
    """A preemption between its ``PreemptionStarted`` and ``PreemptionFinished``."""

    preemption_id: str
    queue: str
    cause: PreemptionCause
    target: RL
    started_offset: int
    started_ts: int
    pod_uid: str | None = None
    occupied: list[str] = msgspec.field(default_factory=list)
    evictions: list[str] = msgspec.field(default_factory=list)


class EvictionRun(msgspec.Struct, kw_only=True):
    """An eviction requested by a running preemption; ``outcome`` once known."""

    eviction_id: str
    preemption_id: str
    pod_uid: str
    queue: str
    requested_offset: int
    requests: RL = msgspec.field(default_factory=dict)  # what the eviction releases
    instance: str = ""
    epoch: int = 0
    outcome: EvictionOutcome | None = None


def builtin_config(name: str) -> QuotaUpserted:
    """``system`` and ``default`` as they exist from the start (DESIGN §5 Tree)."""
    return QuotaUpserted(name=name)


@dataclass(slots=True, eq=False)
class ProjectedState:
    """Everything the fold knows at ``offset``; see module docstring.

    Fields with ``HASHED`` or ``UNHASHED`` metadata are persisted, what the
    facts and decisions determine: a snapshot stores exactly those and the
    state hash covers the ``HASHED`` ones (:mod:`quotaledger.projections.persisted`).
    Adding a field with that metadata is all it takes to snapshot and hash it.
    The other fields are indexes and derived numbers, rebuilt on restore.
    """

    ledger_id: str | None = field(default=None, metadata=UNHASHED)
    offset: int = field(default=-1, metadata=UNHASHED)
    ts: int = field(default=0, metadata=UNHASHED)
    settings: Settings = field(default_factory=Settings, metadata=HASHED)
    leader_epoch: int = field(default=0, metadata=HASHED)
    # who holds ``leader_epoch`` (its accepted LeaderElected)
    leader_instance: str = field(default="", metadata=HASHED)
    nodes: dict[str, RL] = field(default_factory=dict, metadata=HASHED)
    # labels and unschedulable of the nodes whose values are not the defaults: no
    # number reads them; kept so a new leader appends only changed nodes (DECISIONS 260)
    node_meta: dict[str, NodeMeta] = field(default_factory=dict, metadata=UNHASHED_LATER)
    # stored as the configurations; nodes and their numbers are rebuilt
    quotas: dict[str, QuotaNode] = field(default_factory=dict, metadata=HASHED)
    pods: dict[str, PodUpserted] = field(default_factory=dict, metadata=HASHED)
    namespace_weights: dict[str, int] = field(default_factory=dict, metadata=HASHED)
    rejected: list[Rejection] = field(default_factory=list, metadata=UNHASHED)
    # DESIGN §6: timers and the one-preemption-per-queue guard
    decrease_deadlines: dict[str, int] = field(default_factory=dict, metadata=HASHED)
    # running preemptions; their evictions; evicted pods whose removal is pending
    preemptions: dict[str, PreemptionRun] = field(default_factory=dict, metadata=HASHED)
    evictions: dict[str, EvictionRun] = field(default_factory=dict, metadata=HASHED)
    evicted_pods: dict[str, str] = field(default_factory=dict, metadata=HASHED)
    # preemption id -> offset of its PreemptionFinished; the last FINISHED_KEPT
    # (the offsets order the bound; the hash covers the ids: where a record sits,
    # e.g. after LedgerDigest records, is not what the facts say, DESIGN §9)
    finished_preemptions: dict[str, int] = field(default_factory=dict, metadata=HASHED_KEYS)
    # DESIGN §6 rules 2-3 clocks: queue/pod -> since ts; held ones wait for a fact
    owing_since: dict[str, int] = field(default_factory=dict, metadata=HASHED)
    owing_held: set[str] = field(default_factory=set, metadata=HASHED)
    starving_since: dict[str, int] = field(default_factory=dict, metadata=HASHED)
    starving_held: set[str] = field(default_factory=set, metadata=HASHED)
    # ---- indexes, rebuilt from the persisted fields on restore
    allocatable: RL = field(default_factory=dict)  # Σ nodes
    occupied: dict[str, str] = field(default_factory=dict)  # queue -> preemption_id
    evicting_pods: dict[str, str] = field(default_factory=dict)  # pod uid -> eviction_id
    children_of: dict[str, set[str]] = field(default_factory=dict)  # incl. missing parents
    namespace_claims: dict[str, str] = field(default_factory=dict)
    pod_quota: dict[str, str] = field(default_factory=dict)  # active pods only
    namespace_pods: dict[str, set[str]] = field(default_factory=dict)  # active pods
    field_pods: dict[str, set[str]] = field(default_factory=dict)  # active, by `quota` field
    pending_pods: set[str] = field(default_factory=set)  # Pending without a node
    # starvation bookkeeping: pending pods by quota and, per resource, by
    # requested amount (with the distinct amounts sorted); what changed since
    # the last sample (a restored state starts with a full sample)
    pending_by_quota: dict[str, set[str]] = field(default_factory=dict)
    pending_index: dict[str, dict[int, set[str]]] = field(default_factory=dict)
    pending_amounts: dict[str, list[int]] = field(default_factory=dict)
    touched_pods: set[str] = field(default_factory=set)
    free_at_sample: RL = field(default_factory=dict)
    starving_full: bool = True
    # what the starvation sample read of pending pods and their quotas, kept
    # between samples (``clocks.SampleInputs``; made by its first sample)
    sample_inputs: object = None
    # the tree's shape: bumped whenever quotas are added, removed or moved, or
    # change parent, is_parent or namespaces (``projections.recompute`` keeps its
    # walk of the tree in ``tree_arrays`` while this stays the same)
    tree_version: int = 0
    tree_arrays: object = None
    # quotas given another configuration since ``tree_arrays`` last looked
    # (numbers-only edits: the shape, and so ``tree_version``, stayed the same)
    reconfigured: set[str] = field(default_factory=set)
    # each parent's children in name order while ``tree_version`` stays the
    # same (key "": the version and the quotas they were listed from)
    sorted_children: dict[str, Any] = field(default_factory=dict)
    # the quotas that owe now, kept between reclaims (``clocks.owing_quotas``)
    owing_index: object = None
    # ``finished_preemptions`` by offset (``guard.remember_finished``: the oldest
    # is dropped past FINISHED_KEPT without a scan)
    finished_order: object = None
    # the armed timers in firing order between an engine's looks
    # (``projections.timers.TimerIndex``; made by its first reader)
    timer_index: object = None
    # every quota's numbers, one row each (DECISIONS 150; ``QuotaNode.store``)
    columns: QuotaColumns = field(default_factory=QuotaColumns)
    # lazy recompute bookkeeping
    dirty: set[str] = field(default_factory=set)
    touched: set[str] = field(default_factory=set)  # changed since the clocks last looked
    total_dirty: bool = True
    refill: set[str] = field(default_factory=set)
    cluster_total: RL = field(default_factory=dict)
    root_subtree: RL = field(default_factory=dict)
    root_usage: RL = field(default_factory=dict)
    # the incremental state hash (:mod:`.state_digest`): the entries of the
    # large maps changed since it last looked (one insertion per change, by
    # the fold and the tree), and the digests it keeps; ``hash_pods`` maps each
    # changed pod's uid to the pod the state holds (None: removed), so the hash
    # need not look it up again (DECISIONS 401)
    hash_pods: dict[str, PodUpserted | None] = field(default_factory=dict)
    hash_quotas: set[str] = field(default_factory=set)
    hash_nodes: set[str] = field(default_factory=set)
    hash_weights: set[str] = field(default_factory=set)
    hash_memo: object = None

    @classmethod
    def empty(cls) -> ProjectedState:
        state = cls()
        for name in (SYSTEM, DEFAULT):
            state.quotas[name] = node = QuotaNode(config=builtin_config(name))
            state.attach(node)
            state.children_of.setdefault(ROOT, set()).add(name)
        return state

    def attach(self, node: QuotaNode) -> None:
        """Give a quota its row in this state's columns (once)."""
        if node.store is not self.columns:
            node.store = self.columns
            node.row = self.columns.take_row()

    def children(self, name: str) -> set[str]:
        """Quotas naming ``name`` as parent (existing ones; orphans included)."""
        return self.children_of.get(name, set())
