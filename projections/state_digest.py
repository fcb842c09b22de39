"""The state hash, kept incrementally (DESIGN §5 "State hash", §9; DECISIONS 230-235).

The hash is SHA-256 over one canonical encoding of

* the **remainder**: every hashed persisted field (:data:`.persisted.FIELDS`)
  but the four large maps, in canonical form (every dict and set sorted by
  us), and the cluster's derived sums (allocatable, total, root's subtree and
  usage);
* the **root digest of each large map** (:class:`MapDigest`): ``pods`` (each
  pod with the quota it belongs to, §8 rule 7), ``quotas`` (each quota's
  configuration and whether it is an orphan), ``nodes`` and
  ``namespace_weights``;
* the **root digest of the quotas' numbers** (:class:`NumberDigest`): every
  number of every quota's row of the columns (the derived request, limited
  request, used, KEP-79 sums, effective min and runtime, and the pod sums),
  in chunks of :data:`CHUNK` quotas in name order.

What the state JSON shows besides (available, namespaces' usage and fair
shares, pod and child lists) is computed from exactly these by the view's
pure functions when read, so the hash covers the whole projected state
without reading the views (DECISIONS 231).

A map's root digest: each entry has a digest (SHA-256 of its canonical
encoding, key included); entries fall into :data:`BUCKETS` buckets by the
CRC-32 of the key; a bucket's digest is SHA-256 over its entries' digests in
key order; the root is SHA-256 over the bucket number and digest of every
non-empty bucket, in bucket order. So a changed entry costs its own digest,
its bucket's and the root's, whatever the map's size (DECISIONS 230).

:func:`state_hash` keeps these digests in the state (``ProjectedState.hash_memo``)
and brings them up to date when asked: the entries the fold marked changed
(``hash_pods``, ``hash_quotas``, ``hash_nodes``, ``hash_weights``: one set
insertion per changed entry) and the chunks of quotas whose numbers differ
from a copy of the columns taken at the last hash (a comparison at memory
speed, DECISIONS 233). :func:`full_state_hash` computes the same value from
nothing; the two are equal on every state (the property tests).

Deterministic across machines, time zones, locales and ``PYTHONHASHSEED``:
only SHA-256, CRC-32, msgspec JSON, little-endian int64 and Python's
code-point string order are involved. Every dict with more than
:data:`~.persisted.SMALL_DICT` keys reaches the encoder already sorted;
msgspec sorts only smaller ones (DECISIONS 232).
"""

from __future__ import annotations

import struct
import threading
from array import array
from bisect import bisect_left
from collections.abc import Iterable, Mapping
from hashlib import sha256
from typing import Any
from zlib import crc32

import msgspec

from quotaledger.events.model import PodUpserted

from .columns import FIELDS as NUMBER_FIELDS
from .columns import QuotaColumns
from .persisted import FIELDS, presorted_rl
from .settle import settle
from .state import BUILTIN, ProjectedState, QuotaNode

#: Buckets of a map's digest (a power of two: the bucket is CRC-32 & (BUCKETS - 1)).
BUCKETS = 4096
_MASK = BUCKETS - 1
_PREFIX = [bucket.to_bytes(2, "big") for bucket in range(BUCKETS)]
#: Quotas per chunk of the numbers' digest (consecutive in name order).
CHUNK = 64
#: A state with at least this many quota rows is compared and read on numpy.
NUMPY_ROWS = 1024
#: Hashed first: another hash function gets another tag.
VERSION = b"quotaledger state hash 2\n"
#: The four large maps, each hashed as a :class:`MapDigest`.
MAPS = ("nodes", "quotas", "pods", "namespace_weights")

_ENCODE = msgspec.json.Encoder(order="deterministic").encode


# ----------------------------------------------------------------- a large map


def bucket_of(key: str) -> int:
    """The bucket of a key: the low bits of the CRC-32 of its UTF-8 bytes."""
    return crc32(key.encode()) & _MASK


