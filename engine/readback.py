"""An engine reads its own appends back before it acts on them (DESIGN §6; DECISIONS 201).

While an append of the engine waits to be read back, its follower keeps the batches it
applies; once the follower has applied the append's last offset, the records applied at
the offsets the ledger assigned must be that append's own payloads, byte for byte. A
filler or any other record there means the state lacks this engine's own decisions:
:class:`ReadBackError` stops the engine rather than let it decide on that state.
"""

from __future__ import annotations

import logging

from quotaledger.events.ledger import LedgerError, Record

__all__ = ["ReadBackError", "check_read_back", "trim_kept"]

log = logging.getLogger("quotaledger.engine")


class ReadBackError(LedgerError):
    """What the follower applied at an append's offsets is not that append."""


def check_read_back(
    kept: list[list[Record]], offsets: list[int], payloads: list[bytes], instance: str
) -> None:
    """Raise :class:`ReadBackError` unless the batches applied since the
    append was sent (``kept``) hold ``payloads`` at ``offsets`` (a few compares)."""
    found: dict[int, bytes] = {}
    low, high = offsets[0], offsets[-1]
    for batch in kept:
        if not batch or batch[-1].offset < low or batch[0].offset > high:
            continue
        first = batch[0].offset
        for offset in offsets:
            index = offset - first
            if 0 <= index < len(batch) and batch[index].offset == offset:
                found[offset] = batch[index].payload
    for offset, payload in zip(offsets, payloads, strict=True):
        got = found.get(offset)
        if got == payload:
            continue
        what = "no record" if got is None else f"another record ({got[:160]!r})"
        message = (
            f"engine {instance}: the ledger acknowledged its append at offsets"
            f" {low}..{high}, but the follower applied {what} at offset {offset}:"
            " this engine's state lacks its own decision (a reader that filled or"
            " skipped offsets the broker had not proven gone?); stopping rather than"
            " deciding on that state"
        )
        log.error("%s", message)
        raise ReadBackError(message)


def trim_kept(kept: list[list[Record]], readbacks: dict[int, int]) -> list[list[Record]]:
    """``kept`` without the batches no pending read-back can need (``readbacks``: each
    pending append's token -> the state's offset when it was sent)."""
    if not readbacks:
        return []
    floor = min(readbacks.values())
    return [batch for batch in kept if batch and batch[-1].offset > floor]
