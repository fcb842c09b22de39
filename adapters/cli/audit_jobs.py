"""``audit --jobs N``: the ledger audited by N processes (DESIGN §9 integrity).

Every record is still re-derived from offset 0 by some process; what differs is
where a process starts:

* **From the ledger's snapshots** (DECISIONS 160-162): the boundaries are the
  snapshot offsets nearest to an even split of the records. Process 0 audits
  from offset 0; process k starts from the snapshot at its boundary, taken as
  a hypothesis that process k - 1 must confirm by arriving at exactly that
  state, digest and stored blob. A snapshot it does not reproduce is reported
  (a warning naming it) and process k - 1 audits on past it from its own,
  verified state, so the report is the one-process report whatever the jobs
  (:func:`quotaledger.engine.audit.parallel.merge_spans`).
* **Without a usable snapshot** (DECISIONS 46, 121): N - 1 processes audit
  equal segments, each folding the records before its segment first, while
  this process checks the digest chain.

Anything that does not join up (a gap, a snapshot replaced or a ledger grown
while audited) falls back to one process. Workers are processes this process
forks (or spawns) and ends: SIGTERM/SIGINT here terminates them at once (DESIGN
§9 shutdown), and their progress is summed into this process's progress line.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from quotaledger.engine.audit import AuditReport, audit
from quotaledger.engine.audit.digests import chain_pass
from quotaledger.engine.audit.parallel import (
    SegmentMismatch,
    audit_segment,
    audit_span,
    merge_segments,
    merge_spans,
    segments,
    with_chain,
)
from quotaledger.engine.audit.plan import Cut, plan_cuts
from quotaledger.events.ledger import LedgerError

from ..ledgers.jsonl import is_jsonl_path
from ..ledgers.sources import jsonl_file_records, ledger_record_source, with_record_source
from ..ledgers.sqlite.ledger import SqliteLedger
from .common import UserError, progress_for, progress_meter, tune_gc, warn

Progress = Callable[[int], None]
#: How workers start (DECISIONS 343): forked on Linux (the parent has every module
#: imported and no other thread then), spawned elsewhere (macOS's system libraries
#: are not safe to fork, Windows cannot).
START_METHOD = "fork" if sys.platform.startswith("linux") else "spawn"
#: A worker's job: picklable by name, called with its arguments and a progress callback.
Job = Callable[..., Any]


# ----------------------------------------------------------------- worker side


def _worker(writer: Connection, counter: Any, slot: int, job: Job, args: tuple[Any, ...]) -> None:
    """The body of one worker process: run ``job`` and send back its result."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops its workers
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # (a forked worker had the parent's)
    tune_gc()

    def progress(done: int) -> None:
        counter[slot] = done

    outcome: tuple[str, Any]
    try:
        outcome = ("ok", job(*args, progress))
    except (LedgerError, UserError, ValueError) as exc:
        outcome = ("error", str(exc))
    writer.send(outcome)
    writer.close()


def span_job(
    path: str,
    start: Cut | None,
    stops: Sequence[Cut],
    end: int,
    digests: Mapping[int, bytes],
    progress: Progress,
) -> Any:
    """One process of a snapshot-segmented audit (:func:`audit_span`)."""

    async def run() -> Any:
        ledger = await SqliteLedger.open(path, read_only=True)
        try:
            return audit_span(
                await ledger_record_source(ledger),
                ledger.snapshot_at,
                start,
                stops,
                end,
                digests=digests,
                progress=progress,
            )
        finally:
            await ledger.close()

    return asyncio.run(run())


def segment_job(path: str, start: int, end: int, progress: Progress) -> Any:
    """One segment folded from offset 0 (:func:`audit_segment`)."""
    return with_record_source(
        Path(path), lambda source: audit_segment(source, start, end), progress_meter("audit")
    )


# ----------------------------------------------------------------- parent side


def run_workers(
    jobs: Sequence[tuple[Job, tuple[Any, ...]]],
    progress: Progress | None = None,
    meanwhile: Callable[[Callable[[], int]], Any] | None = None,
) -> tuple[list[Any], Any]:
    """Run each job in its own process (:data:`START_METHOD`); ``meanwhile`` runs here while
    they do (given a callable that sums the records the workers report done).
    Returns their results in order and ``meanwhile``'s. ``progress`` gets the
    sum of the records the workers report done, four times a second.
    However this ends (an error, SIGTERM), every worker still running is
    terminated before it returns."""
    context: Any = multiprocessing.get_context(START_METHOD)
    counter: Any = context.Array("q", len(jobs), lock=False)
    processes: list[Any] = []
    waiting: dict[Connection, int] = {}
    try:
        for slot, (job, args) in enumerate(jobs):
            reader, writer = context.Pipe(duplex=False)
            process = context.Process(
                target=_worker, args=(writer, counter, slot, job, args), daemon=True
            )
            process.start()
            writer.close()
            processes.append(process)
            waiting[reader] = slot
        extra = meanwhile(lambda: sum(counter)) if meanwhile is not None else None
        outcomes: list[tuple[str, Any]] = [("error", "no result")] * len(jobs)
        while waiting:
            for ready in wait(list(waiting), timeout=0.25):
                assert isinstance(ready, Connection)
                slot = waiting.pop(ready)
                try:
                    outcomes[slot] = ready.recv()
                except EOFError:
                    outcomes[slot] = ("error", "an audit worker process ended without a result")
            if progress is not None:
                progress(sum(counter))
    finally:
        for process in processes:
            if process.is_alive() and waiting:
                process.terminate()
        for process in processes:
            process.join()
    results = []
    for status, value in outcomes:
        if status != "ok":
            raise LedgerError(f"audit --jobs: {value}")
        results.append(value)
    return results, extra


