"""The event vocabulary of the ledger (DESIGN §4).

Facts are written by producers, adapters and importers; decisions only by the
engine. Every event is a msgspec Struct tagged by ``kind`` (its class name).
Decoding is the one place input is trusted or refused: a missing field, a wrong
type, a ``null`` where the default is not null (§8 rule 4), a negative amount
or an unparsable quantity raises an error naming the field.

Resource lists of facts accept quantity strings or JSON numbers on the wire;
:func:`quotaledger.events.codec.decode_event` canonicalises them right after
decoding (§2) by calling ``canonicalize()``. A struct built in Python (tests,
snapshots) holds canonical integers already. Resource lists of decisions are
always canonical integers.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

from .quantity import canonical_list
from .times import MAX_DELAY_S, MAX_INT, bounded_time

if TYPE_CHECKING:
    #: After decoding, every amount of a fact is a canonical integer.
    InputAmount = int
else:
    # ``bool`` and ``None`` are let through the decoder only so that
    # canonical_amount refuses them naming `$.field.resource` (msgspec itself
    # would only say `$.field[...]`).
    InputAmount = Union[None, bool, int, float, str]

#: A resource list: resource name -> canonical amount (DESIGN §2).
RL = dict[str, int]
InputRL = dict[str, InputAmount]
#: A delay in seconds: 0 .. ten years (§8 rule 3, §9 bounds).
NonNegativeSeconds = Annotated[float, Meta(ge=0, le=MAX_DELAY_S)]
#: Any other integer: bounded so that every state a fold can hold encodes
#: (snapshots, JSON) and stays exact (§9; DECISIONS 33).
BoundedInt = Annotated[int, Meta(ge=-MAX_INT, le=MAX_INT)]
#: A pod priority is a Kubernetes int32.
Priority = Annotated[int, Meta(ge=-(2**31), le=2**31 - 1)]
PodPhase = Literal["Pending", "Running", "Succeeded", "Failed"]


def _canon(name: str, raw: InputRL | None) -> RL | None:
    if raw is None:
        return None
    return canonical_list(name, raw)  # type: ignore[arg-type]


class _Event(Struct, tag_field="kind", tag=True, kw_only=True, omit_defaults=False):
    """Common shape: an optional RFC 3339 ``at`` that becomes the record's ts."""

    at: datetime | None = None


# --------------------------------------------------------------------- facts


class NodeUpserted(_Event, gc=False):
    name: str
    allocatable: InputRL = {}
    labels: dict[str, str] = {}
    unschedulable: bool = False

    def canonicalize(self) -> None:
        self.allocatable = canonical_list("allocatable", self.allocatable)  # type: ignore[arg-type]


class NodeRemoved(_Event, gc=False):
    name: str


class PodUpserted(_Event, gc=False):
    uid: str
    name: str
    namespace: str
    requests: InputRL = {}
    priority: Priority = 0
    phase: PodPhase = "Pending"
    node: str | None = None
    quota: str | None = None
    created_at: datetime | None = None
    preemptible: bool = True
    daemonset: bool = False
    originator: bool = False
    allow_preemption: bool = True
    labels: dict[str, str] = {}

    def canonicalize(self) -> None:
        self.requests = canonical_list("requests", self.requests)  # type: ignore[arg-type]
        created = self.created_at
        if created is not None and (created.tzinfo is None or not 1970 < created.year < 9000):
            self.created_at = bounded_time("created_at", created)


class PodRemoved(_Event, gc=False):
    uid: str


class QuotaUpserted(_Event, gc=False):
    name: str
    parent: str = "root"
    is_parent: bool = False
    min: InputRL = {}
    max: InputRL | None = None
    shared_weight: InputRL | None = None
    allow_lent: bool = True
    lending_limit: InputRL | None = None
    borrowing_limit: InputRL | None = None
    namespaces: list[str] = []
    preemption_delay_s: NonNegativeSeconds = 0.0

    def canonicalize(self) -> None:
        self.min = canonical_list("min", self.min)  # type: ignore[arg-type]
        self.max = _canon("max", self.max)
        self.shared_weight = _canon("shared_weight", self.shared_weight)
        self.lending_limit = _canon("lending_limit", self.lending_limit)
        self.borrowing_limit = _canon("borrowing_limit", self.borrowing_limit)


class QuotaRemoved(_Event, gc=False):
    name: str


class NamespaceWeighted(_Event, gc=False):
    namespace: str
    weight: Annotated[int, Meta(ge=1, le=MAX_INT)]


class SettingsChanged(_Event, gc=False):
    """Absent fields keep their value; ``null`` is a wrong type (§8 rule 4)."""

    min_scaling: bool | UnsetType = UNSET
    revoke_enabled: bool | UnsetType = UNSET
    revoke_after_s: NonNegativeSeconds | UnsetType = UNSET
    reclaim_enabled: bool | UnsetType = UNSET
    reclaim_after_s: NonNegativeSeconds | UnsetType = UNSET
    quota_preemption_enabled: bool | UnsetType = UNSET
    preemption_miss_percent: Annotated[float, Meta(ge=0, le=100)] | UnsetType = UNSET


