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

from .resources import RL
from .settle import ChangedQuotas, settle, top_quotas
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
        store = node.store
        if store is not None:
            # used − runtime over the row's resources, which ``by_key`` sorts
            row = node.row
            for columns in store.by_key:
                gap = columns.used[row] - columns.runtime[row]
                if gap > 0:
                    out[columns.key] = gap
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
    store = node.store
    if config.is_parent or not node.connected or config.name in BUILTIN or store is None:
        return False
    cap = config.max
    row = node.row
    if cap is None:
        # owed's used − runtime, read from the row
        return any(columns.used[row] > columns.runtime[row] for columns in store.by_key)
    for key, limit in cap.items():
        held, runtime_of = _numbers(node, key)
        if min(held, limit) > runtime_of:
            return True
    return False


def owing_quotas(state: ProjectedState) -> set[str]:
    """The quotas that owe now (:func:`is_owing`), in a settled state: kept in
    ``state.owing_index`` and brought up to date by re-checking the quotas the
    settles changed since the last call (all of them after a full recompute
    or on first use), the way the clock sample re-checks ``touched``."""
    index = state.owing_index
    quotas = state.quotas
    if not isinstance(index, ChangedQuotas) or index.quotas is not quotas:
        index = state.owing_index = ChangedQuotas(quotas)
    members = index.members
    if index.everything:
        members.clear()
        members.update(name for name, node in quotas.items() if is_owing(node))
        index.everything = False
    elif index.changed:
        for name in index.changed:
            node = quotas.get(name)
            if node is not None and is_owing(node):
                members.add(name)
            else:
                members.discard(name)
    index.changed = set()
    return members


def free_capacity(state: ProjectedState) -> RL:
    """Cluster total − Σ used of all quotas (§8 rule 31); system and default
    are already off the total."""
    free = dict(state.cluster_total)
    for node in top_quotas(state):
        store = node.store
        if store is None:
            continue
        row = node.row
        # what ``node.used`` reads, without building it
        for columns in store.by_key:
            value = columns.used[row]
            if value:
                key = columns.key
                free[key] = free.get(key, 0) - value
    return free


def is_starving(state: ProjectedState, uid: str, free: RL) -> bool:
    """§8 rule 31: Pending without a node, its quota has room for it under its
    runtime (on every requested resource its max lists), and the cluster's
    free capacity does not cover its request. (The conditions are checked
    cheapest first: free capacity usually covers a pod.)"""
    pod = state.pods[uid]
    requests = pod.requests
    if not any(value > 0 and value > free.get(key, 0) for key, value in requests.items()):
        return False
    node = state.quotas[state.pod_quota[uid]]
    config = node.config
    if config.is_parent or not node.connected or config.name in BUILTIN:
        return False
    cap = config.max
    for key, value in requests.items():
        if value <= 0 or (cap is not None and key not in cap):
            continue
        used, runtime = _numbers(node, key)
        if used + value > runtime:
            return False
    return True


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


class SampleInputs:
    """What the starvation sample reads, kept between samples (DECISIONS 353):
    a pending pod's requests (as items) and a quota's :func:`_room`. Both are
    inputs the sample already re-checks by: a pod whose requests change is in
    ``touched_pods`` (the pending index's writers), a quota whose numbers or
    configuration change is in ``touched`` (the settle, a full recompute); so
    dropping those at each sample leaves what is kept equal to a fresh read.
    Everything is dropped with ``starving_full`` (a restore, reclaim switched
    off) and when the kept pods outgrow the pending ones."""

    __slots__ = ("requests", "rooms")

    def __init__(self) -> None:
        self.requests: dict[str, tuple[tuple[str, int], ...]] = {}
        self.rooms: dict[str, tuple[RL | None, RL] | None] = {}


def _sample_inputs(state: ProjectedState) -> SampleInputs:
    """The state's kept sample inputs, rid of what changed since the last sample."""
    inputs = state.sample_inputs
    if (
        not isinstance(inputs, SampleInputs)
        or state.starving_full
        or len(inputs.requests) > 2 * len(state.pending_pods) + 4096
    ):
        inputs = state.sample_inputs = SampleInputs()
        return inputs
    rooms, requests = inputs.rooms, inputs.requests
    for name in state.touched:
        rooms.pop(name, None)
    for uid in state.touched_pods:
        requests.pop(uid, None)
    return inputs


