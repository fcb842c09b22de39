"""Audit: re-derive every decision of a ledger from the facts and check its digests
(DESIGN §7 audit, §9 integrity).

The entry points callers use: :func:`audit` (one pass over a record source),
:class:`AuditReport` (what it found) and :func:`report_text` / :func:`report_json`
(its wording). :mod:`.decisions` re-derives the decisions, :mod:`.findings` holds
what was found as data, :mod:`.report` says it in words.
"""

from __future__ import annotations

from .decisions import audit
from .findings import AuditReport, DigestCheck, Finding, Problem
from .report import report_json, report_text

__all__ = [
    "AuditReport",
    "DigestCheck",
    "Finding",
    "Problem",
    "audit",
    "report_json",
    "report_text",
]
