"""Audit: explain every decision of a ledger and re-derive it from the facts (DESIGN §7).

The ledger is folded in order. Each preemption decision is checked against what
the reconcilers' pure functions (:mod:`quotaledger.projections.plans`) decide on
the state the decision names as its ``basis``:

* ``PreemptionStarted`` — a timer of that cause was armed for the queue and due
  at the decision's ts (quota-decrease: the queue's deadline, with
  ``quota_preemption_enabled``; overuse: the owing clock + ``revoke_after_s``,
  with ``revoke_enabled``), the queue was free, and the re-derived plan has the
  same target;
* ``EvictionRequested`` — the pods and their order are the plan's victims;
* ``PreemptionFinished`` — every eviction had an outcome, nothing the plan chose
  was left out, and the outcome and claimed amounts follow §8 rule 26 from the
  evictions' outcomes.

A decision the projection itself refused (the one-preemption-per-queue guard,
a stale epoch, an unknown preemption) is flagged with the projection's reason.

Pure apart from reading records through a callable: no clock, no writes. A
second, lagging projection is advanced to each decision's basis; records between
it and the main fold are buffered, and a basis older than the lagging fold (or
than the buffer keeps) refolds it from offset 0.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from quotaledger.events.codec import EventError, decode_event, peek_kind
from quotaledger.events.ledger import Record
from quotaledger.events.model import (
    DECISION_TYPES,
    ClocksObserved,
    Event,
    EvictionFailed,
    EvictionRequested,
    EvictionSucceeded,
    PodUpserted,
    PreemptionCause,
    PreemptionFinished,
    PreemptionOutcome,
    PreemptionStarted,
    kind_of,
)
from quotaledger.events.quantity import format_amount
from quotaledger.projections import Projection, rfc3339
from quotaledger.projections.clocks import (
    free_capacity,
    is_owing,
    is_starving,
    owed,
    sampled,
)
from quotaledger.projections.derive import settle
from quotaledger.projections.guard import delay_ms
from quotaledger.projections.plans import Plan, Victim
from quotaledger.projections.state import ProjectedState

from .core import EngineCore, Timer, timers
from .render import amounts

#: Kinds written by the engine only (DESIGN §4).
DECISION_KINDS = frozenset({"LedgerOpened", *(t.__name__ for t in DECISION_TYPES)})
#: Decisions that get a paragraph even when the projection accepted them.
AUDITED = (
    ClocksObserved,
    PreemptionStarted,
    EvictionRequested,
    EvictionSucceeded,
    EvictionFailed,
    PreemptionFinished,
)

#: Records kept between the lagging fold and the main one before the lagging
#: fold is pushed forward (a basis older than that refolds from offset 0).
BUFFER_LIMIT = 50_000

RecordSource = Callable[[int], Iterable[Record]]


# ----------------------------------------------------------------- wording


def num(resource: str, amount: int) -> str:
    """An amount without its resource name: ``80Gi``, ``1.5``, ``500m``."""
    return format_amount(resource, amount).removesuffix(f" {resource}")


def _rl(values: Mapping[str, int] | None) -> str:
    return amounts(dict(values) if values is not None else None, unlimited="unlimited")


def _seconds(ms: int) -> str:
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms / 1000:g}s"


def _sort_words(explain: Mapping[str, Any]) -> str:
    key = explain.get("sort_key") or {}
    created = key.get("created_at")
    parts = []
    if "originator" in key:
        parts.append("originator" if key["originator"] else "non-originator")
    if "common_ancestor_depth" in key:
        parts.append(f"common ancestor at depth {key['common_ancestor_depth']}")
    parts.append(f"priority {key.get('priority', 0)}")
    if "allow_preemption" in key:
        parts.append(
            "allows preemption" if key["allow_preemption"] else "does not allow preemption"
        )
    if isinstance(created, str) and created.endswith("+00:00"):
        created = created.removesuffix("+00:00") + "Z"
    parts.append(f"created {created}" if created else "no created_at (counts as oldest)")
    return ", ".join(parts)


def _pod_words(pod: PodUpserted) -> str:
    created = pod.created_at.isoformat() if pod.created_at is not None else None
    return _sort_words(
        {
            "sort_key": {
                "originator": pod.originator,
                "priority": pod.priority,
                "allow_preemption": pod.allow_preemption,
                "created_at": created,
            }
        }
    )


def _explain_words(explain: Mapping[str, Any]) -> str:
    """An eviction's ``explain`` in words: rule, rank and order, the numbers."""
    rule = str(explain.get("rule", "?"))
    words = [
        f"rule {rule}, rank {explain.get('rank')} in the order {RULE_ORDER.get(rule, '?')}"
        f" — {_sort_words(explain)}"
    ]
    queue = explain.get("queue")
    leaf = explain.get("leaf")
    split = leaf is not None and leaf != queue
    own = f"{leaf} " if split else ""
    numbers = [f"{own}used {_rl(explain.get('used'))}"]
    if "runtime" in explain:
        numbers.append(f"runtime {_rl(explain.get('runtime'))}")
    if "guaranteed" in explain:
        numbers.append(f"{own}guaranteed {_rl(explain.get('guaranteed'))}")
    if "max" in explain:
        numbers.append(
            f"{queue}'s max {_rl(explain.get('max'))}"
            if split
            else f"max {_rl(explain.get('max'))}"
        )
    if "owed" in explain:
        numbers.append(f"owed {_rl(explain.get('owed'))}")
    words.append(", ".join(numbers))
    target = f"target {_rl(explain.get('target'))}"
    if split:
        target = f"{leaf}'s share of {queue}'s {target}"
    if "for_pod" in explain:
        target += f" for starving pod {explain['for_pod']} in {explain.get('for_queue')}"
    words.append(target)
    return "; ".join(words)


