"""``quotaledger bench k8s``: the cluster watcher at scale (DESIGN §12, docs/PERFORMANCE.md).

The stand-in API server (:mod:`.standin`) runs as a separate process holding a generated
cluster (``--pods`` pods, ``--nodes`` nodes); this process runs the real watcher with the
kubernetes-asyncio client into a SQLite ledger and measures:

* the initial list: wall time from start until every node and pod fact is committed, facts/s,
  this process's CPU time for it (the stand-in server, another process, serves pages more
  slowly than the watcher handles them, so wall time is partly the server's), and the
  resident memory of this process (watcher + ledger connection) after it;
* steady churn: the server updates pods at ``--churn-rate`` per second for
  ``--churn-seconds``; each update carries its wall-clock send time in a label, and the lag is
  the time from that send until the fact is committed to the ledger (p50, p99, max), plus the
  facts/s committed over the churn.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from quotaledger.adapters.ledgers.sqlite.ledger import SqliteLedger  # type: ignore[import-untyped,unused-ignore]

from .client import connect
from .watcher import Baseline, ClusterWatcher, Item, LedgerSink, WatchOptions

_PROBE = b'"bench-sent-ms":"'


def rss_mib() -> float:
    """Resident set size of this process (Linux ``/proc``), MiB."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


@dataclass
class MeasuringSink:
    """A LedgerSink that counts committed facts and the lag of probed ones."""

    inner: LedgerSink
    committed: int = 0
    lags_ms: list[int] = field(default_factory=list)

    async def append(self, items: Sequence[Item]) -> None:
        await self.inner.append(items)
        now = time.time_ns() // 1_000_000
        self.committed += len(items)
        for item in items:
            if isinstance(item, bytes):
                at = item.find(_PROBE)
                if at >= 0:
                    start = at + len(_PROBE)
                    sent = int(item[start : item.index(b'"', start)])
                    self.lags_ms.append(now - sent)


def trimmed_rss_mib() -> float:
    """RSS after a full collection and glibc's ``malloc_trim``: what the watcher keeps, not
    the peak of parsing the list (freed, but kept by the allocator)."""
    import ctypes
    import gc

    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    return rss_mib()


def _percentile(values: list[int], q: float) -> int:
    if not values:
        return 0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _wait_for(check: Any, limit_s: float) -> None:
    end = time.monotonic() + limit_s
    while not check():
        if time.monotonic() > end:
            raise TimeoutError("benchmark stalled")
        await asyncio.sleep(0.05)


async def measure(pods: int, nodes: int, churn_rate: float, churn_seconds: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="quotaledger-bench-k8s-") as tmp:
        url_file = Path(tmp) / "url"
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "quotaledger.adapters.kubernetes.standin",
                "--pods",
                str(pods),
                "--nodes",
                str(nodes),
                "--url-file",
                str(url_file),
            ]
        )
        try:
            end = time.monotonic() + 600
            while not url_file.exists():
                if server.poll() is not None or time.monotonic() > end:
                    raise RuntimeError("the stand-in API server did not start")
                await asyncio.sleep(0.1)
            url = url_file.read_text()
            kubeconfig = Path(tmp) / "kubeconfig"
            kubeconfig.write_text(
                json.dumps(
                    {
                        "apiVersion": "v1",
                        "kind": "Config",
                        "clusters": [{"name": "s", "cluster": {"server": url}}],
                        "users": [{"name": "u", "user": {}}],
                        "contexts": [{"name": "s", "context": {"cluster": "s", "user": "u"}}],
                        "current-context": "s",
                    }
                )
            )
            return await _run(url, kubeconfig, Path(tmp), pods, nodes, churn_rate, churn_seconds)
        finally:
            server.terminate()
            server.wait()


async def _run(
    url: str,
    kubeconfig: Path,
    tmp: Path,
    pods: int,
    nodes: int,
    churn_rate: float,
    churn_seconds: float,
) -> dict[str, Any]:
    cluster = await connect(str(kubeconfig), False)
    ledger = await SqliteLedger.open(tmp / "ledger.db")
    sink = MeasuringSink(LedgerSink(ledger))
    watcher = ClusterWatcher(
        cluster.core, cluster.custom, sink, WatchOptions(watch_timeout_s=300), Baseline()
    )
    rss_before = rss_mib()
    started = time.monotonic()
    cpu_started = time.process_time()
    task = asyncio.create_task(watcher.run())
    try:
        await _wait_for(lambda: sink.committed >= pods + nodes, 1800)
        list_s = time.monotonic() - started
        list_cpu_s = time.process_time() - cpu_started
        rss_after = rss_mib()
        rss_kept = trimmed_rss_mib()
        before_churn = sink.committed
        cpu_churn = time.process_time()
        async with aiohttp.ClientSession() as http:
            query = {"rate": str(churn_rate), "seconds": str(churn_seconds)}
            await (await http.post(f"{url}/bench/churn", params=query)).read()
            churn_started = time.monotonic()
            status: dict[str, Any] = {"done": False, "updates": 0}
            while not status["done"]:
                await asyncio.sleep(0.5)
                status = await (await http.get(f"{url}/bench/churn")).json()
            updates = int(status["updates"])
        await _wait_for(lambda: sink.committed - before_churn >= updates, 600)
        churn_s = time.monotonic() - churn_started
        churn_cpu_s = time.process_time() - cpu_churn
        lags = sink.lags_ms
        return {
            "pods": pods,
            "nodes": nodes,
            "list_seconds": round(list_s, 2),
            "list_facts_per_s": round((pods + nodes) / list_s),
            "list_watcher_cpu_s": round(list_cpu_s, 2),
            "list_facts_per_watcher_cpu_s": round((pods + nodes) / list_cpu_s),
            "rss_mib_before": round(rss_before, 1),
            "rss_mib_after_list": round(rss_after, 1),
            "rss_mib_kept_after_list": round(rss_kept, 1),
            "rss_mib_after_churn": round(rss_mib(), 1),
            "baseline_objects": len(watcher.baseline.pods) + len(watcher.baseline.nodes),
            "churn_rate_asked": churn_rate,
            "churn_updates": updates,
            "churn_facts_per_s": round(updates / churn_s),
            "churn_watcher_cpu_share": round(churn_cpu_s / churn_s, 3),
            "lag_ms_p50": _percentile(lags, 0.5),
            "lag_ms_p99": _percentile(lags, 0.99),
            "lag_ms_max": max(lags, default=0),
            "python": sys.version.split()[0],
            "cpus": os.cpu_count(),
        }
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await cluster.close()
        await ledger.close()


def main(args: argparse.Namespace) -> int:
    result = asyncio.run(measure(args.pods, args.nodes, args.churn_rate, args.churn_seconds))
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for key, value in result.items():
            print(f"{key:>22}: {value}")
    return 0
