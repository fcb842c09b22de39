"""The engine's handled timers, swept by what changed (DESIGN §6; DECISIONS 63, 350).

``EngineCore.handled`` holds the timers already proposed, and only timers
still armed: at every look those no longer armed are forgotten. A timer's
being armed (:func:`armed_test`) reads its source's clock, hold, quota
(``pod_quota`` for a reclaim timer, the quota's existence for an overuse
one) or quota-decrease deadline, and the settings; the timer index
(``projections.timers``) is told of every write of those by the fold (its
changed sources) and rebuilds itself when the settings change. So a look
re-tests only the handled timers of the changed sources and the keys handled
since the last look (:class:`HandledSweep`), and sweeps every key only
when it cannot follow what changed: the first look, a new state or index,
the index rebuilt or its changes taken by another reader, ``handled``
replaced or resized from outside the core.

Handled timers stay armed until their source changes, which late in a
day-long ``simulate`` means thousands of starving pods whose reclaim found no
victim: each is parked in the index, out of the looks' walk, while its index
entry is its key.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from quotaledger.events.model import PreemptionCause
from quotaledger.projections.state import ProjectedState
from quotaledger.projections.timers import DECREASE, OVERUSE, RECLAIM, TimerIndex, timer_index

#: A timer's identity: (cause, queue, pod_uid, deadline).
TimerKey = tuple[PreemptionCause, str, str, int]

#: Cause by rank (``projections.timers`` entries carry the rank).
CAUSES: tuple[PreemptionCause, ...] = ("quota-decrease", "overuse", "reclaim")

_RANK: dict[str, int] = {"quota-decrease": DECREASE, "overuse": OVERUSE, "reclaim": RECLAIM}


def source_of(key: TimerKey) -> tuple[int, str]:
    """A timer key's source in the index: ``(rank, queue or pod uid)``."""
    cause = key[0]
    return (RECLAIM, key[2]) if cause == "reclaim" else (_RANK[cause], key[1])


def armed_test(state: ProjectedState) -> Callable[[TimerKey], bool]:
    """A test of whether a timer key is among ``engine.core.timers`` now,
    reading the state's maps directly (no listing)."""
    settings = state.settings
    decrease = settings.quota_preemption_enabled
    revoke_after = round(settings.revoke_after_s * 1000) if settings.revoke_enabled else None
    reclaim_after = round(settings.reclaim_after_s * 1000) if settings.reclaim_enabled else None
    deadlines, quotas = state.decrease_deadlines, state.quotas
    owing, owing_held = state.owing_since, state.owing_held
    starving, starving_held, pod_quota = state.starving_since, state.starving_held, state.pod_quota

    def armed(key: TimerKey) -> bool:
        cause, queue, pod_uid, deadline = key
        if cause == "quota-decrease":
            return decrease and deadlines.get(queue) == deadline
        if cause == "overuse":
            since = owing.get(queue)
            return (
                revoke_after is not None
                and since is not None
                and since + revoke_after == deadline
                and queue not in owing_held
                and queue in quotas
            )
        since = starving.get(pod_uid)
        return (
            reclaim_after is not None
            and since is not None
            and since + reclaim_after == deadline
            and pod_uid not in starving_held
            and pod_quota.get(pod_uid) == queue
        )

    return armed


@dataclass(slots=True, eq=False)
class HandledSweep:
    """What one engine's last look left (see the module docstring): the index
    it read and that index's ``changes`` after the take, the ``handled`` set
    and its size then, the handled key of each source, and the keys handled
    since. ``token`` names this engine as the index's parker."""

    index: TimerIndex | None = None
    changes: int = -1
    seen: set[TimerKey] | None = None
    size: int = 0
    sources: dict[tuple[int, str], TimerKey] = field(default_factory=dict)
    added: list[TimerKey] = field(default_factory=list)
    token: object = field(default_factory=object)

    def look(self, state: ProjectedState, handled: set[TimerKey]) -> TimerIndex:
        """The state's timer index, brought up to date, and ``handled`` rid of
        every key no longer armed (DECISIONS 63), by re-testing the keys of
        the changed sources and those handled since the last look."""
        index = timer_index(state)
        if (
            index is not self.index
            or index.changes != self.changes
            or handled is not self.seen
            or len(handled) != self.size
            or index.parker is not self.token
        ):
            self.sweep_all(state, index, handled)
            return index
        if not (index.changed_pods or index.changed_queues or self.added):
            return index
        pods, queues = index.take_changes()
        self.changes = index.changes
        armed = armed_test(state)
        sources = self.sources
        park = index.park
        changed = [(RECLAIM, uid) for uid in pods]
        for queue in queues:
            changed += ((DECREASE, queue), (OVERUSE, queue))
        for source in changed:
            key = sources.get(source)
            if key is not None:
                if armed(key):
                    park(source, key[3], key[1])
                else:
                    del sources[source]
                    handled.discard(key)
                    index.unpark(source)
        if self.added:
            added, self.added = self.added, []
            for key in added:
                if key not in handled:
                    continue  # let go of since (reopened, revisited)
                if not armed(key):
                    handled.discard(key)
                    continue
                source = source_of(key)
                old = sources.get(source)
                if old is not None and old != key:
                    # a source has one armed key: the older one is not
                    handled.discard(old)
                    index.unpark(source)
                sources[source] = key
                park(source, key[3], key[1])
        self.size = len(handled)
        return index

    def sweep_all(self, state: ProjectedState, index: TimerIndex, handled: set[TimerKey]) -> None:
        """Test every handled key, and park those that stay."""
        index.take_changes()
        index.unpark_all(self.token)
        self.index = index
        self.changes = index.changes
        self.added = []
        sources: dict[tuple[int, str], TimerKey] = {}
        if handled:
            armed = armed_test(state)
            for key in [key for key in handled if not armed(key)]:
                handled.discard(key)
            park = index.park
            for key in handled:
                source = source_of(key)
                sources[source] = key
                park(source, key[3], key[1])
        self.sources = sources
        self.seen = handled
        self.size = len(handled)

    def handle(self, handled: set[TimerKey], key: TimerKey) -> None:
        """``key`` is handled (tested and parked at the next look)."""
        if key not in handled:
            handled.add(key)
            self.added.append(key)
            if handled is self.seen:
                self.size += 1

    def let_go(self, handled: set[TimerKey], key: TimerKey) -> None:
        """``key`` is pending again (while armed): out of ``handled`` and the park."""
        if key in handled:
            handled.discard(key)
            if handled is self.seen:
                self.size -= 1
            source = source_of(key)
            if self.sources.get(source) == key:
                del self.sources[source]
                index = self.index
                if index is not None and index.parker is self.token:
                    index.unpark(source)
