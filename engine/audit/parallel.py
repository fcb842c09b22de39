"""``audit --jobs N``: the ledger cut into parts audited by separate processes
(DESIGN §9: every record is still re-derived from offset 0 by some process,
nothing is trusted). The processes themselves are the CLI's
(``adapters/audit_jobs.py``); this module cuts, audits one part, and joins.

Two strategies:

* **Segments** (DECISIONS 46, 121), when the ledger has no usable snapshot:
  :func:`segments` cuts the offsets evenly; each :func:`audit_segment` folds the
  records before its segment first (:func:`.start.fold_before`), and
  :func:`merge_segments` checks that each segment's start state hashes to the
  previous one's end state. The digest chain is checked in one pass of its own
  (:func:`.digests.chain_pass`).
* **Spans from snapshots** (DECISIONS 160-162): :func:`plan_stops` picks the
  snapshots nearest to an even split of the work; :func:`audit_span` starts
  from one (a hypothesis) and runs until the records reproduce a later one
  exactly (state, digest, stored blob), rejecting those they do not; and
  :func:`merge_spans` joins the spans that hand over at the very snapshot the
  span before verified (:func:`with_chain` when a digest failed and locating
  the change needs the whole chain).

Anything that does not join up raises :class:`SegmentMismatch` (the caller
falls back to one process).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from quotaledger.events.digest import DigestChain, parse_digest
from quotaledger.events.ledger import LedgerError, LedgerGap, RecordSource, Snapshot
from quotaledger.projections import Projection, state_hash
from quotaledger.projections.snapshot import dump, load

from .decisions import Auditor
from .findings import AuditReport, Finding, Problem
from .plan import Cut
from .start import SegmentStart, fold_before


class SegmentMismatch(RuntimeError):
    """A segment's start state differs from where the previous segment ended."""


# ----------------------------------------------------------------- segments


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


def audit_segment(source: RecordSource, start: int, end: int) -> SegmentResult:
    """Audit records ``start..end``: fold ``0..start-1`` first (no snapshot: a
    segment's start state is the fold of the records, and its hash must equal
    the previous segment's end hash), then feed the segment to an
    :class:`Auditor` that checks no digest chain (the parent does, in one pass)."""
    prefix = fold_before(source, start)
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


# ----------------------------------------------------------------- spans from snapshots


#: A snapshot of the audited ledger at exactly an offset, or None.
SnapshotAt = Callable[[int], Snapshot | None]


@dataclass(frozen=True, slots=True)
class SnapshotMark:
    """A snapshot as one process read it (the digest and state hash it stores,
    the SHA-256 of its blob)."""

    offset: int
    digest: str
    state_hash: str
    blob_sha256: str


@dataclass(frozen=True, slots=True)
class Handover:
    """Where one span hands over to the next (DECISIONS 340): the snapshot the
    next span started from, and the offset ``cut`` (at or after it) through
    which the records were folded onto it, with the digest ``d(cut)`` and the
    state hash there. The span before reports the one it reproduced, the span
    after the one it started from; they must be equal."""

    snapshot: SnapshotMark
    cut: int
    digest: str
    state_hash: str


@dataclass(slots=True)
class SpanResult:
    """What one process of a snapshot-segmented audit found (:func:`audit_span`).

    ``start_mark``: where it started (None: offset 0, or ``start_problem`` says
    why the snapshot could not be used). ``accepted``: the handover whose
    snapshot this span reproduced, at its cut (None: it ran to the last
    offset). ``rejected``: snapshots it did not reproduce, and why; it went on
    auditing past each of them.
    """

    start: int
    end: int
    start_mark: Handover | None
    start_problem: str | None
    accepted: Handover | None
    rejected: list[tuple[int, str]]
    report: AuditReport
    hash_problems: list[tuple[int, Problem]]


def _blob_sha256(blob: bytes) -> str:
    return Snapshot.checksum_of(blob)


def _snapshot_start(snapshot: Snapshot | None, offset: int) -> tuple[SegmentStart, SnapshotMark]:
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
    start = SegmentStart(
        Projection(state),
        indexed=False,
        blob=snapshot.blob,
        digest=digest,
        state_hash=snapshot.state_hash,
    )
    mark = SnapshotMark(offset, snapshot.digest, snapshot.state_hash, _blob_sha256(snapshot.blob))
    return start, mark


