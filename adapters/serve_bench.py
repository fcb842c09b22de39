"""Measurements of ``serve`` (docs/PERFORMANCE.md): the metrics scrape at scale
and concurrent HTTP load.

Tooling, not the engine: it generates workloads with the fold benchmark's
generator (imported here and nowhere else in the HTTP code) and talks to a real
server over loopback.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from quotaledger.adapters.workload import generate
from quotaledger.events.ledger import Append

from .http.options import ServeOptions
from .http.server import Server
from .ledgers.sqlite.ledger import SqliteLedger


async def _ledger_of(path: Path, quotas: int, pods: int, nodes: int) -> SqliteLedger:
    workload = generate(quotas=quotas, pods=pods, nodes=nodes, events=0)
    ledger = await SqliteLedger.open(str(path), create=True, clock_ms=lambda: 0)
    records = [*workload.config[1:], *workload.pods]
    for start in range(0, len(records), 5000):
        chunk = records[start : start + 5000]
        await ledger.append([Append(payload=r.payload, ts=r.ts) for r in chunk])
    return ledger


_FETCH = """
import sys, time, urllib.request
started = time.perf_counter()
body = urllib.request.urlopen(sys.argv[1]).read()
elapsed = time.perf_counter() - started
print(elapsed, sum(1 for line in body.split(b"\\n") if line and not line.startswith(b"#")))
"""


@dataclass(slots=True)
class _LoopGap:
    """The longest the event loop took to run a 10 ms ticker, while ``running``."""

    running: bool = True
    worst: float = 0.0

    async def watch(self) -> None:
        last = time.perf_counter()
        while self.running:
            await asyncio.sleep(0.01)
            now = time.perf_counter()
            self.worst = max(self.worst, now - last - 0.01)
            last = now


async def measure_scrape(
    quotas: int = 10_000, pods: int = 100_000, nodes: int = 1_000, scrapes: int = 5
) -> dict[str, Any]:
    """``GET /metrics`` of a read-only server over a generated ledger: wall time
    per scrape, series count, and the longest the event loop went without
    running a 1 ms ticker meanwhile (the scrape renders in a worker thread)."""
    with tempfile.TemporaryDirectory() as tmp:
        ledger = await _ledger_of(Path(tmp) / "scrape.db", quotas, pods, nodes)
        server = Server(ledger, ServeOptions(port=0, read_only=True, instance="bench"))
        stop = asyncio.Event()
        task = asyncio.create_task(server.run(stop))
        try:
            await server.listening.wait()
            base = f"http://127.0.0.1:{server.port}"
            async with aiohttp.ClientSession() as session:
                while True:
                    async with session.get(f"{base}/readyz") as response:
                        if response.status == 200:
                            break
                    await asyncio.sleep(0.1)
                times: list[float] = []
                stalls: list[float] = []
                series = 0
                for _ in range(scrapes):
                    elapsed, lines, worst = await _timed_fetch(f"{base}/metrics")
                    times.append(elapsed)
                    series = lines
                    stalls.append(worst)
                others = {}
                for path in ("/v1/state", "/v1/tree", "/v1/quotas/default"):
                    elapsed, _, worst = await _timed_fetch(base + path)
                    others[path] = {"s": round(elapsed, 3), "loop_stall_s": round(worst, 3)}
        finally:
            stop.set()
            await task
            await ledger.close()
    return {
        "quotas": quotas,
        "pods": pods,
        "series": series,
        "scrape_s": [round(t, 3) for t in times],
        "scrape_median_s": round(statistics.median(times), 3),
        "loop_stall_max_s": round(max(stalls), 3),
        "reads": others,
    }


async def _timed_fetch(url: str) -> tuple[float, int, float]:
    """GET ``url`` from another process (as Prometheus or a browser would): its wall
    time, the non-comment lines of the answer, and the longest extra delay of this
    process's event loop meanwhile."""
    gap = _LoopGap()
    tick = asyncio.create_task(gap.watch())
    fetch = await asyncio.create_subprocess_exec(
        sys.executable, "-c", _FETCH, url, stdout=asyncio.subprocess.PIPE
    )
    out, _ = await fetch.communicate()
    gap.running = False
    await tick
    elapsed, lines = out.split()
    return float(elapsed), int(lines), gap.worst


def scrape_cpu(
    quotas: int = 10_000, pods: int = 100_000, nodes: int = 1_000, scrapes: int = 5
) -> dict[str, Any]:
    """The collector and the text rendering alone, on a folded generated state:
    CPU seconds of the scraping thread (``thread_time``, insensitive to other
    processes on a shared machine) and wall seconds, per scrape."""
    from quotaledger.projections import Projection, settle

    from .http.metrics import FoldStatistics, LedgerPosition, StateCollector

    workload = generate(quotas=quotas, pods=pods, nodes=nodes, events=0)
    projection = Projection()
    for record in [*workload.config, *workload.pods]:
        projection.apply_record(record)
    settle(projection.state)
    collector = StateCollector(
        lambda: projection.state, FoldStatistics(), LedgerPosition(), lambda: 0, "bench"
    )
    cpu: list[float] = []
    wall: list[float] = []
    for _ in range(scrapes):
        started_cpu, started = time.thread_time(), time.perf_counter()
        collector.render()
        cpu.append(time.thread_time() - started_cpu)
        wall.append(time.perf_counter() - started)
    return {
        "cpu_s": [round(t, 3) for t in cpu],
        "cpu_median_s": round(statistics.median(cpu), 3),
        "wall_s": [round(t, 3) for t in wall],
    }


