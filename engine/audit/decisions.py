"""The decision auditor: every decision of a ledger re-derived from the facts
(DESIGN §7 audit). This module decides; :mod:`.report` says it.

Every record is folded from offset 0: by this pass, or, in a parallel audit, by
the segment before a snapshot that the next segment starts from once the
records reproduce it (:func:`.parallel.audit_span`; a snapshot is never
believed). Each preemption decision is checked against what the reconcilers'
pure functions (:mod:`quotaledger.projections.plans`) decide on the state the
decision names as its ``basis`` (the lagging fold, :mod:`.lagging`):

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
  through ``through`` (its digest: :mod:`.digests`, fed by the same pass).

A decision the projection refused (the one-preemption-per-queue guard, a stale
epoch) is reported as refused, with the re-derivation's notes, and not flagged.

The rules applied to one state are in :mod:`.checks`, the decisions judged on
their basis state (``ClocksObserved``, ``PreemptionStarted``) in :mod:`.basis`;
this module picks the state for each (the basis, or the fold just before the
record), keeps what spans records (each preemption's re-derived plan, the pods it requested, when
each eviction settled) and builds each finding's explanation (in :mod:`.report`'s
words).

Pure apart from reading records through a callable: no clock, no writes.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from quotaledger.events.codec import EventError, decode_event, peek_kind
from quotaledger.events.digest import DigestChain
from quotaledger.events.ledger import Record, RecordSource
from quotaledger.events.model import (
    DECISION_KINDS,
    ClocksObserved,
    Event,
    EvictionFailed,
    EvictionRequested,
    EvictionSucceeded,
    FactRejected,
    LedgerDigest,
    PodUpserted,
    PreemptionCause,
    PreemptionFinished,
    PreemptionOutcome,
    PreemptionStarted,
    kind_of,
)
from quotaledger.events.times import rfc3339
from quotaledger.projections import Projection, state_hash
from quotaledger.projections.plans import Plan, Victim
from quotaledger.projections.state import FINISHED_KEPT

from ..core import EngineCore
from .basis import clocks_finding, started_finding
from .checks import check_victim, landing_problems
from .digests import DigestAudit
from .findings import AuditReport, Finding, Problem
from .lagging import LaggingFold
from .report import (
    explain_words,
    pod_words,
    rl,
)
from .start import SegmentStart, index_before, settled_between, settling, started_at

#: Decisions that get a paragraph even when the projection accepted them.
AUDITED = (
    ClocksObserved,
    PreemptionStarted,
    EvictionRequested,
    EvictionSucceeded,
    EvictionFailed,
    PreemptionFinished,
)

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


# ----------------------------------------------------------------- the auditor


class Auditor:
    """Feeds records in order; collects a :class:`Finding` per decision and a
    :class:`DigestCheck` per digest."""

    def __init__(
        self,
        source: RecordSource,
        *,
        digests: Mapping[int, bytes] | None = None,
        start: SegmentStart | None = None,
    ) -> None:
        """``start``: a segment of a parallel audit starts from the fold of the
        records before it (:func:`.parallel.audit_segment`: it checks no digest
        chain, the parent does) or from a snapshot (:func:`.parallel.audit_span`:
        its chain starts from the snapshot's digest); by default the audit starts
        at offset 0 (:mod:`.start`)."""
        self.source = source
        self.main = start.projection if start is not None else Projection()
        self.begin = self.main.state.offset + 1
        seed = None
        if start is not None and start.blob is not None:
            at = start.blob_offset
            seed = (start.projection.state.offset if at is None else at, start.blob)
        self.lagging = LaggingFold(source, self.main.state.offset, seed)
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
        #: ids of the PreemptionStarted records the projection accepted, and
        #: eviction id -> offset of the record that gave it its outcome; a
        #: segment is given both for the records before it (:func:`.start.fold_before`)
        #: or, from a snapshot, asks the records when a decision needs them
        #: (:meth:`_started_before`, :meth:`_settled_before`).
        self.started_ids: set[str] = set()
        self.settled_at: dict[str, int] = {}
        self.prefix_known = start is None or start.started_ids is not None
        if start is not None and start.started_ids is not None:
            self.started_ids |= start.started_ids
        if start is not None and start.settled_at is not None:
            self.settled_at.update(start.settled_at)
        #: A start from a snapshot: the ids its state holds (running or finished),
        #: all those accepted before it unless the guard has forgotten some.
        self.snapshot_ids: set[str] = set()
        self.snapshot_complete = True
        if not self.prefix_known:
            state = self.main.state
            self.snapshot_ids = set(state.preemptions) | set(state.finished_preemptions)
            self.snapshot_complete = len(state.finished_preemptions) < FINISHED_KEPT
        #: preemption id -> offsets of the PreemptionStarted records before a
        #: segment started from a snapshot (:meth:`_index_prefix`).
        self.start_offsets: dict[str, list[int]] = {}

    def feed_until(self, records: Iterator[Record], stop: int) -> Record | None:
        """:meth:`feed` each record ``records`` yields, through the one at offset
        ``stop`` (or the first past it, or until the audit stops); the last
        record fed, None when ``records`` ran out first. The usual record (a
        ``PodUpserted`` no eviction waits on, with no ``--digest`` value left to
        check) is folded here as :meth:`feed` folds it, without a call per
        record; any other goes through :meth:`feed` (DECISIONS 371)."""
        main = self.main
        apply_pod = main.apply_pod
        lagging = self.lagging
        keep = lagging.buffer.append
        audit_chain = self.chain
        update = audit_chain.chain.update if audit_chain is not None else None
        feed = self.feed
        for record in records:
            offset = record.offset
            if (
                offset == self.next_offset
                and not self.stopped
                and (audit_chain is None or not audit_chain.given)
            ):
                try:
                    event: Event | None = decode_event(record.payload)
                except EventError:
                    event = None
                state = main.state
                if type(event) is PodUpserted and not state.evicting_pods and not state.evictions:
                    self.next_offset = offset + 1
                    if update is not None:
                        update(record)
                    apply_pod(offset, record.ts, event)
                    keep(record)
                    lagging.fed = offset
                    if offset >= stop:
                        return record
                    continue
                self._feed(record, event)
            else:
                feed(record)
            if self.stopped or offset >= stop:
                return record
        return None

    def feed(self, record: Record) -> None:
        if self.stopped:
            return
        try:
            event: Event | None = decode_event(record.payload)
        except EventError:
            event = None
        self._feed(record, event)

    def _feed(self, record: Record, event: Event | None) -> None:
        """:meth:`feed` of a record whose payload decoded to ``event`` (None: did not)."""
        if record.offset != self.next_offset:
            self.report.damage.append(
                Problem("gap", {"expected": self.next_offset, "found": record.offset})
            )
            self.stopped = True
            return
        self.next_offset += 1
        if self.chain is not None:
            self.chain.feed(record)
        kind = type(event)
        state = self.main.state
        if kind is PodUpserted and not state.evicting_pods and not state.evictions:
            # the usual record: a fact no eviction waits on (``settling`` is None)
            self.main.apply(record.offset, record.ts, event)  # type: ignore[arg-type]
            self.lagging.push(record)
            return
        finding: Finding | None = None
        # a pod (most records) is none of AUDITED: no isinstance walk for it
        if event is not None and kind is not PodUpserted and isinstance(event, AUDITED):
            finding = self._explain(record, event)
            if isinstance(event, PreemptionStarted):
                if event.preemption_id not in self.started_ids and self._started_before(
                    event.preemption_id
                ):
                    self.started_ids.add(event.preemption_id)
                started = self.started_ids
                finding.problems += landing_problems(self.main.state, record, event, started)
        before = len(self.main.state.rejected)
        settles = settling(self.main.state, event)
        if event is None:
            self.main.apply_record(record)  # records the decoding error as a rejection
        else:
            self.main.apply(record.offset, record.ts, event)
        if settles is not None:
            run = self.main.state.evictions.get(settles)
            if run is not None and run.outcome is not None:
                self.settled_at[settles] = record.offset
        if kind is PodUpserted:  # a fact: no finding, no preemption, no digest
            self.lagging.push(record)
            return
        rejected = self.main.state.rejected
        refused = [r for r in rejected[before:] if r.offset == record.offset]
        # A FactRejected record is accepted: the rejection it lists is the
        # fact's, refused at the door (DECISIONS 31), not a refused decision.
        if isinstance(event, PreemptionStarted) and not refused:
            self.started_ids.add(event.preemption_id)
        name = kind_of(event) if event is not None else peek_kind(record.payload)
        if refused and name in DECISION_KINDS and not isinstance(event, FactRejected):
            if finding is None:
                finding = Finding(
                    record.offset,
                    record.ts,
                    name or "?",
                    explanation=f"{rfc3339(record.ts)} #{record.offset} {name}",
                )
            finding.refused = "; ".join(rejection.reason for rejection in refused)
        if finding is not None:
            self.report.findings.append(finding)
        if isinstance(event, LedgerDigest):
            self._ledger_digest(record, event)
        self.lagging.push(record)

    def finish(self) -> AuditReport:
        self.report.records = self.next_offset - self.begin
        if self.chain is not None:
            self.chain.finish()
            self.report.digests = self.chain.checks
            self.report.digest = self.chain.chain.hex
            self.report.last_offset = self.chain.chain.through
        self.report.unfinished = sorted(self.main.state.preemptions)
        return self.report

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
        named, as :func:`.start.fold_before` keeps them; what the segment saw
        itself wins."""
        self.indexed = True
        starts, eviction_pods, self.start_offsets = index_before(self.source, self.begin)
        for preemption_id, started in starts.items():
            if preemption_id not in self.expected:
                self.pending_starts.setdefault(preemption_id, started)
        self.eviction_pods = {**eviction_pods, **self.eviction_pods}

    def _started_before(self, preemption_id: str) -> bool:
        """Did the projection accept a ``PreemptionStarted`` with this id before
        the segment? Known when the segment folded the records before it; from a
        snapshot, its state holds every such id (running, or among the finished
        the guard keeps) unless the guard has dropped some (DECISIONS 62): then
        each earlier record with the id is looked up in the lagging fold (the
        preemption it started runs there from its own offset)."""
        if self.prefix_known:
            return False  # all are in started_ids already
        if preemption_id in self.snapshot_ids:
            return True
        if self.snapshot_complete:
            return False
        if not self.indexed:
            self._index_prefix()
        return started_at(self.lagging, preemption_id, self.start_offsets.get(preemption_id, []))

    def _settled_before(self, evictions: Sequence[str], offset: int) -> dict[str, int]:
        """Where each of ``evictions`` got its outcome before a segment started from
        a snapshot, as the single pass sees it (:func:`.start.settling`), for the
        preemption finishing at ``offset``: only the last :data:`JUDGED_WINDOW`
        records before it are read (an outcome before them leaves the window
        too long in any case)."""
        first = max(0, offset - JUDGED_WINDOW)
        if self.prefix_known or first >= self.begin:
            return {}
        return settled_between(self.lagging, set(evictions), first, self.begin - 1)

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
            return clocks_finding(record, event, head, self.lagging)
        if isinstance(event, PreemptionStarted):
            return self._started(record, event, head)
        if isinstance(event, EvictionRequested):
            return self._requested(record, event, head)
        if isinstance(event, PreemptionFinished):
            return self._finished(record, event, head)
        assert isinstance(event, EvictionSucceeded | EvictionFailed)
        return self._outcome(record, event, head)

    # ------------------------------------------------------------ PreemptionStarted

    def _started(self, record: Record, event: PreemptionStarted, head: str) -> Finding:
        """Re-derived on its basis (:func:`.basis.started_finding`); its plan kept."""
        self.pending_starts.pop(event.preemption_id, None)
        finding, plan = started_finding(record, event, head, self.lagging)
        self.expected[event.preemption_id] = _Expected(event.queue, event.cause, plan)
        return finding

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
                victim, problems = check_victim(event, victims, index)
                finding.problems += problems
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
        settled = self.settled_at
        missing = [e for e in evictions if e not in settled]
        if missing and not self.prefix_known:
            settled = {**self._settled_before(missing, record.offset), **settled}
        start = max((settled.get(e, -1) for e in evictions), default=-1)
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
