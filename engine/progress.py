"""Catch-up progress of the live engine (DESIGN §9: long work logs its progress every 10 s)."""

from __future__ import annotations

import logging
import time

__all__ = ["CatchUpProgress"]

log = logging.getLogger("quotaledger.engine")


class CatchUpProgress:
    """Logs catch-up progress every ``every_s`` seconds (DESIGN §9 progress);
    called with the number of records folded so far."""

    def __init__(self, instance: str, tail: int, every_s: float) -> None:
        self.instance, self.tail, self.every_s = instance, tail, every_s
        self.started = self.shown_at = time.monotonic()
        self.records = 0
        self.shown = False

    def __call__(self, records: int) -> None:
        self.records = records
        now = time.monotonic()
        if now - self.shown_at < self.every_s:
            return
        self.shown_at = now
        self.shown = True
        rate = self.records / max(now - self.started, 1e-9)
        log.info(
            "engine %s catching up: %d records folded of %d (%.0f records/s)",
            self.instance,
            self.records,
            self.tail,
            rate,
        )

    def done(self, offset: int) -> None:
        if self.shown:
            log.info(
                "engine %s caught up: %d records in %.1f s, at offset %d",
                self.instance,
                self.records,
                time.monotonic() - self.started,
                offset,
            )
