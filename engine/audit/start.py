"""Where an auditor starts (DESIGN §9: every record re-derived from offset 0 by
some process).

A single audit starts at offset 0 with an empty state. A segment of a parallel
audit (:mod:`.parallel`) starts after offset ``start - 1`` with what the records
before it give: their fold (:func:`fold_before`), or a snapshot's state taken
as a hypothesis the previous segment verifies, and which preemptions those
records started and which pod each eviction named (:func:`index_before`,
scanned only when a decision first refers to one).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from quotaledger.events.codec import EventError, decode_event
from quotaledger.events.ledger import RecordSource
from quotaledger.events.model import Event, EvictionRequested, PreemptionStarted
from quotaledger.projections import Projection


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


def fold_before(source: RecordSource, start: int) -> SegmentStart:
    """Fold records ``0..start-1`` as the auditor (:mod:`.decisions`) would, keeping
    its index: the start of a segment that trusts no snapshot."""
    prefix = SegmentStart(Projection())
    main = prefix.projection
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
        main.apply(record.offset, record.ts, event)
        if isinstance(event, PreemptionStarted):
            prefix.starts[event.preemption_id] = (record.offset, [])
        elif isinstance(event, EvictionRequested):
            prefix.eviction_pods[event.eviction_id] = event.pod_uid
            started = prefix.starts.get(event.preemption_id)
            if started is not None:
                started[1].append(event.pod_uid)
    return prefix


def index_before(
    source: RecordSource, start: int
) -> tuple[dict[str, tuple[int, list[str]]], dict[str, str]]:
    """The preemptions records ``0..start-1`` started (with the pods requested
    since) and the pod of each eviction they requested, as :func:`fold_before`
    keeps them, without folding. A record is decoded only when its bytes may
    name one of the two kinds (the name itself, or a ``\\u`` escape)."""
    starts: dict[str, tuple[int, list[str]]] = {}
    pods: dict[str, str] = {}
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
        elif isinstance(event, EvictionRequested):
            pods[event.eviction_id] = event.pod_uid
            started = starts.get(event.preemption_id)
            if started is not None:
                started[1].append(event.pod_uid)
    return starts, pods
