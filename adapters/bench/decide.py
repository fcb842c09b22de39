"""``quotaledger bench decide``: decision latency, follow throughput and simulate throughput.

Latency: a live engine (simulate executor) follows a SQLite ledger holding the
generated tree (10k quotas, 100k pods) while a *separate process* appends
background pod churn at ``--rate`` events/s. The benchmark appends
quota-decrease triggers (a lowered max with a 20 ms delay) and measures, in
ledger time, from each trigger's deadline to the first ``EvictionRequested``
of the preemption it caused; every trigger is accounted for (a sample, no
victim with the reason, or unanswered: DECISIONS 243). Follow: the engine's
sustained rate on the workload's churn, fed faster than it folds, with its
default ``LedgerDigest`` and snapshot intervals. Throughput: ``simulate`` over
a day-long generated scenario, in events/s.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec

from quotaledger.engine.executors import SimulateExecutor
from quotaledger.engine.live import LiveEngine
from quotaledger.engine.simulate import Simulation
from quotaledger.events.codec import decode_event
from quotaledger.events.ledger import Append
from quotaledger.events.model import (
    EvictionRequested,
    PreemptionFinished,
    PreemptionStarted,
    QuotaUpserted,
)

from ..ledgers.sqlite.ledger import SqliteLedger
from .workload import Workload, generate

DELAY_S = 0.02


def _log(message: str) -> None:
    print(f"[bench decide] {message}", file=sys.stderr, flush=True)


def _background(path: str, payloads: list[bytes], rate: int, stop_after: float) -> None:
    """Child process: append re-upserts of existing pods at ``rate`` events/s."""

    async def main() -> None:
        ledger = await SqliteLedger.open(path, create=False)
        rng = random.Random(7)
        batch = max(1, rate // 100)
        started = time.monotonic()
        sent = 0
        try:
            while time.monotonic() - started < stop_after:
                chunk = [Append(payload=rng.choice(payloads)) for _ in range(batch)]
                await ledger.append(chunk)
                sent += batch
                ahead = sent / rate - (time.monotonic() - started)
                if ahead > 0:
                    await asyncio.sleep(ahead)
        finally:
            await ledger.close()

    asyncio.run(main())


def _input_rl(amounts: dict[str, int]) -> dict[str, Any]:
    """Canonical amounts back to wire form (cpu as millicores)."""
    return {k: (f"{v}m" if k == "cpu" else v) for k, v in amounts.items()}


def _trigger(config: QuotaUpserted, used: dict[str, int]) -> bytes | None:
    """A valid upsert of ``config`` lowering cpu max well below used."""
    cpu_min = config.min.get("cpu", 0)
    cpu_used = used.get("cpu", 0)
    if cpu_used < 2 * cpu_min + 2000:
        return None
    new_max = dict(config.max or {})
    for key, value in config.min.items():
        if value > 0:
            new_max[key] = max(new_max.get(key, value + 1), value + 1)
    new_max["cpu"] = max(cpu_min + 1, cpu_used // 2)
    doc = {
        "kind": "QuotaUpserted",
        "name": config.name,
        "parent": config.parent,
        "is_parent": False,
        "min": _input_rl(config.min),
        "max": _input_rl(new_max),
        "allow_lent": config.allow_lent,
        "namespaces": config.namespaces,
        "preemption_delay_s": DELAY_S,
    }
    for field in ("shared_weight", "lending_limit", "borrowing_limit"):
        value = getattr(config, field)
        if value is not None:
            doc[field] = _input_rl(value)
    return msgspec.json.encode(doc)


async def _bench_ledger(work: Workload, path: Path, seed: int) -> SqliteLedger:
    """A new SQLite ledger holding the generated tree and pods, quota-decrease
    preemption on, revoke and reclaim off."""
    ledger = await SqliteLedger.open(str(path), ledger_id=f"bench-{seed}")
    settings = msgspec.json.encode(
        {
            "kind": "SettingsChanged",
            "quota_preemption_enabled": True,
            "revoke_enabled": False,
            "reclaim_enabled": False,
        }
    )
    await ledger.append([Append(payload=settings, ts=work.config[1].ts)])
    rows = [*work.config[1:], *work.pods]
    for start in range(0, len(rows), 5000):
        await ledger.append(
            [Append(payload=r.payload, ts=r.ts) for r in rows[start : start + 5000]]
        )
    return ledger


async def _started(engine: LiveEngine) -> tuple[asyncio.Event, asyncio.Task[None]]:
    """``engine`` running (restored and elected): its stop event and task."""
    stop = asyncio.Event()
    ready = asyncio.Event()

    async def on_ready() -> None:
        ready.set()

    runner = asyncio.create_task(engine.run(stop, on_ready))
    waiter = asyncio.create_task(ready.wait())
    await asyncio.wait({runner, waiter}, return_when=asyncio.FIRST_COMPLETED)
    if not ready.is_set():
        waiter.cancel()
        await runner  # raises what stopped it
        raise RuntimeError("the engine stopped before it was ready")
    return stop, runner


async def _latency(args: argparse.Namespace, directory: Path) -> dict[str, Any]:
    work = generate(args.quotas, args.pods, args.nodes, 0, args.seed)
    path = directory / "decide.db"
    ledger = await _bench_ledger(work, path, args.seed)
    rows = len(work.config) + len(work.pods)
    _log(f"ledger ready: {rows + 1} records; starting the engine")
    engine = LiveEngine(ledger, SimulateExecutor(), instance="bench", idle_poll_s=0.05)
    stop, runner = await _started(engine)
    pod_payloads = [r.payload for r in work.pods[: min(len(work.pods), 20_000)]]
    duration = args.triggers * 0.25 + 5
    child = multiprocessing.get_context("spawn").Process(
        target=_background, args=(str(path), pod_payloads, args.rate, duration), daemon=True
    )
    child.start()
    await asyncio.sleep(1.0)
    rng = random.Random(args.seed)
    leaves = list(work.leaves)
    triggers: dict[str, int] = {}  # leaf -> trigger offset
    try:
        attempts = 0
        while len(triggers) < args.triggers and attempts < args.triggers * 50:
            attempts += 1
            leaf = rng.choice(leaves)
            state = engine.projection.settled()
            node = state.quotas.get(leaf)
            if leaf in triggers or node is None or leaf in state.occupied:
                continue
            payload = _trigger(node.config, node.used)
            if payload is None:
                continue
            (offset,) = await ledger.append([Append(payload=payload)])
            triggers[leaf] = offset
            await asyncio.sleep(0.2)
        await asyncio.sleep(1.0)
    finally:
        stop.set()
        with contextlib.suppress(Exception):
            await runner
        child.join(timeout=duration + 10)
        if child.is_alive():
            child.terminate()
    report = _classify(ledger, rows + 1, triggers)
    await ledger.close()
    report["background_rate_target"] = args.rate
    return report


def _percentile(values: list[int], q: float) -> float:
    """The ``q`` quantile of sorted ``values`` (nearest rank below), NaN when empty."""
    if not values:
        return float("nan")
    return float(values[min(len(values) - 1, int(q * len(values)))])


def _classify(ledger: SqliteLedger, start: int, triggers: dict[str, int]) -> dict[str, Any]:
    """Each trigger's outcome, read back from the ledger after ``start``.

    A trigger (a lowered max on a leaf, at ledger offset ``t``) is answered by
    the first quota-decrease ``PreemptionStarted`` on its leaf after ``t``. It
    *found a victim* when that preemption has an ``EvictionRequested``: a
    latency sample, from the deadline (the trigger's ts + the delay) to the
    first eviction's ts. It found none when the preemption finished
    ``not-helpful`` without one (the reasons are counted). Anything else is
    reported as unanswered (never fired, or still running at the end), so a
    missing sample is never silently a no-victim case.
    """
    offsets = {offset: leaf for leaf, offset in triggers.items()}
    trigger_ts: dict[str, int] = {}
    answer: dict[str, str] = {}  # leaf -> preemption_id of its first answer
    started_ts: dict[str, int] = {}  # preemption_id -> ts
    first_eviction: dict[str, int] = {}  # preemption_id -> ts
    not_helpful: dict[str, str] = {}  # preemption_id -> reason
    background = 0
    for batch in ledger.iter_batches(start):
        for record in batch:
            leaf = offsets.get(record.offset)
            if leaf is not None:
                trigger_ts[leaf] = record.ts
                continue
            if b'"PodUpserted"' in record.payload[:40]:
                background += 1
                continue
            if b"Preemption" not in record.payload and b"Eviction" not in record.payload:
                continue
            event = decode_event(record.payload)
            if isinstance(event, PreemptionStarted):
                if (
                    event.cause == "quota-decrease"
                    and event.queue in trigger_ts
                    and event.queue not in answer
                ):
                    answer[event.queue] = event.preemption_id
                    started_ts[event.preemption_id] = record.ts
            elif isinstance(event, EvictionRequested) and event.preemption_id in started_ts:
                first_eviction.setdefault(event.preemption_id, record.ts)
            elif (
                isinstance(event, PreemptionFinished)
                and event.preemption_id in started_ts
                and event.outcome == "not-helpful"
            ):
                not_helpful[event.preemption_id] = event.reason
    delay_ms = round(DELAY_S * 1000)
    latencies: list[int] = []
    decisions: list[int] = []
    reasons: dict[str, int] = {}
    unanswered: dict[str, int] = {"never_fired": 0, "no_outcome": 0}
    for leaf, ts in trigger_ts.items():
        preemption = answer.get(leaf)
        if preemption is None:
            unanswered["never_fired"] += 1
            continue
        deadline = ts + delay_ms
        decisions.append(started_ts[preemption] - deadline)
        if preemption in first_eviction:
            latencies.append(first_eviction[preemption] - deadline)
        elif preemption in not_helpful:
            reason = not_helpful[preemption]
            reasons[reason] = reasons.get(reason, 0) + 1
        else:
            unanswered["no_outcome"] += 1
    latencies.sort()
    decisions.sort()
    return {
        "p50_ms": statistics.median(latencies) if latencies else float("nan"),
        "p99_ms": _percentile(latencies, 0.99),
        "max_ms": float(latencies[-1]) if latencies else float("nan"),
        "samples": len(latencies),
        "triggers": len(triggers),
        "victims_found": len(latencies),
        "no_victim": sum(reasons.values()),
        "no_victim_reasons": dict(sorted(reasons.items())),
        "unanswered": sum(unanswered.values()),
        **{f"unanswered_{key}": value for key, value in unanswered.items()},
        "decision_p99_ms": _percentile(decisions, 0.99),
        "background_events": background,
    }


async def _follow_throughput(args: argparse.Namespace, directory: Path) -> dict[str, Any]:
    """The live engine's sustained follow rate on the bench workload.

    A live engine (default settings: a ``LedgerDigest`` every 10,000 records,
    a snapshot every 50,000, election on) restored on the generated tree and
    pods; then the workload's churn (``--events`` records) is committed to the
    ledger at once, through another connection, so the engine is fed faster
    than it can fold. Timed from the commit to the engine having applied the
    last of them; the digests and snapshots it wrote meanwhile are counted.
    """
    events = args.events if args.events is not None else 200_000
    work = generate(args.quotas, args.pods, args.nodes, events, args.seed)
    path = directory / "follow.db"
    ledger = await _bench_ledger(work, path, args.seed)
    engine = LiveEngine(ledger, SimulateExecutor(), instance="bench", idle_poll_s=0.05)
    stop, runner = await _started(engine)
    start = engine.state.offset + 1
    feeder = await SqliteLedger.open(str(path), create=False)
    try:
        offsets = await feeder.append([Append(payload=r.payload) for r in work.churn])
        began, cpu = time.perf_counter(), time.process_time()
        last = offsets[-1]
        while engine.state.offset < last and not runner.done():
            await asyncio.sleep(0.005)
        elapsed, cpu = time.perf_counter() - began, time.process_time() - cpu
    finally:
        await feeder.close()
        stop.set()
        with contextlib.suppress(Exception):
            await runner
    digests = snapshots = 0
    for batch in ledger.iter_batches(start):
        digests += sum(b'"LedgerDigest"' in r.payload[:40] for r in batch)
    snapshots = len([o for o, _ in ledger.snapshot_sizes() if o >= start])
    await ledger.close()
    return {
        "follow_events_per_s": len(work.churn) / elapsed,
        "follow_events": len(work.churn),
        "follow_seconds": elapsed,
        "follow_cpu_seconds": cpu,  # of this process, all threads: for a loaded machine
        "follow_events_per_cpu_s": len(work.churn) / cpu if cpu > 0 else float("nan"),
        "follow_load_1m": os.getloadavg()[0],  # the machine's load average when it ended
        "follow_digests": digests,
        "follow_snapshots": snapshots,
    }


def simulate_lines(work: Workload) -> list[tuple[int, bytes]]:
    """The day-long scenario ``simulate`` runs: quota-decrease preemption on,
    revoke after 5 minutes (reclaim at its default), then the workload's
    nodes, tree, pods and churn."""
    settings = msgspec.json.encode(
        {"kind": "SettingsChanged", "quota_preemption_enabled": True, "revoke_after_s": 300}
    )
    lines = [(work.config[1].ts, settings)]
    lines += [(r.ts, r.payload) for r in [*work.config[1:], *work.pods, *work.churn]]
    return lines


def _simulate_throughput(args: argparse.Namespace) -> dict[str, Any]:
    work = generate(args.quotas, args.pods, args.nodes, args.events, args.seed)
    lines = simulate_lines(work)
    simulation = Simulation(ledger_id=f"bench-{args.seed}")
    began, cpu = time.perf_counter(), time.process_time()
    simulation.run(lines)
    elapsed, cpu = time.perf_counter() - began, time.process_time() - cpu
    preemptions = sum(1 for _, e in simulation.decisions if isinstance(e, PreemptionStarted))
    return {
        "simulate_events_per_s": len(lines) / elapsed,
        "simulate_events": len(lines),
        "simulate_records": len(simulation.records),
        "simulate_preemptions": preemptions,
        "simulate_seconds": elapsed,
        # CPU seconds of the run: on a shared machine, events/s by CPU time
        # is the steadier figure to compare
        "simulate_cpu_seconds": cpu,
    }


def main(args: argparse.Namespace) -> int:
    """Run the measurements (``--simulate-only``: the simulate throughput
    alone; ``--follow-only``: the follow throughput alone); ``--json`` prints
    one JSON object on stdout."""
    report: dict[str, Any] = {}
    follow_only = getattr(args, "follow_only", False)
    if not getattr(args, "simulate_only", False):
        if not follow_only:
            with tempfile.TemporaryDirectory(prefix="quotaledger-bench-") as tmp:
                report = asyncio.run(_latency(args, Path(tmp)))
            _log("latency done; timing the engine's follow rate")
        with tempfile.TemporaryDirectory(prefix="quotaledger-bench-") as tmp:
            report.update(asyncio.run(_follow_throughput(args, Path(tmp))))
        _log("follow done")
    if not follow_only:
        _log("simulating a day-long scenario")
        report.update(_simulate_throughput(args))
    if "p99_ms" in report:
        report["target_p99_ms"] = 50
        report["p99_met"] = report["p99_ms"] <= 50
    if "follow_events_per_s" in report:
        report["target_follow_events_per_s"] = 50_000
        report["follow_met"] = report["follow_events_per_s"] >= 50_000
    if "simulate_events_per_s" in report:
        report["target_simulate_events_per_s"] = 5000
        report["simulate_met"] = report["simulate_events_per_s"] >= 5000
    if args.json:
        print(json.dumps(report))
    else:
        for key, value in report.items():
            print(f"{key:>24}: {value:,.1f}" if isinstance(value, float) else f"{key:>24}: {value}")
    return 0
