"""Audit: re-derive every decision of a ledger from the facts and check its digests
(DESIGN §7 audit, §9 integrity). This module decides; :mod:`.audit_words` says it.

Every record is folded from offset 0: by this pass, or, in a parallel audit, by
the segment before a snapshot that the next segment starts from once the
records reproduce it (:func:`audit_span`; a snapshot is never believed). Each
preemption decision is checked against what the reconcilers' pure functions
(:mod:`quotaledger.projections.plans`) decide on the state the decision names as
its ``basis``:

* ``PreemptionStarted`` — a timer of that cause was armed for the queue and due
  at the decision's ts (quota-decrease: the queue's deadline, with
  ``quota_preemption_enabled``; overuse: the owing clock + ``revoke_after_s``,
  with ``revoke_enabled``), the queue was free, and the re-derived plan has the
  same target; and where it lands, that timer is still armed and due and its
  id was never started before (the guard's rule, DECISIONS 211);
* ``EvictionRequested`` — the pods and their order are the plan's victims;
* ``PreemptionFinished`` — every eviction had an outcome, nothing the plan chose
  was left out, and the outcome and claimed amounts follow §8 rule 26 from the
  evictions' outcomes;
* ``ClocksObserved`` — every clock started owes (starves) at the basis, every
  stopped one does not;
* ``LedgerDigest`` — its ``state_hash`` is the hash of the state re-derived
  through ``through``.

A decision the projection refused (the one-preemption-per-queue guard, a stale
epoch) is reported as refused, with the re-derivation's notes, and not flagged.

The digest chain (:class:`DigestAudit`) is checked in the same pass: every
``LedgerDigest`` record and every digest given from elsewhere must equal
``d(through)`` of the records as they are; a mismatch names the records that
changed (between the last digest that matched and the first that does not).

Pure apart from reading records through a callable: no clock, no writes. A
second, lagging projection is advanced to each decision's basis when a decision
asks for it; the latest records are buffered, older ones read again from the
source, and a basis older than the lagging fold refolds it from offset 0.
"""

from __future__ import annotations

import bisect
import itertools
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from quotaledger.events.codec import EventError, decode_event, peek_kind
from quotaledger.events.digest import DigestChain, next_digest, parse_digest
from quotaledger.events.ledger import LedgerError, Record, RecordSource, Snapshot
from quotaledger.events.model import (
    DECISION_KINDS,
    ClocksObserved,
    Event,
    EvictionFailed,
    EvictionRequested,
    EvictionSucceeded,
    FactRejected,
    LedgerDigest,
    PodRemoved,
    PodUpserted,
    PreemptionCause,
    PreemptionFinished,
    PreemptionOutcome,
    PreemptionStarted,
    kind_of,
)
from quotaledger.projections import Projection, rfc3339, state_hash
from quotaledger.projections.clocks import free_capacity, is_owing, is_starving
from quotaledger.projections.derive import settle
from quotaledger.projections.plans import Plan, Victim, comparable_explain, decrease_target
from quotaledger.projections.snapshot import dump, load
from quotaledger.projections.state import ProjectedState

from .audit_findings import AuditReport, DigestCheck, Finding, Problem
from .audit_words import (
    clocks_words,
    explain_words,
    pod_words,
    rl,
    why_decrease,
    why_overuse,
    why_reclaim,
)
from .core import EngineCore, Timer, timers

#: Decisions that get a paragraph even when the projection accepted them.
AUDITED = (
    ClocksObserved,
    PreemptionStarted,
    EvictionRequested,
    EvictionSucceeded,
    EvictionFailed,
    PreemptionFinished,
)

#: Records the lagging fold keeps in memory; older ones are read again from the
#: source when a basis needs them.
BUFFER_LIMIT = 50_000
#: How many states before a PreemptionFinished its overuse outcome may have been
#: judged on (DECISIONS 212); beyond, only the state just before it counts.
JUDGED_WINDOW = 1_000


@dataclass(slots=True)
class _Expected:
    """What the re-derivation says a preemption should do."""

    queue: str
    cause: PreemptionCause
    plan: Plan | None
    requested: list[str] = field(default_factory=list)


# ----------------------------------------------------------------- lagging fold


class _Lagging:
    """A projection folded up to a basis, behind the main fold, lazily.

    ``projection`` is at some offset p; ``buffer`` holds the latest records the
    main fold has passed (at most :data:`BUFFER_LIMIT`; older ones are dropped,
    not folded). Nothing is folded until a decision asks for its basis: then
    the records p+1..basis are folded, from the buffer when it holds them and
    read again from the source otherwise (issue #11: a ledger of facts alone
    costs no second fold). A basis before p refolds from offset 0.
    """

    def __init__(
        self, source: RecordSource, fed: int = -1, seed: tuple[int, bytes] | None = None
    ) -> None:
        """``seed``: a segment started from a snapshot (offset, blob): a basis at or
        after its offset restarts from the snapshot instead of offset 0."""
        self.source = source
        self.projection = Projection()
        self.fed = fed
        self.buffer: deque[Record] = deque()  # the latest records fed, in order
        self.refolds = 0
        self.seed = seed

    def push(self, record: Record) -> None:
        self.buffer.append(record)
        self.fed = record.offset
        if len(self.buffer) > BUFFER_LIMIT:
            self.buffer.popleft()

    def at(self, basis: int) -> ProjectedState:
        """The state folded through ``basis`` (which the main fold has passed)."""
        if basis < self.projection.state.offset:
            self.refolds += 1
            self.projection = Projection()
        if self.seed is not None and self.projection.state.offset < self.seed[0] <= basis:
            self.projection = Projection(load(self.seed[1]))
        offset = self.projection.state.offset
        buffer = self.buffer
        while buffer and buffer[0].offset <= offset:
            buffer.popleft()
        if offset < basis and (not buffer or buffer[0].offset != offset + 1):
            # the records between the fold and the buffer are read again
            # (never past what the main fold has passed, whatever the basis says)
            until = min(basis, buffer[0].offset - 1 if buffer else self.fed)
            apply_record = self.projection.apply_record
            for record in self.source(offset + 1):
                if record.offset > until:
                    break
                apply_record(record)
        while buffer and buffer[0].offset <= basis:
            self.projection.apply_record(buffer.popleft())
        return self.projection.state