def _starving_changes(
    state: ProjectedState, now: int | None, free: RL
) -> tuple[dict[str, int], set[str]]:
    """The starvation clocks a sample taken now would start (uid -> since) and
    stop, against those in force; ``free`` is the free capacity of the
    settled state. Only pods that changed, pods of quotas whose numbers
    changed, and pods whose coverage by free capacity may have flipped are
    re-checked; the result equals checking every pending pod
    (tests/projections/test_clocks.py). Kept only while ``reclaim_enabled``: without it
    every clock stops."""
    clocks = state.starving_since
    if not state.settings.reclaim_enabled:
        return {}, set(clocks)
    inputs = _sample_inputs(state)
    covered = all(
        free.get(key, 0) >= amounts[-1] for key, amounts in state.pending_amounts.items() if amounts
    )
    if covered and not clocks:
        return {}, set()  # none starves (below), and no clock runs to stop
    if state.starving_full:
        recheck = set(state.pending_pods) | set(clocks)
    else:
        recheck = state.touched_pods | _flipped(state, free)
        for name in state.touched:
            recheck |= state.pending_by_quota.get(name, set())
    if covered:
        # free capacity covers the largest request of every pending pod: none starves
        return {}, recheck & clocks.keys()
    started: dict[str, int] = {}
    stopped: set[str] = set()
    at = state.ts if now is None else max(now, state.ts)
    pending, held = state.pending_pods, state.starving_held
    pods, pod_quota = state.pods, state.pod_quota
    free_get = free.get
    # per quota: None when no pod of it can starve, else (max, its room
    # ``runtime − used`` per resource): what ``is_starving`` reads of it;
    # per pending pod its requests (both kept between samples)
    rooms, kept = inputs.rooms, inputs.requests
    for uid in recheck:
        running = uid in clocks
        if not running and uid in held:
            continue  # a held clock does not start (§8 rule 29), whatever the pod
        starving = False
        if uid in pending:
            requests = kept.get(uid)
            if requests is None:
                requests = kept[uid] = tuple(pods[uid].requests.items())
            # is_starving, the quota's numbers read once
            for key, value in requests:
                if value > 0 and value > free_get(key, 0):
                    break
            else:
                requests = ()
            if requests:
                name = pod_quota[uid]
                if name in rooms:
                    room = rooms[name]
                else:
                    room = rooms[name] = _room(state.quotas[name])
                if room is not None:
                    cap, slack = room
                    starving = True
                    for key, value in requests:
                        if value <= 0 or (cap is not None and key not in cap):
                            continue
                        if value > slack.get(key, 0):
                            starving = False
                            break
        if not starving:
            if running:
                stopped.add(uid)
        elif not running:
            started[uid] = at
    return started, stopped


def _room(node: QuotaNode) -> tuple[RL | None, RL] | None:
    """What :func:`is_starving` reads of a pod's quota: None when it is a
    parent, disconnected or builtin (none of its pods starves), else its max
    and ``runtime − used`` per resource of its row."""
    config = node.config
    if config.is_parent or not node.connected or config.name in BUILTIN:
        return None
    slack: RL = {}
    store = node.store
    if store is not None:
        row = node.row
        for columns in store.by_key:
            slack[columns.key] = columns.runtime[row] - columns.used[row]
    return config.max, slack


def sampled_starving(state: ProjectedState, now: int | None = None) -> dict[str, int]:
    """The starvation clocks as a sample taken now would leave them (pod uid ->
    since), without mutating them (besides settling derived numbers). Kept
    only while ``reclaim_enabled``."""
    if not state.settings.reclaim_enabled:
        return {}
    settle(state)
    started, stopped = _starving_changes(state, now, free_capacity(state))
    clocks = {uid: since for uid, since in state.starving_since.items() if uid not in stopped}
    clocks.update(started)
    return clocks


def _owing_changes(state: ProjectedState, now: int | None) -> tuple[dict[str, int], set[str]]:
    """The owing clocks a sample taken now would start (quota -> since) and
    stop, against those in force, in a settled state. Owing depends on used,
    runtime and max only: every change of those puts the quota in
    ``touched`` (settle, put_quota, released holds), and a removed quota is
    dropped from the clocks by drop_quota."""
    quotas = state.quotas
    clocks = state.owing_since
    held = state.owing_held
    started: dict[str, int] = {}
    stopped: set[str] = set()
    at = state.ts if now is None else max(now, state.ts)
    for name in state.touched:
        node = quotas.get(name)
        if node is None:
            owing = False
        else:
            # is_owing, with the row read in place (no store: no numbers)
            config = node.config
            cap = config.max
            store = node.store
            owing = False
            if config.is_parent or not node.connected or name in BUILTIN or store is None:
                pass
            elif cap is None:
                # owed's used − runtime over every resource of the row
                row = node.row
                for key_columns in store.by_key:
                    if key_columns.used[row] > key_columns.runtime[row]:
                        owing = True
                        break
            else:
                by_key, row = store.columns, node.row
                for key, limit in cap.items():
                    columns = by_key.get(key)
                    if columns is not None:
                        held_now = columns.used[row]
                        if (limit if limit < held_now else held_now) > columns.runtime[row]:
                            owing = True
                            break
        if not owing:
            if name in clocks:
                stopped.add(name)
        elif name not in held and name not in clocks:
            started[name] = at
    return started, stopped


def sampled(state: ProjectedState, now: int | None = None) -> dict[str, int]:
    """The owing clocks as a sample taken now would leave them (no mutation
    besides settling derived numbers). The engine reads this at the tail."""
    settle(state)
    started, stopped = _owing_changes(state, now)
    clocks = {name: since for name, since in state.owing_since.items() if name not in stopped}
    clocks.update(started)
    return clocks


def observation(state: ProjectedState, now: int) -> ClocksObserved | None:
    """What the engine records when it samples the clocks at ``now``: the
    starts and stops against the clocks in force, or None when nothing
    changed. Consumes the change bookkeeping (``touched``, ``touched_pods``,
    free capacity at the sample); the fold never does, so only the engine's
    samples cost a settle. Costs what changed since the last sample, not
    the clocks in force."""
    settle(state)
    owing_started, owing_stopped = _owing_changes(state, now)
    if state.settings.reclaim_enabled:
        free = free_capacity(state)
        starving_started, starving_stopped = _starving_changes(state, now, free)
        state.free_at_sample = free
        state.starving_full = False
    else:
        starving_started, starving_stopped = {}, set(state.starving_since)
        state.starving_full = True
    state.touched = set()
    state.touched_pods = set()
    if not (owing_started or owing_stopped or starving_started or starving_stopped):
        return None
    return ClocksObserved(
        basis=state.offset,
        owing_started={k: owing_started[k] for k in sorted(owing_started)},
        owing_stopped=sorted(owing_stopped),
        starving_started={k: starving_started[k] for k in sorted(starving_started)},
        starving_stopped=sorted(starving_stopped),
    )


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
