"""The engine's decision core: timers, proposals, completions (DESIGN §6).

Synchronous and clock-free: the caller says what time it is. Both drivers —
``simulate`` on a virtual clock and the live engine on the wall clock — use
it the same way:

1. apply every record read back from the ledger to ``projection``;
2. ask :meth:`EngineCore.due` which timers are due *now* and
   :meth:`EngineCore.propose` the decisions for each (they are appended, and
   acted on only once read back and accepted by the projection);
3. ask :meth:`EngineCore.finished` for preemptions whose evictions all have
   an outcome, and :meth:`EngineCore.outstanding` for evictions to drive.

Deadlines come from ledger ``ts`` (the projection's timers and clocks), so a
restart never postpones one.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from quotaledger.events.model import (
    ClocksObserved,
    Event,
    EvictionRequested,
    PreemptionCause,
    PreemptionFinished,
    PreemptionOutcome,
    PreemptionStarted,
)
from quotaledger.projections import Projection
from quotaledger.projections.clocks import observation
from quotaledger.projections.plans import (
    Plan,
    decrease_plan,
    met,
    overuse_plan,
    reclaim_plan,
)
from quotaledger.projections.resources import RL, add_into
from quotaledger.projections.state import EvictionRun, ProjectedState
from quotaledger.projections.timers import Entry, TimerIndex, all_timers

from .handled import CAUSES, HandledSweep, TimerKey

#: §8 rule 27: at one instant, quota-decrease before overuse before reclaim.
CAUSE_ORDER: dict[PreemptionCause, int] = {"quota-decrease": 0, "overuse": 1, "reclaim": 2}


@dataclass(frozen=True, order=True, slots=True)
class Timer:
    """A pending reconciler deadline; ordering is §8 rule 27's."""

    deadline: int
    cause_rank: int
    depth_rank: int  # negative depth: deeper first
    queue: str
    pod_uid: str = ""  # reclaim: the starving pod
    cause: PreemptionCause = field(default="quota-decrease", compare=False)

    @property
    def key(self) -> TimerKey:
        return (self.cause, self.queue, self.pod_uid, self.deadline)


def _timer(entry: Entry) -> Timer:
    return Timer(entry[0], entry[1], entry[2], entry[3], entry[4], CAUSES[entry[1]])


def _key(entry: Entry) -> TimerKey:
    return (CAUSES[entry[1]], entry[3], entry[4], entry[0])


def timers(state: ProjectedState) -> list[Timer]:
    """Every armed timer whose setting is on, in firing order (a full listing;
    the engine's own looks use the state's :class:`~quotaledger.projections.timers.TimerIndex`,
    which gives the same timers).

    Overuse and reclaim deadlines come from the clocks in force, i.e. the
    ``ClocksObserved`` records folded so far (:meth:`EngineCore.observe`
    writes them); a stale clock yields no plan when fired."""
    return [_timer(entry) for entry in all_timers(state)]