# ----------------------------------------------------------------- the digest chain


class DigestAudit:
    """The digest chain of the records as they are, checked against every digest
    recorded (``LedgerDigest``) or given (``--digest OFFSET:HEX``).

    A mismatch at ``through`` means some record in ``0..through`` changed since
    the digest was taken; as every digest that matched covers its records, the
    change lies after the last matching ``through`` below it. When an earlier
    digest failed too, the records between it and this one are re-hashed from
    that recorded digest: if they match, the change is the earlier one's.
    """

    def __init__(
        self,
        source: RecordSource,
        given: Mapping[int, bytes] | None = None,
        chain: DigestChain | None = None,
    ) -> None:
        """``chain``: where the chain starts (a segment's: the digest its snapshot
        stores, at the snapshot's offset); by default at offset -1."""
        self.source = source
        self.chain = chain if chain is not None else DigestChain(keep=1 << 16)
        self.given = dict(given or {})
        self.good: list[int] = []  # sorted throughs whose digest matched
        self.recorded: dict[int, bytes] = {}  # through -> a digest that did not match
        self.checks: list[DigestCheck] = []

    def feed(self, record: Record) -> None:
        self.chain.update(record)
        wanted = self.given.pop(record.offset, None)
        if wanted is not None:
            self.checks.append(self._check(record.offset, wanted, None))

    def feed_alone(self, record: Record) -> None:
        """:meth:`feed`, and check the record if it is a ``LedgerDigest`` (the
        chain pass of a parallel audit, which folds nothing)."""
        self.feed(record)
        if peek_kind(record.payload) == "LedgerDigest":
            try:
                event = decode_event(record.payload)
            except EventError:
                return
            if isinstance(event, LedgerDigest):
                self.check_record(record.offset, event)

    def check_record(self, offset: int, event: LedgerDigest) -> DigestCheck:
        """A ``LedgerDigest`` at ``offset`` (fed already)."""
        if not 0 <= event.through < offset:
            problem = Problem("through-not-before", {"through": event.through, "offset": offset})
            check = DigestCheck(event.through, event.digest, offset, problems=[problem])
            self.checks.append(check)
            return check
        try:
            wanted = bytes.fromhex(event.digest)
        except ValueError:
            wanted = b""
        check = self._check(event.through, wanted, offset, event.digest)
        self.checks.append(check)
        return check

    def finish(self) -> None:
        """Digests given for offsets the ledger does not reach: records removed."""
        for through, wanted in sorted(self.given.items()):
            problem = Problem("beyond-end", {"through": through, "last": self.chain.through})
            self.checks.append(DigestCheck(through, wanted.hex(), None, problems=[problem]))
        self.given.clear()

    def digest_at(self, through: int) -> bytes:
        """``d(through)`` of the records as they are (re-read when no longer kept)."""
        known = self.chain.at(through)
        if known is not None:
            return known
        chain = DigestChain()
        for record in self.source(0):
            chain.update(record)
            if record.offset == through:
                break
        return chain.digest

    def _check(
        self, through: int, wanted: bytes, offset: int | None, shown: str | None = None
    ) -> DigestCheck:
        actual = self.digest_at(through)
        recorded = shown if shown is not None else wanted.hex()
        check = DigestCheck(through, recorded, offset, actual.hex())
        if actual == wanted:
            bisect.insort(self.good, through)
            return check
        below = bisect.bisect_left(self.good, through)
        first = (self.good[below - 1] + 1) if below else 0
        data: dict[str, Any] = {
            "through": through,
            "recorded": recorded,
            "actual": actual.hex(),
            "first": first,
            "last": through,
            "consistent_after": None,
        }
        earlier = [t for t in self.recorded if first <= t < through]
        if earlier:
            anchor = max(earlier)
            if self._segment(anchor, self.recorded[anchor], through) == wanted:
                data["consistent_after"] = anchor
            else:
                data["first"] = anchor + 1
        if len(wanted) == 32:
            self.recorded[through] = wanted
        check.problems.append(Problem("digest-mismatch", data))
        return check

    def _segment(self, after: int, seed: bytes, through: int) -> bytes:
        """The chain over records ``after+1..through`` started from ``seed``."""
        digest = seed
        for record in self.source(after + 1):
            if record.offset > through:
                break
            digest = next_digest(digest, record.offset, record.ts, record.payload)
        return digest


# ----------------------------------------------------------------- the auditor


