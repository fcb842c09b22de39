"""Overuse and starvation clocks (DESIGN §6 rules 2-3, §8 rules 28-29, 31; DECISIONS 13).

A leaf quota is *owing* while ``min(used, max) > runtime`` on some resource its
max lists (all of them when max is null): other quotas are entitled to what it
holds. A pod *starves* per §8 rule 31.

The engine samples the clocks (:func:`observation`: at every instant in
``simulate``, at most once a second live) and writes what started and stopped
as a ``ClocksObserved`` record; the fold only applies those records
(:func:`apply_observation`), so clocks are a function of the ledger and replay
never pays for sampling. A quota owing at a sample starts (or keeps) its clock
at that sample's time; one that stops owing loses it. After a revoke the
quota's clock is held until the next fact, which lets it start again.
"""

from __future__ import annotations

from bisect import bisect_right

from quotaledger.events.model import ClocksObserved

from .derive import settle, top_quotas
from .resources import RL
from .state import BUILTIN, ProjectedState, QuotaNode
from .timers import TimerIndex


def _numbers(node: QuotaNode, key: str) -> tuple[int, int]:
    """``(used, runtime)`` of one resource, read from the quota's row: what
    ``node.used.get(key, 0)`` and ``node.runtime.get(key, 0)`` give, without
    building the quota's dicts."""
    store = node.store
    if store is None:
        return 0, 0
    columns = store.columns.get(key)
    if columns is None:
        return 0, 0
    row = node.row
    return columns.used[row], columns.runtime[row]


def owed(node: QuotaNode) -> RL:
    """``min(used, max) − runtime`` per compared resource, where positive (§8 rule 30
    takes ``used − runtime`` as the revoke target; this is the entitlement gap),
    in the order of max's resources, or sorted when max is null."""
    cap = node.config.max
    out: RL = {}
    if cap is None:
        used, runtime = node.used, node.runtime
        for key in sorted(used.keys() | runtime.keys()):
            gap = used.get(key, 0) - runtime.get(key, 0)
            if gap > 0:
                out[key] = gap
        return out
    for key, limit in cap.items():
        held, runtime_of = _numbers(node, key)
        if limit < held:
            held = limit
        gap = held - runtime_of
        if gap > 0:
            out[key] = gap
    return out


def is_owing(node: QuotaNode) -> bool:
    """A connected leaf (not system/default) holding more than its runtime
    (``owed`` not empty)."""
    config = node.config
    if config.is_parent or not node.connected or config.name in BUILTIN:
        return False
    cap = config.max
    if cap is None:
        return bool(owed(node))
    for key, limit in cap.items():
        held, runtime_of = _numbers(node, key)
        if min(held, limit) > runtime_of:
            return True
    return False


def free_capacity(state: ProjectedState) -> RL:
    """Cluster total − Σ used of all quotas (§8 rule 31); system and default
    are already off the total."""
    free = dict(state.cluster_total)
    for node in top_quotas(state):
        for key, value in node.used.items():
            free[key] = free.get(key, 0) - value
    return free


def is_starving(state: ProjectedState, uid: str, free: RL) -> bool:
    """§8 rule 31: Pending without a node, its quota has room for it under its
    runtime (on every requested resource its max lists), and the cluster's
    free capacity does not cover its request."""
    pod = state.pods[uid]
    node = state.quotas[state.pod_quota[uid]]
    config = node.config
    if config.is_parent or not node.connected or config.name in BUILTIN:
        return False
    requested = [key for key, value in pod.requests.items() if value > 0]
    if not requested:
        return False
    cap = config.max
    for key in requested:
        if cap is not None and key not in cap:
            continue
        used, runtime = _numbers(node, key)
        if used + pod.requests[key] > runtime:
            return False
    return any(pod.requests[key] > free.get(key, 0) for key in requested)


def _flipped(state: ProjectedState, free: RL) -> set[str]:
    """Pending pods whose "free capacity does not cover it" may have changed
    since the last sample: those whose request lies between the old and the
    new free amount of some resource."""
    out: set[str] = set()
    old = state.free_at_sample
    for key, amounts in state.pending_amounts.items():
        before, after = old.get(key, 0), free.get(key, 0)
        if before == after or not amounts:
            continue
        low, high = min(before, after), max(before, after)
        buckets = state.pending_index[key]
        for amount in amounts[bisect_right(amounts, low) : bisect_right(amounts, high)]:
            out.update(buckets[amount])
    return out


