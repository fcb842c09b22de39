"""``quotaledger bench fold``: how fast the fold, the settle and the ledger are.

It folds the deterministic workload of :mod:`.workload` (a 5-level quota
tree, nodes, pods, then a day of churn, in the wire form).

Figures (``time.perf_counter``; the garbage collector as in production: run through the
CLI, which sets ``adapters.cli.common.GC_THRESHOLDS``):

* ``decode_events_per_s``: ``decode_event`` of the churn payloads (msgspec and the
  canonical amounts), no fold: the ceiling; ``msgspec_decode_events_per_s`` is
  the msgspec decoder alone, for reference;
* ``fold_events_per_s``: ``Projection.apply_record`` of the churn, after the setup was folded;
* ``full_recompute_ms``: ``recompute_all`` of the final state (median of 5);
* ``incremental_recompute_us``: one ``PodUpserted`` changing a pod's request,
  then ``settled().quotas[leaf].runtime`` (median of 1000);
* ``append_events_per_s`` / ``read_events_per_s``: the SQLite ledger, batches of 1000;
* ``bytes_per_pod``: tracemalloc of folding the setup pods, divided by their number;
* ``replay_10m_estimate_s``: an *estimate*, 10M / fold_events_per_s + the final settle;
* ``replay_1m_s``, ``audit_1m_s``, ``audit_1m_jobs2_s``: wall seconds of ``quotaledger
  replay --no-snapshot --json``, ``audit`` and ``audit --jobs 2`` of the SQLite ledger the
  append figure wrote (every record of the workload), each a new process (start included),
  run interleaved, best of ``cli_runs``; ``audit_jobs2_vs_1`` is their ratio. A live
  engine (election off, the engine's default intervals) follows that ledger as it is
  written and leaves what a running engine leaves: a ``LedgerDigest`` every
  ``digest_every`` records and a snapshot every ``snapshot_every``
  (:class:`EngineCheckpoints`; ``ledger_digests``, ``ledger_snapshots``); its work and
  appends are outside the append figure.
* ``digest_chain_events_per_s``: the digest chain alone (sha256 per record, DESIGN §9)
  over the churn records, the part of the fold figure it costs (DECISIONS 172).
* the state hash (DESIGN §5 "State hash"; a second fold of the workload, the churn
  cut into windows of ``digest_every`` records): ``state_hash_ms``, the hash computed
  from nothing of the final state (``full_state_hash``, median of 3);
  ``state_hash_incremental_us``, the kept hash of one ``LedgerDigest`` after a window
  of churn (``state_hash`` of the settled state, median over the last 3 windows), and
  ``digest_settle_ms`` the settle before it; ``state_hash_bytes_per_pod``, what the
  kept digests hold (tracemalloc of the first hash, per pod; ``bytes_per_pod_hashed``
  adds it to ``bytes_per_pod``);
* the adversarial shape of DECISIONS 232: the final state's pods as a map sorted but
  for two keys appended out of order at its tail (what re-upserted pods make):
  ``tail_state_hash_ms`` (the hash from nothing) and ``tail_snapshot_dump_ms`` (the
  snapshot's encoding) of that state; both sort nothing quadratically.

Progress goes to stderr; ``--json`` prints exactly one JSON object on stdout.

This module runs the measurements and makes the report: the figures above, their targets,
the table and ``--json``; each figure is measured in :mod:`.fold_measurements`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import msgspec

from quotaledger.events.model import Event
from quotaledger.projections import Projection

from .fold_measurements import (
    fold_pods_traced,
    fold_records,
    measure_chain,
    measure_cli,
    measure_decode,
    measure_fold,
    measure_full_recompute,
    measure_incremental,
    measure_sqlite,
    measure_state_hash,
)
from .workload import generate

REPLAY_EVENTS = 10_000_000

#: Issue targets (one core, default sizes).
TARGET_FOLD_VS_DECODE = 0.3
TARGET_FOLD_EVENTS_PER_S = 300_000
TARGET_FULL_RECOMPUTE_MS = 20.0
TARGET_INCREMENTAL_US = 350.0
TARGET_P99_US = 4000.0
TARGET_BYTES_PER_POD = 1024
TARGET_REPLAY_10M_S = 60.0
#: Targets: fold ≥ 0.15 × the msgspec decoder alone (DECISIONS 172, left unmet); audit
#: --jobs 2 ≤ 0.6 × one process (DECISIONS 160, 236).
TARGET_FOLD_VS_MSGSPEC = 0.15
TARGET_AUDIT_JOBS2_VS_1 = 0.6
#: Target: the one-process audit of the engine-written bench ledger (DECISIONS 236).
TARGET_AUDIT_1M_S = 20.0


def _log(message: str) -> None:
    print(f"bench: {message}", file=sys.stderr, flush=True)


def run(
    quotas: int = 10_000,
    pods: int = 100_000,
    nodes: int = 1_000,
    events: int = 1_000_000,
    seed: int = 1,
    progress: Callable[[str], None] | None = _log,
    cli_runs: int = 2,
    snapshot_every: int = 50_000,
    digest_every: int = 10_000,
) -> dict[str, Any]:
    """Generate the workload, take every measurement, return the report."""
    say = progress or (lambda message: None)
    start = time.perf_counter()
    work = generate(quotas, pods, nodes, events, seed, progress=say)
    say(f"workload generated in {time.perf_counter() - start:.1f} s")
    churn = work.churn or work.pods
    payloads = [record.payload for record in churn]

    decode_s = measure_decode(payloads)
    decode_rate = len(payloads) / decode_s
    raw_rate = len(payloads) / measure_decode(payloads, decode=msgspec.json.Decoder(Event).decode)
    say(f"decode: {decode_rate:,.0f} events/s (msgspec alone: {raw_rate:,.0f} events/s)")

    if work.churn:
        fold_s, bytes_per_pod, runs, projection = measure_fold(work)
    else:  # no churn: time the pods instead
        traced, projection, runs = Projection(), Projection(), 1
        fold_records(traced, work.config)
        bytes_per_pod = fold_pods_traced(traced, work.pods)
        fold_records(projection, work.config)
        fold_s = fold_records(projection, work.pods)
    fold_rate = len(churn) / fold_s
    say(f"fold: {fold_rate:,.0f} events/s (best of {runs})")
    say(f"memory: {bytes_per_pod:,.0f} bytes per pod")
    settle_start = time.perf_counter()
    projection.settled()
    settle_ms = (time.perf_counter() - settle_start) * 1000
    rejected = len(projection.state.rejected)
    say(f"settle after the fold: {settle_ms:.1f} ms; rejected: {rejected}")

    recompute_ms = measure_full_recompute(projection)
    say(f"full recompute: {recompute_ms:.2f} ms")
    incremental = measure_incremental(projection, work, seed=seed)
    incremental_us = statistics.median(incremental) * 1e6
    p99_us = sorted(incremental)[int(len(incremental) * 0.99) - 1] * 1e6
    say(f"incremental: median {incremental_us:.1f} us, p99 {p99_us:.1f} us")

    chain_rate = len(churn) / measure_chain(churn)
    say(f"digest chain alone: {chain_rate:,.0f} events/s")

    hashing = measure_state_hash(work, window=digest_every)
    say(
        f"state hash: from nothing {hashing['state_hash_ms']:.1f} ms, kept"
        f" {hashing['state_hash_incremental_us']:,.0f} us after {digest_every:,} records"
        f" (settle {hashing['digest_settle_ms']:.1f} ms), kept digests"
        f" {hashing['state_hash_bytes_per_pod']:,.0f} B/pod; pods map with two keys out of"
        f" order at its tail: hash {hashing['tail_state_hash_ms']:.1f} ms,"
        f" snapshot {hashing['tail_snapshot_dump_ms']:.1f} ms"
    )

    with tempfile.TemporaryDirectory(prefix="quotaledger-bench-") as directory:
        path = os.path.join(directory, "bench.db")
        append_s, read_s, read_count, checkpoints = measure_sqlite(
            work.records, path, snapshot_every, digest_every
        )
        assert checkpoints is not None
        append_rate = (len(work.records) - 1) / append_s
        read_rate = read_count / read_s
        say(f"sqlite: append {append_rate:,.0f} events/s, read {read_rate:,.0f} events/s")
        say(
            f"the engine left {checkpoints.snapshots} snapshot(s) and"
            f" {checkpoints.digests} LedgerDigest record(s) in the ledger"
        )
        cli = measure_cli(path, cli_runs)
    say(
        f"through the CLI: replay {cli['replay_1m_s']:.2f} s, audit {cli['audit_1m_s']:.2f} s,"
        f" audit --jobs 2 {cli['audit_1m_jobs2_s']:.2f} s"
    )

    replay_s = REPLAY_EVENTS / fold_rate + settle_ms / 1000
    state = projection.state
    report: dict[str, Any] = {
        "decode_events_per_s": round(decode_rate),
        "msgspec_decode_events_per_s": round(raw_rate),
        "fold_events_per_s": round(fold_rate),
        "fold_vs_decode": round(fold_rate / decode_rate, 3),
        "fold_vs_msgspec": round(fold_rate / raw_rate, 3),
        "digest_chain_events_per_s": round(chain_rate),
        "full_recompute_ms": round(recompute_ms, 3),
        "incremental_recompute_us": round(incremental_us, 1),
        "incremental_recompute_p99_us": round(p99_us, 1),
        "settle_after_fold_ms": round(settle_ms, 3),
        "append_events_per_s": round(append_rate),
        "read_events_per_s": round(read_rate),
        "bytes_per_pod": round(bytes_per_pod),
        "bytes_per_pod_hashed": round(bytes_per_pod + hashing["state_hash_bytes_per_pod"]),
        "state_hash_ms": round(hashing["state_hash_ms"], 1),
        "state_hash_incremental_us": round(hashing["state_hash_incremental_us"]),
        "digest_settle_ms": round(hashing["digest_settle_ms"], 1),
        "state_hash_bytes_per_pod": round(hashing["state_hash_bytes_per_pod"]),
        "tail_state_hash_ms": round(hashing["tail_state_hash_ms"], 1),
        "tail_snapshot_dump_ms": round(hashing["tail_snapshot_dump_ms"], 1),
        "replay_10m_estimate_s": round(replay_s, 1),
        "replay_1m_s": round(cli["replay_1m_s"], 2),
        "audit_1m_s": round(cli["audit_1m_s"], 2),
        "audit_1m_jobs2_s": round(cli["audit_1m_jobs2_s"], 2),
        "audit_jobs2_vs_1": round(cli["audit_1m_jobs2_s"] / cli["audit_1m_s"], 3),
        "ledger_snapshots": checkpoints.snapshots,
        "ledger_digests": checkpoints.digests,
        "snapshot_every": snapshot_every,
        "digest_every": digest_every,
        "cpus": os.cpu_count(),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "quotas": quotas,
        "pods": pods,
        "nodes": nodes,
        "events": events,
        "seed": seed,
        "tree_levels": work.depth,
        "records": len(work.config) + len(work.pods) + len(work.churn),
        "rejected": rejected,
        "active_pods": len(state.pod_quota),
        "fold_runs": runs,
        "mix": work.mix,
        "python": platform.python_version(),
        "msgspec": msgspec.__version__,
    }
    report["targets_met"] = targets_met(report)
    return report


def targets_met(report: dict[str, Any]) -> dict[str, bool]:
    """The issue's targets, each met or not."""
    return {
        "fold_events_per_s": report["fold_events_per_s"] >= TARGET_FOLD_EVENTS_PER_S,
        "fold_vs_decode": report["fold_vs_decode"] >= TARGET_FOLD_VS_DECODE,
        "full_recompute_ms": report["full_recompute_ms"] <= TARGET_FULL_RECOMPUTE_MS,
        "incremental_recompute_us": report["incremental_recompute_us"] <= TARGET_INCREMENTAL_US,
        "incremental_recompute_p99_us": report["incremental_recompute_p99_us"] <= TARGET_P99_US,
        "fold_vs_msgspec": report["fold_vs_msgspec"] >= TARGET_FOLD_VS_MSGSPEC,
        "audit_jobs2_vs_1": report["audit_jobs2_vs_1"] <= TARGET_AUDIT_JOBS2_VS_1,
        "bytes_per_pod": report["bytes_per_pod"] <= TARGET_BYTES_PER_POD,
        "bytes_per_pod_hashed": report["bytes_per_pod_hashed"] <= TARGET_BYTES_PER_POD,
        "audit_1m_s": report["audit_1m_s"] <= TARGET_AUDIT_1M_S,
        "replay_10m_estimate_s": report["replay_10m_estimate_s"] <= TARGET_REPLAY_10M_S,
    }


