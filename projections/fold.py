"""The fold: apply ledger records to the projected state, in order (DESIGN §3-§5).

:class:`Projection` is the sans-I/O core: it is fed records and answers
questions. Same records in the same order give the same state, byte for byte.
A record that does not decode, or a fact or decision that is invalid, is
recorded in ``state.rejected`` (§8 rule 5) and changes nothing else.
"""

from __future__ import annotations

from collections.abc import Callable
from sys import intern
from typing import Any

from msgspec import UNSET

from quotaledger.events.codec import EventError, decode_event
from quotaledger.events.ledger import Record
from quotaledger.events.model import (
    DECISION_TYPES,
    FACT_TYPES,
    ClocksObserved,
    Event,
    EvictionFailed,
    EvictionRequested,
    EvictionSucceeded,
    FactRejected,
    LeaderElected,
    LedgerDigest,
    LedgerOpened,
    NamespaceWeighted,
    NodeRemoved,
    NodeUpserted,
    PodRemoved,
    PodUpserted,
    PreemptionFinished,
    PreemptionStarted,
    QuotaRemoved,
    QuotaUpserted,
    SettingsChanged,
    kind_of,
)

from . import guard
from .clocks import apply_observation, release_holds
from .persisted import SMALL_DICT
from .plans import decrease_target
from .pods import attach_pod, compact, detach_pod, replace_pod, shared_labels
from .quota_tree import drop_quota, put_quota
from .resources import add_into, sub_into
from .settle import settle
from .state import ACTIVE_PHASES, ROOT, NodeMeta, ProjectedState, Rejection
from .state_digest import forget as forget_digests
from .timers import touch_queue
from .validation import check_remove, check_upsert

_FACTS = frozenset(FACT_TYPES)


class OutOfOrder(ValueError):
    """A record that does not follow the last one applied (offsets are gap-free)."""


