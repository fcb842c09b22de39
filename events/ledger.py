"""The ledger: one totally ordered, append-only sequence of records (DESIGN §3).

Every backend (SQLite, Kafka) implements :class:`Ledger`. Invariants a backend
keeps:

* offsets are 0, 1, 2, ... without gaps;
* ``ts`` (ms since the epoch) never decreases: a smaller one is clamped up to
  the previous record's;
* record 0 is ``LedgerOpened{ledger_id}``, and a reader holding a checkpoint of
  another ledger id stops with :class:`LedgerMismatch`;
* a reader never reads past missing offsets as if the ledger were whole: it (or
  the digest chain every reader folds) stops with :class:`LedgerGap`.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from typing import Protocol

import msgspec


class Record(msgspec.Struct, frozen=True, gc=False, array_like=True):
    """One ledger entry: position, time, and the event's JSON payload."""

    offset: int
    ts: int
    payload: bytes


#: A ledger's records from an offset on: ``source(n)`` yields records n, n + 1, ...
#: in order, to the end, as often as it is called (an audit reads some ranges twice).
RecordSource = Callable[[int], Iterable[Record]]


class Append(msgspec.Struct, frozen=True, gc=False, array_like=True):
    """One entry to append; ``ts`` None means "now" by the backend's clock."""

    payload: bytes
    ts: int | None = None


class LedgerError(RuntimeError):
    """The ledger cannot be used as asked."""


class LedgerMismatch(LedgerError):
    """A checkpoint or snapshot belongs to another ledger's history."""


class LedgerGap(LedgerError):
    """The records skip offsets (DESIGN §3: offsets are gap-free): records are
    missing, deleted (retention, compaction), damaged, or the offsets hold
    transaction markers. Raised by the digest chain when a record does not
    follow the previous one, and by a Kafka reader at a proven hole, after it
    has handed out every record before it. One class, whoever finds the gap.

    ``missing`` is the first offset missing and ``found`` the next offset that
    holds a record, when the finder knows them (None otherwise).
    """

    def __init__(
        self, message: str, *, missing: int | None = None, found: int | None = None
    ) -> None:
        super().__init__(message)
        self.missing = missing
        self.found = found


class Snapshot(msgspec.Struct, frozen=True, gc=False):
    """Projected state folded through ``offset`` (inclusive), opaque bytes.

    A snapshot is a cache, never evidence (DESIGN §9): ``digest`` (hex of the
    chain digest ``d(offset)``) and ``state_hash`` (the state hash at
    ``offset``) let a reader verify it before use; ``checksum`` (hex SHA-256 of
    ``blob``) catches damage to what the state hash does not cover (the
    rejection list, the time). A snapshot without digest and state hash
    (written by an older version) cannot be verified and is not used.
    """

    offset: int
    blob: bytes
    digest: str | None = None
    state_hash: str | None = None
    checksum: str | None = None

    @staticmethod
    def checksum_of(blob: bytes) -> str:
        return hashlib.sha256(blob).hexdigest()


class Ledger(Protocol):
    """What the engine needs of any ledger backend."""

    @property
    def ledger_id(self) -> str: ...

    async def append(self, batch: Sequence[Append]) -> list[int]:
        """Append atomically (group commit); return the assigned offsets."""
        ...

    def read(self, from_offset: int = 0, *, follow: bool = False) -> AsyncIterator[list[Record]]:
        """Yield records from ``from_offset`` in batches; with ``follow``,
        wait for new records at the tail instead of stopping."""
        ...

    async def last_offset(self) -> int:
        """Offset of the newest record (-1 for none)."""
        ...

    async def save_snapshot(self, snapshot: Snapshot) -> None: ...

    async def load_snapshot(self, at_most: int | None = None) -> Snapshot | None:
        """The newest snapshot whose offset is ``<= at_most`` (any if None)."""
        ...

    async def close(self) -> None: ...