class MapDigest:
    """The root digest of a keyed map, updated entry by entry (module docstring).

    ``keys[b]``/``digests[b]``: bucket ``b``'s keys in order and their entries'
    digests (None while empty); ``parts[b]``: its bucket number and digest as
    the root hashes them (empty bytes while empty); ``dirty``: buckets changed
    since the last :meth:`root`."""

    __slots__ = ("digests", "dirty", "keys", "parts", "size")

    def __init__(self) -> None:
        self.keys: list[list[str] | None] = [None] * BUCKETS
        self.digests: list[list[bytes] | None] = [None] * BUCKETS
        self.parts: list[bytes] = [b""] * BUCKETS
        self.dirty: set[int] = set()
        self.size = 0

    @classmethod
    def of(cls, entries: Iterable[tuple[str, bytes]]) -> MapDigest:
        """A map digest holding ``entries`` (key, entry digest), keys distinct."""
        out = cls()
        buckets: dict[int, list[tuple[str, bytes]]] = {}
        for key, digest in entries:
            buckets.setdefault(crc32(key.encode()) & _MASK, []).append((key, digest))
        for bucket, items in buckets.items():
            items.sort()
            out.keys[bucket] = [key for key, _ in items]
            out.digests[bucket] = [digest for _, digest in items]
            out.size += len(items)
            out.dirty.add(bucket)
        return out

    def put(self, key: str, digest: bytes) -> None:
        """Set ``key``'s entry digest (added or replaced)."""
        bucket = crc32(key.encode()) & _MASK
        keys = self.keys[bucket]
        digests = self.digests[bucket]
        if keys is None or digests is None:
            self.keys[bucket] = [key]
            self.digests[bucket] = [digest]
            self.size += 1
        else:
            at = bisect_left(keys, key)
            if at < len(keys) and keys[at] == key:
                if digests[at] == digest:
                    return
                digests[at] = digest
            else:
                keys.insert(at, key)
                digests.insert(at, digest)
                self.size += 1
        self.dirty.add(bucket)

    def remove(self, key: str) -> None:
        """Drop ``key``'s entry, if it has one."""
        bucket = crc32(key.encode()) & _MASK
        keys = self.keys[bucket]
        digests = self.digests[bucket]
        if keys is None or digests is None:
            return
        at = bisect_left(keys, key)
        if at < len(keys) and keys[at] == key:
            del keys[at], digests[at]
            self.size -= 1
            self.dirty.add(bucket)

    def root(self) -> bytes:
        """SHA-256 over every non-empty bucket's number and digest, in bucket order."""
        parts = self.parts
        for bucket in self.dirty:
            digests = self.digests[bucket]
            if digests:
                parts[bucket] = _PREFIX[bucket] + sha256(b"".join(digests)).digest()
            else:
                parts[bucket] = b""
                self.keys[bucket] = self.digests[bucket] = None
        self.dirty.clear()
        return sha256(b"".join(parts)).digest()


# ----------------------------------------------------------------- entries


def pod_digest(pod: PodUpserted, quota: str | None) -> bytes:
    """A pod's entry: the pod as the fold keeps it (msgspec JSON) and the quota
    it belongs to (none while it is not active). Its labels and requests have
    more than ``SMALL_DICT`` keys only sorted (``pods.compact``)."""
    encoded = _ENCODE(pod)
    if quota is not None:
        encoded += b"\0" + quota.encode()
    return sha256(encoded).digest()


def node_digest(name: str, allocatable: Mapping[str, int]) -> bytes:
    if isinstance(allocatable, dict):
        allocatable = presorted_rl(allocatable)
    return sha256(_ENCODE((name, allocatable))).digest()


def weight_digest(namespace: str, weight: int) -> bytes:
    return sha256(_ENCODE((namespace, weight))).digest()


def quota_digest(name: str, node: QuotaNode) -> bytes:
    """A quota's entry: its configuration and whether it is an orphan (its
    numbers are the :class:`NumberDigest`'s)."""
    return sha256(_ENCODE((name, node.config, not node.connected))).digest()


