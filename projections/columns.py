"""The quotas' numbers as columns (DESIGN §5, §9; DECISIONS 150-152).

Every number the projection derives per quota — request, limited request,
used, the KEP-79 subtree/local/usage, effective min and runtime — and the
Σ requests of its active pods (``pod_request``/``pod_used``) live here, one
column per resource and field; a quota owns one *row* of every column for as
long as it exists (a removed quota's row is zeroed and handed to the next new
quota). ``QuotaNode`` reads its numbers from its row and builds the sparse
per-quota dict only when asked (views, plans, clocks, the state JSON and the
hash), so the recomputes never build dicts.

A column is an ``array('q')`` (int64: a Python int per element read, a
zero-copy numpy view for the full recompute, :mod:`.recompute.arrays`) until a value
does not fit; storing one raises ``OverflowError`` and the whole resource
turns *wide*: every column of that resource becomes a Python ``list`` of ints
(exact whatever the size; DESIGN §9 bounds amounts at 2^62, their sums are
unbounded). The kind of a column never changes a number, only its storage.
"""

from __future__ import annotations

from array import array
from bisect import insort
from collections.abc import Iterable, Mapping, MutableSequence
from itertools import compress

#: The derived fields, then the pod sums.
DERIVED = (
    "request",
    "limited_request",
    "used",
    "subtree",
    "local",
    "usage",
    "effective_min",
    "runtime",
)
FIELDS = (*DERIVED, "pod_request", "pod_used")

Column = MutableSequence[int]  # array('q') or list[int]


def _zeros(count: int, wide: bool) -> Column:
    if wide:
        return [0] * count
    return array("q", bytes(8 * count))


class KeyColumns:
    """Every field's column of one resource (attributes named as the fields)."""

    __slots__ = (
        "effective_min",
        "key",
        "limited_request",
        "local",
        "pod_request",
        "pod_used",
        "request",
        "runtime",
        "subtree",
        "usage",
        "used",
        "wide",
    )

    def __init__(self, key: str, count: int, wide: bool) -> None:
        self.key = key
        self.wide = wide
        for name in FIELDS:
            setattr(self, name, _zeros(count, wide))

    request: Column
    limited_request: Column
    used: Column
    subtree: Column
    local: Column
    usage: Column
    effective_min: Column
    runtime: Column
    pod_request: Column
    pod_used: Column


class QuotaColumns:
    """The columns of one state, and which row each quota owns."""

    def __init__(self) -> None:
        self.capacity = 0
        self.next_row = 0
        self.free: list[int] = []
        self.live = 0
        #: resource -> its columns; ``keys`` sorted, ``by_key`` in that order
        self.columns: dict[str, KeyColumns] = {}
        self.keys: list[str] = []
        self.by_key: list[KeyColumns] = []
        #: the quotas dict every quota of which was last seen holding a row here
        self.verified: object = None

    # ---------------------------------------------------------------- rows

    def take_row(self) -> int:
        """A zeroed row for a new quota."""
        if self.free:
            row = self.free.pop()
        else:
            row = self.next_row
            self.next_row += 1
            if row >= self.capacity:
                self._grow(max(64, 2 * self.capacity))
        self.live += 1
        return row

    def release_row(self, row: int) -> None:
        """A removed quota's row: zeroed, then free for the next new quota."""
        for columns in self.by_key:
            for name in FIELDS:
                getattr(columns, name)[row] = 0
        self.free.append(row)
        self.live -= 1

    def _grow(self, capacity: int) -> None:
        more = capacity - self.capacity
        for columns in self.by_key:
            for name in FIELDS:
                column = getattr(columns, name)
                if columns.wide:
                    column.extend([0] * more)
                else:
                    column.frombytes(bytes(8 * more))
        self.capacity = capacity

    # ---------------------------------------------------------------- keys

    def key(self, key: str) -> KeyColumns:
        """The columns of a resource, created (all zero) when first named."""
        columns = self.columns.get(key)
        if columns is None:
            columns = self.columns[key] = KeyColumns(key, self.capacity, wide=False)
            insort(self.keys, key)
            self.by_key.insert(self.keys.index(key), columns)
        return columns

    def add_keys(self, keys: Iterable[str]) -> None:
        for key in keys:
            if key not in self.columns:
                self.key(key)

    def widen(self, columns: KeyColumns) -> None:
        """Turn a resource's columns into Python-int lists (a value left int64)."""
        if not columns.wide:
            for name in FIELDS:
                setattr(columns, name, list(getattr(columns, name)))
            columns.wide = True

    # ------------------------------------------------------- one row, as a dict

    def read(self, name: str, row: int) -> dict[str, int]:
        """One quota's ``name`` as a sparse dict (keys in sorted order, zeros left out)."""
        out: dict[str, int] = {}
        for columns in self.by_key:
            value = getattr(columns, name)[row]
            if value:
                out[columns.key] = value
        return out

    def read_rows(self, name: str) -> list[dict[str, int]]:
        """Every row's ``name`` at once, indexed by row: the dicts :meth:`read`
        would build one by one (keys in sorted order, zeros left out), for
        readers of every quota (the state JSON and hash, DESIGN §7). Zero
        cells are skipped in C (``itertools.compress``)."""
        rows: list[dict[str, int]] = [{} for _ in range(self.capacity)]
        for columns in self.by_key:
            column = getattr(columns, name)
            key = columns.key
            for row in compress(range(len(column)), column):
                rows[row][key] = column[row]
        return rows

    def write(self, name: str, row: int, amounts: Mapping[str, int]) -> None:
        """Set one quota's ``name`` to ``amounts`` (absent keys: 0)."""
        self.add_keys(amounts)
        for columns in self.by_key:
            self.put(columns, name, row, amounts.get(columns.key, 0))

    def put(self, columns: KeyColumns, name: str, row: int, value: int) -> None:
        """``columns.<name>[row] = value``, widening the resource when needed."""
        try:
            getattr(columns, name)[row] = value
        except OverflowError:
            self.widen(columns)
            getattr(columns, name)[row] = value

    def add(self, name: str, row: int, amounts: Mapping[str, int], sign: int) -> None:
        """``name[row] += sign · amounts`` per resource."""
        known = self.columns.get
        for key, value in amounts.items():
            if value:
                columns = known(key) or self.key(key)
                column = getattr(columns, name)
                try:
                    column[row] += sign * value
                except OverflowError:
                    self.widen(columns)
                    getattr(columns, name)[row] += sign * value

    def clear(self, names: Iterable[str], row: int) -> None:
        for columns in self.by_key:
            for name in names:
                getattr(columns, name)[row] = 0
