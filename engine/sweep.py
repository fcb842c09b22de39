"""Forgetting handled timers that are no longer armed (DESIGN §6; DECISIONS 63, 322).

At every look after a record, :class:`~quotaledger.engine.core.EngineCore`
drops from ``handled`` each timer that is not armed at that moment. A busy
cluster keeps thousands of starving pods whose reclaim found no victim: their
timers stay handled and armed, and testing each of them in Python at every
look cost more than everything else the engine did. :class:`HandledSweep`
keeps the handled reclaim keys as parallel lists, in step with ``handled``
by set differences, and tests them with C-level membership in the state's
maps: a reclaim timer ``(reclaim, queue, uid, deadline)`` is armed exactly
when ``(uid, deadline − reclaim_after)`` is an item of ``starving_since``,
``(uid, queue)`` one of ``pod_quota`` and ``uid`` is not held
(``core.armed_test``). The other causes (few) are tested one by one.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from itertools import compress

from quotaledger.events.model import PreemptionCause
from quotaledger.projections.state import ProjectedState

#: A timer's identity: (cause, queue, pod_uid, deadline).
TimerKey = tuple[PreemptionCause, str, str, int]


class HandledSweep:
    """The handled keys seen at the last sweep, the reclaim ones as parallel
    lists (key, ``(uid, since)``, ``(uid, queue)``, uid) for one
    ``reclaim_after``; the others in a set."""

    __slots__ = ("after", "keys", "members", "others", "quota_pairs", "since_pairs", "uids")

    def __init__(self) -> None:
        self.after: int | None = None
        self.members: set[TimerKey] = set()
        self.keys: list[TimerKey] = []
        self.since_pairs: list[tuple[str, int]] = []
        self.quota_pairs: list[tuple[str, str]] = []
        self.uids: list[str] = []
        self.others: set[TimerKey] = set()

    def unarmed(
        self,
        state: ProjectedState,
        handled: set[TimerKey],
        armed: Callable[[TimerKey], bool],
    ) -> list[TimerKey]:
        """The keys of ``handled`` that ``armed`` says are not armed now
        (the same keys, tested in bulk where it can)."""
        settings = state.settings
        if not settings.reclaim_enabled:
            return [key for key in handled if not armed(key)]
        after = round(settings.reclaim_after_s * 1000)
        if after != self.after:
            self.__init__()  # type: ignore[misc]
            self.after = after
        removed = self.members - handled
        if removed:
            keep = list(map(operator.not_, map(removed.__contains__, self.keys)))
            self.keys = list(compress(self.keys, keep))
            self.since_pairs = list(compress(self.since_pairs, keep))
            self.quota_pairs = list(compress(self.quota_pairs, keep))
            self.uids = list(compress(self.uids, keep))
            self.others -= removed
        for key in handled - self.members:
            if key[0] == "reclaim":
                self.keys.append(key)
                self.since_pairs.append((key[2], key[3] - after))
                self.quota_pairs.append((key[2], key[1]))
                self.uids.append(key[2])
            else:
                self.others.add(key)
        self.members = set(handled)
        # armed: both items present and not held (True > False only)
        flags = map(
            operator.gt,
            map(
                operator.and_,
                map(state.starving_since.items().__contains__, self.since_pairs),
                map(state.pod_quota.items().__contains__, self.quota_pairs),
            ),
            map(state.starving_held.__contains__, self.uids),
        )
        gone = list(compress(self.keys, map(operator.not_, flags)))
        gone.extend(key for key in self.others if not armed(key))
        return gone
