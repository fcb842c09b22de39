"""The armed reconciler timers, kept in firing order between looks (DESIGN §6, §8 rules 19, 27, 34).

A timer is armed, while its setting is on, for

* every ``decrease_deadlines`` entry (quota decrease, §6 rule 1), at its deadline;
* every ``owing_since`` clock of a quota that exists and is not held (overuse,
  §6 rule 2), at ``since + revoke_after``;
* every ``starving_since`` clock of an active pod that is not held
  (reclaim, §6 rule 3), at ``since + reclaim_after``, on the pod's quota.

Firing order is §8 rule 27's: deadline, then quota-decrease before overuse
before reclaim, deeper queue first, then queue name (then pod uid). An entry
is that order's tuple ``(deadline, cause rank, -depth, queue, pod uid)``.

:class:`TimerIndex` keeps the entries sorted instead of listing and sorting
every timer at each look (an engine looks after every record). What it must
be told, it is told by the only writers of the clocks: a clock started,
stopped or restarted is marked by :func:`quotaledger.projections.clocks.apply_observation`
and :func:`~quotaledger.projections.clocks.release_holds`; everything else is
compared or re-derived when looked at:

* a clock that ended (a revoke or reclaim finished, its quota removed) leaves a
  stale entry, dropped when a look reaches it (its ``since`` no longer matches);
* whether a timer whose clock runs is armed (held, quota gone, pod not
  active) and where it sorts (the pod's quota, the quota's depth) is read from
  the state at each look, so a look sorts what it returns by the fresh keys;
* the quota-decrease deadlines (a small map, changed by the fold's
  configuration and guard paths) are compared with the last look's copy;
* the settings (which timers exist, the delays) and the state's identity (a
  restore) are compared, and any difference rebuilds the index.

The result equals :func:`all_timers`, a full listing of the state
(tests/projections/test_timer_index.py checks it after every record of engine-made
histories). Nothing here depends on set or dict iteration order: entries are
totally ordered tuples.

For the engine's handled timers (DECISIONS 63, 350) the index also keeps

* the *changed sources*: every pod and queue whose timer inputs the fold wrote
  since they were last taken (:meth:`TimerIndex.take_changes`) — a clock
  started, stopped or released (the marks above), a reclaim or overuse clock
  ended by a finished preemption (``guard.on_finished``), a pod attached to
  or detached from a quota (``pods.attach_pod``/``detach_pod``: its
  ``pod_quota``), a quota removed (the fold's ``QuotaRemoved``), a
  quota-decrease deadline that differs from the last look's copy. A timer key
  whose source is not among them is armed exactly when it was at the last take
  (``engine.core.armed_test`` reads nothing else but the settings, whose change
  rebuilds the index). ``changes`` counts the takes and the rebuilds, so a
  reader that finds it moved by someone else knows it missed changes;
* *parked* entries: one reader (``parker``) may set entries aside whose timer
  it has handled, so that its looks do not walk past them one by one. A
  parked entry keeps its place in ``by_source`` and is re-derived like any
  other; it leaves the park when its timer key (deadline, queue) changes.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterator

from .state import ProjectedState

#: ``(deadline, cause rank, -depth, queue, pod uid)``; ranks: §8 rule 27.
Entry = tuple[int, int, int, str, str]

DECREASE, OVERUSE, RECLAIM = 0, 1, 2

#: Changed sources kept for a reader that does not take them; past this many
#: they are dropped (``changes`` moves: the reader sweeps everything). The
#: add-and-cap is written out where a source changes (``mark_queue``,
#: ``mark_pod``, :func:`touch_pod`, :func:`touch_queue`) on purpose: one shared
#: method, called per clock start or stop, made ``simulate`` 3.5 % slower
#: (measured 2026-11-27, reverted).
CHANGES_KEPT = 1 << 16


def _depth(state: ProjectedState, queue: str) -> int:
    node = state.quotas.get(queue)
    return node.depth if node is not None else 0


def all_timers(state: ProjectedState) -> list[Entry]:
    """Every armed timer whose setting is on, in firing order (the full listing)."""
    settings = state.settings
    quotas = state.quotas
    out: list[Entry] = []
    if settings.quota_preemption_enabled:
        for queue, deadline in state.decrease_deadlines.items():
            out.append((deadline, DECREASE, -_depth(state, queue), queue, ""))
    if settings.revoke_enabled:
        after = round(settings.revoke_after_s * 1000)
        held = state.owing_held
        for queue, since in state.owing_since.items():
            if queue not in held and queue in quotas:
                out.append((since + after, OVERUSE, -quotas[queue].depth, queue, ""))
    if settings.reclaim_enabled:
        after = round(settings.reclaim_after_s * 1000)
        held = state.starving_held
        pod_quota = state.pod_quota
        for uid, since in state.starving_since.items():
            if uid in pod_quota and uid not in held:
                queue = pod_quota[uid]
                out.append((since + after, RECLAIM, -_depth(state, queue), queue, uid))
    out.sort()
    return out


class TimerIndex:
    """Sorted entries of the armed timers of one state (see the module docstring).

    ``entries`` holds one entry per running clock or deadline whose setting is
    on, sorted; an entry may be stale in its queue and depth, or not armed at
    the moment (held, quota gone, pod inactive): :meth:`fresh` says what it is
    now. ``by_source`` maps ``(rank, queue or pod uid)`` to its entry,
    ``parked`` the sources whose entry is set aside (not in ``entries``).
    """

    __slots__ = (
        "_owing",
        "_starving",
        "by_source",
        "changed_pods",
        "changed_queues",
        "changes",
        "deadlines",
        "entries",
        "marked_pods",
        "marked_queues",
        "parked",
        "parker",
        "settings_key",
        "stale",
        "state",
    )

    def __init__(self) -> None:
        self.state: ProjectedState | None = None
        self.entries: list[Entry] = []
        self.by_source: dict[tuple[int, str], Entry] = {}
        self.deadlines: dict[str, int] = {}
        self.settings_key: tuple[object, ...] = ()
        self.marked_queues: set[str] = set()
        self.marked_pods: set[str] = set()
        self.stale: list[Entry] = []
        self.changed_pods: set[str] = set()
        self.changed_queues: set[str] = set()
        self.changes = 0
        self.parked: dict[tuple[int, str], Entry] = {}
        self.parker: object = None
        self._owing: object = None
        self._starving: object = None

    # ---------------------------------------------------------------- upkeep

    def _add(self, entry: Entry) -> None:
        source = (entry[1], entry[4] if entry[1] == RECLAIM else entry[3])
        old = self.by_source.get(source)
        if old is not None:
            if old == entry:
                return
            parked = self.parked
            if source in parked:
                self.by_source[source] = entry
                if old[0] == entry[0] and old[3] == entry[3]:
                    parked[source] = entry  # the same timer key (a depth moved)
                else:
                    del parked[source]
                    insort(self.entries, entry)
                return
            self._remove(old)
        self.by_source[source] = entry
        insort(self.entries, entry)

    def _remove(self, entry: Entry) -> None:
        source = (entry[1], entry[4] if entry[1] == RECLAIM else entry[3])
        if self.parked.get(source) == entry:
            del self.parked[source]
            del self.by_source[source]
            return
        entries = self.entries
        i = bisect_left(entries, entry)
        if i < len(entries) and entries[i] == entry:
            del entries[i]
        if self.by_source.get(source) == entry:
            del self.by_source[source]

    def _source_entry(self, state: ProjectedState, rank: int, name: str) -> Entry | None:
        """The entry of one clock or deadline as the state holds it (armed or not)."""
        settings = state.settings
        if rank == DECREASE:
            deadline = state.decrease_deadlines.get(name)
            if deadline is None or not settings.quota_preemption_enabled:
                return None
            return (deadline, DECREASE, -_depth(state, name), name, "")
        if rank == OVERUSE:
            since = state.owing_since.get(name)
            if since is None or not settings.revoke_enabled:
                return None
            after = round(settings.revoke_after_s * 1000)
            return (since + after, OVERUSE, -_depth(state, name), name, "")
        since = state.starving_since.get(name)
        if since is None or not settings.reclaim_enabled:
            return None
        after = round(settings.reclaim_after_s * 1000)
        queue = state.pod_quota.get(name, "")
        return (since + after, RECLAIM, -_depth(state, queue), queue, name)

    def _rebuild(self, state: ProjectedState) -> None:
        self.state = state
        self._owing = state.owing_since
        self._starving = state.starving_since
        self.settings_key = _settings_key(state)
        self.deadlines = dict(state.decrease_deadlines)
        self.marked_queues = set()
        self.marked_pods = set()
        self.stale = []
        self.changed_pods = set()
        self.changed_queues = set()
        self.changes += 1
        self.parked = {}
        self.parker = None
        entries: list[Entry] = []
        by_source: dict[tuple[int, str], Entry] = {}
        for rank, names in (
            (DECREASE, state.decrease_deadlines),
            (OVERUSE, state.owing_since),
            (RECLAIM, state.starving_since),
        ):
            for name in names:
                entry = self._source_entry(state, rank, name)
                if entry is not None:
                    entries.append(entry)
                    by_source[(rank, name)] = entry
        entries.sort()
        self.entries = entries
        self.by_source = by_source

    def refresh(self, state: ProjectedState) -> None:
        """Bring the entries up to date with ``state`` (see the module docstring)."""
        if (
            state is not self.state
            or state.owing_since is not self._owing
            or state.starving_since is not self._starving
            or _settings_key(state) != self.settings_key
        ):
            self._rebuild(state)
            return
        if self.stale:
            for entry in self.stale:
                self._resource(state, entry)
                # re-derived: a reader may now park the timer it handled
                if entry[1] == RECLAIM:
                    self.changed_pods.add(entry[4])
                else:
                    self.changed_queues.add(entry[3])
            self.stale = []
        if state.decrease_deadlines != self.deadlines:
            for queue in self.deadlines.keys() | state.decrease_deadlines.keys():
                self._resource_of(state, DECREASE, queue)
                self.changed_queues.add(queue)
            self.deadlines = dict(state.decrease_deadlines)
        if self.marked_queues:
            for queue in self.marked_queues:
                self._resource_of(state, OVERUSE, queue)
            self.marked_queues = set()
        if self.marked_pods:
            self._refresh_pods(state)
            self.marked_pods = set()

    def _refresh_pods(self, state: ProjectedState) -> None:
        """:meth:`_resource_of` for every marked pod (a sample starts and stops
        many starvation clocks at once), the settings read once."""
        settings = state.settings
        if not settings.reclaim_enabled:
            for uid in self.marked_pods:
                self._resource_of(state, RECLAIM, uid)
            return
        after = round(settings.reclaim_after_s * 1000)
        starving, pod_quota, quotas = state.starving_since, state.pod_quota, state.quotas
        by_source = self.by_source
        for uid in self.marked_pods:
            since = starving.get(uid)
            if since is None:
                old = by_source.get((RECLAIM, uid))
                if old is not None:
                    self._remove(old)
                continue
            queue = pod_quota.get(uid, "")
            node = quotas.get(queue)
            self._add((since + after, RECLAIM, -node.depth if node is not None else 0, queue, uid))

    def _resource_of(self, state: ProjectedState, rank: int, name: str) -> None:
        entry = self._source_entry(state, rank, name)
        if entry is not None:
            self._add(entry)
        else:
            old = self.by_source.get((rank, name))
            if old is not None:
                self._remove(old)

    def _resource(self, state: ProjectedState, entry: Entry) -> None:
        """Re-derive a stale entry from its source."""
        rank = entry[1]
        self._resource_of(state, rank, entry[4] if rank == RECLAIM else entry[3])

    # ---------------------------------------------------------------- looks

    def fresh(self, state: ProjectedState, entry: Entry) -> Entry | None:
        """``entry`` as it is armed now (queue and depth re-read), or None when
        it is not armed at the moment. An entry whose clock or deadline is gone
        or moved, or that sorts elsewhere now, is queued for the next refresh."""
        rank = entry[1]
        if rank == DECREASE:
            # the deadlines are compared at every refresh: the entry is current
            depth = -_depth(state, entry[3])
            if depth != entry[2]:
                self.stale.append(entry)
                return (entry[0], DECREASE, depth, entry[3], "")
            return entry
        settings = state.settings
        if rank == OVERUSE:
            queue = entry[3]
            since = state.owing_since.get(queue)
            if since is None or since + round(settings.revoke_after_s * 1000) != entry[0]:
                self.stale.append(entry)
                return None
            node = state.quotas.get(queue)
            if node is None or queue in state.owing_held:
                return None
            if -node.depth != entry[2]:
                self.stale.append(entry)
                return (entry[0], OVERUSE, -node.depth, queue, "")
            return entry
        uid = entry[4]
        since = state.starving_since.get(uid)
        if since is None or since + round(settings.reclaim_after_s * 1000) != entry[0]:
            self.stale.append(entry)
            return None
        pod_quota = state.pod_quota.get(uid)
        if pod_quota is None or uid in state.starving_held:
            return None
        depth = -_depth(state, pod_quota)
        if pod_quota != entry[3] or depth != entry[2]:
            self.stale.append(entry)
            return (entry[0], RECLAIM, depth, pod_quota, uid)
        return entry

    def scan(self, state: ProjectedState) -> Iterator[Entry]:
        """The armed timers, fresh, by deadline (call :meth:`refresh` first).
        Within one deadline the order may differ from firing order when a
        queue moved or a pod changed quota since it was indexed: a caller that
        needs firing order sorts what it takes."""
        entries = self.entries
        fresh = self.fresh
        i = 0
        # the list does not change while scanning: fixes wait in ``stale``
        while i < len(entries):
            current = fresh(state, entries[i])
            if current is not None:
                yield current
            i += 1

    def armed(self, state: ProjectedState, source: tuple[int, str], deadline: int) -> bool:
        """Is the timer of ``source`` (rank, queue or pod uid) armed at ``deadline``?"""
        entry = self.by_source.get(source)
        if entry is None or entry[0] != deadline:
            return False
        return self.fresh(state, entry) is not None

    def mark_queue(self, queue: str) -> None:
        """An owing clock of ``queue`` started, stopped or was released."""
        self.marked_queues.add(queue)
        changed = self.changed_queues
        changed.add(queue)
        if len(changed) > CHANGES_KEPT:
            self.take_changes()

    def mark_pod(self, uid: str) -> None:
        """A starvation clock of ``uid`` started, stopped or was released."""
        self.marked_pods.add(uid)
        changed = self.changed_pods
        changed.add(uid)
        if len(changed) > CHANGES_KEPT:
            self.take_changes()

    # ---------------------------------------------------------------- readers

    def take_changes(self) -> tuple[set[str], set[str]]:
        """The changed sources (pods, queues) since the last take; they start
        afresh and ``changes`` moves by one."""
        pods, queues = self.changed_pods, self.changed_queues
        self.changed_pods = set()
        self.changed_queues = set()
        self.changes += 1
        return pods, queues

    def park(self, source: tuple[int, str], deadline: int, queue: str) -> None:
        """Set the entry of ``source`` aside while its timer key is ``deadline``
        on ``queue`` (the parker handled that timer); nothing when it is not."""
        if source in self.parked:
            return
        entry = self.by_source.get(source)
        if entry is None or entry[0] != deadline or entry[3] != queue:
            return
        entries = self.entries
        i = bisect_left(entries, entry)
        if i < len(entries) and entries[i] == entry:
            del entries[i]
            self.parked[source] = entry

    def unpark(self, source: tuple[int, str]) -> None:
        """Put the entry of ``source`` back among ``entries`` (if parked)."""
        entry = self.parked.pop(source, None)
        if entry is not None:
            insort(self.entries, entry)

    def unpark_all(self, parker: object) -> None:
        """Every parked entry back; ``parker`` parks from now on."""
        if self.parked:
            self.entries.extend(self.parked.values())
            self.entries.sort()
            self.parked = {}
        self.parker = parker


def _settings_key(state: ProjectedState) -> tuple[object, ...]:
    s = state.settings
    return (
        s.quota_preemption_enabled,
        s.revoke_enabled,
        s.revoke_after_s,
        s.reclaim_enabled,
        s.reclaim_after_s,
    )


def touch_pod(state: ProjectedState, uid: str) -> None:
    """The fold changed a timer input of pod ``uid`` (its quota, a hold, a
    clock ended): tell the state's timer index, if it has one."""
    index = state.timer_index
    if isinstance(index, TimerIndex):
        changed = index.changed_pods
        changed.add(uid)
        if len(changed) > CHANGES_KEPT:
            index.take_changes()  # nobody takes them: a reader sweeps all


def touch_queue(state: ProjectedState, queue: str) -> None:
    """The fold changed a timer input of quota ``queue`` (a hold, a clock
    ended, the quota removed): tell the state's timer index, if it has one."""
    index = state.timer_index
    if isinstance(index, TimerIndex):
        changed = index.changed_queues
        changed.add(queue)
        if len(changed) > CHANGES_KEPT:
            index.take_changes()


def timer_index(state: ProjectedState) -> TimerIndex:
    """The state's timer index, refreshed (made on first use)."""
    index = state.timer_index
    if not isinstance(index, TimerIndex):
        index = state.timer_index = TimerIndex()
    index.refresh(state)
    return index
