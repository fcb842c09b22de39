"""``audit``: explain every decision and re-derive it from the facts before it (DESIGN §7, §9).

Read only. Every record is re-derived from offset 0 (never from a snapshot),
the digest chain is checked against every ``LedgerDigest`` and ``--digest``,
and ``--jobs N`` splits the work over processes (:mod:`.audit_jobs`). The
auditor is imported when the command runs: it takes longer to import than a
short replay takes to run, and ``audit_jobs`` brings multiprocessing.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from quotaledger.events.codec import EventError, decode_event, peek_kind
from quotaledger.events.digest import parse_digest
from quotaledger.events.ledger import LedgerGap, RecordSource

from ..ledgers.sources import with_record_source
from .common import (
    LEDGER_HELP,
    Commands,
    UserError,
    ledger_arg,
    print_json,
    progress_meter,
    warn,
)

if TYPE_CHECKING:
    from quotaledger.engine.audit import AuditReport


def parse_digests(values: Sequence[str] | None) -> dict[int, bytes]:
    """``--digest OFFSET:HEX`` values (DESIGN §9: a digest kept elsewhere)."""
    digests: dict[int, bytes] = {}
    for value in values or ():
        offset, sep, text = value.partition(":")
        if not sep or not offset.strip().isdigit():
            raise UserError(f"--digest {value!r}: expected OFFSET:HEX, e.g. 1200:9f86d0...")
        try:
            digests[int(offset)] = parse_digest(text)
        except ValueError as exc:
            raise UserError(f"--digest {value!r}: {exc}") from None
    return digests


def cmd_audit(args: argparse.Namespace) -> int:
    # Imported here: the auditor and its words take longer to import than a replay runs.
    from quotaledger.engine.audit import audit, report_json, report_text

    digests = parse_digests(args.digest)
    if args.jobs < 1:
        raise UserError("--jobs must be at least 1")
    ledger = ledger_arg(args.ledger)
    unnamed: LedgerGap | None = None
    if args.jobs > 1 and isinstance(ledger, Path):
        from .audit_jobs import audit_parallel

        report = audit_parallel(ledger, args.jobs, digests)
    else:
        gaps: list[LedgerGap] = []
        report = with_record_source(
            ledger,
            lambda source: audit(source, digests=digests),
            progress_meter("audit"),
            gaps=gaps,
        )
        unnamed = stopped_at(report, gaps)
    if args.pod is not None:
        report = report.for_pod(args.pod)
        if not report.findings and not with_record_source(
            ledger,
            lambda source: mentions_pod(source, args.pod),
            progress_meter("audit"),
            gaps=[],
        ):
            raise UserError(f"--pod {args.pod}: no such pod in {args.ledger}")
    if args.json:
        document = report_json(report)
        if args.pod is not None:
            document["pod"] = args.pod
        print_json(document)
    else:
        print(report_text(report))
    if unnamed is not None:
        raise unnamed
    return 1 if report.failed else 0


def stopped_at(report: AuditReport, gaps: Sequence[LedgerGap]) -> LedgerGap | None:
    """A Kafka read stopped at a hole (DESIGN §10): the records before it were
    audited, and the hole is reported as a SQLite ledger's missing records are,
    a ``gap`` in the damage (TAMPERED, exit 1), with the reader's reason on
    stderr. A gap whose next record is unknown is returned, for the command to
    raise after the report."""
    from quotaledger.engine.audit import Problem  # loaded by the command already

    if not gaps:
        return None
    gap = gaps[0]
    if gap.missing is None or gap.found is None:
        return gap
    if not any(problem.code == "gap" for problem in report.damage):
        report.damage.append(Problem("gap", {"expected": gap.missing, "found": gap.found}))
    warn(str(gap))
    return None


def mentions_pod(source: RecordSource, uid: str) -> bool:
    """True when a pod fact of the ledger names ``uid`` (``audit --pod``: a pod the
    ledger never held is "no such pod", exit 2, like every other not-found)."""
    for record in source(0):
        if peek_kind(record.payload) in ("PodUpserted", "PodRemoved"):
            try:
                event = decode_event(record.payload)
            except EventError:
                continue
            if getattr(event, "uid", None) == uid:
                return True
    return False


def register(commands: Commands) -> None:
    """``audit``."""
    raw = argparse.RawDescriptionHelpFormatter

    audit = commands.add_parser(
        "audit",
        help="explain every decision and flag any the facts do not justify",
        description="Explain each decision of a ledger in plain words with its numbers (rule,"
        " why this pod, why now, used/runtime/max/guaranteed), each re-derived from the facts"
        " before it (its basis): the timer was armed and due, the target and the victims and"
        " their order are what the rules give, the outcome follows from the evictions'"
        " outcomes. A decision the facts do not justify is FLAGGED; one the ledger's guard"
        " refused (a second engine's late proposal, a stale epoch) is listed as REFUSED and"
        " counted apart: the guard working is not a failure. Audit re-derives every record"
        " from offset 0 (with --jobs, a segment may start from one of the ledger's snapshots,"
        " which the segment before must reproduce exactly, else it is named in a warning and"
        " audited past), checks the digest chain (DESIGN §9) against every LedgerDigest"
        " record and every --digest, and names the records that changed.\n\n"
        "LEDGER is a SQLite ledger (e.g. `simulate --out`) or a JSONL file holding decisions"
        " (an export starting with its LedgerOpened line keeps its offsets). Read only.\n\n"
        "exit status: 0 when no decision is flagged and every digest matches; 1 when an"
        " accepted decision is flagged (with --pod: one of that pod's) or the records do not"
        " match a digest (tampering, removed records); 2 on bad input or an unreadable file.",
        epilog="examples:\n"
        "  quotaledger simulate examples/quota-decrease.jsonl --out sim.db\n"
        "  quotaledger audit sim.db\n"
        "  quotaledger audit sim.db --pod spark-3\n"
        "  quotaledger audit sim.db --json | jq '.decisions[] | select(.justified | not)'\n",
        formatter_class=raw,
    )
    audit.add_argument("ledger", metavar="LEDGER", help=f"{LEDGER_HELP}, or FILE.jsonl")
    audit.add_argument(
        "--pod",
        metavar="UID",
        help="only decisions concerning this pod: its evictions, their outcomes, and the start"
        " and finish of their preemptions",
    )
    audit.add_argument(
        "--json",
        action="store_true",
        help='print {"decisions": [{offset, at, kind, queue, explanation, justified, refused,'
        ' problems, problem_data}], "flagged": n, "refused": n, "digests": [...], "tampered":'
        ' n, "last_offset", "digest"}',
    )
    audit.add_argument(
        "--digest",
        metavar="OFFSET:HEX",
        action="append",
        help="a digest d(OFFSET) kept elsewhere (e.g. printed by an earlier audit or replay"
        " --json); the records must still give it. Repeatable.",
    )
    audit.add_argument(
        "--jobs",
        type=int,
        default=1,
        metavar="N",
        help="check the ledger in N parallel processes, cut at its snapshots when it has"
        " some (each verified by the segment before); same output as 1",
    )
    audit.set_defaults(handler=cmd_audit)
