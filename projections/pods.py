"""Pods and the quotas they belong to (DESIGN §5 Tree, §8 rules 7, 11-12).

Only this module moves pods between quotas, and it keeps the per-quota pod
sums exact: a quota's ``pod_request`` is always the Σ requests of the active
pods associated with it (once :func:`flush_sums` has run), ``pod_used`` of
those with a node. It also keeps the indexes that find a pod again (by
namespace, by ``quota`` field, the Pending pods for the starvation clocks)
and shrinks a pod to what the projection keeps (:func:`compact`). The tree's
shape is :mod:`.quota_tree`'s.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable
from functools import lru_cache
from sys import intern

from quotaledger.events.model import PodUpserted

from .columns import KeyColumns, QuotaColumns
from .persisted import SMALL_DICT
from .resources import RL, add_into
from .state import (
    ACTIVE_PHASES,
    BUILTIN,
    DEFAULT,
    SYSTEM,
    ProjectedState,
    QuotaNode,
)
from .timers import touch_pod


def compact(pod: PodUpserted, old: PodUpserted | None) -> None:
    """Shrink a pod to what the projection keeps (DESIGN §5; DECISIONS 27,
    for memory): ``at`` is dropped (the record's ts is the time), namespace and
    node names are interned, a name equal to the uid is the uid, and equal
    label maps are one shared map. A pod upserted again reuses the previous
    version's equal values, so replacing it frees only what was just decoded.
    Pods are facts the projection never mutates otherwise: sharing is safe.
    Labels or requests of more than ``SMALL_DICT`` keys are kept sorted by key
    (the hash and snapshot encoders then never sort a large map, DECISIONS 232)."""
    pod.at = None
    name, namespace, node, labels = pod.name, pod.namespace, pod.node, pod.labels
    if len(pod.requests) > SMALL_DICT:
        pod.requests = dict(sorted(pod.requests.items()))
    if old is None:
        uid = pod.uid
        if name == uid:
            pod.name = uid
        pod.namespace = intern(namespace)
        if node is not None:
            pod.node = intern(node)
        if labels:
            pod.labels = _shared_labels(_label_items(labels))
        return
    uid = pod.uid = old.uid
    created = pod.created_at
    if created is not None and created == old.created_at:
        pod.created_at = old.created_at
    if name == uid:
        pod.name = uid
    elif name == old.name:
        pod.name = old.name
    kept = old.namespace
    pod.namespace = kept if namespace == kept else intern(namespace)
    if node is not None:
        kept_node = old.node
        pod.node = kept_node if node == kept_node else intern(node)
    if labels:
        kept_labels = old.labels
        pod.labels = kept_labels if labels == kept_labels else _shared_labels(_label_items(labels))


def shared_labels(labels: dict[str, str]) -> dict[str, str]:
    """The one shared map equal to ``labels`` (see :func:`compact`)."""
    return _shared_labels(_label_items(labels))


def _label_items(labels: dict[str, str]) -> tuple[tuple[str, str], ...]:
    if len(labels) > SMALL_DICT:
        return tuple(sorted(labels.items()))
    return tuple(labels.items())


@lru_cache(maxsize=4096)
def _shared_labels(items: tuple[tuple[str, str], ...]) -> dict[str, str]:
    return dict(items)


def is_active(pod: PodUpserted) -> bool:
    """Active pods are Pending or Running (DESIGN §5)."""
    return pod.phase in ACTIVE_PHASES


def quota_for(state: ProjectedState, pod: PodUpserted) -> str:
    """The quota a pod belongs to: first match of §8 rule 7.

    Its ``quota`` field naming an existing quota; ``kube-system`` → system; a
    quota named like its namespace; the quota listing its namespace; default.
    A match that is a parent quota sends the pod to default.
    """
    quotas = state.quotas
    if pod.quota is not None and pod.quota in quotas:
        match = pod.quota
    elif pod.namespace == "kube-system":
        match = SYSTEM
    elif pod.namespace in quotas:
        match = pod.namespace
    else:
        match = state.namespace_claims.get(pod.namespace, DEFAULT)
    if quotas[match].config.is_parent:
        return DEFAULT
    return match


def mark_dirty(state: ProjectedState, name: str) -> None:
    """Ask ``settle`` to recompute this quota and its ancestors (a builtin
    quota's used also changes the cluster total)."""
    state.dirty.add(name)
    if name in BUILTIN:
        state.total_dirty = True


def _charge(state: ProjectedState, node: QuotaNode, pod: PodUpserted, sign: int) -> None:
    if not node.sums_stale:
        state.attach(node)
        store, row = state.columns, node.row
        store.add("pod_request", row, pod.requests, sign)
        if pod.node is not None:
            store.add("pod_used", row, pod.requests, sign)
    mark_dirty(state, node.config.name)


def flush_sums(state: ProjectedState, node: QuotaNode) -> None:
    """Bring the quota's ``pod_request``/``pod_used`` row up to date: apply the
    logged in-place changes, or rebuild from the quota's pods when the log
    outgrew them. Either way the sums equal Σ over the active pods (sums
    commute, so when a change is applied does not matter)."""
    state.attach(node)
    store, row = state.columns, node.row
    if node.sums_stale:
        request: RL = {}
        used: RL = {}
        pods = state.pods
        for uid in node.pods:
            pod = pods[uid]
            add_into(request, pod.requests)
            if pod.node is not None:
                add_into(used, pod.requests)
        store.write("pod_request", row, request)
        store.write("pod_used", row, used)
        node.sums_stale = False
    elif node.sum_log:
        _apply_log(state, node.sum_log, row)


def flush_all(state: ProjectedState, names: Iterable[str]) -> None:
    """:func:`flush_sums` of every quota named (unknown names skipped), for the
    full recompute's thousands of dirty quotas: each logged change is added
    straight into the columns, entry by entry, without building the net change
    first (sums commute: the same sums). A quota whose sums are stale, or
    without its row yet, goes through :func:`flush_sums`."""
    quotas = state.quotas
    store = state.columns
    known = store.columns.get
    for name in names:
        node = quotas.get(name)
        if node is None:
            continue
        log = node.sum_log
        if node.sums_stale or node.store is not store:
            if log or node.sums_stale:
                flush_sums(state, node)
            continue
        if not log:
            continue
        row = node.row
        for old, new, was_bound, bound in log:
            if old is not new:
                both = was_bound and bound
                for key, value in new.items():
                    value -= old.get(key, 0)
                    if value:
                        columns = known(key) or store.key(key)
                        try:  # _add, inlined
                            columns.pod_request[row] += value
                        except OverflowError:
                            _add(store, columns, "pod_request", row, value)
                        if both:
                            try:
                                columns.pod_used[row] += value
                            except OverflowError:
                                _add(store, columns, "pod_used", row, value)
                for key, value in old.items():
                    if value and key not in new:
                        columns = known(key) or store.key(key)
                        _add(store, columns, "pod_request", row, -value)
                        if both:
                            _add(store, columns, "pod_used", row, -value)
                if both:
                    continue
            if was_bound:
                for key, value in old.items():
                    if value:
                        _add(store, known(key) or store.key(key), "pod_used", row, -value)
            if bound:
                for key, value in new.items():
                    if value:
                        _add(store, known(key) or store.key(key), "pod_used", row, value)
        log.clear()


def _add(store: QuotaColumns, columns: KeyColumns, name: str, row: int, value: int) -> None:
    """``columns.<name>[row] += value``, widening the resource when needed."""
    column = getattr(columns, name)
    try:
        column[row] += value
    except OverflowError:
        store.widen(columns)
        getattr(columns, name)[row] += value


def _add_both(store: QuotaColumns, columns: KeyColumns, row: int, value: int) -> None:
    """``pod_request[row] += value`` and ``pod_used[row] += value`` of one resource."""
    try:
        columns.pod_request[row] += value
    except OverflowError:
        store.widen(columns)
        columns.pod_request[row] += value
    try:
        columns.pod_used[row] += value
    except OverflowError:
        store.widen(columns)
        columns.pod_used[row] += value


def _apply_log(state: ProjectedState, log: list[tuple[RL, RL, bool, bool]], row: int) -> None:
    """Add the log's net change per resource to ``row``'s pod sums, once per
    column and resource (the sums are exact integers, so the result is the
    entries' added one by one), then empty the log. A resized pod bound before
    and after (the common entry) moves both columns by the same difference,
    kept once in ``both``. The adds go straight into the columns (a column
    that cannot hold a result turns wide, as in ``QuotaColumns.add``)."""
    both: RL = {}
    request_delta: RL | None = None
    used_delta: RL | None = None
    for old, new, was_bound, bound in log:
        if old is not new:
            if was_bound and bound:
                _difference_into(both, old, new)
                continue
            if request_delta is None:
                request_delta = {}
            _difference_into(request_delta, old, new)
        if was_bound != bound:
            if used_delta is None:
                used_delta = {}
            if was_bound:
                for key, value in old.items():
                    used_delta[key] = used_delta.get(key, 0) - value
            else:
                for key, value in new.items():
                    used_delta[key] = used_delta.get(key, 0) + value
    log.clear()
    store = state.columns
    known = store.columns.get
    for key, value in both.items():
        if value:
            _add_both(store, known(key) or store.key(key), row, value)
    if request_delta:
        store.add("pod_request", row, request_delta, +1)
    if used_delta:
        store.add("pod_used", row, used_delta, +1)


def _difference_into(delta: RL, old: RL, new: RL) -> None:
    """``delta += new - old``, per resource."""
    get = delta.get
    for key, value in old.items():
        delta[key] = get(key, 0) - value
    for key, value in new.items():
        delta[key] = get(key, 0) + value


def attach_pod(state: ProjectedState, pod: PodUpserted) -> None:
    """Count an active pod in its quota (and the indexes that find it again)."""
    uid = pod.uid
    name = quota_for(state, pod)
    state.pod_quota[uid] = name
    state.namespace_pods.setdefault(pod.namespace, set()).add(uid)
    if pod.quota is not None:
        state.field_pods.setdefault(pod.quota, set()).add(uid)
    node = state.quotas[name]
    node.pods.add(uid)
    counts = node.namespaces
    counts[pod.namespace] = counts.get(pod.namespace, 0) + 1
    if pod.phase == "Pending" and pod.node is None:
        _index_pending(state, name, uid, pod.requests)
    _charge(state, node, pod, +1)


def detach_pod(state: ProjectedState, pod: PodUpserted) -> None:
    """Undo :func:`attach_pod` for a pod that was active."""
    uid = pod.uid
    name = state.pod_quota.pop(uid)
    # a reclaim timer's queue (DECISIONS 350); attach needs no mark: a pod
    # with an armed timer is attached, so its quota changes by a detach first
    touch_pod(state, uid)
    discard_member(state.namespace_pods, pod.namespace, uid)
    if pod.quota is not None:
        discard_member(state.field_pods, pod.quota, uid)
    node = state.quotas[name]
    node.pods.discard(uid)
    counts = node.namespaces
    left = counts[pod.namespace] - 1
    if left:
        counts[pod.namespace] = left
    else:
        del counts[pod.namespace]
    if uid in state.pending_pods:
        _unindex_pending(state, name, uid, pod.requests)
    _charge(state, node, pod, -1)


def replace_pod(state: ProjectedState, old: PodUpserted, pod: PodUpserted) -> None:
    """An active pod upserted again, still active, with the same namespace and
    ``quota`` field: rule 7 gives it the same quota, so only its sums move, by
    the difference. Equivalent to ``detach_pod(old)`` then ``attach_pod(pod)``,
    without touching what did not change (the fold's hot path)."""
    uid = pod.uid
    name = state.pod_quota[uid]
    node = state.quotas[name]
    old_requests, requests = old.requests, pod.requests
    if old_requests is not requests and old_requests == requests:
        requests = old_requests
    same = old_requests is requests
    was_bound, bound = old.node is not None, pod.node is not None
    if not same or was_bound != bound:
        if not node.sums_stale:
            log = node.sum_log
            log.append((old_requests, requests, was_bound, bound))
            if len(log) > len(node.pods) + 8:
                log.clear()
                node.sums_stale = True
        mark_dirty(state, name)
    # the pending index holds exactly the active Pending pods without a node
    was_pending = not was_bound and old.phase == "Pending"
    pending = not bound and pod.phase == "Pending"
    if was_pending:
        if not pending:
            _unindex_pending(state, name, uid, old_requests)
        elif not same:
            _reindex_pending(state, uid, old_requests, requests)
    elif pending:
        _index_pending(state, name, uid, requests)


def _index_pending(state: ProjectedState, name: str, uid: str, requests: RL) -> None:
    """A Pending pod without a node joins the starvation indexes (§8 rule 31):
    by quota, and per resource by requested amount (buckets of uids, with the
    distinct amounts kept sorted for :func:`clocks._flipped`)."""
    state.pending_pods.add(uid)
    state.pending_by_quota.setdefault(name, set()).add(uid)
    for key, value in requests.items():
        if value > 0:
            buckets = state.pending_index.get(key)
            if buckets is None:
                buckets = state.pending_index[key] = {}
            bucket = buckets.get(value)
            if bucket is None:
                bucket = buckets[value] = set()
                insort(state.pending_amounts.setdefault(key, []), value)
            bucket.add(uid)
    state.touched_pods.add(uid)


def _reindex_pending(state: ProjectedState, uid: str, old: RL, new: RL) -> None:
    """A pod pending before and after with other requests: the same as
    :func:`_unindex_pending` then :func:`_index_pending`, moving only the
    amounts that changed (it stays in ``pending_pods`` and its quota's set,
    and is re-checked at the next sample)."""
    index, amounts_of = state.pending_index, state.pending_amounts
    for key, value in old.items():
        if value > 0 and new.get(key) != value:
            buckets = index[key]
            bucket = buckets[value]
            bucket.discard(uid)
            if not bucket:
                del buckets[value]
                amounts = amounts_of[key]
                del amounts[bisect_left(amounts, value)]
                if not buckets:
                    del index[key], amounts_of[key]
    for key, value in new.items():
        if value > 0 and old.get(key) != value:
            joined = index.get(key)
            if joined is None:
                joined = index[key] = {}
            members = joined.get(value)
            if members is None:
                members = joined[value] = set()
                insort(amounts_of.setdefault(key, []), value)
            members.add(uid)
    state.touched_pods.add(uid)


def _unindex_pending(state: ProjectedState, name: str, uid: str, requests: RL) -> None:
    """Undo :func:`_index_pending`."""
    state.pending_pods.discard(uid)
    discard_member(state.pending_by_quota, name, uid)
    for key, value in requests.items():
        if value > 0:
            buckets = state.pending_index[key]
            bucket = buckets[value]
            bucket.discard(uid)
            if not bucket:
                del buckets[value]
                amounts = state.pending_amounts[key]
                del amounts[bisect_left(amounts, value)]
                if not buckets:
                    del state.pending_index[key], state.pending_amounts[key]
    # a pod no longer pending needs a re-check only to stop its starvation clock;
    # without one, forgetting it keeps ``touched_pods`` bounded between samples
    if uid in state.starving_since:
        state.touched_pods.add(uid)
    else:
        state.touched_pods.discard(uid)


def discard_member(index: dict[str, set[str]], key: str, member: str) -> None:
    """Remove ``member`` from ``index[key]``, and the key once its set is empty."""
    members = index.get(key)
    if members is not None:
        members.discard(member)
        if not members:
            del index[key]


def reassociate(
    state: ProjectedState, namespaces: Iterable[str], quota_names: Iterable[str]
) -> None:
    """Re-run rule 7 for the active pods a configuration change may move:
    those in ``namespaces`` and those whose ``quota`` field names one of
    ``quota_names``."""
    uids: set[str] = set()
    for ns in namespaces:
        uids |= state.namespace_pods.get(ns, set())
    for name in quota_names:
        uids |= state.field_pods.get(name, set())
    for uid in sorted(uids):
        pod = state.pods[uid]
        if quota_for(state, pod) != state.pod_quota[uid]:
            detach_pod(state, pod)
            attach_pod(state, pod)
            state.hash_pods[uid] = pod  # its entry holds its quota (state_digest)
