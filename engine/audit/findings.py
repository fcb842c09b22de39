"""What ``audit`` found, as data (DESIGN §7 audit, §9 integrity).

The re-derivation (:mod:`quotaledger.engine.audit.decisions`) decides and fills these;
the wording (:mod:`quotaledger.engine.audit.report`) renders them as text or
JSON. A :class:`Problem` carries a code and the numbers behind it, never
prose, so a tool can act on ``code`` and a person reads the rendered words.

Exit status (DESIGN §9): an audit fails when an *accepted* decision is not
justified by the facts, or when the records do not match a digest
(``LedgerDigest`` records or one given with ``--digest``). A decision the
projection refused (the guard working: a second engine's late proposal, a
stale epoch) is reported and counted as refused, not flagged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with a decision or with the records: ``code`` and its data
    (JSON-able values)."""

    code: str
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(slots=True)
class Finding:
    """One audited decision: what it says, why (``explanation``, in words, built
    from the basis state), and what the re-derivation disagrees with."""

    offset: int
    ts: int
    kind: str
    queue: str | None = None
    preemption_id: str | None = None
    pod_uid: str | None = None
    explanation: str = ""
    problems: list[Problem] = field(default_factory=list)
    #: The projection's reason when it refused the decision (the guard).
    refused: str | None = None
    #: A shorter explanation for the text report, when the full one is long
    #: (a ClocksObserved naming thousands of quotas); JSON keeps the full one.
    summary: str | None = None

    @property
    def justified(self) -> bool:
        return not self.problems

    @property
    def flagged(self) -> bool:
        """An accepted decision the facts do not justify."""
        return self.refused is None and bool(self.problems)


@dataclass(slots=True)
class DigestCheck:
    """One digest checked against the records: a ``LedgerDigest`` record (at
    ``offset``) or a digest given from elsewhere (``offset`` None)."""

    through: int
    recorded: str
    offset: int | None = None
    actual: str | None = None  # d(through) of the records as they are, if known
    problems: list[Problem] = field(default_factory=list)

    @property
    def verified(self) -> bool:
        return not self.problems


@dataclass(slots=True)
class AuditReport:
    """Every audited decision in ledger order, and every digest checked."""

    findings: list[Finding] = field(default_factory=list)
    records: int = 0
    unfinished: list[str] = field(default_factory=list)
    digests: list[DigestCheck] = field(default_factory=list)
    #: Problems of the record stream itself (a gap in the offsets).
    damage: list[Problem] = field(default_factory=list)
    #: d(last offset) of the records read, hex.
    digest: str = ""
    last_offset: int = -1

    @property
    def flagged(self) -> int:
        return sum(1 for finding in self.findings if finding.flagged)

    @property
    def refused(self) -> int:
        return sum(1 for finding in self.findings if finding.refused is not None)

    @property
    def tampered(self) -> int:
        """Digests the records do not match, plus damage to the stream."""
        return sum(1 for check in self.digests if not check.verified) + len(self.damage)

    @property
    def covered_through(self) -> int:
        """The highest offset a matching digest vouches for (-1: none); a change to
        a later record cannot be detected yet."""
        return max((check.through for check in self.digests if check.verified), default=-1)

    @property
    def failed(self) -> bool:
        """Exit status 1 (see the module docstring)."""
        return bool(self.flagged or self.tampered)

    def for_pod(self, uid: str) -> AuditReport:
        """Decisions concerning one pod: its evictions (and their outcomes) and
        the start and finish of the preemptions that requested them (or that
        reclaim for it). Digest checks are kept: they concern every record."""
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
        return AuditReport(
            kept,
            self.records,
            [p for p in self.unfinished if p in preemptions],
            self.digests,
            self.damage,
            self.digest,
            self.last_offset,
        )
