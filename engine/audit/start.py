"""Where an auditor starts (DESIGN §9: every record re-derived from offset 0 by
some process).

A single audit starts at offset 0 with an empty state. A segment of a parallel
audit (:mod:`.parallel`) starts after offset ``start - 1`` with what the records
before it give: their fold (:func:`fold_before`), or a snapshot's state taken
as a hypothesis the previous segment verifies, and which preemptions those
records started and which pod each eviction named (:func:`index_before`,
scanned only when a decision first refers to one).

What the single pass keeps across records, a segment must be given for the
records before it, or it judges differently near its start: the ids of the
preemptions the projection accepted (a ``PreemptionStarted`` reusing one is
``id-reused``) and the offset where each eviction got its outcome (an overuse
outcome may be judged on any state from there to its finish, DECISIONS 212).
:func:`fold_before` keeps both as the auditor does (:func:`settling`); a start
from a snapshot has neither, and the auditor recovers them from the records
when a decision needs them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from quotaledger.events.codec import EventError, decode_event
from quotaledger.events.ledger import RecordSource
from quotaledger.events.model import (
    Event,
    EvictionFailed,
    EvictionRequested,
    EvictionSucceeded,
    PodRemoved,
    PodUpserted,
    PreemptionFinished,
    PreemptionStarted,
)
from quotaledger.projections import Projection
from quotaledger.projections.state import ProjectedState

from .lagging import LaggingFold


@dataclass(slots=True)
class SegmentStart:
    """What a segment's auditor needs of the records before it: their fold, and
    which preemptions they started and evictions they requested."""

    projection: Projection
    starts: dict[str, tuple[int, list[str]]] = field(default_factory=dict)
    eviction_pods: dict[str, str] = field(default_factory=dict)
    #: False when the segment starts from a snapshot: ``starts`` and
    #: ``eviction_pods`` are filled by a scan of the records before it when a
    #: decision first refers to something the segment has not seen.
    indexed: bool = True
    #: A start from a snapshot: its blob (the lagging fold restarts from it),
    #: the digest and state hash it stores (the previous segment verifies both).
    blob: bytes | None = None
    digest: bytes | None = None
    state_hash: str | None = None
    #: The offset of ``blob``'s state when the records after it up to the
    #: segment's start were folded onto it (None: the projection's offset).
    blob_offset: int | None = None
    #: The ids of the preemptions the projection accepted before the segment,
    #: and the offset where each eviction of a preemption not finished then got
    #: its outcome (None: not known, a start from a snapshot).
    started_ids: set[str] | None = None
    settled_at: dict[str, int] | None = None


_OUTCOMES = (EvictionSucceeded, EvictionFailed)
_POD_GONE = (PodRemoved, PodUpserted)


def settling(state: ProjectedState, event: Event | None) -> str | None:
    """The running eviction ``event`` may give its outcome on ``state`` (its own
    outcome record, or the removal or stop of its pod), if any."""
    if not state.evicting_pods and not state.evictions:  # the usual record: none runs
        return None
    if isinstance(event, _OUTCOMES):
        run = state.evictions.get(event.eviction_id)
        return event.eviction_id if run is not None and run.outcome is None else None
    if isinstance(event, _POD_GONE) and state.evicting_pods:
        return state.evicting_pods.get(event.uid)
    return None


def fold_before(source: RecordSource, start: int) -> SegmentStart:
    """Fold records ``0..start-1`` as the auditor (:mod:`.decisions`) would, keeping
    its index, the ids it saw started and when each eviction settled: the start
    of a segment that trusts no snapshot."""
    prefix = SegmentStart(Projection(), started_ids=set(), settled_at={})
    main = prefix.projection
    started_ids, settled_at = prefix.started_ids, prefix.settled_at
    assert started_ids is not None and settled_at is not None
    if start == 0:
        return prefix
    for record in source(0):
        if record.offset >= start:
            break
        try:
            event: Event | None = decode_event(record.payload)
        except EventError:
            event = None
        if event is None:
            main.apply_record(record)
            continue
        state = main.state
        if isinstance(event, PreemptionFinished):
            run = state.preemptions.get(event.preemption_id)
            for eviction_id in run.evictions if run is not None else ():
                settled_at.pop(eviction_id, None)  # as the auditor forgets them
        settles = settling(state, event)
        before = len(state.rejected)
        main.apply(record.offset, record.ts, event)
        state = main.state
        if settles is not None:
            eviction = state.evictions.get(settles)
            if eviction is not None and eviction.outcome is not None:
                settled_at[settles] = record.offset
        if isinstance(event, PreemptionStarted):
            if not any(r.offset == record.offset for r in state.rejected[before:]):
                started_ids.add(event.preemption_id)
            prefix.starts[event.preemption_id] = (record.offset, [])
        elif isinstance(event, EvictionRequested):
            prefix.eviction_pods[event.eviction_id] = event.pod_uid
            started = prefix.starts.get(event.preemption_id)
            if started is not None:
                started[1].append(event.pod_uid)
    return prefix


def index_before(
    source: RecordSource, start: int
) -> tuple[dict[str, tuple[int, list[str]]], dict[str, str], dict[str, list[int]]]:
    """The preemptions records ``0..start-1`` started (with the pods requested
    since) and the pod of each eviction they requested, as :func:`fold_before`
    keeps them, and the offsets of every ``PreemptionStarted`` by id, without
    folding. A record is decoded only when its bytes may name one of the two
    kinds (the name itself, or a ``\\u`` escape)."""
    starts: dict[str, tuple[int, list[str]]] = {}
    pods: dict[str, str] = {}
    offsets: dict[str, list[int]] = {}
    for record in source(0):
        if record.offset >= start:
            break
        payload = record.payload
        if isinstance(payload, bytes) and not (
            b"PreemptionStarted" in payload or b"EvictionRequested" in payload or b"\\u" in payload
        ):
            continue
        try:
            event = decode_event(payload)
        except EventError:
            continue
        if isinstance(event, PreemptionStarted):
            starts[event.preemption_id] = (record.offset, [])
            offsets.setdefault(event.preemption_id, []).append(record.offset)
        elif isinstance(event, EvictionRequested):
            pods[event.eviction_id] = event.pod_uid
            started = starts.get(event.preemption_id)
            if started is not None:
                started[1].append(event.pod_uid)
    return starts, pods, offsets


def started_at(lagging: LaggingFold, preemption_id: str, offsets: Iterable[int]) -> bool:
    """Did the projection accept one of the ``PreemptionStarted`` records at
    ``offsets`` (each starting ``preemption_id``)? An accepted one runs in the
    state through its own offset, from that offset."""
    for offset in offsets:
        run = lagging.at(offset).preemptions.get(preemption_id)
        if run is not None and run.started_offset == offset:
            return True
    return False


def settled_between(
    lagging: LaggingFold, evictions: set[str], first: int, last: int
) -> dict[str, int]:
    """The offset among ``first..last`` where each of ``evictions`` got its
    outcome, as the auditor notes it (:func:`settling`, then the outcome set),
    the lagging fold walking those records."""
    found: dict[str, int] = {}
    pending: tuple[str, int] | None = None

    def note() -> None:
        if pending is not None:
            run = lagging.projection.state.evictions.get(pending[0])
            if run is not None and run.outcome is not None:
                found[pending[0]] = pending[1]

    for record in lagging.walk(first, last):
        note()  # the record before this one is folded now
        pending = None
        try:
            event = decode_event(record.payload)
        except EventError:
            continue
        settles = settling(lagging.projection.state, event)
        if settles is not None and settles in evictions:
            pending = (settles, record.offset)
    note()
    return found
