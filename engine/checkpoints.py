"""What a checkpoint of the live engine holds, and how its snapshot is encoded (DESIGN §9;
DECISIONS 240, 242).

A checkpoint is taken of the state as it is at one instant (no record folded in between):
the digest chain's head, the state hash and, for a snapshot, a copy of the persisted state
(:func:`~quotaledger.projections.snapshot.copy_persisted`). The snapshot is encoded from
that copy a few milliseconds at a time, yielding to the event loop in between, so the
engine goes on folding and deciding meanwhile (msgspec holds the GIL for a whole call:
a worker thread would stall the loop just the same, DECISIONS 240).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from quotaledger.projections.snapshot import PersistedCopy, dump_pieces

__all__ = ["Checkpoint", "encode_in_slices"]


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A checkpoint taken at ``through`` (``LiveEngine._take_checkpoint``): ``copy`` is
    the persisted state to snapshot, None for a ``LedgerDigest`` alone."""

    through: int
    digest: str
    state_hash: str
    copy: PersistedCopy | None


async def encode_in_slices(copy: PersistedCopy, slice_s: float) -> bytes:
    """:func:`~quotaledger.projections.snapshot.dump` of the copied state, byte for byte,
    encoded at most ``slice_s`` at a time, yielding to the loop in between."""
    pieces: list[bytes] = []
    clock = time.perf_counter
    until = clock() + slice_s
    for piece in dump_pieces(copy):
        pieces.append(piece)
        if clock() >= until:
            await asyncio.sleep(0)
            until = clock() + slice_s
    return b"".join(pieces)
