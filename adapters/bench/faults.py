"""``quotaledger bench faults``: a seeded, randomized fault harness (DESIGN §3, §6, §9, §10,
§12; docs/DECISIONS.md 220-229).

Each trial runs, on one ledger (a SQLite file, or a Kafka topic on tansu with ``s3://``
storage on a local moto server, so that a broker restart keeps the log):

* 2-3 engines, each a ``quotaledger run LEDGER --kubeconfig ... --executor kubernetes``
  process with shortened Lease timings, against the stand-in API server
  (:mod:`.standin`) holding nodes, pods, quotas (the quotas.quotaledger.io CRD) and
  the settings ConfigMap. The leader's watcher appends what the cluster does; its
  evictions are real HTTP POSTs, answered 201, 404, 409 (uid precondition), 429 or 500;
* a small controller in this process playing the rest of the cluster: a scheduler binding
  pending pods to nodes with room, pods arriving, finishing, and (StatefulSet-like) coming
  back under the same name with a new uid after an eviction; quota changes that cause
  quota-decrease, overuse and reclaim preemptions;
* 1-3 outside producers of facts with ids of their own (``quotaledger ingest``
  processes; on Kafka also a plain confluent-kafka producer);
* faults drawn at random (:data:`.fault_plan.FAULT_KINDS`): SIGKILL of an engine (then a
  restart, under the same or a new instance name), SIGSTOP of the Lease holder past its Lease
  then SIGCONT, a TCP fault proxy (:mod:`.fault_proxy`) on each engine's link to the API
  server and on every link to the broker (tansu advertises the proxy) that delays, stalls
  or cuts connections in the middle of a response, or (on the broker's link) hands out a
  later record batch before an earlier one (:meth:`.FaultProxy.hide_first_batch`, the race
  of DECISIONS 200), and broker restarts (SIGKILL or SIGTERM).

At quiescence (nothing running, nothing outstanding, no deadline to come, the cluster
reflected in the ledger, the tail still) the engines get SIGTERM, and the checks run on what
this process reads itself: the raw records (plain ``sqlite3``; on Kafka plain Fetch
requests, each record at its partition offset, not the ledger's reader), folded here with
:class:`quotaledger.projections.Projection` only to know which records were accepted and
which timers were armed; the stand-in server's own record of eviction POSTs and Lease
writes; the proxies' record of when each request left its engine. Never an engine's view.
A violation is printed as one line with the trial's seed.

The harness, one job per module: this one runs the trials of a command (:func:`run_trial`,
:func:`run_trials`, on one :class:`.fault_environment.Environment`), sums them up and prints
them (:func:`main`); :mod:`.fault_plan` (the options, the fault kinds and the schedule a
trial draws), :mod:`.fault_trial` (one trial in order, on what
:mod:`.fault_trial_state` holds), :mod:`.fault_processes` (the engine processes and their
logs), :mod:`.fault_injection` (the faults applied), :mod:`.fault_producers` (the outside
producers), :mod:`.fault_verdict` (what is read and judged at the end), :mod:`.fault_checks`
(the checks, :data:`~.fault_checks.CHECKS`) on :mod:`.fault_records` (the raw reads),
:mod:`.fault_cluster` (the stand-in server and the cluster around the engines),
:mod:`.fault_environment` (the brokers and moto the trials share).

A trial's seed decides everything drawn (the scenario, the faults, their times and
targets); the machine's timing decides the rest, so a failing seed is re-run with
``--seed SEED --trials 1`` to look again.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import shlex
import shutil
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .fault_environment import Environment
from .fault_plan import BACKENDS, FAULT_KINDS, Options, TrialResult
from .fault_trial import Trial


async def run_trial(env: Environment, seed: int) -> TrialResult:
    """One trial; its files are kept (``--keep``) when it found a violation, or always with
    ``--keep-all``."""
    trial = Trial(env, seed)
    result = await trial.run()
    keep = env.options.keep_dir
    if keep is not None and (result.violations or env.options.keep_all):
        target = keep / f"{env.backend}-trial-{seed}"
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(trial.dir, target)
        (target / "faults.log").write_text("\n".join(result.fault_log) + "\n")
    shutil.rmtree(trial.dir, ignore_errors=True)
    return result


async def run_trials(
    backend: str,
    seeds: Sequence[int],
    options: Options,
    on_result: Callable[[TrialResult], None] | None = None,
) -> list[TrialResult]:
    """The trials of ``seeds`` on one environment, ``options.parallel`` at a time."""
    # the stand-in server logs every watch a proxy cut as an error with a traceback:
    # expected here (the harness cuts them), and not a process under test
    logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)
    # the raw Kafka reads reconnect through broker restarts and cuts: not news either
    logging.getLogger("aiokafka").setLevel(logging.CRITICAL)
    results: dict[int, TrialResult] = {}
    gate = asyncio.Semaphore(options.parallel)

    async def one(env: Environment, seed: int) -> None:
        async with gate:
            result = await run_trial(env, seed)
        results[seed] = result
        if on_result is not None:
            on_result(result)

    # SIGTERM cancels the trials as SIGINT does, so that every process they started is
    # stopped (by pid) on the way out
    main = asyncio.current_task()
    loop = asyncio.get_running_loop()
    if main is not None:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signal.SIGTERM, main.cancel)
    try:
        async with Environment(backend, options) as env, asyncio.TaskGroup() as group:
            for seed in seeds:
                group.create_task(one(env, seed))
    finally:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.remove_signal_handler(signal.SIGTERM)
    return [results[seed] for seed in seeds]


def summarize(backend: str, results: Sequence[TrialResult], seconds: float) -> dict[str, Any]:
    faults: Counter[str] = Counter()
    stats: Counter[str] = Counter()
    by_check: Counter[str] = Counter()
    violations = []
    for result in results:
        faults.update(result.faults)
        for key, value in result.stats.items():
            stats[key] = max(stats[key], value) if key.endswith(" max") else stats[key] + value
        for violation in result.violations:
            by_check[violation.check] += 1
            violations.append(violation)
    return {
        "backend": backend,
        "trials": len(results),
        "violations": [
            {"seed": v.seed, "check": v.check, "offsets": v.offsets, "detail": v.detail}
            for v in violations
        ],
        "by_check": dict(sorted(by_check.items())),
        "faults_applied": {k: faults[k] for k in FAULT_KINDS[backend]},
        "faults_drawn": {k: faults[f"{k} drawn"] for k in FAULT_KINDS[backend]},
        "seen": dict(sorted(stats.items())),
        "seconds": round(seconds, 1),
        "load": [round(x, 2) for x in os.getloadavg()],
    }


def summary_text(summary: dict[str, Any]) -> str:
    applied = ", ".join(f"{k} {v}" for k, v in summary["faults_applied"].items())
    drawn = ", ".join(f"{k} {v}" for k, v in summary["faults_drawn"].items())
    checks = ", ".join(f"{k} {v}" for k, v in summary["by_check"].items()) or "none"
    seen = ", ".join(f"{k} {v}" for k, v in summary["seen"].items())
    return (
        f"bench faults ({summary['backend']}): {summary['trials']} trials,"
        f" {len(summary['violations'])} violations ({checks}) in {summary['seconds']} s,"
        f" load {summary['load']}\n"
        f"  faults applied: {applied}\n  faults drawn: {drawn}\n  seen: {seen}"
    )


def main(args: argparse.Namespace) -> int:
    """``quotaledger bench faults``: one line per violation, then the summary; exit 1 when
    any check failed."""
    backends = list(BACKENDS) if args.backend == "all" else [args.backend]
    engine = (
        tuple(shlex.split(args.engine_command)) if args.engine_command else Options.engine_command
    )
    keep = Path(args.keep) if args.keep else None
    if keep is not None:
        keep.mkdir(parents=True, exist_ok=True)
    failed = False
    summaries = []
    for backend in backends:
        kinds = tuple(k for k in (args.faults or "").split(",") if k)
        unknown = sorted(set(kinds) - set(FAULT_KINDS[backend]))
        if unknown:
            raise SystemExit(
                f"quotaledger: error: --faults: {', '.join(unknown)} not a fault kind of"
                f" {backend} ({', '.join(FAULT_KINDS[backend])})"
            )
        options = Options(
            backend=backend,
            fault_kinds=kinds,
            engine_command=engine,
            keep_dir=keep,
            keep_all=args.keep_all,
            parallel=args.parallel,
        )
        seeds = [args.seed + i for i in range(args.trials)]

        def show(result: TrialResult) -> None:
            for violation in result.violations:  # with --json, the object holds them
                print(violation.line(), file=sys.stderr if args.json else sys.stdout, flush=True)
            if args.verbose:
                print(
                    f"trial {result.seed} ({result.backend}): {len(result.violations)} violations,"
                    f" {result.seconds:.1f} s, faults {dict(result.faults)}",
                    file=sys.stderr,
                    flush=True,
                )
                for line in result.fault_log:
                    print(f"  {line}", file=sys.stderr, flush=True)

        started = time.monotonic()
        try:
            results = asyncio.run(run_trials(backend, seeds, options, show))
        except (asyncio.CancelledError, KeyboardInterrupt):
            print("quotaledger: bench faults stopped; every process it started is stopped")
            return 130
        summary = summarize(backend, results, time.monotonic() - started)
        summaries.append(summary)
        failed = failed or bool(summary["violations"])
        if not args.json:
            print(summary_text(summary), flush=True)
    if args.json:
        print(json.dumps(summaries[0] if len(summaries) == 1 else summaries, indent=2))
    return 1 if failed else 0
