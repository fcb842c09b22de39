"""The lagging fold of an audit: the state each decision names as its basis
(DESIGN §7 audit).

A decision is re-derived on the state of the facts through its ``basis``, an
offset before its own record; the main fold of the audit is already past it.
A second projection is advanced to each basis when a decision asks for it:
the latest records are buffered, older ones read again from the source, and a
basis older than the lagging fold refolds it from offset 0 (or from the
snapshot a segment started from).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from quotaledger.events.ledger import Record, RecordSource
from quotaledger.projections import Projection
from quotaledger.projections.snapshot import load
from quotaledger.projections.state import ProjectedState

#: Records the lagging fold keeps in memory; older ones are read again from the
#: source when a basis needs them.
BUFFER_LIMIT = 50_000


class LaggingFold:
    """A projection folded up to a basis, behind the main fold, lazily.

    ``projection`` is at some offset p; ``buffer`` holds the latest records the
    main fold has passed (at most :data:`BUFFER_LIMIT`; older ones are dropped,
    not folded). Nothing is folded until a decision asks for its basis: then
    the records p+1..basis are folded, from the buffer when it holds them and
    read again from the source otherwise (DECISIONS 121: a ledger of facts
    alone costs no second fold). A basis before p refolds from offset 0.
    """

    def __init__(
        self, source: RecordSource, fed: int = -1, seed: tuple[int, bytes] | None = None
    ) -> None:
        """``seed``: a segment started from a snapshot (offset, blob): a basis at or
        after its offset restarts from the snapshot instead of offset 0."""
        self.source = source
        self.projection = Projection()
        self.fed = fed
        #: the latest records fed, in order (the oldest dropped past the limit)
        self.buffer: deque[Record] = deque(maxlen=BUFFER_LIMIT)
        self.refolds = 0
        self.seed = seed

    def push(self, record: Record) -> None:
        """A record the main fold has just passed (kept, not folded)."""
        self.buffer.append(record)
        self.fed = record.offset

    def at(self, basis: int) -> ProjectedState:
        """The state folded through ``basis`` (which the main fold has passed)."""
        if basis < self.projection.state.offset:
            self.refolds += 1
            self.projection = Projection()
        if self.seed is not None and self.projection.state.offset < self.seed[0] <= basis:
            self.projection = Projection(load(self.seed[1]))
        offset = self.projection.state.offset
        buffer = self.buffer
        while buffer and buffer[0].offset <= offset:
            buffer.popleft()
        if offset < basis and (not buffer or buffer[0].offset != offset + 1):
            # the records between the fold and the buffer are read again
            # (never past what the main fold has passed, whatever the basis says)
            until = min(basis, buffer[0].offset - 1 if buffer else self.fed)
            apply_record = self.projection.apply_record
            for record in self.source(offset + 1):
                if record.offset > until:
                    break
                apply_record(record)
        while buffer and buffer[0].offset <= basis:
            self.projection.apply_record(buffer.popleft())
        return self.projection.state

    def walk(self, first: int, last: int) -> Iterator[Record]:
        """Fold from ``first`` through ``last`` (which the main fold has passed)
        one record at a time: each record is yielded before it is folded, so
        ``projection.state`` is then the state just before it."""
        self.at(first - 1)
        apply_record = self.projection.apply_record
        for record in self.source(first):
            if record.offset > min(last, self.fed):
                break
            yield record
            apply_record(record)
