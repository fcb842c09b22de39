"""The end of a ``quotaledger bench faults`` trial (DECISIONS 220, 222, 224): every record
read again independently of quotaledger's readers (:mod:`.fault_records`), ``quotaledger
audit --json`` run on the ledger, and the evidence handed to the checks
(:func:`.fault_checks.check_trial`) with the offsets a broker restart lost; and the
processes' logs read for tracebacks and for offsets a reader filled that hold records (a
hole that was not one, DECISIONS 200).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from .fault_checks import CheckContext, check_trial
from .fault_cluster import now_ms
from .fault_processes import filled, tail, term_starts_ms, tracebacks
from .fault_records import RawRecord, decode_json
from .fault_trial_state import TrialState


async def check(trial: TrialState, settled: list[RawRecord]) -> None:
    """Every check of the trial, at its end: ``settled`` are the records quiescence was
    reached with (the final read must hold as many)."""
    records = await trial.final_records()
    if len(records) < len(settled):
        trial.violate(
            "gap",
            f"the final read found {len(records)} records, the follower saw {len(settled)}",
        )
    present = {r.offset for r in records}
    holes = set(range(max(present, default=-1) + 1)) - present
    # a ledger with a hole is audited as a gaps=fill engine reads it (DESIGN §10)
    audit = await run_audit(trial, trial.engine_url("fill" if holes else "stop"))
    ctx = CheckContext(
        seed=trial.seed,
        backend=trial.env.backend,
        produced=trial.produced.acked,
        posts=trial.server.posts,
        lease_writes=trial.server.lease_writes,
        requests=[
            (slot.name, seen.at_ms, seen.path)
            for slot in trial.slots
            for seen in slot.proxy.requests
            if seen.method == "POST" and seen.path.endswith("/eviction")
        ],
        instance_at={slot.name: slot.instance_at for slot in trial.slots},
        now_ms=now_ms(),
        deadline_grace_ms=trial.options.deadline_grace_ms,
        audit=audit,
    )
    restarted = trial.broker is not None and any(
        up >= trial.started_ms for _, up in trial.broker.restarts
    )
    if holes and restarted:
        # the broker lost writes when it was restarted (tansu on s3 does): not the
        # engines' doing; what matters is that no acknowledged fact is among them
        trial.result.stats["offsets lost by broker restarts"] += len(holes)
        ctx.broker_holes = set(holes)
    for who, offset, text in trial.stopped_at_holes:
        if offset in ctx.broker_holes:
            trial.result.stats["stops at a lost offset (gaps=stop)"] += 1
        else:
            trial.violate("process-exit", f"{who} stopped at offset {offset}: {text}")
    if trial.env.backend == "kafka":
        trial.result.stats["offsets readable after a later one"] += trial.tap.late
    violations, stats = check_trial(records, ctx)
    trial.result.violations.extend(violations)
    trial.result.stats.update(stats)
    await check_logs(trial, records)


async def check_logs(trial: TrialState, records: list[RawRecord] | None) -> None:
    """Tracebacks, and offsets a reader said it filled that hold records (the raw
    records of the checks, else read now): a hole that was not one (DECISIONS 200)."""
    errs = [i.stderr for s in trial.slots for i in s.incarnations] + trial.tool_errs
    starts = [ms for path in errs for ms in term_starts_ms(path)]
    trial.result.stats["terms"] += len(starts)
    trial.result.stats["term start ms max"] = max(starts, default=0)
    for path, text in tracebacks(errs):
        trial.violate("traceback", f"{path.name}: {' | '.join(text.splitlines()[-4:])}")
    fills = filled(errs)
    if not fills:
        return
    if records is None:
        with contextlib.suppress(Exception):
            async with asyncio.timeout(60):
                records = await trial.final_records()
    present = {r.offset for r in records or ()}
    for path, first, last in fills:
        held = sorted(present & set(range(first, last + 1)))
        trial.result.stats["offset ranges filled"] += 1
        if held:
            trial.violate(
                "filled-record",
                f"{path.name}: a reader filled offsets {first}..{last}, and the ledger holds"
                f" records at {held[0]}..{held[-1]}",
                f"{first}..{last}",
            )


async def run_audit(trial: TrialState, url: str) -> tuple[int, dict[str, Any] | None, str]:
    """``quotaledger audit URL --json`` (again, up to 3 times, while it cannot connect:
    a broker restart of a trial running beside this one)."""
    for _ in range(3):
        code, report, err = await audit_once(trial, url)
        if not (code == 2 and "cannot connect" in err):
            break
        await asyncio.sleep(2.0)
    return code, report, err


async def audit_once(trial: TrialState, url: str) -> tuple[int, dict[str, Any] | None, str]:
    """One ``audit --json`` process: (exit code, its report, the tail of its stderr)."""
    err = trial.dir / "audit.err"
    trial.tool_errs.append(err)
    with err.open("wb") as stderr:
        proc = await asyncio.create_subprocess_exec(
            *trial.options.tool_command,
            "audit",
            url,
            "--json",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=stderr,
        )
        try:
            out, _ = await proc.communicate()
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    code = proc.returncode if proc.returncode is not None else -1
    return code, decode_json(out), tail(err)
