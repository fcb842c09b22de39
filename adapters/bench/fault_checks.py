"""The checks of ``quotaledger bench faults`` (DECISIONS 220, 222): the invariants checked
on a trial's raw records (:mod:`.fault_records`, read without quotaledger's readers), on the
stand-in API server's record of eviction POSTs and Lease writes, and on ``audit``.

Nothing here believes an engine: :class:`quotaledger.projections.Projection` folds the raw
records only to say which were accepted and which timers were armed where.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from quotaledger.events.ledger import Record
from quotaledger.projections import Projection

from .fault_records import RawRecord, contiguous, decode_json

#: What is checked (the docstring of :func:`check_trial` says how).
CHECKS = (
    "trigger-twice",
    "trigger-unjustified",
    "overlap",
    "eviction-twice",
    "post-without-decision",
    "zombie-post",
    "zombie-decision",
    "fact-lost",
    "fact-twice",
    "gap",
    "armed-deadline",
    "audit",
    "traceback",
    "unclean-stop",
    "process-exit",
    "no-quiescence",
    "harness-error",
)
GAP_REASON = "holds no record"  # what a gaps=fill reader writes into its fillers


@dataclass(frozen=True)
class Violation:
    seed: int
    check: str
    offsets: str
    detail: str

    def line(self) -> str:
        where = f" at offsets {self.offsets}" if self.offsets else ""
        return f"seed {self.seed}: {self.check}{where}: {self.detail}"


@dataclass(frozen=True, slots=True)
class EvictionPost:
    """One eviction POST as the stand-in server answered it."""

    at_ms: int
    via: str  # the proxy (engine slot) it came through
    namespace: str
    name: str
    uid: str  # the uid precondition, else the pod's uid at the server
    status: int


# ------------------------------------------------------------------ the checks


@dataclass
class CheckContext:
    seed: int
    backend: str
    produced: dict[str, bool]  # fact id -> acknowledged
    posts: Sequence[EvictionPost]
    lease_writes: Sequence[tuple[int, str | None]]
    requests: Sequence[tuple[str, int, str]]  # (slot, sent ms, path) of eviction POSTs
    instance_at: dict[str, Callable[[int], str | None]]
    now_ms: int
    deadline_grace_ms: int
    audit: tuple[int, dict[str, Any] | None, str] | None = None
    broker_holes: set[int] = field(default_factory=set)  # offsets a broker restart lost


def _span(offsets: Sequence[int]) -> str:
    if not offsets:
        return ""
    low, high = min(offsets), max(offsets)
    return str(low) if low == high else f"{low}..{high}"


def _holder_at(writes: Sequence[tuple[int, str | None]], at_ms: int) -> str | None:
    holder: str | None = None
    for ms, who in writes:
        if ms > at_ms:
            break
        holder = who
    return holder


def _retried(copies: Sequence[RawRecord], backend: str) -> bool:
    """Copies of one record a retried Kafka append left: the same bytes stamped at the same
    ms by the writer (DESIGN §10: a retried append may duplicate a record). SQLite never
    retries a commit: two copies there were written twice."""
    return backend == "kafka" and len({(c.payload, c.stamp) for c in copies}) == 1


@dataclass
class _History:
    """Values a dict of the state took, per key, from which offset on."""

    changes: dict[str, list[tuple[int, Any]]] = field(default_factory=dict)
    last: dict[str, Any] = field(default_factory=dict)

    def observe(self, offset: int, current: dict[str, Any]) -> list[str]:
        changed = []
        if current != self.last:
            for key in set(current) | set(self.last):
                if current.get(key) != self.last.get(key):
                    self.changes.setdefault(key, []).append((offset, current.get(key)))
                    changed.append(key)
            self.last = dict(current)
        return changed

    def at(self, key: str, offset: int) -> tuple[int, Any] | None:
        """(offset it was set at, value) in force after record ``offset``."""
        found = None
        for since, value in self.changes.get(key, []):
            if since > offset:
                break
            found = (since, value)
        return found if found is not None and found[1] is not None else None


def check_trial(
    records: Sequence[RawRecord], ctx: CheckContext
) -> tuple[list[Violation], Counter[str]]:
    """Every check of :data:`CHECKS` that reads the ledger, the API server's record and
    the audit; returns the violations and counts of what was seen.

    * **gap**: offsets 0..N follow each other, no record is a gaps=fill filler;
    * **fact-lost / fact-twice**: every acknowledged outside fact (by its id) is in the
      ledger, and no fact is there twice (on Kafka a copy left by a retried append, the
      same bytes with the same writer stamp, is not a second write);
    * **trigger-unjustified / trigger-twice**: an accepted ``PreemptionStarted`` answers a
      trigger armed at its basis (quota-decrease: the queue's deadline, armed at some offset;
      overuse: the queue's owing clock; reclaim: the pod's starving clock); a quota-decrease
      one lands where its queue's deadline is still armed and passed (DESIGN §6); no trigger
      is answered by two accepted preemptions, no ``preemption_id`` starts twice;
    * **overlap**: a preemption holds its queue and every queue it evicts from from its
      accepted start to its accepted finish; no other accepted start or eviction there;
    * **eviction-twice**: one outcome record per eviction (a retried append's copy aside),
      no two outcomes that differ, at most one POST answered 201 per pod;
    * **post-without-decision**: every eviction POST names (by uid) a pod of an accepted
      ``EvictionRequested``;
    * **zombie-post / zombie-decision**: no eviction POST left an engine while the server's
      Lease named another holder; no accepted decision was stamped by its epoch's engine
      while the Lease named another holder, and none carries an epoch older than the newest
      accepted ``LeaderElected`` before it;
    * **armed-deadline**: at quiescence no quota-decrease deadline is armed in the past;
    * **audit**: ``quotaledger audit`` exits 0 and flags nothing, finds nothing changed and
      no preemption unfinished.
    """
    out: list[Violation] = []
    stats: Counter[str] = Counter()

    def violate(check: str, detail: str, offsets: Sequence[int] = ()) -> None:
        out.append(Violation(ctx.seed, check, _span(offsets), detail))

    # gap
    expected = 0
    for record in records:
        missing = [o for o in range(expected, record.offset) if o not in ctx.broker_holes]
        if missing:
            violate(
                "gap",
                f"offsets {_span(missing)} missing, next record at {record.offset}",
                [missing[0], record.offset],
            )
        expected = record.offset + 1
    records = contiguous(records)
    stats["records"] = len(records)
    docs = [decode_json(r.payload) for r in records]
    for record, doc in zip(records, docs, strict=True):
        if doc and doc.get("kind") == "FactRejected" and GAP_REASON in str(doc.get("reason", "")):
            violate(
                "gap",
                f"offset {record.offset} holds a gaps=fill filler: {doc.get('reason')}",
                [record.offset],
            )

    # facts of the outside producers
    copies: dict[str, list[RawRecord]] = {}
    for record, doc in zip(records, docs, strict=True):
        fact = doc
        if doc and doc.get("kind") == "FactRejected" and isinstance(doc.get("raw"), str):
            fact = decode_json(doc["raw"].encode())
        if fact and fact.get("kind") == "NamespaceWeighted":
            name = str(fact.get("namespace"))
            if name in ctx.produced:
                copies.setdefault(name, []).append(record)
    for fact_id, acked in ctx.produced.items():
        found = copies.get(fact_id, [])
        if acked and not found:
            violate("fact-lost", f"acknowledged fact {fact_id} is not in the ledger")
        if len(found) > 1:
            if _retried(found, ctx.backend):
                stats["fact copies left by retried appends"] += len(found) - 1
            else:
                violate(
                    "fact-twice",
                    f"fact {fact_id} written {len(found)} times",
                    [r.offset for r in found],
                )
    stats["facts found"] = len(copies)

    # the fold: what was accepted, what was armed when
    projection = Projection()
    deadlines, owing, starving = _History(), _History(), _History()
    holders: dict[str, str] = {}  # queue -> running preemption
    holding: dict[str, set[str]] = {}  # preemption -> queues it holds
    started_at: dict[str, list[RawRecord]] = {}
    triggers: dict[tuple[str, ...], list[int]] = {}
    requested: dict[str, tuple[str, int]] = {}  # eviction id -> (pod uid, offset)
    outcomes: dict[str, list[RawRecord]] = {}
    removed: set[str] = set()
    newest_epoch = 0
    epoch_instance: dict[int, str] = {}
    for record, doc in zip(records, docs, strict=True):
        kind = doc.get("kind") if doc else None
        state = projection.state
        armed_before = (
            state.decrease_deadlines.get(str(doc.get("queue")))
            if kind == "PreemptionStarted" and doc
            else None
        )
        accepted = (
            projection.apply_record(Record(record.offset, record.ts, record.payload)) is not None
        )
        state = projection.state
        deadlines.observe(record.offset, state.decrease_deadlines)
        owing.observe(record.offset, state.owing_since)
        starving.observe(record.offset, state.starving_since)
        if doc is None or not isinstance(kind, str):
            continue
        where = [record.offset]
        if kind == "LeaderElected" and accepted:
            newest_epoch = max(newest_epoch, int(doc.get("epoch", 0)))
            epoch_instance[int(doc.get("epoch", 0))] = str(doc.get("instance"))
        if (
            kind
            in ("PreemptionStarted", "EvictionRequested", "PreemptionFinished", "ClocksObserved")
            and accepted
        ):
            epoch = int(doc.get("epoch", 0))
            if epoch < newest_epoch:
                violate(
                    "zombie-decision",
                    f"{kind} of epoch {epoch} accepted after epoch {newest_epoch} was elected",
                    where,
                )
            decider = epoch_instance.get(epoch)
            holder = _holder_at(ctx.lease_writes, record.stamp)
            if decider is not None and ctx.lease_writes and holder != decider:
                violate(
                    "zombie-decision",
                    f"{kind} of {decider} (epoch {epoch}) stamped {record.stamp} while the Lease"
                    f" named {holder}",
                    where,
                )
        if kind == "PreemptionStarted" and accepted:
            pid, queue, cause = str(doc["preemption_id"]), str(doc["queue"]), str(doc["cause"])
            basis = int(doc.get("basis", -1))
            stats[f"preemptions {cause}"] += 1
            if pid in started_at:
                violate(
                    "trigger-twice",
                    f"{pid} started twice (offsets {started_at[pid][0].offset}, {record.offset})",
                    [started_at[pid][0].offset, record.offset],
                )
            started_at.setdefault(pid, []).append(record)
            if cause == "quota-decrease":
                arm = deadlines.at(queue, basis)
                if armed_before is None or armed_before > record.ts:
                    violate(
                        "trigger-unjustified",
                        f"{pid}: no passed quota-decrease deadline armed for {queue} where it lands"
                        f" (deadline {armed_before}, ts {record.ts})",
                        where,
                    )
                key: tuple[str, ...] = (cause, queue, str(arm[0]) if arm else "none")
            elif cause == "overuse":
                clock = owing.at(queue, basis)
                key = (cause, queue, str(clock[1]) if clock else "none")
            else:
                uid = str(doc.get("pod_uid"))
                clock = starving.at(uid, basis)
                key = (cause, uid, str(clock[1]) if clock else "none")
            if key[-1] == "none":
                violate(
                    "trigger-unjustified",
                    f"{pid}: no {cause} timer armed at its basis {basis}",
                    where,
                )
            else:
                triggers.setdefault(key, []).append(record.offset)
                if len(triggers[key]) > 1:
                    violate(
                        "trigger-twice",
                        f"one {cause} trigger of {key[1]} (armed {key[2]}) answered by"
                        f" {len(triggers[key])} preemptions",
                        triggers[key],
                    )
            if queue in holders:
                violate("overlap", f"{pid} starts on {queue}, held by {holders[queue]}", where)
            holders[queue] = pid
            holding[pid] = {queue}
        elif kind == "EvictionRequested" and accepted:
            eid, pid, queue = str(doc["eviction_id"]), str(doc["preemption_id"]), str(doc["queue"])
            stats["evictions"] += 1
            if holders.get(queue, pid) != pid:
                violate("overlap", f"{pid} evicts from {queue}, held by {holders[queue]}", where)
            holders[queue] = pid
            holding.setdefault(pid, set()).add(queue)
            if eid in requested:
                violate(
                    "eviction-twice", f"{eid} requested twice", [requested[eid][1], record.offset]
                )
            requested[eid] = (str(doc["pod_uid"]), record.offset)
        elif kind == "PreemptionFinished" and accepted:
            for queue in holding.pop(str(doc["preemption_id"]), set()):
                if holders.get(queue) == doc["preemption_id"]:
                    del holders[queue]
        elif kind in ("EvictionSucceeded", "EvictionFailed"):
            outcomes.setdefault(str(doc.get("eviction_id")), []).append(record)
        elif kind == "PodRemoved":
            removed.add(str(doc.get("uid")))
    for eid, found in outcomes.items():
        if eid not in requested:
            violate(
                "eviction-twice",
                f"outcome of {eid}, which was never requested",
                [r.offset for r in found],
            )
        elif len(found) > 1:
            if _retried(found, ctx.backend):
                stats["outcome copies left by retried appends"] += len(found) - 1
            else:
                kinds = [decode_json(r.payload) or {} for r in found]
                violate(
                    "eviction-twice",
                    f"{eid} has {len(found)} outcome records"
                    f" ({', '.join(str(k.get('kind')) for k in kinds)})",
                    [r.offset for r in found],
                )
    state = projection.state

    # the API server's record
    by_uid: dict[str, list[str]] = {}
    for eid, (uid, _) in requested.items():
        by_uid.setdefault(uid, []).append(eid)
    evicted = Counter(post.uid for post in ctx.posts if post.status == 201)
    stats["eviction POSTs"] = len(ctx.posts)
    stats["eviction POSTs answered 201"] = sum(evicted.values())
    for uid, count in evicted.items():
        if count > 1:
            violate("eviction-twice", f"pod {uid} evicted (201) {count} times")
    for post in ctx.posts:
        if post.uid not in by_uid:
            violate(
                "post-without-decision",
                f"POST evicting {post.namespace}/{post.name} (uid {post.uid}, answered"
                f" {post.status}) via {post.via}: no accepted EvictionRequested names it",
            )
    for slot, sent_ms, path in ctx.requests:
        instance = ctx.instance_at[slot](sent_ms) if slot in ctx.instance_at else None
        holder = _holder_at(ctx.lease_writes, sent_ms)
        if instance is not None and holder != instance:
            own = [ms for ms, who in ctx.lease_writes if who == instance and ms <= sent_ms]
            passed = [ms for ms, who in ctx.lease_writes if who != instance and ms <= sent_ms]
            violate(
                "zombie-post",
                f"{instance} sent POST {path} at {sent_ms} while the Lease named {holder}"
                f" (its own last Lease write {sent_ms - own[-1] if own else '?'} ms before,"
                f" the Lease another's for {sent_ms - passed[-1] if passed else '?'} ms)",
            )

    # at quiescence
    if state.settings.quota_preemption_enabled:
        for queue, deadline in sorted(state.decrease_deadlines.items()):
            if deadline < ctx.now_ms - ctx.deadline_grace_ms:
                violate(
                    "armed-deadline",
                    f"{queue}: deadline {deadline} armed, {ctx.now_ms - deadline} ms in the past,"
                    " at the end of the ledger",
                )
    if ctx.audit is not None:
        code, report, err = ctx.audit
        if report is None:
            violate("audit", f"audit exited {code} without a report: {err}")
        else:
            flagged = [
                d
                for d in report.get("decisions", [])
                if d.get("problems") and d.get("refused") is None
            ]
            for decision in flagged[:5]:
                violate(
                    "audit",
                    f"flagged {decision.get('kind')} {decision.get('preemption_id')}:"
                    f" {'; '.join(decision.get('problems', []))[:300]}",
                    [int(decision.get("offset", -1))],
                )
            if report.get("tampered"):
                violate(
                    "audit", f"{report.get('tampered')} digest mismatch(es): {report.get('damage')}"
                )
            if report.get("unfinished"):
                violate("audit", f"preemptions unfinished: {report.get('unfinished')}")
            if code != 0 and not flagged and not report.get("tampered"):
                violate("audit", f"audit exited {code} with nothing flagged: {err}")
            if code == 0 and (flagged or report.get("tampered")):
                violate("audit", f"audit exited 0 although it flagged {len(flagged)} decision(s)")
            stats["decisions audited"] += len(report.get("decisions", []))
            stats["refused by the guard"] += int(report.get("refused", 0))
    return out, stats