_ROWS = (
    ("decode_events_per_s", "decode (ceiling)", "events/s", None),
    ("msgspec_decode_events_per_s", "msgspec alone", "events/s", None),
    ("fold_events_per_s", "fold", "events/s", f">= {TARGET_FOLD_EVENTS_PER_S:,}"),
    ("fold_vs_decode", "fold / decode", "", f">= {TARGET_FOLD_VS_DECODE}"),
    ("fold_vs_msgspec", "fold / msgspec alone", "", f">= {TARGET_FOLD_VS_MSGSPEC}"),
    ("digest_chain_events_per_s", "digest chain alone", "events/s", None),
    ("full_recompute_ms", "full recompute", "ms", f"<= {TARGET_FULL_RECOMPUTE_MS:g}"),
    ("incremental_recompute_us", "incremental (median)", "us", f"<= {TARGET_INCREMENTAL_US:g}"),
    (
        "incremental_recompute_p99_us",
        "incremental (p99)",
        "us",
        f"<= {TARGET_P99_US:g}",
    ),
    ("settle_after_fold_ms", "settle after the fold", "ms", None),
    ("append_events_per_s", "SQLite append", "events/s", None),
    ("read_events_per_s", "SQLite read", "events/s", None),
    ("bytes_per_pod", "memory per pod", "bytes", f"<= {TARGET_BYTES_PER_POD}"),
    ("bytes_per_pod_hashed", "... with kept digests", "bytes", f"<= {TARGET_BYTES_PER_POD}"),
    ("state_hash_ms", "state hash (full)", "ms", None),
    ("state_hash_incremental_us", "state hash (kept)", "us", None),
    ("digest_settle_ms", "settle before a digest", "ms", None),
    ("tail_state_hash_ms", "hash, tail out of order", "ms", None),
    ("tail_snapshot_dump_ms", "snapshot, tail disorder", "ms", None),
    ("replay_10m_estimate_s", "10M replay (estimate)", "s", f"<= {TARGET_REPLAY_10M_S:g}"),
    ("replay_1m_s", "replay (CLI)", "s", None),
    ("audit_1m_s", "audit (CLI)", "s", f"<= {TARGET_AUDIT_1M_S:g}"),
    ("audit_1m_jobs2_s", "audit --jobs 2 (CLI)", "s", None),
    ("audit_jobs2_vs_1", "audit jobs 2 / jobs 1", "", f"<= {TARGET_AUDIT_JOBS2_VS_1}"),
)


