"""Quota-decrease timers and the one-preemption-per-queue guard (DESIGN §6, §8 19-21, 34).

The guard lives in the projection, so it is applied in ledger order: it holds
across restarts and with two engines writing one ledger. A ``PreemptionStarted``
is refused while its queue is occupied, when its leader epoch is stale, when its
``preemption_id`` was used before, or when the timer it answers no longer holds
at its own offset (DECISIONS 211); a preemption occupies its queue and every
queue it evicts from until its ``PreemptionFinished``. An eviction is refused
for a pod already being evicted.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping

from quotaledger.events.model import (
    EvictionFailed,
    EvictionRequested,
    EvictionSucceeded,
    LeaderElected,
    PreemptionFinished,
    PreemptionStarted,
    QuotaUpserted,
)
from quotaledger.events.times import seconds_ms

from .pods import flush_sums
from .resources import fits
from .state import FINISHED_KEPT, EvictionOutcome, EvictionRun, PreemptionRun, ProjectedState
from .timers import touch_pod, touch_queue

_UNLIMITED = float("inf")


def _limit(amounts: Mapping[str, int] | None, key: str) -> float:
    if amounts is None or key not in amounts:
        return _UNLIMITED
    return amounts[key]


def only_raised(old: Mapping[str, int] | None, new: Mapping[str, int] | None) -> bool:
    """§8 rule 20: no resource lowered and some raised (absent/null = unlimited)."""
    keys = set(old or {}) | set(new or {})
    lowered = any(_limit(new, key) < _limit(old, key) for key in keys)
    raised = any(_limit(new, key) > _limit(old, key) for key in keys)
    return raised and not lowered


def delay_ms(config: QuotaUpserted) -> int:
    """§8 rule 3: ``round(delay × 1000)`` ms, clamped to the §9 bound (decoding
    refuses more; a struct built otherwise must still give a valid deadline)."""
    return seconds_ms(config.preemption_delay_s)


def on_quota_change(
    state: ProjectedState, previous: QuotaUpserted | None, config: QuotaUpserted, ts: int
) -> None:
    """Re-evaluate a queue's quota-decrease timer after a change of its max or delay.

    Disarmed if the delay is 0, if used fits the new max, or if the change only
    raised max (delay unchanged); otherwise armed at ``ts + delay`` — a reset,
    not a continuation (DESIGN §6 rule 1).
    """
    old_max = previous.max if previous is not None else None
    old_delay = previous.preemption_delay_s if previous is not None else 0.0
    max_changed = previous is None or old_max != config.max
    delay_changed = old_delay != config.preemption_delay_s
    if not (max_changed or delay_changed):
        return
    name = config.name
    if delay_ms(config) <= 0:  # also a NaN delay a struct built in Python may hold
        state.decrease_deadlines.pop(name, None)
        return
    if not delay_changed and only_raised(old_max, config.max):
        state.decrease_deadlines.pop(name, None)
        return
    if fits(current_used(state, name), config.max):
        state.decrease_deadlines.pop(name, None)
        return
    state.decrease_deadlines[name] = ts + delay_ms(config)


def current_used(state: ProjectedState, name: str) -> dict[str, int]:
    """A quota's used straight from its pods' sums, without settling the tree:
    a leaf's ``pod_used``, a parent's Σ over its descendant leaves (§5)."""
    total: dict[str, int] = {}
    stack = [name]
    while stack:
        node = state.quotas[stack.pop()]
        if node.config.is_parent:
            stack.extend(state.children(node.config.name))
        else:
            flush_sums(state, node)
            for key, value in node.pod_used.items():
                total[key] = total.get(key, 0) + value
    return total


def on_leader(state: ProjectedState, event: LeaderElected) -> str | None:
    """A new epoch must exceed the current one; the accepted claim's instance
    holds it (two engines claiming the same epoch: the first one read wins)."""
    if event.epoch <= state.leader_epoch:
        return f"epoch: {event.epoch} is not newer than {state.leader_epoch}"
    state.leader_epoch = event.epoch
    state.leader_instance = event.instance
    return None


def on_started(state: ProjectedState, event: PreemptionStarted, offset: int, ts: int) -> str | None:
    """Admit a preemption, or say why the guard refuses it.

    A decision is accepted only where it is justified at its own offset
    (DECISIONS 211): besides a current epoch, a known and free queue and a
    ``preemption_id`` never started before, the trigger it answers must still
    hold at ``ts`` (:func:`trigger_gone`). Two engines deciding from stale
    views can thus never run one trigger twice: the first accepted answer
    consumes it (a deadline popped, a clock held when the preemption ends)."""
    if event.epoch < state.leader_epoch:
        return f"epoch: stale leader epoch {event.epoch} < {state.leader_epoch}"
    if event.queue not in state.quotas:
        return f"queue: unknown quota {event.queue!r}"
    if (
        event.preemption_id in state.preemptions
        or event.preemption_id in state.finished_preemptions
    ):
        return f"preemption_id: {event.preemption_id!r} already used"
    holder = state.occupied.get(event.queue)
    if holder is not None:
        return f"queue: {event.queue!r} is occupied by preemption {holder!r}"
    gone = trigger_gone(state, event, ts)
    if gone is not None:
        return gone
    state.preemptions[event.preemption_id] = PreemptionRun(
        preemption_id=event.preemption_id,
        queue=event.queue,
        cause=event.cause,
        target=dict(event.target),
        started_offset=offset,
        started_ts=ts,
        pod_uid=event.pod_uid,
        occupied=[event.queue],
    )
    state.occupied[event.queue] = event.preemption_id
    if event.cause == "quota-decrease":
        state.decrease_deadlines.pop(event.queue, None)
    return None


def trigger_gone(state: ProjectedState, event: PreemptionStarted, ts: int) -> str | None:
    """Why the timer a ``PreemptionStarted`` answers is not armed and due at
    ``ts`` on ``state`` (None when it is), DECISIONS 211. The timers are the
    engine's (DESIGN §6 rules 1-3, §8 rules 19, 29, 31):

    * quota-decrease: ``quota_preemption_enabled`` and the queue's deadline
      armed and at or before ``ts``;
    * overuse: ``revoke_enabled``, the queue's owing clock running and not
      held, and ``since + revoke_after_s`` at or before ``ts``;
    * reclaim: ``reclaim_enabled``, ``pod_uid`` an active pod of the queue, its
      starving clock running and not held, and ``since + reclaim_after_s`` at
      or before ``ts``.
    """
    settings = state.settings
    queue = event.queue
    if event.cause == "quota-decrease":
        if not settings.quota_preemption_enabled:
            return "cause: quota-decrease preemption is disabled (quota_preemption_enabled)"
        deadline = state.decrease_deadlines.get(queue)
        if deadline is None:
            return f"queue: {queue!r} has no armed quota-decrease deadline"
    elif event.cause == "overuse":
        if not settings.revoke_enabled:
            return "cause: overuse revoke is disabled (revoke_enabled)"
        if queue in state.owing_held:
            return f"queue: {queue!r} overuse clock is held after its last revoke"
        since = state.owing_since.get(queue)
        if since is None:
            return f"queue: {queue!r} has no running overuse clock"
        deadline = since + round(settings.revoke_after_s * 1000)
    elif event.cause == "reclaim":
        if not settings.reclaim_enabled:
            return "cause: starvation reclaim is disabled (reclaim_enabled)"
        uid = event.pod_uid
        if uid is None:
            return "pod_uid: a reclaim names its starving pod"
        if state.pod_quota.get(uid) != queue:
            return f"pod_uid: {uid!r} is not an active pod of {queue!r}"
        if uid in state.starving_held:
            return f"pod_uid: {uid!r} starvation clock is held after its last reclaim"
        since = state.starving_since.get(uid)
        if since is None:
            return f"pod_uid: {uid!r} has no running starvation clock"
        deadline = since + round(settings.reclaim_after_s * 1000)
    else:  # a cause the decoder admits is one of the three
        return f"cause: unknown cause {event.cause!r}"
    if deadline > ts:
        timer = "deadline" if event.cause == "quota-decrease" else f"{event.cause} deadline"
        return f"queue: {queue!r} {timer} {deadline} is after {ts}"
    return None


def on_eviction(state: ProjectedState, event: EvictionRequested, offset: int) -> str | None:
    """Admit an eviction of a running preemption; it occupies the pod's queue."""
    if event.epoch < state.leader_epoch:
        return f"epoch: stale leader epoch {event.epoch} < {state.leader_epoch}"
    run = state.preemptions.get(event.preemption_id)
    if run is None:
        return f"preemption_id: {event.preemption_id!r} is not running"
    if event.eviction_id in state.evictions:
        return f"eviction_id: {event.eviction_id!r} already requested"
    if event.pod_uid in state.evicting_pods:
        return f"pod_uid: {event.pod_uid!r} is already being evicted"
    if event.pod_uid in state.evicted_pods:
        return f"pod_uid: {event.pod_uid!r} was already evicted"
    queue = state.pod_quota.get(event.pod_uid)
    if queue is None:
        return f"pod_uid: {event.pod_uid!r} is not an active pod"
    holder = state.occupied.get(queue)
    if holder is not None and holder != event.preemption_id:
        return f"queue: {queue!r} is occupied by preemption {holder!r}"
    state.occupied[queue] = event.preemption_id
    if queue not in run.occupied:
        run.occupied.append(queue)
    run.evictions.append(event.eviction_id)
    state.evictions[event.eviction_id] = EvictionRun(
        eviction_id=event.eviction_id,
        preemption_id=event.preemption_id,
        pod_uid=event.pod_uid,
        queue=queue,
        requested_offset=offset,
        requests=dict(state.pods[event.pod_uid].requests),
        instance=event.instance,
        epoch=event.epoch,
    )
    state.evicting_pods[event.pod_uid] = event.eviction_id
    return None