@dataclass(slots=True)
class EngineCore:
    """Decides; never does I/O. ``instance``/``epoch`` fence a stale writer.

    ``sealed_through`` is an offset through which the driver knows it has
    applied every appended batch whole (the end of its own last append read
    back, or the tail it restored to); see :meth:`finished`.

    ``handled`` holds the timers already proposed, so each is proposed once.
    It only ever holds timers that are still armed (DECISIONS 63): a timer
    that is no longer armed (its deadline consumed, its clock stopped) is
    dropped at the next look, so the set stays as small as the timers. A
    key leaves ``handled`` while its timer is still armed in two ways, and
    the timer is then pending again: :meth:`reopen_if_refused` (the proposal
    was refused) and :meth:`revisit` (a quota-decrease timer that proposed
    nothing, once the state has moved past the offset it was evaluated at:
    ``empty_at``, DECISIONS 210).

    A look re-tests only the handled timers whose source the fold changed
    since the last look (the timer index's changed sources) and those handled
    since; it sweeps them all after anything it cannot follow: the first
    look, a new state or index, the index rebuilt or its changes taken by
    another reader, ``handled`` replaced or resized from outside this class
    (DECISIONS 350). Handled timers are parked in the index, out of the
    looks' walk.
    """

    projection: Projection
    instance: str = "engine"
    epoch: int = 0
    handled: set[TimerKey] = field(default_factory=set)
    sealed_through: int = -1
    #: refused timers: key -> (refusals so far, earliest ms to propose again)
    backoff: dict[tuple[str, str, str, int], tuple[int, int]] = field(default_factory=dict)
    backoff_base_ms: int = 250
    backoff_max_ms: int = 30_000
    #: quota-decrease timers whose target was empty (§8 rule 21: nothing
    #: proposed): key -> the state offset they were evaluated at (DECISIONS 210)
    empty_at: dict[TimerKey, int] = field(default_factory=dict)
    #: the look's bookkeeping of ``handled`` (DECISIONS 350)
    _sweep: HandledSweep = field(
        default_factory=HandledSweep, init=False, repr=False, compare=False
    )

    @property
    def state(self) -> ProjectedState:
        return self.projection.state

    def _look(self) -> TimerIndex:
        """The state's timer index, brought up to date; handled timers that are
        no longer armed are forgotten (DECISIONS 63), as at every look: those
        whose source the fold changed since the last look, and those handled
        since, are tested again (``engine.handled``, DECISIONS 350)."""
        return self._sweep.look(self.state, self.handled)

    def _waiting(self, index: TimerIndex) -> Iterator[Entry]:
        """The armed timers not handled, fresh, by deadline (after
        :meth:`_look`). Handled timers are parked out of ``index.entries``
        where the index's entry is their key; any other entry whose key is
        handled is skipped on the entry as it stands, before it is freshened:
        after the look's sweep every handled key is armed, and a source has
        one armed key, so an entry whose key is handled freshens to that same
        key (a stale depth aside) and would be skipped anyway."""
        state = self.state
        handled = self.handled
        if not handled:
            yield from index.scan(state)
            return
        fresh = index.fresh
        # the list does not change while scanning: fixes wait in ``stale``
        for entry in index.entries:
            if (CAUSES[entry[1]], entry[3], entry[4], entry[0]) in handled:
                continue
            current = fresh(state, entry)
            if current is not None:
                yield current

    def pending(self) -> list[Timer]:
        """Timers not yet handled, waiting or due, in firing order. Forgets
        handled timers that are no longer armed."""
        state = self.state
        index = self._look()
        occupied = state.occupied
        waiting = sorted(
            entry
            for entry in self._waiting(index)
            if entry[3] not in occupied  # §8 rule 34: waits for the running one
        )
        return [_timer(entry) for entry in waiting]

    def ready_at(self, timer: Timer) -> int:
        """When ``timer`` may be proposed: its deadline, or later while it backs
        off after a refusal (see :meth:`reopen_if_refused`)."""
        held = self.backoff.get((timer.cause, timer.queue, timer.pod_uid, timer.deadline))
        return timer.deadline if held is None else max(timer.deadline, held[1])

    def _ready_at(self, entry: Entry) -> int:
        if not self.backoff:
            return entry[0]
        held = self.backoff.get(_key(entry))
        return entry[0] if held is None else max(entry[0], held[1])

    def next_deadline(self, before: int | None = None) -> int | None:
        """The earliest time a pending timer may fire (only looking before
        ``before`` if given).

        Scans the timers by deadline and stops at the first deadline no
        earlier than the best time found (a timer is never ready before its
        deadline), so a look costs the timers passed over, not all of them."""
        state = self.state
        index = self._look()
        occupied = state.occupied
        best = before
        found = False
        for entry in self._waiting(index):
            if best is not None and entry[0] >= best:
                break
            if entry[3] in occupied:
                continue
            at = self._ready_at(entry)
            if best is None or at < best:
                best = at
                found = True
        return best if found else None

    def due(self, now: int) -> list[Timer]:
        """The pending timers ready at ``now``, in firing order."""
        state = self.state
        index = self._look()
        occupied = state.occupied
        ready: list[Entry] = []
        for entry in self._waiting(index):
            if entry[0] > now:
                break
            if entry[3] in occupied:
                continue
            if self._ready_at(entry) <= now:
                ready.append(entry)
        ready.sort()
        return [_timer(entry) for entry in ready]

    def plan(self, timer: Timer) -> Plan | None:
        if timer.cause == "quota-decrease":
            return decrease_plan(self.state, timer.queue)
        if timer.cause == "reclaim":
            return reclaim_plan(self.state, timer.pod_uid)
        return overuse_plan(self.state, timer.queue)

    def propose(self, timer: Timer) -> list[Event]:
        """The decisions for one due timer (empty when there is nothing to do).

        ``basis`` is the offset of the last record the plan was computed from.
        A timer is proposed once; if the projection refuses the proposal (a
        race with another writer) the state it leaves decides what comes next
        (see :meth:`reopen_if_refused`). A timer whose queue is occupied is not
        handled: it waits for the running preemption (§8 rule 34). A
        quota-decrease timer with an empty target proposes nothing and is
        handled only for the state it was evaluated on (``empty_at``; see
        :meth:`revisit` and :meth:`disarm_at`, DECISIONS 210).
        """
        state = self.state
        if timer.queue in state.occupied:
            return []
        self._sweep.handle(self.handled, timer.key)
        if timer.queue not in state.quotas:
            return []
        plan = self.plan(timer)
        if plan is None:
            if timer.cause == "quota-decrease":
                if len(self.empty_at) > 2 * len(state.decrease_deadlines) + 64:
                    self._forget_disarmed()
                self.empty_at[timer.key] = state.offset
            return []
        basis = state.offset
        preemption_id = f"{plan.cause}/{plan.queue}/{basis}"
        if plan.pod_uid is not None:
            preemption_id += f"/{plan.pod_uid}"
        events: list[Event] = [
            PreemptionStarted(
                preemption_id=preemption_id,
                queue=plan.queue,
                cause=plan.cause,
                target=plan.target,
                basis=basis,
                epoch=self.epoch,
                pod_uid=plan.pod_uid,
            )
        ]
        for victim in plan.victims:
            events.append(
                EvictionRequested(
                    eviction_id=f"{preemption_id}/{victim.pod_uid}",
                    preemption_id=preemption_id,
                    pod_uid=victim.pod_uid,
                    queue=victim.queue,
                    explain=victim.explain,
                    epoch=self.epoch,
                    instance=self.instance,
                )
            )
        if not plan.victims:
            events.append(
                PreemptionFinished(
                    preemption_id=preemption_id,
                    queue=plan.queue,
                    outcome="not-helpful",
                    claimed={},
                    reason=plan.reason,
                    epoch=self.epoch,
                )
            )
        return events

    def reopen_if_refused(
        self, timer: Timer, proposal: Sequence[Event], now: int | None = None
    ) -> None:
        """Once ``proposal`` (for ``timer``) is read back: if the projection
        refused its ``PreemptionStarted`` because another writer's preemption
        occupied the queue first, the timer is pending again. It waits for that
        preemption and is then evaluated on the state of that time (§8 rule 34);
        if the other preemption answered the same deadline, the timer is gone.

        With ``now`` (the live engine), a refused timer also backs off: it is
        not proposed again before ``now + base × 2^(refusals-1)`` (capped at
        ``backoff_max_ms``), so a refusal whose cause persists (another writer
        keeps winning, a fence this engine does not see coming) costs a bounded
        number of refused records instead of one per reconciler round
        (DECISIONS 51).
        """
        started = proposal[0] if proposal else None
        if not isinstance(started, PreemptionStarted):
            return
        state = self.state
        key = (timer.cause, timer.queue, timer.pod_uid, timer.deadline)
        if (
            started.preemption_id in state.preemptions
            or started.preemption_id in state.finished_preemptions
        ):
            # accepted (ours, or an identical proposal of another engine)
            self.backoff.pop(key, None)
            return
        self._sweep.let_go(self.handled, timer.key)
        if now is None:
            return
        refusals = self.backoff.get(key, (0, 0))[0] + 1
        wait = min(self.backoff_base_ms << min(refusals - 1, 30), self.backoff_max_ms)
        self.backoff[key] = (refusals, now + wait)
        if len(self.backoff) > 4 * len(self.handled) + 1024:
            alive = {t.key for t in timers(state)}
            self.backoff = {k: v for k, v in self.backoff.items() if k in alive}

    def revisit(self) -> None:
        """Make pending again every quota-decrease timer that proposed nothing
        on a state older than the current one (DECISIONS 210).

        "Nothing to do" was true of the records it was evaluated on; a record
        read since (a pod stamped at the deadline that landed after the look)
        may have made the target non-empty, and the fold keeps such a
        deadline armed (it disarms only an empty one, DECISIONS 14). Whatever
        the projection holds as an armed, passed deadline is thus evaluated
        again, now, on the state at hand. The live engine calls this before
        each round; ``simulate`` need not (its facts stamped at or before a
        deadline are all applied before the deadline fires, §8 rule 27, and
        decisions never grow a target)."""
        if not self.empty_at:
            return
        offset = self.state.offset
        self._forget_disarmed()
        for key, at in list(self.empty_at.items()):
            if at != offset:
                del self.empty_at[key]
                self._sweep.let_go(self.handled, key)

    def _forget_disarmed(self) -> None:
        deadlines = self.state.decrease_deadlines
        for key in [k for k in self.empty_at if deadlines.get(k[1]) != k[3]]:
            del self.empty_at[key]

    def disarm_at(self) -> int | None:
        """When the ledger needs a record to disarm a passed quota-decrease
        deadline with an empty target (§8 rule 21; DECISIONS 14, 210).

        The fold disarms such a deadline at the first record stamped after
        both the deadline and the state's ts, if the target is still empty
        just before it. For every timer this engine found empty on the
        current state (offset unchanged since) whose deadline is still
        armed, on a free queue, with the setting on: ``max(deadline, ts) +
        1``, the earliest; None when there is none. The driver appends
        :meth:`disarm_record` once its clock reaches it, so that "disarmed"
        is something every reader of the ledger sees."""
        state = self.state
        if not self.empty_at or not state.settings.quota_preemption_enabled:
            return None
        at: int | None = None
        for (_, queue, _, deadline), offset in self.empty_at.items():
            if (
                offset == state.offset
                and state.decrease_deadlines.get(queue) == deadline
                and queue not in state.occupied
            ):
                due = max(deadline, state.ts) + 1
                at = due if at is None else min(at, due)
        return at

    def disarm_record(self, now: int) -> ClocksObserved:
        """The record that carries the ledger's time past the deadlines of
        :meth:`disarm_at`: the clocks sampled at ``now`` (DECISIONS 13), or,
        when no clock started or stopped, a ``ClocksObserved`` that starts and
        stops nothing (the engine's clock read ``now``; the fold changes no
        clock for it). Its ts is the ledger's, at least ``now``."""
        event = self.observe(now)
        if event is None:
            event = ClocksObserved(basis=self.state.offset, epoch=self.epoch)
        return event

    def observe(self, now: int) -> ClocksObserved | None:
        """Sample the overuse and starvation clocks at ``now`` (DECISIONS 13):
        the record to append, or None when no clock started or stopped."""
        if not (self.state.settings.revoke_enabled or self.state.settings.reclaim_enabled):
            return None
        event = observation(self.state, now)
        if event is not None:
            event.epoch = self.epoch
        return event

    def outstanding(self, *, mine_only: bool = False) -> list[EvictionRun]:
        """Requested evictions without an outcome: the executors' work.

        With ``mine_only``, only those this instance proposed, plus those of
        an older epoch when this instance holds the newest (a fenced writer's
        work is taken over by the leader)."""
        state = self.state
        runs = [run for run in state.evictions.values() if run.outcome is None]
        if not mine_only:
            return runs
        leader = self.epoch > 0 and self.epoch == state.leader_epoch
        return [
            run
            for run in runs
            if run.instance == self.instance or (leader and run.epoch < self.epoch)
        ]

    def finished(self) -> list[PreemptionFinished]:
        """``PreemptionFinished`` for every running preemption whose evictions
        all have an outcome (DESIGN §6; outcomes per §8 rule 26).

        The revoke outcome compares used with runtime, which are derived
        numbers: settle first, or a PodRemoved just applied is not counted.

        A preemption none of whose evictions was accepted (the guard refused
        every victim: another writer's preemption took the pod or its queue
        first) finishes ``not-helpful``, but only once its proposal is known to
        be applied whole: the proposer appends ``PreemptionStarted`` and its
        ``EvictionRequested`` as one batch, and a batch that starts at or
        before ``sealed_through`` ends there at the latest.
        """
        if not self.projection.state.preemptions:
            return []
        state = self.projection.settled()
        out: list[PreemptionFinished] = []
        for run in sorted(state.preemptions.values(), key=lambda r: r.started_offset):
            evictions = [state.evictions[e] for e in run.evictions if e in state.evictions]
            if not run.evictions:
                if run.started_offset <= self.sealed_through:
                    out.append(
                        PreemptionFinished(
                            preemption_id=run.preemption_id,
                            queue=run.queue,
                            outcome="not-helpful",
                            claimed={},
                            reason="every eviction was refused by the guard",
                            epoch=self.epoch,
                        )
                    )
                continue
            if not evictions or any(e.outcome is None for e in evictions):
                continue
            claimed: RL = {}
            for eviction in evictions:
                if eviction.outcome == "succeeded":
                    add_into(claimed, eviction.requests)
            succeeded = any(e.outcome == "succeeded" for e in evictions)
            if run.cause == "overuse":
                node = state.quotas.get(run.queue)
                complete = node is not None and all(
                    node.used.get(key, 0) <= node.runtime.get(key, 0) for key in run.target
                )
            else:
                complete = met(claimed, run.target, state.settings.preemption_miss_percent)
            outcome: PreemptionOutcome
            if complete or succeeded:
                outcome = "complete" if complete else "best-effort"
            else:
                outcome = "not-helpful"
            reason = "" if outcome == "complete" else "target not met"
            out.append(
                PreemptionFinished(
                    preemption_id=run.preemption_id,
                    queue=run.queue,
                    outcome=outcome,
                    claimed={k: claimed[k] for k in sorted(claimed)},
                    reason=reason,
                    epoch=self.epoch,
                )
            )
        return out
