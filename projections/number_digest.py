"""The digest of the quotas' numbers in the state hash (DESIGN §5 "State hash", DECISIONS 233).

Every number of every quota's row of the columns (the derived request,
limited request, used, KEP-79 sums, effective min and runtime, and the pod
sums) is hashed in chunks of :data:`CHUNK` quotas in name order; a chunk is
recomputed only when one of its rows changed. Which rows changed is found by
comparing the number columns with a copy taken at the last hash (numpy for
states of :data:`NUMPY_ROWS` quota rows or more, the same rows in Python
below, so small states never import numpy). :mod:`.state_digest` combines
this root with the maps' and the remainder's.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Iterable
from hashlib import sha256
from typing import Any

import msgspec

from .columns import FIELDS as NUMBER_FIELDS
from .columns import QuotaColumns
from .state import BUILTIN, ProjectedState, QuotaNode

#: Quotas per chunk of the numbers' digest (consecutive in name order).
CHUNK = 64
#: A state with at least this many quota rows is compared and read on numpy.
NUMPY_ROWS = 1024

#: The state hash's canonical encoding (msgspec JSON, keys in order).
_ENCODE = msgspec.json.Encoder(order="deterministic").encode


#: The KEP-79 sums (only available reads them: of connected, non-builtin
#: quotas; of others they are hashed as 0), by their place in ``NUMBER_FIELDS``.
_KEP_AT = tuple(
    index for index, name in enumerate(NUMBER_FIELDS) if name in ("subtree", "local", "usage")
)
_INT64 = range(-(2**63), 2**63)


def _shows_kep(name: str, node: QuotaNode) -> bool:
    return node.connected and name not in BUILTIN


def _key_block(key: bytes, matrix: list[list[int]]) -> bytes:
    """One resource's numbers of a chunk (a row of ten per quota): its key
    (JSON), then ``=`` and the numbers as little-endian int64 when all fit,
    else ``~`` and their JSON."""
    flat = [value for values in matrix for value in values]
    if all(value in _INT64 for value in flat):
        return key + b"=" + struct.pack(f"<{len(flat)}q", *flat)
    return key + b"~" + _ENCODE(matrix)


class NumberDigest:
    """The quotas' numbers, in chunks of :data:`CHUNK` quotas in name order.

    A chunk's digest is SHA-256 of its quotas' names (JSON) and, for each
    resource (in key order) with a non-zero number among them, the
    :func:`_key_block` of their rows; the root is SHA-256 of the quota count
    and every chunk's digest in order. The order (names, their rows, which
    show the KEP-79 sums) is rebuilt when the tree's shape changes; a chunk is
    recomputed when one of its rows changed (``mark_rows``) or the order did."""

    def __init__(self) -> None:
        self.stamp: tuple[int, ...] = ()
        self.names: list[str] = []
        self.rows: list[int] = []  # in name order; -1: a quota without a row
        self.shows: list[bool] = []
        self.chunk_of_row: dict[int, int] = {}
        self.digests: list[bytes] = []
        self.encoded_names: list[bytes | None] = []  # per chunk, its names' JSON once known
        self.dirty: set[int] = set()
        self.columns: QuotaColumns | None = None
        self.shadow: dict[str, list[Any]] = {}

    # ------------------------------------------------------------ the order

    def refresh_order(self, state: ProjectedState) -> None:
        """Re-read the names in order when the tree's shape (or storage) changed."""
        columns = state.columns
        stamp = (
            state.tree_version,
            id(state.quotas),
            len(state.quotas),
            id(columns),
            columns.live,
            columns.next_row,
        )
        if stamp == self.stamp:
            return
        self.stamp = stamp
        quotas = state.quotas
        self.names = sorted(quotas)
        nodes = [quotas[name] for name in self.names]
        self.rows = [node.row if node.store is columns else -1 for node in nodes]
        self.shows = [_shows_kep(name, node) for name, node in zip(self.names, nodes, strict=True)]
        self.chunk_of_row = {row: at // CHUNK for at, row in enumerate(self.rows) if row >= 0}
        count = -(-len(self.names) // CHUNK)
        self.digests = [b""] * count
        self.encoded_names = [None] * count
        self.dirty = set(range(count))

    def mark_rows(self, rows: Iterable[int]) -> None:
        found: set[int | None] = set(map(self.chunk_of_row.get, rows))
        self.dirty.update(chunk for chunk in found if chunk is not None)

    # ------------------------------------------------------------ the copy

    def take_shadow(self, columns: QuotaColumns) -> None:
        """Copy every number column (compared at the next hash)."""
        self.columns = columns
        self.shadow = {
            kc.key: [_copy(getattr(kc, name)) for name in NUMBER_FIELDS] for kc in columns.by_key
        }

    def changed_rows(self, columns: QuotaColumns) -> set[int]:
        """Rows whose numbers differ from the copy (which is then brought up to date).

        On numpy, int64 columns as long as their copies are compared into
        one mask and copied over their copies in place; any other column
        (wide, or grown since) row by row."""
        changed: set[int] = set()
        fast = columns.capacity >= NUMPY_ROWS
        np = _numpy() if fast else None
        mask = None
        for kc in columns.by_key:
            copies = self.shadow.get(kc.key)
            if copies is None:
                copies = self.shadow[kc.key] = [array("q") for _ in NUMBER_FIELDS]
            for index, name in enumerate(NUMBER_FIELDS):
                column = getattr(kc, name)
                old = copies[index]
                if type(old) is type(column) and old == column:
                    continue
                if (
                    np is not None
                    and type(column) is type(old) is array
                    and len(old) == len(column)
                ):
                    if mask is None:
                        mask = np.zeros(len(column), dtype=bool)
                    if len(mask) == len(column):
                        mask |= np.frombuffer(column, dtype=np.int64) != np.frombuffer(
                            old, dtype=np.int64
                        )
                        old[:] = column
                        continue
                changed.update(_differing(column, old) if fast else _differing_slow(column, old))
                copies[index] = _copy(column)
        if np is not None and mask is not None:
            changed.update(np.flatnonzero(mask).tolist())
        return changed

    # ------------------------------------------------------------ the digest

    def root(self, state: ProjectedState) -> bytes:
        """Recompute the dirty chunks; the root over every chunk."""
        if self.dirty:
            dirty = sorted(self.dirty)
            columns = state.columns
            keys = [
                (_ENCODE(kc.key), [getattr(kc, name) for name in NUMBER_FIELDS])
                for kc in columns.by_key
            ]
            narrow = all(isinstance(column, array) for _, cols in keys for column in cols)
            if narrow and columns.capacity >= NUMPY_ROWS:
                blocks = self._numpy_blocks(dirty, keys)
            else:
                blocks = [self._python_blocks(chunk, keys) for chunk in dirty]
            encoded_names = self.encoded_names
            for chunk, parts in zip(dirty, blocks, strict=True):
                names = encoded_names[chunk]
                if names is None:
                    names = encoded_names[chunk] = _ENCODE(
                        self.names[chunk * CHUNK : (chunk + 1) * CHUNK]
                    )
                self.digests[chunk] = sha256(names + b"".join(parts)).digest()
            self.dirty.clear()
        return sha256(len(self.names).to_bytes(8, "big") + b"".join(self.digests)).digest()

    def _python_blocks(self, chunk: int, keys: list[tuple[bytes, list[Any]]]) -> list[bytes]:
        span = range(chunk * CHUNK, min((chunk + 1) * CHUNK, len(self.names)))
        parts = []
        for key, columns in keys:
            matrix = []
            for at in span:
                row = self.rows[at]
                values = [column[row] for column in columns] if row >= 0 else [0] * len(columns)
                if not self.shows[at]:
                    for index in _KEP_AT:
                        values[index] = 0
                matrix.append(values)
            if any(any(values) for values in matrix):
                parts.append(_key_block(key, matrix))
        return parts

    def _numpy_blocks(
        self, dirty: list[int], keys: list[tuple[bytes, list[Any]]]
    ) -> list[list[bytes]]:
        """:meth:`_python_blocks` of many chunks of int64 columns: each resource's
        ten columns gathered at the dirty chunks' rows into one matrix."""
        import numpy as np

        count = len(self.names)
        spans = [(chunk * CHUNK, min((chunk + 1) * CHUNK, count)) for chunk in dirty]
        at = np.concatenate([np.arange(start, end) for start, end in spans])
        rows = np.asarray(self.rows, dtype=np.intp)[at]
        missing = rows < 0
        rows[missing] = 0
        hidden = ~np.asarray(self.shows, dtype=bool)[at]
        hidden_kep = np.ix_(hidden, list(_KEP_AT))
        bounds = np.cumsum([0] + [end - start for start, end in spans]).tolist()
        out: list[list[bytes]] = [[] for _ in dirty]
        for key, columns in keys:
            matrix = np.stack(
                [np.frombuffer(column, dtype=np.int64)[rows] for column in columns], axis=1
            )
            matrix[missing] = 0
            matrix[hidden_kep] = 0
            nonzero = np.add.reduceat(matrix.any(axis=1), bounds[:-1]).tolist() if len(at) else []
            data = matrix.astype("<i8").tobytes()
            head = key + b"="
            width = 8 * len(columns)
            for index, present in enumerate(nonzero):
                if present:
                    out[index].append(
                        head + data[bounds[index] * width : bounds[index + 1] * width]
                    )
        return out


def _numpy() -> Any:
    import numpy

    return numpy


def _copy(column: Any) -> Any:
    return array("q", column) if isinstance(column, array) else list(column)


def _differing_slow(column: Any, old: Any) -> list[int]:
    """Rows where ``column`` differs from ``old`` (a missing row counts as 0)."""
    size = len(old)
    out = [row for row, value in enumerate(column) if value != (old[row] if row < size else 0)]
    return out + [row for row in range(len(column), size) if old[row]]


def _differing(column: Any, old: Any) -> list[int]:
    """:func:`_differing_slow` on numpy (int64 columns; lists the slow way)."""
    if not (isinstance(column, array) and isinstance(old, array)):
        return _differing_slow(column, old)
    import numpy as np

    new = np.frombuffer(column, dtype=np.int64) if len(column) else np.zeros(0, np.int64)
    before = np.zeros(len(new), dtype=np.int64)
    if len(old):
        kept = np.frombuffer(old, dtype=np.int64)[: len(new)]
        before[: len(kept)] = kept
    rows: list[int] = np.flatnonzero(new != before).tolist()
    if len(old) > len(column):
        rest = np.frombuffer(old, dtype=np.int64)[len(column) :]
        rows += (np.flatnonzero(rest) + len(column)).tolist()
    return rows