# ----------------------------------------------------------------- decisions

PreemptionCause = Literal["quota-decrease", "overuse", "reclaim"]
PreemptionOutcome = Literal["complete", "best-effort", "not-helpful"]


class LedgerOpened(_Event, gc=False):
    ledger_id: str


class LeaderElected(_Event, gc=False):
    epoch: BoundedInt
    instance: str


class FactRejected(_Event, gc=False):
    """A fact refused at the door. ``raw`` keeps the refused text: nothing is lost."""

    offset: BoundedInt
    reason: str
    rejected_kind: str | None = None
    raw: str | None = None


class LedgerDigest(_Event, gc=False):
    """A checkpoint of the digest chain and the state (DESIGN §9).

    ``digest`` is the hex of ``d(through)``, ``state_hash`` the state hash after
    folding records ``0..through``. The projection ignores it (state and hash
    unchanged); snapshots are verified against it and ``audit`` checks it.
    """

    through: int
    digest: str
    state_hash: str


class ClocksObserved(_Event, gc=False):
    """The engine's sample of the overuse and starvation clocks (DESIGN §6 rules 2-3).

    Starts give each clock's start time (ms); stops name clocks that ended. The
    fold only applies these; it never samples, so replay stays a cheap fold and
    the engine owns time.
    """

    basis: BoundedInt
    owing_started: dict[str, BoundedInt] = {}
    owing_stopped: list[str] = []
    starving_started: dict[str, BoundedInt] = {}
    starving_stopped: list[str] = []
    epoch: BoundedInt = 0


class PreemptionStarted(_Event, gc=False):
    preemption_id: str
    queue: str
    cause: PreemptionCause
    target: RL
    basis: BoundedInt
    epoch: BoundedInt = 0
    pod_uid: str | None = None  # reclaim: the starving pod


class EvictionRequested(_Event, gc=False):
    eviction_id: str
    preemption_id: str
    pod_uid: str
    queue: str
    explain: dict[str, Any] = {}
    epoch: BoundedInt = 0
    instance: str = ""  # the engine that proposed it, and drives it


class EvictionSucceeded(_Event, gc=False):
    eviction_id: str


class EvictionFailed(_Event, gc=False):
    eviction_id: str
    error: str


class PreemptionFinished(_Event, gc=False):
    preemption_id: str
    queue: str
    outcome: PreemptionOutcome
    claimed: RL = {}
    reason: str = ""
    epoch: BoundedInt = 0


Fact = Union[
    NodeUpserted,
    NodeRemoved,
    PodUpserted,
    PodRemoved,
    QuotaUpserted,
    QuotaRemoved,
    NamespaceWeighted,
    SettingsChanged,
]
Decision = Union[
    LedgerOpened,
    LeaderElected,
    FactRejected,
    ClocksObserved,
    PreemptionStarted,
    EvictionRequested,
    EvictionSucceeded,
    EvictionFailed,
    PreemptionFinished,
    LedgerDigest,
]
Event = Union[Fact, Decision]

FACT_TYPES: tuple[type[Struct], ...] = (
    NodeUpserted,
    NodeRemoved,
    PodUpserted,
    PodRemoved,
    QuotaUpserted,
    QuotaRemoved,
    NamespaceWeighted,
    SettingsChanged,
)
DECISION_TYPES: tuple[type[Struct], ...] = (
    LeaderElected,
    FactRejected,
    ClocksObserved,
    PreemptionStarted,
    EvictionRequested,
    EvictionSucceeded,
    EvictionFailed,
    PreemptionFinished,
    LedgerDigest,
)
#: Kinds written by the engine only (DESIGN §4): the decisions and the ledger's own
#: first record, ``LedgerOpened``.
DECISION_KINDS: frozenset[str] = frozenset({"LedgerOpened", *(t.__name__ for t in DECISION_TYPES)})


def kind_of(event: Struct) -> str:
    """The ``kind`` tag of an event."""
    return type(event).__name__


def is_fact(event: Struct) -> bool:
    """Facts describe the cluster; everything else is the engine's own record."""
    return isinstance(event, FACT_TYPES)


__all__ = [
    "DECISION_KINDS",
    "DECISION_TYPES",
    "FACT_TYPES",
    "RL",
    "ClocksObserved",
    "Decision",
    "Event",
    "EvictionFailed",
    "EvictionRequested",
    "EvictionSucceeded",
    "Fact",
    "FactRejected",
    "LeaderElected",
    "LedgerDigest",
    "LedgerOpened",
    "NamespaceWeighted",
    "NodeRemoved",
    "NodeUpserted",
    "PodRemoved",
    "PodUpserted",
    "PreemptionFinished",
    "PreemptionStarted",
    "QuotaRemoved",
    "QuotaUpserted",
    "SettingsChanged",
    "is_fact",
    "kind_of",
    "msgspec",
]
