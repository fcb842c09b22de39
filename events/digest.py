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

from .ledger import LedgerError, Record

__all__ = [
    "GENESIS",
    "DigestChain",
    "DigestRing",
    "LedgerGap",
    "chained",
    "next_digest",
    "parse_digest",
]

#: ``d(-1)``: the digest before record 0.
GENESIS = bytes(32)

_HEAD = struct.Struct(">qq")


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


class LedgerGap(LedgerError):
    """A record that does not follow the previous one: records missing (DESIGN §3)."""


class DigestChain:
    """The running digest: ``digest`` is ``d(through)``.

    Start from :data:`GENESIS` at ``through=-1``, or from a digest kept
    elsewhere (a snapshot's) at its offset. Records must come in offset order
    without gaps; a record out of order raises :class:`LedgerGap`.
    """

    __slots__ = ("digest", "through")

    def __init__(self, digest: bytes = GENESIS, through: int = -1) -> None:
        if len(digest) != 32:
            raise ValueError(f"a digest is 32 bytes, not {len(digest)}")
        self.digest = digest
        self.through = through

    @property
    def hex(self) -> str:
        return self.digest.hex()

    def update(self, record: Record) -> bytes:
        """Fold one record into the chain; return the new digest."""
        if record.offset != self.through + 1:
            raise LedgerGap(
                f"record {record.offset} follows record {self.through}: records are missing"
                " (removed, or the file is damaged)"
            )
        self.digest = hashlib.sha256(
            self.digest + _HEAD.pack(record.offset, record.ts) + record.payload
        ).digest()
        self.through = record.offset
        return self.digest


class DigestRing:
    """The digests of the last ``size`` records, by offset (for checking a
    ``LedgerDigest`` whose ``through`` is a little behind the record itself)."""

    __slots__ = ("_digests", "_last", "size")

    def __init__(self, size: int = 1 << 14) -> None:
        self.size = size
        self._digests: list[bytes | None] = [None] * size
        self._last = -1

    def put(self, offset: int, digest: bytes) -> None:
        self._digests[offset % self.size] = digest
        self._last = offset

    def get(self, offset: int) -> bytes | None:
        """``d(offset)`` if it is still kept, else None."""
        if offset < 0 or offset > self._last or offset <= self._last - self.size:
            return None
        return self._digests[offset % self.size]


def chained(records: Iterable[Record], chain: DigestChain) -> Iterator[Record]:
    """``records`` unchanged, each folded into ``chain`` as it passes."""
    for record in records:
        chain.update(record)
        yield record