# ------------------------------------------------------------------------ load


@dataclass(slots=True)
class LoadReport:
    clients: int
    seconds: float
    posts: int = 0
    events: int = 0
    reads: int = 0
    failures: list[str] = field(default_factory=list)
    quota_latencies: list[float] = field(default_factory=list)
    acknowledged: list[tuple[int, int]] = field(default_factory=list)  # (first, last) offsets

    def p99_ms(self) -> float:
        ordered = sorted(self.quota_latencies)
        if not ordered:
            return 0.0
        return 1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]

    def summary(self) -> dict[str, Any]:
        return {
            "clients": self.clients,
            "seconds": self.seconds,
            "posts": self.posts,
            "events": self.events,
            "reads": self.reads,
            "failures": len(self.failures),
            "quota_reads": len(self.quota_latencies),
            "quota_p50_ms": round(1000 * statistics.median(self.quota_latencies), 2)
            if self.quota_latencies
            else 0.0,
            "quota_p99_ms": round(self.p99_ms(), 2),
        }


async def drive_load(
    base: str, token: str, *, clients: int = 50, seconds: float = 20.0, seed: int = 1
) -> LoadReport:
    """``clients`` concurrent clients for ``seconds``: each posts a small NDJSON
    batch of facts, then reads ``/v1/quotas/{name}`` and ``/v1/state`` in turn."""
    report = LoadReport(clients=clients, seconds=seconds)
    headers = {"Authorization": f"Bearer {token}"}
    deadline = time.monotonic() + seconds
    connector = aiohttp.TCPConnector(limit=clients)
    timeout = aiohttp.ClientTimeout(total=60)

    async def client(number: int, session: aiohttp.ClientSession) -> None:
        rng = random.Random(seed * 1000 + number)
        sequence = 0
        while time.monotonic() < deadline:
            sequence += 1
            lines = []
            for item in range(rng.randint(1, 5)):
                uid = f"load-{number}-{sequence}-{item}"
                lines.append(
                    json.dumps(
                        {
                            "kind": "PodUpserted",
                            "uid": uid,
                            "name": uid,
                            "namespace": f"team-{number % 4}",
                            "requests": {"cpu": "100m", "memory": "64Mi"},
                            "phase": "Running",
                            "node": "node-1",
                        }
                    )
                )
            body = ("\n".join(lines) + "\n").encode()
            try:
                async with session.post(f"{base}/v1/events", data=body, headers=headers) as r:
                    if r.status != 200:
                        report.failures.append(f"POST {r.status} {await r.text()}")
                        continue
                    answer = await r.json()
                report.posts += 1
                report.events += answer["appended"]
                report.acknowledged.append((answer["first_offset"], answer["last_offset"]))
                quota = f"team-{number % 4}"
                started = time.perf_counter()
                async with session.get(f"{base}/v1/quotas/{quota}") as r:
                    await r.read()
                    if r.status != 200:
                        report.failures.append(f"GET quota {r.status}")
                report.quota_latencies.append(time.perf_counter() - started)
                report.reads += 1
                if sequence % 10 == 0:
                    async with session.get(f"{base}/v1/state") as r:
                        await r.read()
                        if r.status != 200:
                            report.failures.append(f"GET state {r.status}")
                    report.reads += 1
            except (aiohttp.ClientError, TimeoutError) as exc:
                report.failures.append(f"{type(exc).__name__}: {exc}")

    async with (
        aiohttp.ClientSession(connector=connector, timeout=timeout) as session,
        asyncio.TaskGroup() as group,
    ):
        for number in range(clients):
            group.create_task(client(number, session))
    return report


LOAD_SETUP = [
    {"kind": "NodeUpserted", "name": "node-1", "allocatable": {"cpu": "10000", "memory": "64Ti"}},
    {"kind": "QuotaUpserted", "name": "teams", "is_parent": True, "min": {"cpu": "400"}},
    *(
        {
            "kind": "QuotaUpserted",
            "name": f"team-{n}",
            "parent": "teams",
            "min": {"cpu": "100"},
            "namespaces": [f"team-{n}"],
        }
        for n in range(4)
    ),
]


def main() -> None:
    """``python -m quotaledger.adapters.serve_bench scrape`` prints the scrape figures."""
    if sys.argv[1:2] == ["scrape"]:
        from .cli.common import tune_gc

        tune_gc()  # as `quotaledger serve` runs
        report = {"in_process": scrape_cpu(), "http": asyncio.run(measure_scrape())}
        print(json.dumps(report, indent=2))
    else:
        print("usage: python -m quotaledger.adapters.serve_bench scrape", file=sys.stderr)
        raise SystemExit(2)


if __name__ == "__main__":
    main()
