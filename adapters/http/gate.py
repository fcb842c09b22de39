"""The fold gate: one lock between the follower's fold and the HTTP readers (DESIGN §11).

``serve`` wraps its ledger in :class:`GatedLedger` before handing it to the
engine. Every batch the engine's follower reads is yielded while the gate is
held, and the gate is released only when the follower asks for the next batch,
i.e. once it has applied this one. So a reader that holds the gate sees a state
no record is being applied to: it may settle it on the event loop and then read
it from a worker thread (state JSON, metrics) without the loop waiting for it.

The same place observes every batch, before and after it is applied, for the
metrics (fold time, decision latency, decision counters) and the live feed
(``GET /v1/stream``): the engine itself is not touched.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Protocol

from quotaledger.events.ledger import Append, Ledger, Record, Snapshot
from quotaledger.projections.state import ProjectedState


class BatchObserver(Protocol):
    """Told about each batch the follower folds."""

    def before_fold(self, batch: Sequence[Record], state: ProjectedState) -> None:
        """Called with the gate held, before any record of ``batch`` is applied."""

    def after_fold(self, batch: Sequence[Record], state: ProjectedState, seconds: float) -> None:
        """Called once ``batch`` is applied (``seconds``: how long that took)."""


class GatedLedger:
    """A :class:`~quotaledger.events.ledger.Ledger` whose reads hold :attr:`gate`
    per batch (see module docstring). Everything else is delegated."""

    def __init__(
        self,
        inner: Ledger,
        state: Callable[[], ProjectedState],
        observer: BatchObserver | None = None,
    ) -> None:
        self.inner = inner
        self.gate = asyncio.Lock()
        self._state = state
        self._observer = observer

    @property
    def ledger_id(self) -> str:
        return self.inner.ledger_id

    async def append(self, batch: Sequence[Append]) -> list[int]:
        return await self.inner.append(batch)

    async def read(
        self, from_offset: int = 0, *, follow: bool = False, **options: Any
    ) -> AsyncIterator[list[Record]]:
        """The inner ledger's ``read`` (backend options passed through), gated per batch."""
        observer = self._observer
        async for batch in self.inner.read(from_offset, follow=follow, **options):
            # A catch-up read never waits on I/O: let the loop serve between batches.
            await asyncio.sleep(0)
            async with self.gate:
                if observer is not None:
                    observer.before_fold(batch, self._state())
                started = time.perf_counter()
                yield batch
                if observer is not None:
                    observer.after_fold(batch, self._state(), time.perf_counter() - started)

    async def last_offset(self) -> int:
        return await self.inner.last_offset()

    async def save_snapshot(self, snapshot: Snapshot) -> None:
        await self.inner.save_snapshot(snapshot)

    async def load_snapshot(self, at_most: int | None = None) -> Snapshot | None:
        return await self.inner.load_snapshot(at_most)

    async def close(self) -> None:
        await self.inner.close()

    def __getattr__(self, name: str) -> Any:
        # Backend extras (e.g. SqliteLedger.iter_batches) stay reachable.
        return getattr(self.inner, name)