def _last_offset(path: Path) -> int:
    if is_jsonl_path(path):
        return len(jsonl_file_records(path)) - 1

    async def run() -> int:
        ledger = await SqliteLedger.open(str(path), read_only=True)
        try:
            return await ledger.last_offset()
        finally:
            await ledger.close()

    return asyncio.run(run())


def _snapshot_sizes(path: Path) -> list[tuple[int, int]]:
    if is_jsonl_path(path):
        return []

    async def run() -> list[tuple[int, int]]:
        ledger = await SqliteLedger.open(str(path), read_only=True)
        try:
            return ledger.snapshot_sizes()
        finally:
            await ledger.close()

    return asyncio.run(run())


def audit_parallel(path: Path, jobs: int, digests: dict[int, bytes]) -> AuditReport:
    """``audit --jobs N`` of a SQLite ledger or JSONL file (see the module docstring)."""

    def single() -> AuditReport:
        report: AuditReport = with_record_source(
            path, lambda source: audit(source, digests=digests), progress_meter("audit")
        )
        return report

    if not path.exists():
        raise UserError(f"{path}: no such file")
    last_offset = _last_offset(path)
    if last_offset < 1:
        return single()
    try:
        sizes = _snapshot_sizes(path)
    except LedgerError as exc:  # snapshots are a cache: audit without them
        warn(f"{exc}; auditing without snapshots")
        sizes = []
    cuts = plan_cuts(sizes, last_offset, jobs)
    if cuts:
        report = _audit_spans(path, cuts, last_offset, digests)
        if report is not None:
            return report
        return single()
    ranges = segments(last_offset, max(1, jobs - 1))
    work = [(segment_job, (str(path), a, b)) for a, b in ranges]
    results, chained = run_workers(
        work,
        meanwhile=lambda _workers_done: with_record_source(
            path, lambda source: chain_pass(source, digests), progress_meter("audit")
        ),
    )
    if chained.damage or chained.last_offset != last_offset:
        return single()
    try:
        merged: AuditReport = merge_segments(chained, results)
    except SegmentMismatch as exc:
        warn(f"{exc}; auditing in one process instead")
        return single()
    return merged


def _audit_spans(
    path: Path,
    cuts: list[Cut],
    last_offset: int,
    digests: dict[int, bytes],
) -> AuditReport | None:
    """The snapshot-segmented audit; None when it must be done in one process.
    The span at offset 0 is audited here, each other in a worker process
    (DECISIONS 340: the plan counts a worker's start in its span's cost)."""
    work = [(span_job, (str(path), cut, cuts, last_offset, digests)) for cut in cuts]
    progress = progress_for("audit", last_offset + 1, None)
    mine = [0]  # records this process has audited

    def show(workers: int) -> None:
        # (a span discarded after a rejected snapshot counts too: capped at the total)
        progress(min(mine[0] + workers, last_offset + 1))

    def first_span(workers_done: Callable[[], int]) -> Any:
        def done(count: int) -> None:
            mine[0] = count
            show(workers_done())

        try:
            return span_job(str(path), None, cuts, last_offset, digests, done)
        except (LedgerError, UserError, ValueError) as exc:
            raise LedgerError(f"audit --jobs: {exc}") from None

    try:
        others, first = run_workers(work, show, meanwhile=first_span)
        results = [first, *others]
    except LedgerError as exc:
        warn(f"{exc}; auditing in one process instead")
        return None
    finally:
        progress.close()
    if _last_offset(path) != last_offset:
        return None
    try:
        report, clean, hash_problems = merge_spans(results, last_offset, warn)
    except SegmentMismatch as exc:
        warn(f"{exc}; auditing in one process instead")
        return None
    if not clean:
        # a digest failed: locating the changed records needs the whole chain
        chained = with_record_source(
            path, lambda source: chain_pass(source, digests), progress_meter("audit")
        )
        report = with_chain(report, chained, hash_problems)
    return report
