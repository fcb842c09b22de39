"""The ledger's digest chain: tamper evidence over every record (DESIGN §9).

``d(-1)`` is 32 zero bytes and ``d(n) = sha256(d(n-1) ‖ offset ‖ ts ‖ payload)``
with ``offset`` and ``ts`` as 8 bytes big-endian (two's complement, so any
64-bit value a backend can hold encodes; for the non-negative offsets and the
bounded times of DESIGN §9 this is the plain unsigned encoding). The chain is
computed over :class:`~quotaledger.events.ledger.Record` values, whatever
backend produced them, so every reader gets it for free.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Iterator

from .ledger import LedgerGap, Record

__all__ = [
    "GENESIS",
    "DigestChain",
    "chained",
    "next_digest",
    "parse_digest",
]

#: ``d(-1)``: the digest before record 0.
GENESIS = bytes(32)

_HEAD = struct.Struct(">qq")
_sha256 = hashlib.sha256


def next_digest(previous: bytes, offset: int, ts: int, payload: bytes) -> bytes:
    """``d(n)`` from ``d(n-1)`` and record ``n``'s offset, ts and payload."""
    return hashlib.sha256(previous + _HEAD.pack(offset, ts) + payload).digest()


def parse_digest(text: str) -> bytes:
    """A digest from its 64-hex-digit form; ``ValueError`` naming what is wrong."""
    cleaned = text.strip().lower()
    if len(cleaned) != 64:
        raise ValueError(f"a digest is 64 hex digits, not {len(cleaned)}: {text!r}")
    try:
        return bytes.fromhex(cleaned)
    except ValueError:
        raise ValueError(f"a digest is 64 hex digits: {text!r}") from None


class DigestChain:
    """The running digest: ``digest`` is ``d(through)``.

    Start from :data:`GENESIS` at ``through=-1``, or from a digest kept
    elsewhere (a snapshot's) at its offset. Records must come in offset order
    without gaps; a record out of order raises :class:`LedgerGap`. With
    ``keep`` > 0 the digests of the last ``keep`` offsets (rounded up to a power
    of two) stay available through :meth:`at`, to check a ``LedgerDigest``
    written a little after its ``through``.
    """

    __slots__ = ("_mask", "_ring", "digest", "through")

    def __init__(self, digest: bytes = GENESIS, through: int = -1, *, keep: int = 0) -> None:
        if len(digest) != 32:
            raise ValueError(f"a digest is 32 bytes, not {len(digest)}")
        self.digest = digest
        self.through = through
        size = 1 << max(0, keep - 1).bit_length() if keep > 0 else 0
        self._mask = size - 1
        self._ring: list[bytes] = [GENESIS] * size
        if size and through >= 0:
            self._ring[through & self._mask] = digest

    @property
    def hex(self) -> str:
        return self.digest.hex()

    def update(self, record: Record) -> bytes:
        """Fold one record into the chain; return the new digest."""
        offset = record.offset
        if offset != self.through + 1:
            raise LedgerGap(
                f"record {offset} follows record {self.through}: records are missing"
                " (removed, or the file is damaged)",
                missing=self.through + 1,
                found=offset,
            )
        digest = _sha256(self.digest + _HEAD.pack(offset, record.ts) + record.payload).digest()
        self.digest = digest
        self.through = offset
        if self._ring:
            self._ring[offset & self._mask] = digest
        return digest

    def at(self, offset: int) -> bytes | None:
        """``d(offset)`` if it is still kept (``through`` itself always is), else None."""
        if offset == self.through:
            return self.digest
        if not self._ring or not self.through - len(self._ring) < offset < self.through:
            return None
        return self._ring[offset & self._mask]


def chained(records: Iterable[Record], chain: DigestChain) -> Iterator[Record]:
    """``records`` unchanged, each folded into ``chain`` as it passes."""
    for record in records:
        chain.update(record)
        yield record
