"""Audit: re-derive every decision of a ledger from the facts and check its digests
(DESIGN §7 audit, §9 integrity).

Every record is folded from offset 0, every decision re-derived on the state it
names as its basis, and every digest compared with the records as they are;
nothing a ledger stores besides its records (a snapshot) is believed. The
entry points: :func:`audit` (one pass over a record source), the
:class:`AuditReport` it returns, and its wording (:func:`report_text`,
:func:`report_json`). The parts, each with one job:

* :mod:`.decisions` — the :class:`~.decisions.Auditor`: feeds records in order,
  re-derives each decision and explains it;
* :mod:`.basis` — the decisions judged on the state at their basis
  (``ClocksObserved``, ``PreemptionStarted``);
* :mod:`.checks` — the rules a decision is checked against on one state
  (clocks, the timer it answers at its basis and where it lands, its plan and
  victims);
* :mod:`.lagging` — the second, lagging fold that gives each basis state;
* :mod:`.start` — where an auditor starts (offset 0, or the records before a
  segment);
* :mod:`.digests` — the digest chain (``LedgerDigest`` records, ``--digest``);
* :mod:`.parallel` — ``audit --jobs N``: segments, spans from snapshots, and
  how their reports join;
* :mod:`.findings` — what was found, as data; :mod:`.report` — in words.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

from quotaledger.events.ledger import RecordSource

from .decisions import Auditor
from .findings import AuditReport, DigestCheck, Finding, Problem
from .report import report_json, report_text


def audit(source: RecordSource, *, digests: Mapping[int, bytes] | None = None) -> AuditReport:
    """Audit every record ``source(0)`` yields; ``source(n)`` must yield the same
    records from offset ``n`` (used to refold for an out-of-order basis and to
    locate a changed record). ``digests`` are ``d(offset)`` values kept elsewhere."""
    auditor = Auditor(source, digests=digests)
    auditor.feed_until(iter(source(0)), sys.maxsize)
    return auditor.finish()


__all__ = [
    "AuditReport",
    "DigestCheck",
    "Finding",
    "Problem",
    "audit",
    "report_json",
    "report_text",
]