def render(report: dict[str, Any]) -> str:
    """The report as a readable table."""
    lines = [
        f"quotaledger bench fold: {report['quotas']:,} quotas ({report['tree_levels']} levels), "
        f"{report['pods']:,} pods, {report['nodes']:,} nodes, {report['events']:,} events "
        f"(seed {report['seed']}, Python {report['python']})",
        "",
        f"{'figure':<24}{'value':>16}  {'unit':<9}{'target':<12}met",
    ]
    met = report["targets_met"]
    for key, label, unit, target in _ROWS:
        value = report[key]
        text = f"{value:,.0f}" if isinstance(value, int) or value >= 1000 else f"{value:,.3g}"
        verdict = ("yes" if met[key] else "NO") if key in met else ""
        lines.append(f"{label:<24}{text:>16}  {unit:<9}{target or '':<12}{verdict}")
    lines.append("")
    lines.append(
        f"rejected by the projection: {report['rejected']} of {report['records']:,} records; "
        f"active pods at the end: {report['active_pods']:,}"
    )
    lines.append("churn mix: " + ", ".join(f"{k} {v:,}" for k, v in report["mix"].items()))
    lines.append("(the 10M replay figure is an estimate: 10M / fold rate + the final settle)")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    """Entry point of ``quotaledger bench`` (wired in the CLI)."""
    if args.suite != "fold":
        print(f"quotaledger: error: unknown bench suite {args.suite!r}", file=sys.stderr)
        return 2
    try:
        report = run(
            args.quotas, args.pods, args.nodes, args.events, args.seed, cli_runs=args.cli_runs
        )
    except ValueError as exc:
        print(f"quotaledger: error: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(report))
    else:
        print(render(report))
    return 0