# ----------------------------------------------------------------- the numbers

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
        self.dirty = set(range(count))

    def mark_rows(self, rows: Iterable[int]) -> None:
        chunk_of_row = self.chunk_of_row
        self.dirty.update(chunk_of_row[row] for row in rows if row in chunk_of_row)

    # ------------------------------------------------------------ the copy

    def take_shadow(self, columns: QuotaColumns) -> None:
        """Copy every number column (compared at the next hash)."""
        self.columns = columns
        self.shadow = {
            kc.key: [_copy(getattr(kc, name)) for name in NUMBER_FIELDS] for kc in columns.by_key
        }

    def changed_rows(self, columns: QuotaColumns) -> set[int]:
        """Rows whose numbers differ from the copy (which is then brought up to date)."""
        changed: set[int] = set()
        fast = columns.capacity >= NUMPY_ROWS
        for kc in columns.by_key:
            copies = self.shadow.get(kc.key)
            if copies is None:
                copies = self.shadow[kc.key] = [array("q") for _ in NUMBER_FIELDS]
            for index, name in enumerate(NUMBER_FIELDS):
                column = getattr(kc, name)
                old = copies[index]
                if type(old) is type(column) and old == column:
                    continue
                changed.update(_differing(column, old) if fast else _differing_slow(column, old))
                copies[index] = _copy(column)
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
            for chunk, parts in zip(dirty, blocks, strict=True):
                names = _ENCODE(self.names[chunk * CHUNK : (chunk + 1) * CHUNK])
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


# ----------------------------------------------------------------- the remainder


def _canonical(value: Any) -> Any:
    """``value`` with every dict sorted by key (by us), every set as a sorted
    list and every Struct as a dict of its fields in declaration order."""
    if isinstance(value, dict):
        out = {}
        for key in sorted(value):
            item = value[key]
            out[key] = item if isinstance(item, str | int | float | None) else _canonical(item)
        return out
    if isinstance(value, set | frozenset):
        return sorted(value)
    if isinstance(value, list | tuple):
        return [_canonical(item) for item in value]
    if isinstance(value, msgspec.Struct):
        return {field: _canonical(getattr(value, field)) for field in value.__struct_fields__}
    return value


def remainder(state: ProjectedState) -> bytes:
    """The canonical encoding of every hashed field but the maps, and of the
    cluster's derived sums (call after ``settle``)."""
    fields = {
        item.name: _canonical(item.hash_form(getattr(state, item.name)))
        for item in FIELDS
        if item.hashed and item.name not in MAPS
    }
    derived = {
        "allocatable": _canonical(state.allocatable),
        "total": _canonical(state.cluster_total),
        "root_subtree": _canonical(state.root_subtree),
        "root_usage": _canonical(state.root_usage),
    }
    return _ENCODE((fields, derived))


# ----------------------------------------------------------------- the memo


class StateDigest:
    """The digests :func:`state_hash` keeps for one state (module docstring).

    ``held``: the four map objects it was built from (a state given other
    ones, by a restore or a test, is hashed afresh)."""

    def __init__(self) -> None:
        self.maps: dict[str, MapDigest] = {}
        self.numbers = NumberDigest()
        self.held: tuple[object, ...] = ()
        self.lock = threading.Lock()

    def __deepcopy__(self, memo: dict[int, Any]) -> None:
        """A copy of a state keeps no digests: it is hashed from nothing."""
        return None

    def follows(self, state: ProjectedState) -> bool:
        """Kept for ``state``'s own maps and columns."""
        held = self.held
        return (
            len(held) == 4
            and held[0] is state.pods
            and held[1] is state.quotas
            and held[2] is state.nodes
            and held[3] is state.namespace_weights
            and self.numbers.columns is state.columns
        )

    def complete(self, state: ProjectedState) -> bool:
        """Every map holds as many entries as the state's (a cheap guard
        against an entry added or removed without its mark)."""
        maps = self.maps
        return (
            maps["pods"].size == len(state.pods)
            and maps["quotas"].size == len(state.quotas)
            and maps["nodes"].size == len(state.nodes)
            and maps["namespace_weights"].size == len(state.namespace_weights)
        )

    def digest(self, state: ProjectedState) -> str:
        """The state hash from the kept digests (all up to date)."""
        out = sha256(VERSION)
        out.update(remainder(state))
        for name in MAPS:
            out.update(name.encode() + b"\0" + self.maps[name].root())
        out.update(b"numbers\0" + self.numbers.root(state))
        return out.hexdigest()