def _cut_start(
    source: RecordSource, snapshot: Snapshot | None, cut: Cut
) -> tuple[SegmentStart, Handover]:
    """The start of a segment at ``cut.offset``: the snapshot at ``cut.snapshot``
    with the records after it up to the cut folded onto it, and the digest chain
    carried from the snapshot's digest (DECISIONS 340). Nothing is audited here:
    the segment before audits those records, and checks the snapshot."""
    start, mark = _snapshot_start(snapshot, cut.snapshot)
    if cut.offset == cut.snapshot:
        return start, Handover(mark, cut.offset, mark.digest, mark.state_hash)
    assert start.digest is not None
    chain = DigestChain(start.digest, cut.snapshot)
    apply_record = start.projection.apply_record
    try:
        for record in source(cut.snapshot + 1):
            if record.offset > cut.offset:
                break
            chain.update(record)
            apply_record(record)
    except LedgerGap as exc:
        raise ValueError(str(exc)) from None
    if chain.through != cut.offset:
        raise ValueError(f"the records end at offset {chain.through}, before {cut.offset}")
    hashed = state_hash(start.projection.state)
    start.blob_offset, start.digest, start.state_hash = cut.snapshot, chain.digest, hashed
    return start, Handover(mark, cut.offset, chain.hex, hashed)


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
    start: Cut | None,
    stops: Sequence[Cut],
    end: int,
    *,
    digests: Mapping[int, bytes] | None = None,
    progress: Callable[[int], None] | None = None,
) -> SpanResult:
    """Audit from offset 0 (``start`` None) or from the cut ``start`` (the snapshot
    there, the records up to the cut folded onto it) up to the first of
    ``stops`` whose snapshot this span reproduces, else to ``end`` (DESIGN §9:
    every record re-derived by some process, nothing trusted; DECISIONS 160,
    340).

    The start is a hypothesis: the span before checks it. At each stop's
    snapshot the state, digest and persisted state the records give are
    compared with it (:func:`_reproduces`): equal, the span audits on to the
    stop's cut, ends there and the next one takes over; different, the
    snapshot is rejected and this span audits on from its own, verified state.
    ``progress`` gets the records done so far.
    """
    begin = 0 if start is None else start.offset + 1
    given = {offset: d for offset, d in (digests or {}).items() if offset >= begin}
    prefix: SegmentStart | None = None
    start_mark: Handover | None = None
    if start is not None:
        try:
            prefix, start_mark = _cut_start(source, snapshot_at(start.snapshot), start)
        except (ValueError, LedgerError) as exc:
            return SpanResult(begin, start.offset, None, str(exc), None, [], AuditReport(), [])
    auditor = Auditor(source, digests=given, start=prefix)
    pending = sorted(
        (cut for cut in stops if begin <= cut.snapshot <= cut.offset < end),
        key=lambda cut: cut.snapshot,
    )
    checking = pending[0].snapshot if pending else -1
    verified: tuple[Cut, SnapshotMark] | None = None
    accepted: Handover | None = None
    rejected: list[tuple[int, str]] = []
    done = 0
    records = iter(source(begin))
    while True:
        stop = min(end, begin + done // 1000 * 1000 + 999)
        if checking >= 0:
            stop = min(stop, checking)
        if verified is not None:
            stop = min(stop, verified[0].offset)
        fed = auditor.feed_until(records, stop)
        if fed is None or auditor.stopped:
            break
        offset = fed.offset
        done = offset - begin + 1
        if progress is not None and done % 1000 == 0:
            progress(done)
        if offset == checking:
            cut = pending.pop(0)
            checking = pending[0].snapshot if pending and verified is None else -1
            try:
                snapshot = snapshot_at(cut.snapshot)
            except LedgerError as exc:
                rejected.append((cut.snapshot, f"it cannot be read ({exc})"))
                continue
            verdict = _reproduces(auditor, snapshot, offset)
            if isinstance(verdict, str):
                rejected.append((cut.snapshot, verdict))
                continue
            verified = (cut, verdict)
            checking = -1
        if verified is not None and offset == verified[0].offset:
            assert auditor.chain is not None
            mark = verified[1]
            hashed = mark.state_hash
            if offset != mark.offset:
                hashed = state_hash(auditor.main.state)
            accepted = Handover(mark, offset, auditor.chain.chain.hex, hashed)
            break
        if offset >= end:
            break
    if progress is not None:
        progress(done)
    if accepted is not None and auditor.chain is not None:
        auditor.chain.given.clear()  # later offsets: the next span's
    report = auditor.finish()
    last = auditor.next_offset - 1
    return SpanResult(
        begin, last, start_mark, None, accepted, rejected, report, auditor.hash_problems
    )


def merge_spans(
    results: Sequence[SpanResult], last_offset: int, warn: Callable[[str], None]
) -> tuple[AuditReport, bool, list[tuple[int, Problem]]]:
    """The report of a snapshot-segmented audit: from the span at offset 0, each
    span that reproduced its end snapshot hands over to the span that started
    from that very snapshot (same digest, state hash and blob), to the last
    offset. ``warn`` gets each snapshot a span did not reproduce. Returns the
    report, whether its digest checks stand as they are (False: a digest
    failed, and locating the change needs the whole chain:
    :func:`.digests.chain_pass`) and the state hash problems of its
    ``LedgerDigest`` records (for :func:`with_chain`).
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
        current = by_start.get(mark.cut + 1)
        if current is None or current.start_mark != mark:
            raise SegmentMismatch(
                f"the segment after offset {mark.cut} did not start from the snapshot"
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
    (:func:`.digests.chain_pass`), each ``LedgerDigest``'s state hash problems attached."""
    by_offset = {check.offset: check for check in chained.digests if check.offset is not None}
    for offset, problem in hash_problems:
        by_offset[offset].problems.append(problem)
    report.digests = chained.digests
    report.digest, report.last_offset = chained.digest, chained.last_offset
    report.damage = chained.damage
    return report
