"""The executors the engine itself ships (DESIGN §6): what carries out an accepted eviction.

An executor is handed each eviction the projection accepted (``state.evictions``, never
what the engine proposed) and returns the facts and decisions to append for it. The
``kubernetes`` and ``kafka`` executors are adapters (``adapters/kubernetes/executor.py``,
``adapters/ledgers/kafka/executor.py``); these two need nothing outside the engine.
"""

from __future__ import annotations

import logging
from typing import Protocol

from quotaledger.events.model import Event, EvictionFailed, EvictionSucceeded, PodRemoved
from quotaledger.projections.state import EvictionRun, ProjectedState

__all__ = ["Executor", "LogExecutor", "SimulateExecutor"]

log = logging.getLogger("quotaledger.engine")


class Executor(Protocol):
    """Carries out one accepted eviction; returns the facts/decisions to append.

    Must be idempotent by ``eviction_id``: after a restart the same eviction
    may be driven again.
    """

    async def evict(self, eviction: EvictionRun, state: ProjectedState) -> list[Event]: ...


class SimulateExecutor:
    """The pod is removed at once: ``EvictionSucceeded`` and ``PodRemoved``."""

    async def evict(self, eviction: EvictionRun, state: ProjectedState) -> list[Event]:
        return [
            EvictionSucceeded(eviction_id=eviction.eviction_id),
            PodRemoved(uid=eviction.pod_uid),
        ]


class LogExecutor:
    """Dry run: logs the eviction and records it as not executed."""

    async def evict(self, eviction: EvictionRun, state: ProjectedState) -> list[Event]:
        log.warning(
            "dry run: would evict pod %s from %s (%s)",
            eviction.pod_uid,
            eviction.queue,
            eviction.eviction_id,
        )
        return [EvictionFailed(eviction_id=eviction.eviction_id, error="dry run (log executor)")]
