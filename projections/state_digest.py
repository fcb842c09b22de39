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
* the **root digest of the quotas' numbers**
  (:class:`.number_digest.NumberDigest`): every
  number of every quota's row of the columns (the derived request, limited
  request, used, KEP-79 sums, effective min and runtime, and the pod sums),
  in chunks of :data:`.number_digest.CHUNK` quotas in name order.

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
(``hash_pods``, ``hash_quotas``, ``hash_nodes``, ``hash_weights``: one
insertion per changed entry; ``hash_pods`` maps the uid to the pod, DECISIONS
401) and the chunks of quotas whose numbers differ from a copy of the columns
taken at the last hash (a comparison at memory speed, DECISIONS 233).
:func:`full_state_hash` computes the same value from nothing; the two are equal
on every state (the property tests).

Deterministic across machines, time zones, locales and ``PYTHONHASHSEED``:
only SHA-256, CRC-32, msgspec JSON, little-endian int64 and Python's
code-point string order are involved. Every dict with more than
:data:`~.persisted.SMALL_DICT` keys reaches the encoder already sorted;
msgspec sorts only smaller ones (DECISIONS 232).
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Iterable, Mapping
from hashlib import sha256
from typing import Any
from zlib import crc32

import msgspec

from quotaledger.events.model import PodUpserted

from .number_digest import NumberDigest
from .persisted import FIELDS, presorted_rl
from .settle import settle
from .state import ProjectedState, QuotaNode

#: Buckets of a map's digest (a power of two: the bucket is CRC-32 & (BUCKETS - 1)).
BUCKETS = 4096
_MASK = BUCKETS - 1
_PREFIX = [bucket.to_bytes(2, "big") for bucket in range(BUCKETS)]
#: Hashed first: another hash function gets another tag.
VERSION = b"quotaledger state hash 2\n"
#: The four large maps, each hashed as a :class:`MapDigest`.
MAPS = ("nodes", "quotas", "pods", "namespace_weights")

_ENCODER = msgspec.json.Encoder(order="deterministic")
_ENCODE = _ENCODER.encode


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
    pod_quota = state.pod_quota.get
    keys_of, digests_of, dirty = entries.keys, entries.digests, entries.dirty
    encode_into = _ENCODER.encode_into
    encoded = bytearray()  # one buffer, encoded into for each pod
    # MapDigest.put and pod_digest, inlined (the hot loop); each mark holds the
    # pod the state holds, or None for a removed one (DECISIONS 401)
    for uid, pod in state.hash_pods.items():
        if pod is None:
            entries.remove(uid)
            continue
        encode_into(pod, encoded)
        quota = pod_quota(uid)
        if quota is not None:
            encoded += b"\0"
            encoded += quota.encode()
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