class Auditor:
    """Feeds records in order; collects a :class:`Finding` per decision and a
    :class:`DigestCheck` per digest."""

    def __init__(
        self,
        source: RecordSource,
        *,
        digests: Mapping[int, bytes] | None = None,
        start: _Prefix | None = None,
    ) -> None:
        """``start``: a segment of a parallel audit starts from the fold of the
        records before it (:func:`audit_segment`: it checks no digest chain, the
        parent does) or from a snapshot (:func:`audit_span`: its chain starts
        from the snapshot's digest); by default the audit starts at offset 0."""
        self.source = source
        self.main = start.projection if start is not None else Projection()
        self.begin = self.main.state.offset + 1
        seed = (start.projection.state.offset, start.blob) if start and start.blob else None
        self.lagging = _Lagging(source, self.main.state.offset, seed)
        self.report = AuditReport()
        self.expected: dict[str, _Expected] = {}
        self.eviction_pods: dict[str, str] = dict(start.eviction_pods) if start else {}
        #: preemption id -> (offset of its PreemptionStarted, pods requested since),
        #: for preemptions started before a segment (re-derived when referenced).
        self.pending_starts = dict(start.starts) if start else {}
        #: False until the records before a segment started from a snapshot have
        #: been scanned for preemptions and evictions (:meth:`_index_prefix`).
        self.indexed = start.indexed if start else True
        self.chain: DigestAudit | None = None
        if start is None:
            self.chain = DigestAudit(source, digests)
        elif start.digest is not None:
            seeded = DigestChain(start.digest, self.begin - 1, keep=1 << 16)
            self.chain = DigestAudit(source, digests, seeded)
        #: State hashes known for an offset (a segment's start: its snapshot's).
        self.known_hashes: dict[int, str] = {}
        if start is not None and start.state_hash is not None:
            self.known_hashes[self.begin - 1] = start.state_hash
        #: State hash problems of LedgerDigest records, by offset (a parallel audit
        #: attaches them to the parent's digest checks).
        self.hash_problems: list[tuple[int, Problem]] = []
        self.next_offset = self.begin
        self.stopped = False
        #: ids of the PreemptionStarted records the projection accepted (this pass)
        self.started_ids: set[str] = set()
        #: eviction id -> offset of the record that gave it its outcome (this pass)
        self.settled_at: dict[str, int] = {}

    def feed(self, record: Record) -> None:
        if self.stopped:
            return
        if record.offset != self.next_offset:
            self.report.damage.append(
                Problem("gap", {"expected": self.next_offset, "found": record.offset})
            )
            self.stopped = True
            return
        self.next_offset += 1
        self.report.records += 1
        if self.chain is not None:
            self.chain.feed(record)
        try:
            event: Event | None = decode_event(record.payload)
        except EventError:
            event = None
        finding: Finding | None = None
        if event is not None and isinstance(event, AUDITED):
            finding = self._explain(record, event)
            if isinstance(event, PreemptionStarted):
                self._landing(record, event, finding)
        before = len(self.main.state.rejected)
        settling = self._settling(event)
        if event is None:
            self.main.apply_record(record)  # records the decoding error as a rejection
        else:
            self.main.apply(record.offset, record.ts, event)
        if settling is not None:
            run = self.main.state.evictions.get(settling)
            if run is not None and run.outcome is not None:
                self.settled_at[settling] = record.offset
        refused = [r for r in self.main.state.rejected[before:] if r.offset == record.offset]
        kind = kind_of(event) if event is not None else peek_kind(record.payload)
        # A FactRejected record is accepted: the rejection it lists is the
        # fact's, refused at the door (DECISIONS 31), not a refused decision.
        if isinstance(event, PreemptionStarted) and not refused:
            self.started_ids.add(event.preemption_id)
        if refused and kind in DECISION_KINDS and not isinstance(event, FactRejected):
            if finding is None:
                finding = Finding(
                    record.offset,
                    record.ts,
                    kind or "?",
                    explanation=f"{rfc3339(record.ts)} #{record.offset} {kind}",
                )
            finding.refused = "; ".join(rejection.reason for rejection in refused)
        if finding is not None:
            self.report.findings.append(finding)
        if isinstance(event, LedgerDigest):
            self._ledger_digest(record, event)
        self.lagging.push(record)

    def finish(self) -> AuditReport:
        if self.chain is not None:
            self.chain.finish()
            self.report.digests = self.chain.checks
            self.report.digest = self.chain.chain.hex
            self.report.last_offset = self.chain.chain.through
        self.report.unfinished = sorted(self.main.state.preemptions)
        return self.report

    def _settling(self, event: Event | None) -> str | None:
        """The running eviction ``event`` may give its outcome (its own outcome
        record, or the removal or stop of its pod), if any."""
        state = self.main.state
        if isinstance(event, EvictionSucceeded | EvictionFailed):
            run = state.evictions.get(event.eviction_id)
            return event.eviction_id if run is not None and run.outcome is None else None
        if isinstance(event, PodRemoved | PodUpserted) and state.evicting_pods:
            return state.evicting_pods.get(event.uid)
        return None

    def _expected_for(self, preemption_id: str) -> _Expected | None:
        """The re-derived plan of a preemption (started before this segment: re-derived
        now from its ``PreemptionStarted`` record, as the single pass did then)."""
        expected = self.expected.get(preemption_id)
        if expected is None and not self.indexed:
            self._index_prefix()
        if expected is None and preemption_id in self.pending_starts:
            offset, requested = self.pending_starts.pop(preemption_id)
            record = next(iter(self.source(offset)))
            event = decode_event(record.payload)
            assert isinstance(event, PreemptionStarted) and record.offset == offset
            self._started(record, event, "")
            expected = self.expected[preemption_id]
            expected.requested = list(requested)
        return expected

    def _index_prefix(self) -> None:
        """A segment started from a snapshot: which preemptions the records before
        it started (and the pods they requested) and which pod each eviction
        named, as :func:`_prefix` keeps them; what the segment saw itself wins."""
        self.indexed = True
        starts, eviction_pods = _index(self.source, self.begin)
        for preemption_id, started in starts.items():
            if preemption_id not in self.expected:
                self.pending_starts.setdefault(preemption_id, started)
        self.eviction_pods = {**eviction_pods, **self.eviction_pods}

    # ------------------------------------------------------------ LedgerDigest

    def _ledger_digest(self, record: Record, event: LedgerDigest) -> None:
        """Its digest against the chain, its state hash against the re-derived state."""
        check = self.chain.check_record(record.offset, event) if self.chain else None
        if not 0 <= event.through < record.offset:
            return
        actual = self.known_hashes.get(event.through)
        if actual is None:
            # A LedgerDigest right after its ``through`` (the engine's) leaves the
            # hashed state as it was (DECISIONS 41): the main fold has it.
            if event.through == record.offset - 1:
                actual = state_hash(self.main.state)
            else:
                actual = state_hash(self.lagging.at(event.through))
        if actual != event.state_hash:
            problem = Problem(
                "state-hash-mismatch",
                {"through": event.through, "recorded": event.state_hash, "actual": actual},
            )
            if check is not None:
                check.problems.append(problem)
            self.hash_problems.append((record.offset, problem))

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
        finding.explanation, finding.summary = clocks_words(event, head)
        basis = event.basis
        if not 0 <= basis < record.offset:
            finding.problems.append(
                Problem(
                    "basis-not-before", {"basis": basis, "offset": record.offset, "what": "one"}
                )
            )
            return finding
        state = self.lagging.at(basis)
        settle(state)
        free = free_capacity(state)

        def owes(name: str) -> bool:
            node = state.quotas.get(name)
            return node is not None and is_owing(node)

        def starves(uid: str) -> bool:
            return uid in state.pending_pods and is_starving(state, uid, free)

        for name in sorted(event.owing_started):
            if not owes(name):
                finding.problems.append(Problem("did-not-owe", {"name": name, "basis": basis}))
        for name in event.owing_stopped:
            if owes(name):
                finding.problems.append(Problem("still-owed", {"name": name, "basis": basis}))
        for uid in sorted(event.starving_started):
            if not starves(uid):
                finding.problems.append(Problem("not-starving", {"uid": uid, "basis": basis}))
        for uid in event.starving_stopped:
            if starves(uid):
                finding.problems.append(Problem("still-starving", {"uid": uid, "basis": basis}))
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
        self.pending_starts.pop(event.preemption_id, None)
        basis = event.basis
        recorded = f"target {rl(event.target)}, basis #{basis}"
        if not 0 <= basis < record.offset:
            finding.explanation = f"{head} {event.cause} preemption on {event.queue}: {recorded}."
            finding.problems.append(
                Problem(
                    "basis-not-before",
                    {"basis": basis, "offset": record.offset, "what": "decision"},
                )
            )
            self.expected[event.preemption_id] = _Expected(event.queue, event.cause, None)
            return finding
        state = self.lagging.at(basis)
        if event.queue not in state.quotas:
            finding.explanation = f"{head} {event.cause} preemption on {event.queue}: {recorded}."
            finding.problems.append(
                Problem("unknown-quota", {"queue": event.queue, "basis": basis})
            )
            self.expected[event.preemption_id] = _Expected(event.queue, event.cause, None)
            return finding
        timer = self._due_timer(state, event, record.ts, finding)
        holder = state.occupied.get(event.queue)
        if holder is not None:
            finding.problems.append(
                Problem("occupied", {"queue": event.queue, "holder": holder, "basis": basis})
            )
        plan = self._plan(state, event, timer)
        self.expected[event.preemption_id] = _Expected(event.queue, event.cause, plan)
        if event.cause == "quota-decrease":
            why = why_decrease(state, event, timer)
        elif event.cause == "overuse":
            why = why_overuse(state, event, timer)
        elif event.cause == "reclaim":
            why = why_reclaim(state, event, timer)
        else:
            why = f"{recorded}."
        finding.explanation = (
            f"{head} {event.cause} preemption {event.preemption_id} on {event.queue}"
            f" (from the facts through #{basis}): {why}"
        )
        if plan is None:
            if event.cause == "overuse":
                finding.problems.append(
                    Problem("nothing-owed", {"queue": event.queue, "basis": basis})
                )
            else:
                finding.problems.append(Problem("empty-target", {"basis": basis}))
        elif plan.target != event.target:
            finding.problems.append(
                Problem("target-differs", {"recorded": dict(event.target), "derived": plan.target})
            )
        if plan is not None:
            if plan.victims:
                names = ", ".join(v.pod_uid for v in plan.victims)
                finding.explanation += f" The rule picks {len(plan.victims)} victim(s): {names}."
            else:
                finding.explanation += f" No victim is possible: {plan.reason}."
        return finding

    def _landing(self, record: Record, event: PreemptionStarted, finding: Finding) -> None:
        """Where the decision lands (the state just before its record) the timer it
        answers must still be armed and due, and its id never started before
        (DECISIONS 211): what the projection's guard requires, derived here from
        the engine's own list of armed timers. A problem here on a decision the
        projection accepted is one the guard should have refused."""
        state = self.main.state
        where = {"offset": record.offset, "cause": event.cause, "queue": event.queue}
        if event.preemption_id in self.started_ids:
            finding.problems.append(Problem("id-reused", {**where, "id": event.preemption_id}))
        if event.queue not in state.quotas:
            return  # the basis check names the unknown quota
        matching = [
            timer
            for timer in timers(state)
            if timer.cause == event.cause
            and timer.queue == event.queue
            and (event.cause != "reclaim" or timer.pod_uid == (event.pod_uid or ""))
        ]
        if not matching:
            reason = self._why_no_timer(state, event).data["reason"]
            finding.problems.append(Problem("trigger-gone", {**where, "reason": reason}))
        elif matching[0].deadline > record.ts:
            data = {**where, "reason": "early", "deadline": matching[0].deadline}
            finding.problems.append(Problem("trigger-gone", {**data, "ts": record.ts}))
        elif (
            event.cause == "quota-decrease"
            and matching[0].deadline < record.ts
            and record.ts > state.ts
            and event.queue not in state.occupied
            and not decrease_target(state, event.queue)
        ):
            # §8 rule 21 (DECISIONS 14): this record is the first after the
            # deadline and the target is empty: the fold disarms it right here
            finding.problems.append(Problem("trigger-gone", {**where, "reason": "empty-target"}))

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
            finding.problems.append(Problem("early", {"ts": ts, "deadline": timer.deadline}))
        return timer

    @staticmethod
    def _why_no_timer(state: ProjectedState, event: PreemptionStarted) -> Problem:
        settings = state.settings
        queue = event.queue
        reason = "not-armed"
        if event.cause == "quota-decrease":
            if not settings.quota_preemption_enabled:
                reason = "quota-preemption-disabled"
        elif event.cause == "overuse":
            if not settings.revoke_enabled:
                reason = "revoke-disabled"
            elif queue in state.owing_held:
                reason = "owing-held"
            else:
                reason = "not-owing"
        elif event.cause == "reclaim" and not settings.reclaim_enabled:
            reason = "reclaim-disabled"
        return Problem(
            "no-timer",
            {"reason": reason, "queue": queue, "cause": event.cause, "basis": event.basis},
        )

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
        releases = f"; releases {rl(pod.requests)}" if pod is not None else ""
        expected = self._expected_for(event.preemption_id)
        victim: Victim | None = None
        if expected is not None:
            index = len(expected.requested)
            expected.requested.append(event.pod_uid)
            victims = expected.plan.victims if expected.plan is not None else []
            if expected.plan is not None:
                victim = self._check_victim(event, victims, index, finding)
        words = [f"{head} evict {event.pod_uid} from {event.queue} ({event.preemption_id})"]
        if victim is not None:
            words.append(": " + explain_words(victim.explain) + releases + ".")
        else:
            if event.explain:
                words.append(": the recorded explain claims " + explain_words(event.explain))
            else:
                words.append(": no explanation recorded")
            if pod is not None:
                words.append(
                    f"; {event.pod_uid} itself: {pod_words(pod)}, requests {rl(pod.requests)}"
                )
            words.append(".")
        finding.explanation = "".join(words)
        return finding

    @staticmethod
    def _check_victim(
        event: EvictionRequested, victims: list[Victim], index: int, finding: Finding
    ) -> Victim | None:
        order = [v.pod_uid for v in victims]
        pod = event.pod_uid
        if index >= len(victims):
            if pod not in order:
                finding.problems.append(Problem("not-a-victim", {"pod": pod, "order": order}))
            else:
                finding.problems.append(Problem("requested-twice", {"pod": pod}))
            return None
        victim = victims[index]
        if victim.pod_uid != pod:
            chosen = next((v for v in victims if v.pod_uid == pod), None)
            data = {"pod": pod, "index": index, "victim": victim.pod_uid, "order": order}
            if chosen is None:
                data["victim_explain"] = dict(victim.explain)
                finding.problems.append(Problem("not-chosen", data))
                return None
            finding.problems.append(Problem("out-of-order", data))
            return chosen
        if victim.queue != event.queue:
            finding.problems.append(
                Problem(
                    "queue-differs", {"recorded": event.queue, "pod": pod, "queue": victim.queue}
                )
            )
        recorded, derived = comparable_explain(event.explain), comparable_explain(victim.explain)
        if event.explain and recorded != derived:
            differing = sorted(
                key for key in set(recorded) | set(derived) if recorded.get(key) != derived.get(key)
            )
            finding.problems.append(Problem("explain-differs", {"keys": differing}))
        return victim

    # ------------------------------------------------------------ outcomes

    def _outcome(
        self, record: Record, event: EvictionSucceeded | EvictionFailed, head: str
    ) -> Finding:
        kind = kind_of(event)
        run = self.main.state.evictions.get(event.eviction_id)
        if event.eviction_id not in self.eviction_pods and not self.indexed:
            self._index_prefix()
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
            f" claimed {rl(event.claimed)}{reason}"
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
            f" of target {rl(run.target)}; {len(succeeded)} eviction(s) succeeded,"
            f" {len(failed)} failed"
        )
        node = state.quotas.get(run.queue)
        if run.cause == "overuse" and node is not None:
            text += f"; {run.queue} now uses {rl(node.used)} with runtime {rl(node.runtime)}"
        finding.explanation = text + "."
        waiting = [e.pod_uid for e in evictions if e.outcome is None]
        if waiting:
            finding.problems.append(Problem("finished-early", {"waiting": waiting}))
        expected = self._expected_for(event.preemption_id)
        if expected is not None and expected.plan is not None:
            missing = [
                v.pod_uid for v in expected.plan.victims if v.pod_uid not in expected.requested
            ]
            if missing:
                finding.problems.append(Problem("never-requested", {"missing": missing}))
        want = self._expected_finish(run.preemption_id, bool(evictions))
        if (
            want is not None
            and not waiting
            and run.cause == "overuse"
            and want != (event.outcome, dict(event.claimed))
        ):
            want = self._judged_earlier(record, event, run.evictions) or want
        for eviction_id in run.evictions:
            self.settled_at.pop(eviction_id, None)
        if want is not None and not waiting:
            outcome, claimed = want
            if outcome != event.outcome:
                finding.problems.append(
                    Problem("outcome-differs", {"recorded": event.outcome, "derived": outcome})
                )
            if claimed != dict(event.claimed):
                finding.problems.append(
                    Problem(
                        "claimed-differs", {"recorded": dict(event.claimed), "derived": claimed}
                    )
                )
        return finding

    def _judged_earlier(
        self, record: Record, event: PreemptionFinished, evictions: Sequence[str]
    ) -> tuple[PreemptionOutcome, dict[str, int]] | None:
        """An overuse outcome compares used with runtime (§8 rule 26), numbers of
        the moment the engine judged it: any state from the one where the last
        of its evictions got its outcome to the one just before the finish (a
        fact may land in between, or the engine may have read an eviction's
        success before its pod's removal). The recorded outcome, if one of those
        states gives it (DECISIONS 212); else None."""
        start = max((self.settled_at.get(e, self.begin - 1) for e in evictions), default=-1)
        if not 0 <= start < record.offset or record.offset - start > JUDGED_WINDOW:
            return None
        recorded = (event.outcome, dict(event.claimed))
        for offset in range(start, record.offset - 1):  # the state before the finish is known
            state = self.lagging.at(offset)
            for finished in EngineCore(Projection(state)).finished():
                judged = (finished.outcome, dict(finished.claimed))
                if finished.preemption_id == event.preemption_id and judged == recorded:
                    return recorded
        return None

    def _expected_finish(
        self, preemption_id: str, any_eviction: bool
    ) -> tuple[PreemptionOutcome, dict[str, int]] | None:
        if not any_eviction:
            return "not-helpful", {}
        for finished in EngineCore(self.main).finished():
            if finished.preemption_id == preemption_id:
                return finished.outcome, dict(finished.claimed)
        return None