def settle_eviction(state: ProjectedState, eviction_id: str, outcome: EvictionOutcome) -> None:
    """Record an eviction's outcome (idempotent: the first outcome wins)."""
    run = state.evictions.get(eviction_id)
    if run is None or run.outcome is not None:
        return
    run.outcome = outcome
    if state.evicting_pods.get(run.pod_uid) == eviction_id:
        del state.evicting_pods[run.pod_uid]
    if outcome == "succeeded" and run.pod_uid in state.pods:
        state.evicted_pods[run.pod_uid] = eviction_id


def on_eviction_outcome(
    state: ProjectedState, event: EvictionSucceeded | EvictionFailed
) -> str | None:
    """Idempotent by eviction_id: a repeated or late outcome is a no-op."""
    outcome: EvictionOutcome = "succeeded" if isinstance(event, EvictionSucceeded) else "failed"
    settle_eviction(state, event.eviction_id, outcome)
    return None


def on_pod_gone(state: ProjectedState, uid: str) -> None:
    """A pod removed or no longer running: its eviction (if any) succeeded."""
    eviction_id = state.evicting_pods.get(uid)
    if eviction_id is not None:
        settle_eviction(state, eviction_id, "succeeded")


def on_finished(state: ProjectedState, event: PreemptionFinished, offset: int) -> str | None:
    """End a preemption: free every queue it occupied, and remember its id
    (the last :data:`FINISHED_KEPT` finished, by offset: DECISIONS 62)."""
    run = state.preemptions.get(event.preemption_id)
    if run is None:
        return f"preemption_id: {event.preemption_id!r} is not running"
    for queue in run.occupied:
        if state.occupied.get(queue) == run.preemption_id:
            del state.occupied[queue]
    for eviction_id in run.evictions:
        eviction = state.evictions.pop(eviction_id, None)
        if eviction is not None and state.evicting_pods.get(eviction.pod_uid) == eviction_id:
            del state.evicting_pods[eviction.pod_uid]
    del state.preemptions[run.preemption_id]
    remember_finished(state, run.preemption_id, offset)
    if run.cause == "overuse":
        state.owing_held.add(run.queue)
        state.owing_since.pop(run.queue, None)
        touch_queue(state, run.queue)  # its timer ends (DECISIONS 350)
    elif run.cause == "reclaim" and run.pod_uid is not None:
        state.starving_held.add(run.pod_uid)
        state.starving_since.pop(run.pod_uid, None)
        touch_pod(state, run.pod_uid)
    return None


