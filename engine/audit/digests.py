"""The digest chain of an audit (DESIGN §9 integrity, digest chain).

Every ``LedgerDigest`` record and every digest given from elsewhere
(``audit --digest OFFSET:HEX``) must equal ``d(through)`` of the records as they
are; a mismatch names the records that changed (between the last digest that
matched and the first that does not). :class:`DigestAudit` is fed by the
auditor's pass; a parallel audit checks the whole chain in one pass of its own
(:func:`chain_pass`) while other processes re-derive the decisions.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping
from typing import Any

from quotaledger.events.codec import EventError, decode_event, peek_kind
from quotaledger.events.digest import DigestChain, next_digest
from quotaledger.events.ledger import Record, RecordSource
from quotaledger.events.model import LedgerDigest

from .findings import AuditReport, DigestCheck, Problem


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
        if self.given:
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