def audit(source: RecordSource, *, digests: Mapping[int, bytes] | None = None) -> AuditReport:
    """Audit every record ``source(0)`` yields; ``source(n)`` must yield the same
    records from offset ``n`` (used to refold for an out-of-order basis and to
    locate a changed record). ``digests`` are ``d(offset)`` values kept elsewhere."""
    auditor = Auditor(source, digests=digests)
    for record in source(0):
        auditor.feed(record)
        if auditor.stopped:
            break
    return auditor.finish()


# ----------------------------------------------------------------- parallel segments


@dataclass(slots=True)
class _Prefix:
    """What a segment's auditor needs of the records before it: their fold, and
    which preemptions they started and evictions they requested."""

    projection: Projection
    starts: dict[str, tuple[int, list[str]]] = field(default_factory=dict)
    eviction_pods: dict[str, str] = field(default_factory=dict)
    #: False when the segment starts from a snapshot: ``starts`` and
    #: ``eviction_pods`` are filled by a scan of the records before it when a
    #: decision first refers to something the segment has not seen.
    indexed: bool = True
    #: A start from a snapshot: its blob (the lagging fold restarts from it),
    #: the digest and state hash it stores (the previous segment verifies both).
    blob: bytes | None = None
    digest: bytes | None = None
    state_hash: str | None = None