def remember_finished(state: ProjectedState, preemption_id: str, offset: int) -> None:
    """Keep a finished preemption's id so a duplicate ``PreemptionStarted``
    (a retried append, DESIGN §10) is refused; only the :data:`FINISHED_KEPT`
    most recently finished are kept, a function of the ledger alone."""
    finished = state.finished_preemptions
    finished[preemption_id] = offset
    order = state.finished_order
    if isinstance(order, _FinishedOrder) and order.source is finished:
        heapq.heappush(order.heap, (offset, preemption_id))
    if len(finished) > FINISHED_KEPT:
        del finished[_oldest(state)]


class _FinishedOrder:
    """``finished_preemptions`` as a heap of ``(offset, id)``, so the oldest is
    found without a scan; entries whose id left the map or finished again are
    skipped (offsets are unique, so the heap's least valid entry is the
    map's least offset)."""

    __slots__ = ("heap", "source")

    def __init__(self, source: dict[str, int]) -> None:
        self.source = source
        self.heap = [(offset, name) for name, offset in source.items()]
        heapq.heapify(self.heap)


def _oldest(state: ProjectedState) -> str:
    """The id in ``finished_preemptions`` with the least offset."""
    finished = state.finished_preemptions
    order = state.finished_order
    if not isinstance(order, _FinishedOrder) or order.source is not finished:
        order = state.finished_order = _FinishedOrder(finished)
    heap = order.heap
    while heap:
        offset, name = heap[0]
        if finished.get(name) == offset:
            heapq.heappop(heap)
            return name
        heapq.heappop(heap)
    raise KeyError("finished_preemptions is empty")