def build(state: ProjectedState) -> StateDigest:
    """Every digest of ``state`` computed from nothing (call after ``settle``)."""
    memo = StateDigest()
    memo.held = (state.pods, state.quotas, state.nodes, state.namespace_weights)
    pod_quota = state.pod_quota.get
    memo.maps = {
        "pods": MapDigest.of(
            (uid, pod_digest(pod, pod_quota(uid))) for uid, pod in state.pods.items()
        ),
        "quotas": MapDigest.of(
            (name, quota_digest(name, node)) for name, node in state.quotas.items()
        ),
        "nodes": MapDigest.of(
            (name, node_digest(name, allocatable)) for name, allocatable in state.nodes.items()
        ),
        "namespace_weights": MapDigest.of(
            (ns, weight_digest(ns, weight)) for ns, weight in state.namespace_weights.items()
        ),
    }
    memo.numbers.refresh_order(state)
    memo.numbers.take_shadow(state.columns)
    return memo


def update(state: ProjectedState, memo: StateDigest) -> None:
    """Bring ``memo`` up to ``state``: the marked entries and the changed rows."""
    maps = memo.maps
    entries = maps["pods"]
    pods, pod_quota = state.pods.get, state.pod_quota.get
    keys_of, digests_of, dirty = entries.keys, entries.digests, entries.dirty
    encode = _ENCODE
    for uid in state.hash_pods:  # MapDigest.put and pod_digest, inlined (the hot loop)
        pod = pods(uid)
        if pod is None:
            entries.remove(uid)
            continue
        encoded = encode(pod)
        quota = pod_quota(uid)
        if quota is not None:
            encoded += b"\0" + quota.encode()
        digest = sha256(encoded).digest()
        bucket = crc32(uid.encode()) & _MASK
        keys = keys_of[bucket]
        digests = digests_of[bucket]
        if keys is not None and digests is not None:
            at = bisect_left(keys, uid)
            if at < len(keys) and keys[at] == uid:
                if digests[at] != digest:
                    digests[at] = digest
                    dirty.add(bucket)
                continue
        entries.put(uid, digest)
    entries = maps["nodes"]
    for name in state.hash_nodes:
        allocatable = state.nodes.get(name)
        if allocatable is None:
            entries.remove(name)
        else:
            entries.put(name, node_digest(name, allocatable))
    entries = maps["namespace_weights"]
    for ns in state.hash_weights:
        weight = state.namespace_weights.get(ns)
        if weight is None:
            entries.remove(ns)
        else:
            entries.put(ns, weight_digest(ns, weight))
    entries = maps["quotas"]
    for name in state.hash_quotas:
        node = state.quotas.get(name)
        if node is None:
            entries.remove(name)
        else:
            entries.put(name, quota_digest(name, node))
    numbers = memo.numbers
    changed = numbers.changed_rows(state.columns)
    numbers.refresh_order(state)
    numbers.mark_rows(changed)


def _clear_marks(state: ProjectedState) -> None:
    state.hash_pods.clear()
    state.hash_quotas.clear()
    state.hash_nodes.clear()
    state.hash_weights.clear()


def state_hash(state: ProjectedState) -> str:
    """The state hash (module docstring), from the digests kept in ``state``:
    the cost follows what changed since the last call, not the state's size.
    Settles the state first. The memo's lock keeps two hashes of one state
    from interleaving; the state must not change meanwhile (the fold paused)."""
    settle(state)
    memo = state.hash_memo
    if not isinstance(memo, StateDigest):
        memo = StateDigest()
    with memo.lock:
        if state.hash_memo is memo and memo.follows(state):
            update(state, memo)
        else:
            memo = build(state)
        _clear_marks(state)
        if not memo.complete(state):  # an entry changed without its mark: start again
            memo = build(state)
        state.hash_memo = memo
        return memo.digest(state)


def full_state_hash(state: ProjectedState) -> str:
    """The state hash computed from nothing (the state's memo left alone)."""
    settle(state)
    return build(state).digest(state)


def forget(state: ProjectedState) -> None:
    """Drop the kept digests (the next :func:`state_hash` computes them afresh)."""
    state.hash_memo = None
    _clear_marks(state)