@dataclass(slots=True)
class SegmentResult:
    """One segment's findings, and the state hashes at its two ends."""

    start: int
    end: int
    findings: list[Finding]
    records: int
    hash_problems: list[tuple[int, Problem]]
    start_hash: str
    end_hash: str
    unfinished: list[str]


def _prefix(source: RecordSource, start: int) -> _Prefix:
    """Fold records ``0..start-1`` as :class:`Auditor` would, keeping its index."""
    prefix = _Prefix(Projection())
    main = prefix.projection
    if start == 0:
        return prefix
    for record in source(0):
        if record.offset >= start:
            break
        try:
            event: Event | None = decode_event(record.payload)
        except EventError:
            event = None
        if event is None:
            main.apply_record(record)
            continue
        main.apply(record.offset, record.ts, event)
        if isinstance(event, PreemptionStarted):
            prefix.starts[event.preemption_id] = (record.offset, [])
        elif isinstance(event, EvictionRequested):
            prefix.eviction_pods[event.eviction_id] = event.pod_uid
            started = prefix.starts.get(event.preemption_id)
            if started is not None:
                started[1].append(event.pod_uid)
    return prefix


def audit_segment(source: RecordSource, start: int, end: int) -> SegmentResult:
    """Audit records ``start..end``: fold ``0..start-1`` first (no snapshot: a
    segment's start state is the fold of the records, and its hash must equal
    the previous segment's end hash), then feed the segment to an
    :class:`Auditor` that checks no digest chain (the parent does, in one pass)."""
    prefix = _prefix(source, start)
    start_hash = state_hash(prefix.projection.state)
    auditor = Auditor(source, start=prefix)
    for record in source(start):
        if record.offset > end:
            break
        auditor.feed(record)
    report = auditor.finish()
    return SegmentResult(
        start,
        end,
        report.findings,
        report.records,
        auditor.hash_problems,
        start_hash,
        state_hash(auditor.main.state),
        report.unfinished,
    )