def sampled_starving(state: ProjectedState, now: int | None = None) -> dict[str, int]:
    """The starvation clocks as a sample taken now would leave them (pod uid ->
    since), without mutating them. Kept only while ``reclaim_enabled``.

    Incremental: only pods that changed, pods of quotas whose numbers changed,
    and pods whose coverage by free capacity may have flipped are re-checked;
    the result equals checking every pending pod (tests/test_clocks.py)."""
    if not state.settings.reclaim_enabled:
        return {}
    settle(state)
    free = free_capacity(state)
    if state.starving_full:
        recheck = set(state.pending_pods) | set(state.starving_since)
    else:
        recheck = state.touched_pods | _flipped(state, free)
        for name in state.touched:
            recheck |= state.pending_by_quota.get(name, set())
    clocks = dict(state.starving_since)
    for uid in recheck:
        if uid not in state.pending_pods or not is_starving(state, uid, free):
            clocks.pop(uid, None)
        elif uid not in state.starving_held:
            clocks.setdefault(uid, state.ts if now is None else max(now, state.ts))
    return clocks


def sampled(state: ProjectedState, now: int | None = None) -> dict[str, int]:
    """The owing clocks as a sample taken now would leave them (no mutation
    besides settling derived numbers). The engine reads this at the tail."""
    settle(state)
    quotas = state.quotas
    clocks = dict(state.owing_since)
    # owing depends on used, runtime and max only: every change of those puts
    # the quota in ``touched`` (settle, put_quota, released holds), and a removed
    # quota is dropped from the clocks by drop_quota
    for name in state.touched:
        node = quotas.get(name)
        if node is None or not is_owing(node):
            clocks.pop(name, None)
        elif name not in state.owing_held:
            clocks.setdefault(name, state.ts if now is None else max(now, state.ts))
    return clocks


def observation(state: ProjectedState, now: int) -> ClocksObserved | None:
    """What the engine records when it samples the clocks at ``now``: the
    starts and stops against the clocks in force, or None when nothing
    changed. Consumes the change bookkeeping (``touched``, ``touched_pods``,
    free capacity at the sample); the fold never does, so only the engine's
    samples cost a settle."""
    owing = sampled(state, now)
    starving = sampled_starving(state, now)
    if state.settings.reclaim_enabled:
        state.free_at_sample = free_capacity(state)
        state.starving_full = False
    else:
        state.starving_full = True
    state.touched = set()
    state.touched_pods = set()
    event = ClocksObserved(
        basis=state.offset,
        owing_started={k: v for k, v in sorted(owing.items()) if k not in state.owing_since},
        owing_stopped=sorted(k for k in state.owing_since if k not in owing),
        starving_started={
            k: v for k, v in sorted(starving.items()) if k not in state.starving_since
        },
        starving_stopped=sorted(k for k in state.starving_since if k not in starving),
    )
    owing_changed = event.owing_started or event.owing_stopped
    starving_changed = event.starving_started or event.starving_stopped
    return event if owing_changed or starving_changed else None


def apply_observation(state: ProjectedState, event: ClocksObserved) -> None:
    """Fold an engine's sample: stops end clocks, starts begin them (the first
    start wins when two engines sample). Held clocks do not start (§8 rule 29).

    The only place a clock starts: it tells the timer index, if the state has
    one (``projections.timers``), which clocks to look at again."""
    for name in event.owing_stopped:
        state.owing_since.pop(name, None)
    for name, since in event.owing_started.items():
        if name in state.quotas and name not in state.owing_held:
            state.owing_since.setdefault(name, since)
    for uid in event.starving_stopped:
        state.starving_since.pop(uid, None)
    for uid, since in event.starving_started.items():
        if uid in state.pending_pods and uid not in state.starving_held:
            state.starving_since.setdefault(uid, since)
    index = state.timer_index
    if isinstance(index, TimerIndex):
        for name in (*event.owing_stopped, *event.owing_started):
            index.mark_queue(name)
        for uid in (*event.starving_stopped, *event.starving_started):
            index.mark_pod(uid)


def release_holds(state: ProjectedState) -> None:
    """A fact arrived: held quotas may start their clocks again at the next sample."""
    index = state.timer_index
    if state.owing_held:
        state.touched |= state.owing_held
        if isinstance(index, TimerIndex):
            for name in state.owing_held:
                index.mark_queue(name)
        state.owing_held = set()
    if state.starving_held:
        state.touched_pods |= state.starving_held
        if isinstance(index, TimerIndex):
            for uid in state.starving_held:
                index.mark_pod(uid)
        state.starving_held = set()