RULE_ORDER = {
    "quota-decrease": "non-originator first, lower priority, allow_preemption first, younger, uid",
    "reclaim": "owing quotas nearest the starving pod first (deeper common ancestor), lower"
    " priority, later start, uid; each owing quota gives at most what it owed",
    "overuse": "least important first (lower priority, later start, uid); the most important"
    " removed pods that still fit under runtime are added back",
}


# ----------------------------------------------------------------- findings


@dataclass(slots=True)
class Finding:
    """One audited decision: what it says, why (in words), and what is wrong with it."""

    offset: int
    ts: int
    kind: str
    queue: str | None = None
    preemption_id: str | None = None
    pod_uid: str | None = None
    explanation: str = ""
    problems: list[str] = field(default_factory=list)

    @property
    def justified(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {
            "offset": self.offset,
            "at": rfc3339(self.ts),
            "kind": self.kind,
            "queue": self.queue,
            "preemption_id": self.preemption_id,
            "pod_uid": self.pod_uid,
            "explanation": self.explanation,
            "justified": self.justified,
            "problems": list(self.problems),
        }

    def text(self) -> str:
        lines = [("FLAGGED " if self.problems else "") + self.explanation]
        lines.extend(f"  ! {problem}" for problem in self.problems)
        return "\n".join(lines)


@dataclass(slots=True)
class AuditReport:
    """Every audited decision in ledger order."""

    findings: list[Finding] = field(default_factory=list)
    records: int = 0
    unfinished: list[str] = field(default_factory=list)

    @property
    def flagged(self) -> int:
        return sum(1 for finding in self.findings if finding.problems)

    def for_pod(self, uid: str) -> AuditReport:
        """Decisions concerning one pod: its evictions (and their outcomes) and
        the start and finish of the preemptions that requested them (or that
        reclaim for it)."""
        preemptions = {
            f.preemption_id
            for f in self.findings
            if f.pod_uid == uid and f.preemption_id is not None
        }
        kept = [
            f
            for f in self.findings
            if f.pod_uid == uid
            or (
                f.preemption_id in preemptions
                and f.kind in ("PreemptionStarted", "PreemptionFinished")
            )
        ]
        return AuditReport(kept, self.records, [p for p in self.unfinished if p in preemptions])

    def to_json(self) -> dict[str, Any]:
        return {
            "decisions": [finding.to_json() for finding in self.findings],
            "flagged": self.flagged,
            "records": self.records,
            "unfinished": list(self.unfinished),
        }

    def text(self) -> str:
        parts = [finding.text() for finding in self.findings]
        for preemption_id in self.unfinished:
            parts.append(f"preemption {preemption_id} is still running at the end of the ledger")
        parts.append(
            f"{len(self.findings)} decision(s) audited over {self.records} record(s);"
            f" {self.flagged} flagged"
        )
        return "\n".join(parts)


@dataclass(slots=True)
class _Expected:
    """What the re-derivation says a preemption should do."""

    queue: str
    cause: PreemptionCause
    plan: Plan | None
    requested: list[str] = field(default_factory=list)


# ----------------------------------------------------------------- lagging fold


class _Lagging:
    """A projection folded up to a basis, behind the main fold."""

    def __init__(self, source: RecordSource) -> None:
        self.source = source
        self.projection = Projection()
        self.buffer: deque[Record] = deque()  # records after projection's offset, in order
        self.refolds = 0

    def push(self, record: Record) -> None:
        self.buffer.append(record)
        while len(self.buffer) > BUFFER_LIMIT:
            self.projection.apply_record(self.buffer.popleft())

    def at(self, basis: int) -> ProjectedState:
        """The state folded through ``basis`` (which the main fold has passed)."""
        if basis < self.projection.state.offset:
            self._refold(basis)
        while self.buffer and self.buffer[0].offset <= basis:
            self.projection.apply_record(self.buffer.popleft())
        return self.projection.state

    def _refold(self, basis: int) -> None:
        self.refolds += 1
        keep = list(self.buffer)
        end = keep[0].offset if keep else None
        projection = Projection()
        pending: list[Record] = []
        for record in self.source(0):
            if record.offset <= basis:
                projection.apply_record(record)
            elif end is None or record.offset < end:
                pending.append(record)
            else:
                break
        self.projection = projection
        self.buffer = deque(pending + keep)


# ----------------------------------------------------------------- the auditor


class Auditor:
    """Feeds records in order; collects a :class:`Finding` per decision."""

    def __init__(self, source: RecordSource) -> None:
        self.main = Projection()
        self.lagging = _Lagging(source)
        self.report = AuditReport()
        self.expected: dict[str, _Expected] = {}
        self.eviction_pods: dict[str, str] = {}

    def feed(self, record: Record) -> None:
        self.report.records += 1
        try:
            event: Event | None = decode_event(record.payload)
        except EventError:
            event = None
        finding: Finding | None = None
        if event is not None and isinstance(event, AUDITED):
            finding = self._explain(record, event)
        before = len(self.main.state.rejected)
        if event is None:
            self.main.apply_record(record)  # records the decoding error as a rejection
        else:
            self.main.apply(record.offset, record.ts, event)
        refused = [r for r in self.main.state.rejected[before:] if r.offset == record.offset]
        kind = kind_of(event) if event is not None else peek_kind(record.payload)
        if refused and kind in DECISION_KINDS:
            if finding is None:
                finding = Finding(
                    record.offset,
                    record.ts,
                    kind or "?",
                    explanation=f"{rfc3339(record.ts)} #{record.offset} {kind}",
                )
            for rejection in reversed(refused):
                finding.problems.insert(0, f"refused by the projection: {rejection.reason}")
        if finding is not None:
            self.report.findings.append(finding)
        self.lagging.push(record)

    def finish(self) -> AuditReport:
        self.report.unfinished = sorted(self.main.state.preemptions)
        return self.report

    # ------------------------------------------------------------ dispatch

    def _explain(self, record: Record, event: Event) -> Finding:
        head = f"{rfc3339(record.ts)} #{record.offset}"
        if isinstance(event, ClocksObserved):
            return self._clocks(record, event, head)
        if isinstance(event, PreemptionStarted):
            return self._started(record, event, head)
        if isinstance(event, EvictionRequested):
            return self._requested(record, event, head)
        if isinstance(event, PreemptionFinished):
            return self._finished(record, event, head)
        assert isinstance(event, EvictionSucceeded | EvictionFailed)
        return self._outcome(record, event, head)

    # ------------------------------------------------------------ ClocksObserved

    def _clocks(self, record: Record, event: ClocksObserved, head: str) -> Finding:
        """Every clock started must owe (starve) at the basis, every stopped one not
        (DECISIONS 13): the clocks that justify revoke and reclaim deadlines."""
        finding = Finding(record.offset, record.ts, "ClocksObserved")
        parts = []
        for label, started, stopped in (
            ("owing", event.owing_started, event.owing_stopped),
            ("starving", event.starving_started, event.starving_stopped),
        ):
            if started:
                parts.append(
                    f"{label} from now: "
                    + ", ".join(f"{k} (since {rfc3339(v)})" for k, v in sorted(started.items()))
                )
            if stopped:
                parts.append(f"{label} no more: " + ", ".join(sorted(stopped)))
        finding.explanation = f"{head} clocks sampled at basis #{event.basis}: " + "; ".join(parts)
        if not 0 <= event.basis < record.offset:
            finding.problems.append(
                f"basis #{event.basis} is not a record before this one (#{record.offset})"
            )
            return finding
        state = self.lagging.at(event.basis)
        settle(state)
        free = free_capacity(state)

        def owes(name: str) -> bool:
            node = state.quotas.get(name)
            return node is not None and is_owing(node)

        def starves(uid: str) -> bool:
            return uid in state.pending_pods and is_starving(state, uid, free)

        for name in sorted(event.owing_started):
            if not owes(name):
                finding.problems.append(f"{name} did not owe at basis #{event.basis}")
        for name in event.owing_stopped:
            if owes(name):
                finding.problems.append(f"{name} still owed at basis #{event.basis}")
        for uid in sorted(event.starving_started):
            if not starves(uid):
                finding.problems.append(f"pod {uid} was not starving at basis #{event.basis}")
        for uid in event.starving_stopped:
            if starves(uid):
                finding.problems.append(f"pod {uid} was still starving at basis #{event.basis}")
        return finding

    # ------------------------------------------------------------ PreemptionStarted

    def _started(self, record: Record, event: PreemptionStarted, head: str) -> Finding:
        finding = Finding(
            record.offset,
            record.ts,
            "PreemptionStarted",
            queue=event.queue,
            preemption_id=event.preemption_id,
            pod_uid=event.pod_uid,
        )
        basis = event.basis
        recorded = f"target {_rl(event.target)}, basis #{basis}"
        if not 0 <= basis < record.offset:
            finding.explanation = f"{head} {event.cause} preemption on {event.queue}: {recorded}."
            finding.problems.append(
                f"basis #{basis} is not a record before this decision (#{record.offset})"
            )
            self.expected[event.preemption_id] = _Expected(event.queue, event.cause, None)
            return finding
        state = self.lagging.at(basis)
        if event.queue not in state.quotas:
            finding.explanation = f"{head} {event.cause} preemption on {event.queue}: {recorded}."
            finding.problems.append(f"quota {event.queue!r} did not exist at basis #{basis}")
            self.expected[event.preemption_id] = _Expected(event.queue, event.cause, None)
            return finding
        timer = self._due_timer(state, event, record.ts, finding)
        holder = state.occupied.get(event.queue)
        if holder is not None:
            finding.problems.append(
                f"{event.queue} was occupied by preemption {holder} at basis #{basis}"
                " (§8 rule 34: a timer waits for the running preemption)"
            )
        plan = self._plan(state, event, timer)
        self.expected[event.preemption_id] = _Expected(event.queue, event.cause, plan)
        if event.cause == "quota-decrease":
            why = self._why_decrease(state, event, timer)
        elif event.cause == "overuse":
            why = self._why_overuse(state, event, timer)
        elif event.cause == "reclaim":
            why = self._why_reclaim(state, event, timer)
        else:
            why = f"{recorded}."
        finding.explanation = (
            f"{head} {event.cause} preemption {event.preemption_id} on {event.queue}"
            f" (from the facts through #{basis}): {why}"
        )
        if plan is None:
            if event.cause == "overuse":
                finding.problems.append(
                    f"{event.queue} did not owe anything at basis #{basis}: nothing to revoke"
                )
            else:
                finding.problems.append(
                    f"the facts through #{basis} give an empty target: nothing to preempt"
                    " (§8 rule 21 records nothing)"
                )
        elif plan.target != event.target:
            finding.problems.append(
                f"recorded target {_rl(event.target)} differs from the re-derived"
                f" {_rl(plan.target)}"
            )
        if plan is not None:
            if plan.victims:
                names = ", ".join(v.pod_uid for v in plan.victims)
                finding.explanation += f" The rule picks {len(plan.victims)} victim(s): {names}."
            else:
                finding.explanation += f" No victim is possible: {plan.reason}."
        return finding

    def _due_timer(
        self, state: ProjectedState, event: PreemptionStarted, ts: int, finding: Finding
    ) -> Timer | None:
        """The armed timer that justifies the decision, or None (with a problem)."""
        matching = [
            timer
            for timer in timers(state)
            if timer.cause == event.cause
            and timer.queue == event.queue
            and (event.cause != "reclaim" or timer.pod_uid == (event.pod_uid or ""))
        ]
        if not matching:
            finding.problems.append(self._why_no_timer(state, event))
            return None
        timer = matching[0]
        if timer.deadline > ts:
            finding.problems.append(
                f"fired at {rfc3339(ts)}, before its deadline {rfc3339(timer.deadline)}"
            )
        return timer

    @staticmethod
    def _why_no_timer(state: ProjectedState, event: PreemptionStarted) -> str:
        settings = state.settings
        queue = event.queue
        at = f"at basis #{event.basis}"
        if event.cause == "quota-decrease":
            if not settings.quota_preemption_enabled:
                return f"quota_preemption_enabled was false {at} (§8 rule 19)"
            return f"no quota-decrease timer was armed for {queue} {at}"
        if event.cause == "overuse":
            if not settings.revoke_enabled:
                return f"revoke_enabled was false {at}"
            if queue in state.owing_held:
                return (
                    f"{queue}'s overuse clock was held after its last revoke {at}"
                    " (§8 rule 29: it restarts with the next fact)"
                )
            return f"{queue} was not owing {at}"
        if event.cause == "reclaim" and not settings.reclaim_enabled:
            return f"reclaim_enabled was false {at}"
        return f"no {event.cause} timer was armed for {queue} {at}"

    @staticmethod
    def _plan(state: ProjectedState, event: PreemptionStarted, timer: Timer | None) -> Plan | None:
        """The plan the engine computes for this timer on the basis state."""
        if timer is None:
            timer = Timer(
                deadline=0,
                cause_rank=0,
                depth_rank=0,
                queue=event.queue,
                pod_uid=event.pod_uid or "",
                cause=event.cause,
            )
        return EngineCore(Projection(state)).plan(timer)

    @staticmethod
    def _why_decrease(state: ProjectedState, event: PreemptionStarted, timer: Timer | None) -> str:
        node = state.quotas[event.queue]
        config = node.config
        cap = config.max or {}
        keys = sorted(set(event.target) | {k for k in cap if node.used.get(k, 0) > cap[k]})
        parts = []
        over = [k for k in keys if k in cap]
        if over:
            exceeded = "; ".join(
                f"used {k} {num(k, node.used.get(k, 0))} exceeded max {num(k, cap[k])}"
                for k in over
            )
            parts.append(exceeded)
        delay = delay_ms(config)
        if timer is not None:
            parts.append(
                f"since the change at {rfc3339(timer.deadline - delay)} + delay"
                f" {_seconds(delay)} (due {rfc3339(timer.deadline)})"
            )
        guaranteed = _rl(config.min) if config.min else "nothing"
        parts.append(f"guaranteed {guaranteed}")
        clamps = []
        for k, value in event.target.items():
            raw = node.used.get(k, 0) - cap.get(k, 0)
            if k in cap and value < raw:
                clamps.append(f"{k} {num(k, raw)} over max, but only {num(k, value)} above a min")
        if clamps:
            parts.append("limited by the guarantee: " + "; ".join(clamps))
        parts.append(f"target {_rl(event.target)}")
        if config.is_parent:
            parts.append("split among the children by releasable usage (used above min)")
        return "; ".join(parts) + "."

    @staticmethod
    def _why_overuse(state: ProjectedState, event: PreemptionStarted, timer: Timer | None) -> str:
        node = state.quotas[event.queue]
        gap = owed(node)
        keys = sorted(gap) or sorted(event.target)
        cap = node.config.max
        held = ", ".join(
            f"{k} {num(k, min(node.used.get(k, 0), (cap or {}).get(k, node.used.get(k, 0))))}"
            for k in keys
        )
        parts = [
            f"held {held} (min of used and max) above its runtime"
            f" {', '.join(f'{k} {num(k, node.runtime.get(k, 0))}' for k in keys)}"
            f" (used {_rl(node.used)}, max {_rl(cap)}, guaranteed {_rl(node.config.min)})"
        ]
        since = sampled(state).get(event.queue)
        after = round(state.settings.revoke_after_s * 1000)
        if since is not None and timer is not None:
            parts.append(
                f"owing continuously since {rfc3339(since)}, longer than revoke_after"
                f" {_seconds(after)} (due {rfc3339(since + after)})"
            )
        parts.append(f"target used − runtime = {_rl(event.target)}")
        return "; ".join(parts) + "."

    @staticmethod
    def _why_reclaim(state: ProjectedState, event: PreemptionStarted, timer: Timer | None) -> str:
        uid = event.pod_uid or "?"
        pod = state.pods.get(uid)
        parts = [f"pod {uid} in {event.queue} is starving"]
        if pod is not None:
            node = state.quotas[event.queue]
            parts[0] += (
                f": pending, requests {_rl(pod.requests)}, which fits {event.queue}'s runtime"
                f" {_rl(node.runtime)} (used {_rl(node.used)}) but not the cluster's free"
                " capacity"
            )
        after = round(state.settings.reclaim_after_s * 1000)
        if timer is not None:
            parts.append(
                f"starving continuously since {rfc3339(timer.deadline - after)}, longer than"
                f" reclaim_after {_seconds(after)} (due {rfc3339(timer.deadline)})"
            )
        parts.append(f"target request − free = {_rl(event.target)}")
        parts.append("taken from owing quotas, nearest in the tree first")
        return "; ".join(parts) + "."

    # ------------------------------------------------------------ EvictionRequested

    def _requested(self, record: Record, event: EvictionRequested, head: str) -> Finding:
        finding = Finding(
            record.offset,
            record.ts,
            "EvictionRequested",
            queue=event.queue,
            preemption_id=event.preemption_id,
            pod_uid=event.pod_uid,
        )
        self.eviction_pods[event.eviction_id] = event.pod_uid
        state = self.main.state
        pod = state.pods.get(event.pod_uid)
        releases = f"; releases {_rl(pod.requests)}" if pod is not None else ""
        expected = self.expected.get(event.preemption_id)
        victim: Victim | None = None
        if expected is not None:
            index = len(expected.requested)
            expected.requested.append(event.pod_uid)
            victims = expected.plan.victims if expected.plan is not None else []
            if expected.plan is not None:
                victim = self._check_victim(event, victims, index, finding)
        words = [f"{head} evict {event.pod_uid} from {event.queue} ({event.preemption_id})"]
        if victim is not None:
            words.append(": " + _explain_words(victim.explain) + releases + ".")
        else:
            if event.explain:
                words.append(": the recorded explain claims " + _explain_words(event.explain))
            else:
                words.append(": no explanation recorded")
            if pod is not None:
                words.append(
                    f"; {event.pod_uid} itself: {_pod_words(pod)}, requests {_rl(pod.requests)}"
                )
            words.append(".")
        finding.explanation = "".join(words)
        return finding

    @staticmethod
    def _check_victim(
        event: EvictionRequested, victims: list[Victim], index: int, finding: Finding
    ) -> Victim | None:
        order = ", ".join(v.pod_uid for v in victims) or "none"
        if index >= len(victims):
            finding.problems.append(
                f"the rule chooses {len(victims)} victim(s) ({order}); this eviction of"
                f" {event.pod_uid} is not one of them"
                if event.pod_uid not in (v.pod_uid for v in victims)
                else f"{event.pod_uid} was requested more than once"
            )
            return None
        victim = victims[index]
        if victim.pod_uid != event.pod_uid:
            chosen = next((v for v in victims if v.pod_uid == event.pod_uid), None)
            if chosen is None:
                finding.problems.append(
                    f"names {event.pod_uid}, which the rule does not choose; victim"
                    f" #{index + 1} is {victim.pod_uid} (rank {victim.explain.get('rank')}:"
                    f" {_sort_words(victim.explain)}); the rule's victims: {order}"
                )
                return None
            finding.problems.append(
                f"{event.pod_uid} is requested out of order: victim #{index + 1} is"
                f" {victim.pod_uid}; the rule's order: {order}"
            )
            return chosen
        if victim.queue != event.queue:
            finding.problems.append(
                f"records queue {event.queue}, but {victim.pod_uid} is in {victim.queue}"
            )
        if event.explain and dict(event.explain) != dict(victim.explain):
            differing = sorted(
                key
                for key in set(event.explain) | set(victim.explain)
                if event.explain.get(key) != victim.explain.get(key)
            )
            finding.problems.append(
                "recorded explain differs from the re-derived numbers in: " + ", ".join(differing)
            )
        return victim

    # ------------------------------------------------------------ outcomes

    def _outcome(
        self, record: Record, event: EvictionSucceeded | EvictionFailed, head: str
    ) -> Finding:
        kind = kind_of(event)
        run = self.main.state.evictions.get(event.eviction_id)
        pod = self.eviction_pods.get(event.eviction_id)
        finding = Finding(
            record.offset,
            record.ts,
            kind,
            queue=run.queue if run is not None else None,
            preemption_id=run.preemption_id if run is not None else None,
            pod_uid=pod,
        )
        what = "succeeded" if isinstance(event, EvictionSucceeded) else f"failed: {event.error}"
        late = ""
        if run is None:
            late = " (no eviction with that id is running: a repeated or late outcome, a no-op)"
        elif run.outcome is not None:
            late = f" (already settled as {run.outcome}: a no-op)"
        finding.explanation = f"{head} eviction {event.eviction_id} of {pod or '?'} {what}{late}."
        return finding

    # ------------------------------------------------------------ PreemptionFinished

    def _finished(self, record: Record, event: PreemptionFinished, head: str) -> Finding:
        finding = Finding(
            record.offset,
            record.ts,
            "PreemptionFinished",
            queue=event.queue,
            preemption_id=event.preemption_id,
        )
        reason = f" ({event.reason})" if event.reason else ""
        text = (
            f"{head} preemption {event.preemption_id} on {event.queue} finished {event.outcome}:"
            f" claimed {_rl(event.claimed)}{reason}"
        )
        state = self.main.settled()
        run = state.preemptions.get(event.preemption_id)
        if run is None:
            finding.explanation = text + "."
            return finding
        evictions = [state.evictions[e] for e in run.evictions if e in state.evictions]
        succeeded = [e for e in evictions if e.outcome == "succeeded"]
        failed = [e for e in evictions if e.outcome == "failed"]
        text += (
            f" of target {_rl(run.target)}; {len(succeeded)} eviction(s) succeeded,"
            f" {len(failed)} failed"
        )
        node = state.quotas.get(run.queue)
        if run.cause == "overuse" and node is not None:
            text += f"; {run.queue} now uses {_rl(node.used)} with runtime {_rl(node.runtime)}"
        finding.explanation = text + "."
        waiting = [e.pod_uid for e in evictions if e.outcome is None]
        if waiting:
            finding.problems.append(
                "finished while the eviction of " + ", ".join(waiting) + " had no outcome yet"
            )
        expected = self.expected.get(event.preemption_id)
        if expected is not None and expected.plan is not None:
            missing = [
                v.pod_uid for v in expected.plan.victims if v.pod_uid not in expected.requested
            ]
            if missing:
                finding.problems.append(
                    "the rule's victim(s) " + ", ".join(missing) + " were never requested"
                )
        want = self._expected_finish(run.preemption_id, bool(evictions))
        if want is not None and not waiting:
            outcome, claimed = want
            if outcome != event.outcome:
                finding.problems.append(
                    f"outcome {event.outcome} does not follow from the evictions' outcomes:"
                    f" §8 rule 26 gives {outcome}"
                )
            if claimed != dict(event.claimed):
                finding.problems.append(
                    f"claimed {_rl(event.claimed)}, but the successful evictions release"
                    f" {_rl(claimed)}"
                )
        return finding

    def _expected_finish(
        self, preemption_id: str, any_eviction: bool
    ) -> tuple[PreemptionOutcome, dict[str, int]] | None:
        if not any_eviction:
            return "not-helpful", {}
        for finished in EngineCore(self.main).finished():
            if finished.preemption_id == preemption_id:
                return finished.outcome, dict(finished.claimed)
        return None


def audit(source: RecordSource) -> AuditReport:
    """Audit every record ``source(0)`` yields; ``source(n)`` must yield the same
    records from offset ``n`` (used to refold for an out-of-order basis)."""
    auditor = Auditor(source)
    for record in source(0):
        auditor.feed(record)
    return auditor.finish()