class SegmentMismatch(RuntimeError):
    """A segment's start state differs from where the previous segment ended."""


def chain_pass(source: RecordSource, digests: Mapping[int, bytes] | None) -> AuditReport:
    """The digest chain of a parallel audit, over every record in one pass; the
    report carries the digest checks, the last offset and any gap."""
    chain = DigestAudit(source, digests)
    report = AuditReport()
    for expected, record in enumerate(source(0)):
        if record.offset != expected:
            report.damage.append(Problem("gap", {"expected": expected, "found": record.offset}))
            break
        chain.feed_alone(record)
    chain.finish()
    report.digests = chain.checks
    report.digest = chain.chain.hex
    report.last_offset = chain.chain.through
    return report


def segments(last_offset: int, jobs: int) -> list[tuple[int, int]]:
    """``jobs`` contiguous offset ranges covering ``0..last_offset`` (fewer when short)."""
    count = last_offset + 1
    jobs = max(1, min(jobs, count))
    bounds = [count * k // jobs for k in range(jobs + 1)]
    return [(bounds[k], bounds[k + 1] - 1) for k in range(jobs)]


def merge_segments(chained: AuditReport, results: list[SegmentResult]) -> AuditReport:
    """The report of a parallel audit: each segment's start state must be the
    previous one's end state (:class:`SegmentMismatch` otherwise)."""
    for before, after in itertools.pairwise(results):
        if after.start_hash != before.end_hash:
            raise SegmentMismatch(
                f"segment {after.start}..{after.end} started from a state hashing to"
                f" {after.start_hash}, the previous segment ended at {before.end_hash}"
            )
    report = chained
    by_offset = {check.offset: check for check in report.digests if check.offset is not None}
    for result in results:
        report.findings.extend(result.findings)
        report.records += result.records
        for offset, problem in result.hash_problems:
            by_offset[offset].problems.append(problem)
    report.unfinished = results[-1].unfinished if results else []
    return report


# ----------------------------------------------------------------- segments from snapshots

#: A snapshot of the audited ledger at exactly an offset, or None.
SnapshotAt = Callable[[int], Snapshot | None]


def _index(
    source: RecordSource, start: int
) -> tuple[dict[str, tuple[int, list[str]]], dict[str, str]]:
    """The preemptions records ``0..start-1`` started (with the pods requested
    since) and the pod of each eviction they requested, as :func:`_prefix`
    keeps them, without folding. A record is decoded only when its bytes may
    name one of the two kinds (the name itself, or a ``\\u`` escape)."""
    starts: dict[str, tuple[int, list[str]]] = {}
    pods: dict[str, str] = {}
    for record in source(0):
        if record.offset >= start:
            break
        payload = record.payload
        if isinstance(payload, bytes) and not (
            b"PreemptionStarted" in payload or b"EvictionRequested" in payload or b"\\u" in payload
        ):
            continue
        try:
            event = decode_event(payload)
        except EventError:
            continue
        if isinstance(event, PreemptionStarted):
            starts[event.preemption_id] = (record.offset, [])
        elif isinstance(event, EvictionRequested):
            pods[event.eviction_id] = event.pod_uid
            started = starts.get(event.preemption_id)
            if started is not None:
                started[1].append(event.pod_uid)
    return starts, pods


@dataclass(frozen=True, slots=True)
class SnapshotMark:
    """A segment boundary: the snapshot at ``offset`` as one process read it (the
    digest and state hash it stores, the SHA-256 of its blob)."""

    offset: int
    digest: str
    state_hash: str
    blob_sha256: str


@dataclass(slots=True)
class SpanResult:
    """What one process of a snapshot-segmented audit found (:func:`audit_span`).

    ``start_mark``: the snapshot it started from (None: offset 0, or
    ``start_problem`` says why the snapshot could not be used). ``accepted``:
    the snapshot at ``end`` whose state, digest and blob this span reproduced
    (None: it ran to the last offset). ``rejected``: boundaries it did not
    reproduce, and why; it went on auditing past each of them.
    """

    start: int
    end: int
    start_mark: SnapshotMark | None
    start_problem: str | None
    accepted: SnapshotMark | None
    rejected: list[tuple[int, str]]
    report: AuditReport
    hash_problems: list[tuple[int, Problem]]


def _blob_sha256(blob: bytes) -> str:
    return Snapshot.checksum_of(blob)


def _snapshot_start(snapshot: Snapshot | None, offset: int) -> tuple[_Prefix, SnapshotMark]:
    """The start of a segment from the snapshot at ``offset`` (a hypothesis, which
    the previous segment verifies); ValueError says why it cannot be used."""
    if snapshot is None or snapshot.offset != offset:
        raise ValueError("the ledger has no snapshot at that offset any more")
    if snapshot.digest is None or snapshot.state_hash is None:
        raise ValueError("it stores no digest or state hash")
    digest = parse_digest(snapshot.digest)
    try:
        state = load(snapshot.blob)
    except Exception as exc:  # any damage to the blob: it is only a cache
        raise ValueError(f"unreadable blob ({type(exc).__name__}: {exc})") from None
    if state.offset != offset:
        raise ValueError(f"its state is at offset {state.offset}")
    start = _Prefix(
        Projection(state),
        indexed=False,
        blob=snapshot.blob,
        digest=digest,
        state_hash=snapshot.state_hash,
    )
    mark = SnapshotMark(offset, snapshot.digest, snapshot.state_hash, _blob_sha256(snapshot.blob))
    return start, mark


def _reproduces(auditor: Auditor, snapshot: Snapshot | None, offset: int) -> SnapshotMark | str:
    """Does the state the records give at ``offset`` (the auditor has just fed it)
    equal the snapshot there? Its mark when it does, else why not: the digest
    chain must give its digest, the state its state hash, and the persisted
    state its blob byte for byte (the blob also holds what the hash leaves out:
    the time, the rejections)."""
    if snapshot is None or snapshot.offset != offset:
        return "the ledger has no snapshot at that offset any more"
    if snapshot.digest is None or snapshot.state_hash is None:
        return "it stores no digest or state hash"
    assert auditor.chain is not None and auditor.chain.chain.through == offset
    digest = auditor.chain.chain.hex
    if snapshot.digest != digest:
        return f"it stores digest {snapshot.digest}, the records give {digest}"
    checksum = _blob_sha256(snapshot.blob)
    if snapshot.checksum is not None and snapshot.checksum != checksum:
        return "its blob does not match its checksum"
    hashed = state_hash(auditor.main.state)
    if hashed != snapshot.state_hash:
        return f"it stores state hash {snapshot.state_hash}, the records give {hashed}"
    if dump(auditor.main.state) != snapshot.blob:
        return "its stored state differs from the records' (in what the state hash leaves out)"
    return SnapshotMark(offset, digest, hashed, checksum)


def audit_span(
    source: RecordSource,
    snapshot_at: SnapshotAt,
    start: int | None,
    stops: Sequence[int],
    end: int,
    *,
    digests: Mapping[int, bytes] | None = None,
    progress: Callable[[int], None] | None = None,
) -> SpanResult:
    """Audit from offset 0 (``start`` None) or from the snapshot at ``start`` up
    to the first of ``stops`` whose snapshot this span reproduces, else to
    ``end`` (DESIGN §9: every record re-derived by some process, nothing
    trusted; DECISIONS 160).

    The start snapshot is a hypothesis: the span before checks it. At each stop
    the state, digest and persisted state the records give are compared with
    the snapshot there (:func:`_reproduces`): equal, the span ends and the next
    one takes over; different, the snapshot is rejected and this span audits
    on from its own, verified state. ``progress`` gets the records done so far.
    """
    begin = 0 if start is None else start + 1
    given = {offset: d for offset, d in (digests or {}).items() if offset >= begin}
    prefix: _Prefix | None = None
    start_mark: SnapshotMark | None = None
    if start is not None:
        try:
            prefix, start_mark = _snapshot_start(snapshot_at(start), start)
        except (ValueError, LedgerError) as exc:
            return SpanResult(begin, start, None, str(exc), None, [], AuditReport(), [])
    auditor = Auditor(source, digests=given, start=prefix)
    pending = sorted(offset for offset in stops if begin <= offset < end)
    accepted: SnapshotMark | None = None
    rejected: list[tuple[int, str]] = []
    done = 0
    for record in source(begin):
        if record.offset > end:
            break
        auditor.feed(record)
        if auditor.stopped:
            break
        done += 1
        if progress is not None and done % 1000 == 0:
            progress(done)
        if pending and record.offset == pending[0]:
            stop = pending.pop(0)
            try:
                snapshot = snapshot_at(stop)
            except LedgerError as exc:
                rejected.append((stop, f"it cannot be read ({exc})"))
                continue
            verdict = _reproduces(auditor, snapshot, stop)
            if isinstance(verdict, SnapshotMark):
                accepted = verdict
                break
            rejected.append((stop, verdict))
    if progress is not None:
        progress(done)
    if accepted is not None and auditor.chain is not None:
        auditor.chain.given.clear()  # later offsets: the next span's
    report = auditor.finish()
    last = auditor.next_offset - 1
    return SpanResult(
        begin, last, start_mark, None, accepted, rejected, report, auditor.hash_problems
    )


def plan_stops(snapshots: Sequence[tuple[int, int]], last_offset: int, jobs: int) -> list[int]:
    """Segment boundaries for ``jobs`` processes among the ``(offset, size)`` of
    the ledger's snapshots: for each even split of the work, the snapshot where
    the work done so far is nearest to it (ties: the earlier; one at
    ``last_offset`` is of no use, a segment starts after its snapshot).

    The work of a record grows with the state it is folded into (folding,
    and the settle and state hash of each ``LedgerDigest``, whose cost follows
    what changed: DECISIONS 230), and a snapshot's size measures that state:
    records between two snapshots weigh the mean of their sizes, records
    before the first half of its size (the state grows from empty), records
    after the last its size. Measured on the bench ledger with the kept hash
    (DECISIONS 236), this still puts the cut where the two spans' CPU times
    are nearest.
    """
    usable = sorted({(o, size) for o, size in snapshots if 0 <= o < last_offset})
    if not usable:
        return []
    work: list[tuple[int, float]] = []  # (offset, work of records 0..offset)
    done, previous, previous_size = 0.0, -1, 0
    for offset, size in usable:
        done += (offset - previous) * (previous_size + size) / 2
        work.append((offset, done))
        previous, previous_size = offset, size
    total = done + (last_offset - previous) * previous_size
    stops: set[int] = set()
    for k in range(1, jobs):
        target = total * k / jobs
        stops.add(min(work, key=lambda item: (abs(item[1] - target), item[0]))[0])
    return sorted(stops)


def merge_spans(
    results: Sequence[SpanResult], last_offset: int, warn: Callable[[str], None]
) -> tuple[AuditReport, bool, list[tuple[int, Problem]]]:
    """The report of a snapshot-segmented audit: from the span at offset 0, each
    span that reproduced its end snapshot hands over to the span that started
    from that very snapshot (same digest, state hash and blob), to the last
    offset. ``warn`` gets each snapshot a span did not reproduce. Returns the
    report, whether its digest checks stand as they are (False: a digest
    failed, and locating the change needs the whole chain: :func:`chain_pass`)
    and the state hash problems of its ``LedgerDigest`` records (for
    :func:`with_chain`).
    Raises :class:`SegmentMismatch` when the spans do not join up (a gap, a
    snapshot replaced meanwhile, a ledger that grew)."""
    by_start = {result.start: result for result in results}
    chosen: list[SpanResult] = []
    current = by_start.get(0)
    while current is not None:
        chosen.append(current)
        for offset, problem in current.rejected:
            warn(
                f"snapshot at offset {offset} does not hold the state the records give"
                f" ({problem}); the records after it were audited again from that state"
            )
        if current.report.damage:
            raise SegmentMismatch(f"the records after offset {current.end} are not contiguous")
        mark = current.accepted
        if mark is None:
            break
        current = by_start.get(mark.offset + 1)
        if current is None or current.start_mark != mark:
            raise SegmentMismatch(
                f"the segment after offset {mark.offset} did not start from the snapshot"
                " the segment before it verified"
            )
    if not chosen or chosen[-1].end != last_offset:
        raise SegmentMismatch("the ledger changed while it was audited")
    report = AuditReport()
    for result in chosen:
        report.findings.extend(result.report.findings)
        report.records += result.report.records
        report.digests.extend(result.report.digests)
    last = chosen[-1].report
    report.digest, report.last_offset, report.unfinished = (
        last.digest,
        last.last_offset,
        last.unfinished,
    )
    clean = all(
        problem.code == "state-hash-mismatch"
        for check in report.digests
        for problem in check.problems
    )
    hash_problems = [item for result in chosen for item in result.hash_problems]
    return report, clean, hash_problems


def with_chain(
    report: AuditReport, chained: AuditReport, hash_problems: Iterable[tuple[int, Problem]]
) -> AuditReport:
    """``report`` with the digest checks of one pass over the whole chain
    (:func:`chain_pass`), each ``LedgerDigest``'s state hash problems attached."""
    by_offset = {check.offset: check for check in chained.digests if check.offset is not None}
    for offset, problem in hash_problems:
        by_offset[offset].problems.append(problem)
    report.digests = chained.digests
    report.digest, report.last_offset = chained.digest, chained.last_offset
    report.damage = chained.damage
    return report