class Projection:
    """Folds records into a :class:`ProjectedState`."""

    def __init__(self, state: ProjectedState | None = None) -> None:
        self.state = state if state is not None else ProjectedState.empty()
        self._handlers = self._handler_table()

    # ------------------------------------------------------------ records

    def apply_record(self, record: Record) -> Event | None:
        """Decode and apply one record; return its event if it was accepted."""
        try:
            event = decode_event(record.payload)
        except EventError as exc:
            self._advance(record.offset, record.ts)
            self.reject(record.offset, exc.kind, exc.reason)
            return None
        return event if self.apply(record.offset, record.ts, event) else None

    def apply(self, offset: int, ts: int, event: Event) -> bool:
        """Apply a decoded event at ``offset``/``ts``; False when it was rejected.

        The fold's hot path (DECISIONS 170): one dispatch by exact type, the offset
        and time advanced (:meth:`_advance`), and held clocks released only when some are
        held (``release_holds`` does nothing otherwise). A ``PodUpserted`` (most
        records) goes to :meth:`apply_pod` first (DECISIONS 400)."""
        kind = type(event)
        if kind is PodUpserted:
            self.apply_pod(offset, ts, event)  # type: ignore[arg-type]
            return True
        if kind is LedgerDigest:
            self._pass(offset)
            return True
        state = self._advance(offset, ts)
        handler = self._handlers.get(kind)
        if handler is None:
            reason: str | None = f"kind: unsupported event {kind_of(event)!r}"
        else:
            reason = handler(offset, ts, event)
        if reason is not None:
            self.reject(offset, kind_of(event), reason)
            return False
        if kind in _FACTS:
            # the PodRemoved answer to an eviction does not restart a held clock (§8 rule 29)
            if kind is PodRemoved and state.evicted_pods.pop(event.uid, None) is not None:  # type: ignore[union-attr]
                return True
            if state.owing_held or state.starving_held:
                release_holds(state)
        return True

    def apply_pod(self, offset: int, ts: int, pod: PodUpserted) -> None:
        """:meth:`apply` of a decoded ``PodUpserted`` (the usual record: a fact
        never refused), without the dispatch (DECISIONS 400): the offset and
        time advanced, the pod folded (the usual upsert inline, any other by
        :meth:`_pod_upserted`), held clocks released."""
        state = self._advance(offset, ts)
        uid = pod.uid
        pods = state.pods
        old = pods.get(uid)
        phase = pod.phase
        if (
            old is not None
            and (phase == "Running" or phase == "Pending")
            and old.phase in ACTIVE_PHASES
            and old.quota == pod.quota
            and old.namespace == pod.namespace
        ):
            # the usual record: an active pod upserted again, still active, same
            # namespace and ``quota`` field (compact then replace_pod, inlined)
            pod.at = None
            requests = pod.requests
            if len(requests) > SMALL_DICT:
                requests = pod.requests = dict(sorted(requests.items()))
            uid = pod.uid = old.uid
            created = pod.created_at
            if created is not None and created == old.created_at:
                pod.created_at = old.created_at
            name = pod.name
            if name == uid:
                pod.name = uid
            elif name == old.name:
                pod.name = old.name
            pod.namespace = old.namespace
            node = pod.node
            if node is not None:
                kept_node = old.node
                pod.node = node = kept_node if node == kept_node else intern(node)
            labels = pod.labels
            if labels:
                kept_labels = old.labels
                pod.labels = kept_labels if labels == kept_labels else shared_labels(labels)
            pods[uid] = pod
            state.hash_pods[uid] = pod
            replace_pod(state, old, pod)
            if phase != "Running" and state.evicting_pods:
                guard.on_pod_gone(state, uid)
            if state.owing_held or state.starving_held:
                release_holds(state)
            return
        self._pod_upserted(offset, ts, pod)
        if state.owing_held or state.starving_held:
            release_holds(state)

    def reject(self, offset: int, kind: str | None, reason: str) -> None:
        self.state.rejected.append(Rejection(offset=offset, kind=kind, reason=reason))

    def _pass(self, offset: int) -> None:
        """A ``LedgerDigest`` takes its offset and nothing else (DESIGN §9: the
        projection ignores it for the state and the hash). Not even its ts: a
        later ts would disarm expired deadlines here rather than at the next
        record, so a ledger would hash differently with and without digests."""
        if offset != self.state.offset + 1:
            raise OutOfOrder(f"record {offset} does not follow {self.state.offset}")
        self.state.offset = offset

    def _advance(self, offset: int, ts: int) -> ProjectedState:
        """The state, its offset moved to ``offset`` (the next one, else
        :class:`OutOfOrder`) and its time to ``ts`` when later (deadlines of
        empty decreases passed by then disarmed first, §8 rule 21)."""
        state = self.state
        if offset != state.offset + 1:
            raise OutOfOrder(f"record {offset} does not follow {state.offset}")
        state.offset = offset
        if ts > state.ts:
            if state.decrease_deadlines and state.settings.quota_preemption_enabled:
                self._disarm_empty_deadlines(ts)
            state.ts = ts
        return state

    def _disarm_empty_deadlines(self, ts: int) -> None:
        """§8 rule 21: a deadline passed (before ``ts``) on a free queue whose
        target is empty records nothing and is disarmed."""
        state = self.state
        for queue, deadline in sorted(state.decrease_deadlines.items()):
            if deadline < ts and queue not in state.occupied and not decrease_target(state, queue):
                del state.decrease_deadlines[queue]

    # ------------------------------------------------------------ events

    def _handler_table(self) -> dict[type, Callable[[int, int, Any], str | None]]:
        """Event type -> the method that applies it (a reason when refused)."""
        facts: dict[type, Callable[[int, int, Any], str | None]] = {
            PodRemoved: self._pod_removed,
            NodeUpserted: self._node_upserted,
            NodeRemoved: self._node_removed,
            QuotaUpserted: self._quota_upserted,
            QuotaRemoved: self._quota_removed,
            NamespaceWeighted: self._namespace_weighted,
            SettingsChanged: self._settings,
        }
        decision: Callable[[int, int, Any], str | None] = self._decision
        table: dict[type, Callable[[int, int, Any], str | None]] = dict.fromkeys(
            (LedgerOpened, *DECISION_TYPES), decision
        )
        table.update(facts)
        return table

    def _pod_removed(self, offset: int, ts: int, event: PodRemoved) -> str | None:
        state = self.state
        old = state.pods.pop(event.uid, None)
        if old is not None:
            if old.phase in ACTIVE_PHASES:
                detach_pod(state, old)
            guard.on_pod_gone(state, event.uid)
            marks = state.hash_pods
            marks[old.uid] = None
            if len(marks) > 2 * len(state.pods) + 4096:  # nobody hashes: keep them bounded
                forget_digests(state)
        return None

    def _node_upserted(self, offset: int, ts: int, event: NodeUpserted) -> str | None:
        state = self.state
        old_alloc = state.nodes.get(event.name)
        if old_alloc is not None:
            sub_into(state.allocatable, old_alloc)
        state.nodes[event.name] = event.allocatable
        add_into(state.allocatable, event.allocatable)
        state.total_dirty = True
        if event.labels or event.unschedulable:
            state.node_meta[event.name] = NodeMeta(dict(event.labels), event.unschedulable)
        elif state.node_meta:
            state.node_meta.pop(event.name, None)
        state.hash_nodes.add(event.name)
        return None

    def _node_removed(self, offset: int, ts: int, event: NodeRemoved) -> str | None:
        state = self.state
        removed = state.nodes.pop(event.name, None)
        state.node_meta.pop(event.name, None)
        if removed is not None:
            sub_into(state.allocatable, removed)
            state.total_dirty = True
            state.hash_nodes.add(event.name)
        return None

    def _quota_upserted(self, offset: int, ts: int, event: QuotaUpserted) -> str | None:
        state = self.state
        reason = check_upsert(state, event)
        if reason is None:
            previous = put_quota(state, event)
            guard.on_quota_change(state, previous, event, ts)
        return reason

    def _quota_removed(self, offset: int, ts: int, event: QuotaRemoved) -> str | None:
        reason = check_remove(self.state, event)
        if reason is None:
            drop_quota(self.state, event.name)
            touch_queue(self.state, event.name)  # its timers end (DECISIONS 350)
        return reason

    def _namespace_weighted(self, offset: int, ts: int, event: NamespaceWeighted) -> str | None:
        self.state.namespace_weights[event.namespace] = event.weight
        self.state.hash_weights.add(event.namespace)
        return None

    def _pod_upserted(self, offset: int, ts: int, pod: PodUpserted) -> None:
        """Fold a pod upsert whatever it changes (:meth:`apply_pod`'s general path)."""
        state = self.state
        uid = pod.uid
        pods = state.pods
        old = pods.get(uid)
        compact(pod, old)
        pods[uid] = pod
        state.hash_pods[pod.uid] = pod  # the key object the state holds (compact)
        phase = pod.phase
        active = phase == "Running" or phase == "Pending"
        if old is None:
            if active:
                attach_pod(state, pod)
            return None
        if old.phase in ACTIVE_PHASES:
            if active and old.namespace is pod.namespace and old.quota == pod.quota:
                # compact shares the old namespace when equal: ``is`` is ``==`` here
                replace_pod(state, old, pod)
            else:
                detach_pod(state, old)
                if active:
                    attach_pod(state, pod)
        elif active:
            attach_pod(state, pod)
        if phase != "Running" and state.evicting_pods:
            guard.on_pod_gone(state, uid)
        return None

    def _settings(self, offset: int, ts: int, event: SettingsChanged) -> str | None:
        """Absent fields keep their value (§4); seconds and percentages are kept
        as floats whatever number a Python-built event carries, so the state and
        its hash are those of the decoded record (and of a snapshot)."""
        settings = self.state.settings
        before = settings.min_scaling
        for field in SettingsChanged.__struct_fields__:
            value = getattr(event, field)
            if field != "at" and value is not UNSET:
                if type(value) is int:
                    value = float(value)
                setattr(settings, field, value)
        if settings.min_scaling != before:
            self.state.refill.update(self.state.quotas)
            self.state.refill.add(ROOT)
        return None

    def _decision(self, offset: int, ts: int, event: Event) -> str | None:
        state = self.state
        if isinstance(event, LedgerOpened):
            if offset != 0 or state.ledger_id is not None:
                return "LedgerOpened may only be the first record"
            state.ledger_id = event.ledger_id
            return None
        if isinstance(event, FactRejected):
            state.rejected.append(
                Rejection(offset=event.offset, kind=event.rejected_kind, reason=event.reason)
            )
            return None
        if isinstance(event, LeaderElected):
            return guard.on_leader(state, event)
        if isinstance(event, ClocksObserved):
            if event.epoch < state.leader_epoch:  # a deposed leader's sample (DECISIONS 223)
                return f"epoch: stale leader epoch {event.epoch} < {state.leader_epoch}"
            apply_observation(state, event)
            return None
        if isinstance(event, PreemptionStarted):
            return guard.on_started(state, event, offset, ts)
        if isinstance(event, EvictionRequested):
            return guard.on_eviction(state, event, offset)
        if isinstance(event, EvictionSucceeded | EvictionFailed):
            return guard.on_eviction_outcome(state, event)
        if isinstance(event, PreemptionFinished):
            return guard.on_finished(state, event, offset)
        return f"kind: unsupported event {kind_of(event)!r}"

    # ------------------------------------------------------------ reading

    def settled(self) -> ProjectedState:
        """The state with every derived number up to date."""
        settle(self.state)
        return self.state
