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
* faults drawn at random (:data:`FAULT_KINDS`): SIGKILL of an engine (then a restart,
  under the same or a new instance name), SIGSTOP of the Lease holder past its Lease then
  SIGCONT, a TCP fault proxy (:mod:`.fault_proxy`) on each engine's link to the API
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
The checks are in :mod:`.fault_checks` (:data:`~.fault_checks.CHECKS`), the
stand-in server and the cluster around the engines in :mod:`.fault_cluster`; a
violation is printed as one line with the trial's seed.

``run_trial`` runs one trial; :func:`main` many (``bench faults``). A trial's seed decides
everything drawn (the scenario, the faults, their times and targets); the machine's timing
decides the rest, so a failing seed is re-run with ``--seed SEED --trials 1`` to look again.

Longer than 600 lines: one trial is one story (processes, the controller playing the
cluster, the fault schedule, the stops) told in order; its checks (:mod:`.fault_checks`),
cluster (:mod:`.fault_cluster`) and proxy (:mod:`.fault_proxy`) are already apart. Splitting
the trial runner itself further is a known follow-up.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import random
import re
import shlex
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from quotaledger.engine.core import timers

from ..ledgers.url import open_ledger
from .fault_checks import CheckContext, Violation, check_trial
from .fault_cluster import (
    Cluster,
    FaultApiServer,
    Scenario,
    apply_event,
    draw_scenario,
    now_ms,
)
from .fault_proxy import FaultProxy
from .fault_records import KafkaTap, RawRecord, decode_json, fold, read_sqlite

BACKENDS = ("sqlite", "kafka")
#: Fault kinds per backend; ``bench faults`` counts how often each was drawn and applied.
FAULT_KINDS: dict[str, tuple[str, ...]] = {
    "sqlite": ("kill", "pause", "api-delay", "api-stall", "api-cut"),
    "kafka": (
        "kill",
        "pause",
        "api-delay",
        "api-stall",
        "api-cut",
        "broker-delay",
        "broker-stall",
        "broker-cut",
        "broker-reorder",
        "broker-restart",
    ),
}
URL = "{ledger}"  # where a command line takes the ledger's URL
#: the error of a reader that stops at a missing offset (DESIGN §10)
MISSING = re.compile(r"offset (\d+) is missing")


# ------------------------------------------------------------------ options and results


@dataclass(frozen=True)
class Options:
    """Shortened timings (DESIGN §12 defaults are 15/10/2 s) and what runs as what."""

    backend: str = "sqlite"
    lease_duration_s: float = 1.0
    renew_deadline_s: float = 0.6
    retry_period_s: float = 0.2
    workload_s: float = 8.0
    settle_timeout_s: float = 90.0
    #: how long a Kafka reader waits for offsets it cannot read (URL ``gap_patience_s``)
    gap_patience_s: float = 5.0
    #: SIGTERM to exit (DESIGN §9): at most this much CPU time after the signal, and this
    #: much wall time less the time the process waited for a CPU (DECISIONS 180, 225)
    stop_bound_s: float = 2.0
    #: an armed quota-decrease deadline this far in the past at quiescence is left behind
    deadline_grace_ms: int = 3000
    engine_command: tuple[str, ...] = (sys.executable, "-m", "quotaledger.adapters.cli")
    tool_command: tuple[str, ...] = (sys.executable, "-m", "quotaledger.adapters.cli")
    keep_dir: Path | None = None  # the files of every trial with a violation are kept here
    keep_all: bool = False  # ... and of every other trial too
    parallel: int = 1  # trials at once
    fault_kinds: tuple[str, ...] = ()  # draw only these (default: every kind of the backend)
    #: share of eviction POSTs answered 429 (default: drawn per trial from 0, 0.2, 0.5)
    refuse_share: float | None = None
    #: how often a pause waits (up to 1.5 s) for the leader's next refused eviction, so that
    #: it stops the leader with a retry pending
    pause_when_refused: float = 0.5
    #: a pause lasts the Lease duration plus this much (uniform)
    pause_extra_s: tuple[float, float] = (0.3, 1.5)
    #: outside ``ingest`` producers (1..N) and runs of each (1..N): each run is a process
    #: start, most of a trial's CPU after the engines' (the tests' short form takes fewer)
    ingest_producers: int = 3
    ingest_runs: int = 3


@dataclass
class TrialResult:
    seed: int
    backend: str
    violations: list[Violation] = field(default_factory=list)
    faults: Counter[str] = field(default_factory=Counter)
    stats: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0
    fault_log: list[str] = field(default_factory=list)


# ------------------------------------------------------------------ processes


@dataclass
class Incarnation:
    instance: str
    pid: int
    started_ms: int
    stderr: Path
    ended_ms: int | None = None
    expected_end: bool = False


@dataclass
class EngineSlot:
    """One engine's place: its API-server proxy, kubeconfig and successive processes."""

    index: int
    proxy: FaultProxy
    kubeconfig: Path
    dir: Path
    command: list[str]  # the run command line without --instance; URL stands for the ledger
    urls: dict[str, str]  # the ledger URL per gaps mode
    gaps: str = "stop"
    proc: asyncio.subprocess.Process | None = None
    incarnations: list[Incarnation] = field(default_factory=list)
    paused: bool = False
    starts: int = 0

    @property
    def name(self) -> str:
        return f"e{self.index}"

    @property
    def instance(self) -> str | None:
        return self.incarnations[-1].instance if self.incarnations else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def start(self, instance: str) -> None:
        self.starts += 1
        stderr = self.dir / f"{self.name}-{self.starts}-{instance}.err"
        with stderr.open("wb") as err:
            self.proc = await asyncio.create_subprocess_exec(
                *[self.urls[self.gaps] if part == URL else part for part in self.command],
                "--instance",
                instance,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=err,
            )
        self.paused = False
        self.incarnations.append(Incarnation(instance, self.proc.pid, now_ms(), stderr))

    def instance_at(self, at_ms: int) -> str | None:
        for incarnation in reversed(self.incarnations):
            if incarnation.started_ms <= at_ms and (
                incarnation.ended_ms is None or at_ms <= incarnation.ended_ms
            ):
                return incarnation.instance
        return None

    def signal(self, signum: int) -> None:
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signum)

    async def kill(self) -> None:
        if self.proc is None:
            return
        self.incarnations[-1].expected_end = True
        self.signal(signal.SIGKILL)
        await self.proc.wait()
        self.incarnations[-1].ended_ms = now_ms()
        self.paused = False

    def pause(self) -> None:
        self.signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        self.signal(signal.SIGCONT)
        self.paused = False

    async def terminate(self, hang_s: float) -> Stopped:
        """SIGTERM, and how the process ended (SIGKILL after ``hang_s``)."""
        if self.proc is None or self.proc.returncode is not None:
            return Stopped(None if self.proc is None else self.proc.returncode, 0.0, 0.0, 0.0)
        if self.paused:
            self.resume()
        self.incarnations[-1].expected_end = True
        pid = self.proc.pid
        before, last = sched(pid), sched(pid)
        started = time.monotonic()
        self.signal(signal.SIGTERM)
        while time.monotonic() - started < hang_s and self.proc.returncode is None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.02):
                    await self.proc.wait()
            if self.proc.returncode is None:
                last = sched(pid) or last
        took = time.monotonic() - started
        code = self.proc.returncode
        if code is None:
            self.signal(signal.SIGKILL)
            await self.proc.wait()
        self.incarnations[-1].ended_ms = now_ms()
        cpu = waited = 0.0
        if before is not None and last is not None:
            cpu, waited = last[0] - before[0], last[1] - before[1]
        return Stopped(code, took, cpu, waited)


@dataclass(frozen=True)
class Stopped:
    """How a process met its SIGTERM: exit code (None: killed at the hang guard), wall
    seconds to its exit, CPU seconds it spent, and seconds its main thread waited for a
    CPU (``/proc/PID/schedstat``): the wall time less that wait is what the process
    itself took, whatever the load (DESIGN §9, DECISIONS 180)."""

    code: int | None
    wall_s: float
    cpu_s: float
    waited_s: float

    @property
    def own_s(self) -> float:
        return self.wall_s - self.waited_s


def sched(pid: int) -> tuple[float, float] | None:
    """(CPU seconds of all its threads, seconds its main thread waited on a run queue) of
    a live process; None once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        waiting = int(Path(f"/proc/{pid}/schedstat").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return cpu, waiting / 1e9


def tracebacks(paths: Iterable[Path]) -> list[tuple[Path, str]]:
    """Files holding a Python traceback, with the lines around the first one."""
    found = []
    for path in paths:
        if not path.exists():
            continue
        text = path.read_text(errors="replace")
        at = text.find("Traceback (most recent call last)")
        if at >= 0:
            end = text.find("\n\n", at)
            found.append((path, text[at : end if end > 0 else at + 2000][-1500:]))
    return found


#: a ``gaps=fill`` reader's warning when it fills offsets (ledgers/kafka/reader.py)
FILLED = re.compile(
    r"offsets (\d+)\.\.(\d+) held no record for [0-9.]+ s while offset \d+ was"
    r" readable: a write the broker lost before acknowledging it; filling them"
)


def filled(paths: Iterable[Path]) -> list[tuple[Path, int, int]]:
    """The offset ranges each log says its reader filled."""
    found = []
    for path in paths:
        if path.exists():
            for match in FILLED.finditer(path.read_text(errors="replace")):
                found.append((path, int(match.group(1)), int(match.group(2))))
    return found


def refused_at_start(code: int | None, stderr: Path) -> bool:
    """Did an engine exit 2 saying ``cannot connect`` before it had opened its ledger
    (it says ``waiting for lease`` once it has)?"""
    if code != 2 or not stderr.exists():
        return False
    text = stderr.read_text(errors="replace")
    return "cannot connect" in text and "waiting for lease" not in text


def term_starts_ms(path: Path) -> list[int]:
    """From an engine's log: ms from each Lease taken to its engine leading (its
    catch-up and election; the Lease is held, nothing decided yet)."""
    taken: datetime | None = None
    out: list[int] = []
    if not path.exists():
        return out
    for line in path.read_text(errors="replace").splitlines():
        if " taken by " not in line and " leads with epoch " not in line:
            continue
        try:
            moment = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
        except ValueError:
            continue
        if " taken by " in line:
            taken = moment
        elif taken is not None:
            out.append(round((moment - taken).total_seconds() * 1000))
            taken = None
    return out


def tail(path: Path, lines: int = 6) -> str:
    if not path.exists():
        return ""
    return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])


# ------------------------------------------------------------------ the environment


@dataclass(eq=False)
class Broker:
    """A tansu broker and the fault proxy it advertises (every client goes through it)."""

    storage: str
    tansu: Any
    proxy: FaultProxy
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    reorder_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    restarts: list[tuple[int, int]] = field(default_factory=list)  # (down ms, up ms)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.proxy.port}"

    async def restart(self, rng: random.Random) -> str:
        """SIGKILL or SIGTERM, a pause, then the same broker on the same storage."""
        async with self.lock:
            how = rng.choice(["SIGKILL", "SIGTERM"])
            down_s = rng.uniform(0.1, 1.0)
            down = now_ms()
            await asyncio.to_thread(self.tansu.kill if how == "SIGKILL" else self.tansu.stop)
            await asyncio.sleep(down_s)
            await asyncio.to_thread(self.tansu.start)
            self.restarts.append((down, now_ms()))
            return f"broker {how}, down {down_s:.2f} s"

    async def reorder(self, rng: random.Random, patience_s: float, result: TrialResult) -> str:
        """Every fetch's first batch hidden for a while (a later batch readable first,
        DECISIONS 200), then a clear spell. One window at a time on this broker, whichever
        trial asks (trials run side by side share it): a batch is never held back longer
        than 40 % of the readers' patience, which a reader must wait out, never take for
        a hole (DECISIONS 224, 226)."""
        async with self.reorder_lock:
            for_s = rng.uniform(0.5, 0.4 * patience_s)
            before = self.proxy.batches_hidden
            self.proxy.hide_first_batch(for_s)
            await asyncio.sleep(for_s)
            hidden = self.proxy.batches_hidden - before
            result.stats["fetch responses with their first batch hidden"] += hidden
            await asyncio.sleep(0.6 * patience_s)  # readable again, before any next window
            return f"broker link: each fetch's first batch hidden for {for_s:.2f} s ({hidden})"

    async def ensure_up(self) -> None:
        async with self.lock:
            if self.tansu.proc is None or self.tansu.proc.poll() is not None:
                await asyncio.to_thread(self.tansu.start)


class Environment:
    """What trials share: a work directory; on Kafka a moto server and two tansu brokers
    behind their fault proxies, one on ``s3://`` storage (a restart keeps its log: the
    trials that restart a broker use it, and some others) and one in memory (much faster
    to read: the other trials)."""

    def __init__(self, backend: str, options: Options) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, not {backend!r}")
        self.backend = backend
        self.options = options
        self.dir = Path(tempfile.mkdtemp(prefix=f"bench-faults-{backend}-"))
        self.moto: Any = None
        self.brokers: dict[str, Broker] = {}

    async def __aenter__(self) -> Environment:
        if self.backend == "kafka":
            from .tansu import Moto, Tansu, free_port

            self.moto = await asyncio.to_thread(lambda: Moto().start())
            for storage, env in (("s3", self.moto.tansu_env()), ("memory", None)):
                port = free_port()
                tansu = Tansu(storage=f"{storage}://tansu/", env=env, advertise=port)
                await asyncio.to_thread(tansu.start)
                proxy = await FaultProxy("127.0.0.1", tansu.port, name="broker", kafka=True).start(
                    port
                )
                self.brokers[storage] = Broker(storage, tansu, proxy)
        return self

    async def __aexit__(self, *exc: object) -> None:
        for broker in self.brokers.values():
            await broker.proxy.close()
            await asyncio.to_thread(broker.tansu.close)
        if self.moto is not None:
            await asyncio.to_thread(self.moto.stop)
        shutil.rmtree(self.dir, ignore_errors=True)


# ------------------------------------------------------------------ one trial


@dataclass
class Produced:
    """Facts an outside producer wrote, by id: acknowledged or not."""

    acked: dict[str, bool] = field(default_factory=dict)


class Trial:
    def __init__(self, env: Environment, seed: int) -> None:
        self.env = env
        self.options = env.options
        self.seed = seed
        self.rng = random.Random(seed)
        self.result = TrialResult(seed, env.backend)
        self.dir = env.dir / f"trial-{seed}"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.registry: dict[int, str] = {}
        self.server = FaultApiServer(random.Random(self.rng.random()), self.registry)
        self.cluster = Cluster(self.server, random.Random(self.rng.random()), seed)
        self.slots: list[EngineSlot] = []
        self.produced = Produced()
        self.tool_errs: list[Path] = []
        self.pauses: list[tuple[str, str, int, int]] = []  # (slot, instance, stop ms, cont ms)
        self.stop_workload = asyncio.Event()
        self.topic = f"faults-{seed}-{self.rng.randrange(1 << 30):08x}"
        self.path = self.dir / "ledger.db"
        self.instances = 0
        self.stopped_at_holes: list[tuple[str, int, str]] = []
        self.tap_task: asyncio.Task[None] | None = None
        self.faults = self._draw_faults()
        self.broker: Broker | None = None
        if env.backend == "kafka":
            restarts = any(kind == "broker-restart" for _, kind in self.faults)
            s3 = restarts or self.rng.random() < 0.25
            self.broker = env.brokers["s3" if s3 else "memory"]
        self.tap = KafkaTap(self.bootstrap, self.topic)

    # ---------------------------------------------------------- urls and reads

    @property
    def bootstrap(self) -> str:
        return self.broker.bootstrap if self.broker is not None else ""

    def engine_url(self, gaps: str) -> str:
        if self.env.backend == "sqlite":
            return str(self.path)
        # a shortened wait for unreadable offsets (DECISIONS 200: 60 s by default), as for
        # every other timing of the trials; a later batch readable first resolves in ms
        patience = f"gap_patience_s={self.options.gap_patience_s:g}"
        mode = "gaps=fill&" if gaps == "fill" else ""
        return f"kafka://{self.bootstrap}/{self.topic}?{mode}{patience}"

    async def records(self) -> list[RawRecord]:
        """The records so far, for waiting (not for the checks: :meth:`final_records`)."""
        if self.env.backend == "sqlite":
            return await asyncio.to_thread(read_sqlite, self.path)
        return self.tap.records

    async def final_records(self) -> list[RawRecord]:
        """Every record, read again independently of quotaledger's readers (SQLite: plain
        ``sqlite3``; Kafka: raw fetches, :class:`KafkaTap`)."""
        if self.env.backend == "sqlite":
            return await asyncio.to_thread(read_sqlite, self.path)
        return await self.tap.read_all()

    def note(self, text: str, at: float | None = None) -> None:
        """A line of the trial's log, at ``at`` (monotonic; default now)."""
        at = time.monotonic() if at is None else at
        self.result.fault_log.append(f"{at - self.started:7.2f} {text}")

    def exited(self, who: str, code: int | None, text: str) -> None:
        """A process that ended by itself: a violation, unless it stopped at an offset the
        broker lost for good after a restart (DESIGN §10: a gap stops a reader with a
        clear error), which :meth:`_check` finds out at the end."""
        found = MISSING.search(text)
        if code == 2 and found is not None:
            self.stopped_at_holes.append((who, int(found.group(1)), text))
            return
        self.violate("process-exit", f"{who} exited {code}: {text}")

    def violate(self, check: str, detail: str, offsets: str = "") -> None:
        self.result.violations.append(Violation(self.seed, check, offsets, detail))

    # ---------------------------------------------------------- the run

    async def run(self) -> TrialResult:
        self.started = time.monotonic()
        self.started_ms = now_ms()
        await self.server.start()
        try:
            async with asyncio.TaskGroup() as group:
                self.group = group
                try:
                    async with asyncio.timeout(
                        self.options.workload_s + self.options.settle_timeout_s + 120
                    ):
                        await self._run()
                except TimeoutError:
                    self.violate("no-quiescence", "the trial did not end within its hang guard")
                except Exception as exc:  # a harness bug: said, never hidden
                    self.violate("harness-error", f"{type(exc).__name__}: {exc}")
                finally:
                    if self.tap_task is not None:
                        self.tap_task.cancel()
        finally:
            for slot in self.slots:
                if slot.alive():
                    slot.resume()
                    await slot.kill()
                await slot.proxy.close()
            await self.server.stop()
        self.result.seconds = time.monotonic() - self.started
        holder: str | None = "-"
        for ms, who in self.server.lease_writes:
            if who != holder:
                holder = who
                self.result.fault_log.append(
                    f"{(ms - self.started_ms) / 1000:7.2f} lease held by {who}"
                )
        self.result.fault_log.sort(key=lambda line: float(line.split()[0]))
        return self.result

    async def _run(self) -> None:
        rng = self.rng
        scenario = draw_scenario(rng, self.cluster, self.options.workload_s)
        self.server.put(
            "configmaps",
            {
                "metadata": {"name": "quotaledger-settings", "namespace": "quotaledger"},
                "data": scenario.settings,
            },
        )
        self.server.refuse_share = (
            scenario.eviction_refuse
            if self.options.refuse_share is None
            else self.options.refuse_share
        )
        self.server.error_share = scenario.eviction_error
        self.server.retry_after = scenario.retry_after
        self.server.on_evicted = self.cluster.evicted
        ledger = await open_ledger(
            str(self.path)
            if self.env.backend == "sqlite"
            else f"kafka://{self.bootstrap}/{self.topic}",
            create=True,
        )
        await ledger.close()
        if self.env.backend == "kafka":  # only now: a fetch of a missing topic creates it
            self.tap_task = self.group.create_task(self.tap.follow())
        engines = rng.choice([2, 2, 3])
        for index in range(engines):
            await self._add_slot(index, scenario, rng.choice(["stop", "fill"]))
        for slot in self.slots:
            await slot.start(self._instance_name(slot, new=True))
        if not await self._wait_ready():
            return
        self.note(f"ready: {engines} engines, lease held by {self.server.holder()}")
        faults = self.faults
        if self.broker is not None:
            self.note(f"broker storage: {self.broker.storage}")
        stop_scheduler = asyncio.Event()
        async with asyncio.TaskGroup() as group:
            group.create_task(self.cluster.run_scheduler(stop_scheduler))
            supervisor = group.create_task(self._supervise())
            group.create_task(self._workload(scenario))
            producers = [
                group.create_task(self._ingest_producer(i))
                for i in range(rng.randint(1, self.options.ingest_producers))
            ]
            if self.env.backend == "kafka" and rng.random() < 0.7:
                producers.append(group.create_task(self._kafka_producer()))
            fault_task = group.create_task(self._faults(faults))
            await asyncio.sleep(self.options.workload_s)
            self.cluster.recreate = False
            await fault_task
            await asyncio.gather(*producers)
            await self._heal()
            settled = await self._settle()
            supervisor.cancel()
            stop_scheduler.set()
        await self._stop_engines()
        if settled is not None:
            await self._check(settled)
        else:  # what the logs say is checked all the same
            await self._check_logs(None)

    def _instance_name(self, slot: EngineSlot, new: bool) -> str:
        if not new and slot.instance is not None:
            return slot.instance
        self.instances += 1
        return f"{slot.name}-{self.instances}"

    async def _add_slot(self, index: int, scenario: Scenario, gaps: str) -> None:
        proxy = await FaultProxy(
            "127.0.0.1",
            int(self.server.url.rsplit(":", 1)[1]),
            name=f"e{index}",
            http=True,
            registry=self.registry,
            rng=random.Random(self.rng.random()),
        ).start()
        standin_url = self.server.url
        self.server.url = f"http://127.0.0.1:{proxy.port}"
        kubeconfig = self.server.kubeconfig(self.dir / f"e{index}.kubeconfig")
        self.server.url = standin_url
        o = self.options
        command = [
            *o.engine_command,
            "run",
            URL,
            "--kubeconfig",
            str(kubeconfig),
            "--executor",
            "kubernetes",
            "--lease-duration",
            str(o.lease_duration_s),
            "--renew-deadline",
            str(o.renew_deadline_s),
            "--retry-period",
            str(o.retry_period_s),
            "--watch-timeout",
            "5",
            "--eviction-retry-for",
            str(scenario.eviction_retry_for),
            "--digest-every",
            str(self.rng.choice([25, 100, 10_000])),
            "--snapshot-every",
            str(self.rng.choice([40, 150, 50_000])),
        ]
        if self.env.backend == "kafka" and self.rng.random() < 0.5:
            command += ["--snapshots", str(self.dir / f"e{index}-snapshots.db")]
        urls = {mode: self.engine_url(mode) for mode in ("stop", "fill")}
        self.slots.append(EngineSlot(index, proxy, kubeconfig, self.dir, command, urls, gaps))

    async def _wait_ready(self) -> bool:
        """Until a Lease holder's watcher has put the cluster into the ledger."""
        pods = {p["metadata"]["uid"] for p in self.cluster.pods()}
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            await asyncio.sleep(0.3)
            if self.server.holder() is None:
                continue
            projection = fold(await self.records())
            state = projection.state
            if pods <= set(state.pods) and {"p", "a", "b", "c"} <= set(state.quotas):
                return True
            for slot in self.slots:
                if not slot.alive():
                    self.violate(
                        "process-exit",
                        f"engine {slot.instance} exited"
                        f" {slot.proc.returncode if slot.proc else '?'} while starting:"
                        f" {tail(slot.incarnations[-1].stderr)}",
                    )
                    return False
        self.violate("no-quiescence", "the engines did not put the cluster into the ledger in 90 s")
        return False

    # ---------------------------------------------------------- workload

    async def _workload(self, scenario: Scenario) -> None:
        start = time.monotonic()
        for at_s, action, params in scenario.events:
            await asyncio.sleep(max(0.0, at_s - (time.monotonic() - start)))
            self.note(apply_event(self.cluster, self.cluster.rng, action, params))

    async def _ingest_producer(self, index: int) -> None:
        """``quotaledger ingest`` runs of a few facts each, at random times."""
        rng = random.Random(self.rng.random())
        runs = rng.randint(1, self.options.ingest_runs)
        # early in the window: an ingest into a long Kafka ledger reads it (slow on s3)
        times = sorted(rng.uniform(0.0, self.options.workload_s * 0.6) for _ in range(runs))
        start = time.monotonic()
        for run, at_s in enumerate(times):
            await asyncio.sleep(max(0.0, at_s - (time.monotonic() - start)))
            lines = []
            ids = []
            for n in range(rng.randint(3, 25)):
                fact_id = f"f{self.seed}x{index}x{run}x{n}"
                ids.append(fact_id)
                weight = 0 if rng.random() < 0.05 else rng.randint(1, 9)  # 0: refused, kept raw
                lines.append(
                    json.dumps(
                        {"kind": "NamespaceWeighted", "namespace": fact_id, "weight": weight}
                    )
                )
            source = self.dir / f"ingest-{index}-{run}.jsonl"
            source.write_text("\n".join(lines) + "\n")
            err = self.dir / f"ingest-{index}-{run}.err"
            self.tool_errs.append(err)
            url = self.engine_url(rng.choice(["stop", "fill"]))
            with err.open("wb") as stderr:
                proc = await asyncio.create_subprocess_exec(
                    *self.options.tool_command,
                    "ingest",
                    str(source),
                    url,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.DEVNULL,
                    stderr=stderr,
                )
                try:
                    code = await proc.wait()
                finally:
                    if proc.returncode is None:  # cancelled: nothing outlives the trial
                        proc.kill()
                        await proc.wait()
            for fact_id in ids:
                self.produced.acked[fact_id] = code == 0
            self.result.stats["facts ingested"] += len(ids)
            if code == 2 and "cannot connect" in tail(err, 2):
                # a clear refusal at start (the broker restarting): nothing appended
                self.result.stats["ingest runs refused at connect"] += 1
            elif code != 0:
                self.exited("ingest", code, tail(err))

    async def _kafka_producer(self) -> None:
        """A plain confluent-kafka producer (acks=all), one fact every few tens of ms."""
        import confluent_kafka

        rng = random.Random(self.rng.random())
        producer = confluent_kafka.Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "acks": "all",
                "enable.idempotence": False,
                "linger.ms": 0,
                "message.timeout.ms": 120_000,
                "log_level": 0,
            }
        )
        acked = self.produced.acked
        lock = threading.Lock()

        def delivered(error: Any, message: Any) -> None:
            fact = decode_json(message.value() or b"") or {}
            with lock:
                acked[str(fact.get("namespace"))] = error is None

        stop_at = time.monotonic() + self.options.workload_s - 0.3
        n = 0
        while time.monotonic() < stop_at:
            fact_id = f"f{self.seed}xkx{n}"
            n += 1
            weight = 0 if rng.random() < 0.03 else rng.randint(1, 9)
            value = json.dumps(
                {"kind": "NamespaceWeighted", "namespace": fact_id, "weight": weight}
            )
            acked.setdefault(fact_id, False)
            producer.produce(self.topic, value.encode(), partition=0, on_delivery=delivered)
            producer.poll(0)
            await asyncio.sleep(rng.uniform(0.02, 0.15))
        left = len(producer)
        flush_until = time.monotonic() + 150
        while left and time.monotonic() < flush_until:  # in short steps: cancellable
            left = await asyncio.to_thread(producer.flush, 1.0)
        self.result.stats["facts produced"] += n
        if left:
            self.violate(
                "fact-lost", f"the confluent-kafka producer could not deliver {left} facts"
            )

    # ---------------------------------------------------------- engines

    async def _supervise(self) -> None:
        """An engine that exits by itself is a violation; it is started again."""
        while True:
            await asyncio.sleep(0.2)
            for slot in self.slots:
                proc = slot.proc
                if proc is None or proc.returncode is None or slot.incarnations[-1].expected_end:
                    continue
                incarnation = slot.incarnations[-1]
                incarnation.ended_ms = now_ms()
                text = tail(incarnation.stderr)
                if refused_at_start(proc.returncode, incarnation.stderr):
                    # its broker unreachable as it started (a restart or a cut, maybe a
                    # trial's beside it): a clear refusal, as for ingest (DECISIONS 227)
                    self.result.stats["engine starts refused at connect"] += 1
                else:
                    self.exited(f"engine {incarnation.instance}", proc.returncode, text)
                if MISSING.search(text) is not None:
                    slot.gaps = "fill"  # as an operator would, once told of a lost write
                self.note(f"{incarnation.instance} exited {proc.returncode}; restarting")
                await slot.start(self._instance_name(slot, new=True))

    def _leader_slot(self) -> EngineSlot | None:
        holder = self.server.holder()
        for slot in self.slots:
            if slot.alive() and not slot.paused and slot.instance == holder:
                return slot
        return None

    # ---------------------------------------------------------- faults

    def _draw_faults(self) -> list[tuple[float, str]]:
        kinds = self.options.fault_kinds or FAULT_KINDS[self.env.backend]
        count = self.rng.randint(2, 4)
        window = self.options.workload_s
        return sorted(
            (round(self.rng.uniform(0.3, window - 0.5), 3), self.rng.choice(kinds))
            for _ in range(count)
        )

    async def _faults(self, plan: Sequence[tuple[float, str]]) -> None:
        start = time.monotonic()
        for at_s, kind in plan:
            await asyncio.sleep(max(0.0, at_s - (time.monotonic() - start)))
            self.result.faults[f"{kind} drawn"] += 1
            began = time.monotonic()
            what = await self._fault(kind)
            if what is not None:
                self.result.faults[kind] += 1
                self.note(f"fault {kind}: {what}", began)
            else:
                self.note(f"fault {kind}: not applicable now", began)

    async def _fault(self, kind: str) -> str | None:
        rng = self.rng
        live = [s for s in self.slots if s.alive() and not s.paused]
        if kind == "kill":
            leader = self._leader_slot()
            slot = (
                leader
                if leader is not None and rng.random() < 0.6
                else (rng.choice(live) if live else None)
            )
            if slot is None:
                return None
            victim = slot.instance
            await slot.kill()
            down_s = rng.uniform(0.0, 1.0)
            await asyncio.sleep(down_s)
            await slot.start(self._instance_name(slot, new=rng.random() < 0.5))
            return f"SIGKILL {victim}, restarted as {slot.instance} after {down_s:.2f} s"
        if kind == "pause":
            slot = self._leader_slot()
            if slot is None:
                await asyncio.sleep(1.0)
                slot = self._leader_slot()
            if slot is None:
                return None
            how = "at once"
            if rng.random() < self.options.pause_when_refused:  # with a retry pending
                event = self.server.refused.setdefault(slot.name, asyncio.Event())
                event.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(1.5):
                        await event.wait()
                        how = "after a refused eviction"
            if not slot.alive() or slot.instance != self.server.holder():
                return None
            pause_s = self.options.lease_duration_s + rng.uniform(*self.options.pause_extra_s)
            instance = slot.instance or "?"
            stopped = now_ms()
            slot.pause()
            await asyncio.sleep(pause_s)
            slot.resume()
            self.pauses.append((slot.name, instance, stopped, now_ms()))
            return (
                f"SIGSTOP {instance} ({how}) at {(stopped - self.started_ms) / 1000:.2f}"
                f" for {pause_s:.2f} s, then SIGCONT"
            )
        if kind.startswith("api-"):
            if not self.slots:
                return None
            slot = self._leader_slot() if rng.random() < 0.6 else None
            slot = slot or rng.choice(self.slots)
            return self._link_fault(kind[4:], slot.proxy, slot.instance or slot.name)
        if kind.startswith("broker-") and self.broker is not None:
            if kind == "broker-restart":
                return await self.broker.restart(rng)
            if kind == "broker-reorder":
                return await self.broker.reorder(rng, self.options.gap_patience_s, self.result)
            return self._link_fault(kind[7:], self.broker.proxy, "broker")
        return None

    def _link_fault(self, fault: str, proxy: FaultProxy, who: str) -> str:
        rng = self.rng
        if fault == "delay":
            low = rng.uniform(0.005, 0.05)
            high = low + rng.uniform(0.01, 0.3)
            for_s = rng.uniform(1.0, 3.0)
            proxy.delay(low, high, for_s)
            return f"{who} link: each chunk held {low:.3f}-{high:.3f} s for {for_s:.1f} s"
        if fault == "stall":
            for_s = rng.uniform(0.3, 2.5)
            proxy.stall(for_s)
            return f"{who} link stalled for {for_s:.2f} s"
        share = 1.0 if who != "broker" else rng.uniform(0.3, 1.0)
        cut = proxy.cut(share)
        return f"{who} link: {cut} connections cut mid-response"

    async def _heal(self) -> None:
        for slot in self.slots:
            slot.proxy.heal()
            if slot.paused:
                slot.resume()
        if self.broker is not None:
            self.broker.proxy.heal()
            await self.broker.ensure_up()

    # ---------------------------------------------------------- quiescence and stop

    async def _settle(self) -> list[RawRecord] | None:
        """Wait until nothing runs and nothing is to come; the records then."""
        deadline = time.monotonic() + self.options.settle_timeout_s
        grace = self.options.deadline_grace_ms
        last: tuple[int, int] = (-1, 0)
        why = "?"
        told = time.monotonic()
        while time.monotonic() < deadline:
            await asyncio.sleep(0.5)
            if time.monotonic() - told > 10:
                told = time.monotonic()
                self.note(f"not quiet yet: {why}")
            records = await self.records()
            state = fold(records).state
            now = now_ms()
            tail_offset = records[-1].offset if records else -1
            if tail_offset != last[0]:
                last = (tail_offset, now)
            cluster = {
                p["metadata"]["uid"]: (p["status"]["phase"], p["spec"].get("nodeName"))
                for p in self.cluster.pods()
            }
            mirrored = {
                uid: (pod.phase, pod.node)
                for uid, pod in state.pods.items()
                if pod.phase in ("Pending", "Running")
            }
            if state.preemptions:
                why = f"preemptions running: {sorted(state.preemptions)}"
            elif any(e.outcome is None for e in state.evictions.values()):
                outstanding = sorted(e for e, r in state.evictions.items() if r.outcome is None)
                why = f"evictions outstanding: {outstanding}"
            elif state.settings.quota_preemption_enabled and state.decrease_deadlines:
                # to come, or passed and not yet answered: the leader may still be
                # catching up (a slow broker); one left armed for good ends the wait at
                # the settle timeout and is reported (armed-deadline)
                why = f"deadlines armed: {state.decrease_deadlines}"
            elif soon := [t for t in timers(state) if t.deadline > now - grace]:
                # an overuse or reclaim deadline to come (or just passed): its engine has
                # yet to decide on it
                why = f"timers to come: {[(t.cause, t.queue, t.deadline) for t in soon]}"
            elif self.env.backend == "kafka" and not self.tap.caught_up:
                why = f"the raw reads lag the broker (high watermark {self.tap.highwater})"
            elif cluster != mirrored:
                why = "the ledger does not mirror the cluster yet"
            elif self.server.holder() is None:
                why = "no Lease holder"
            elif state.leader_instance != self.server.holder():
                why = f"the Lease holder {self.server.holder()} has not claimed its epoch yet"
            elif now - last[1] < 1500:
                why = "the tail still moves"
            else:
                return records
        self.violate(
            "no-quiescence", f"not quiet after {self.options.settle_timeout_s:.0f} s: {why}"
        )
        return None

    async def _stop_engines(self) -> None:
        """SIGTERM every engine at once: each must exit 0 (or, stopped before its handlers were in
        place, by the signal itself or with 143 and ``stopped by SIGTERM``), spending less
        than the bound in CPU and in wall time less its waits for a CPU."""
        bound = self.options.stop_bound_s
        # all at once: an engine left running while another stops (slowly, on a loaded
        # machine) may still decide, and its decision then goes unfinished
        instances = [slot.instance for slot in self.slots]
        stops = await asyncio.gather(*(slot.terminate(60.0) for slot in self.slots))
        for slot, instance, stopped in zip(self.slots, instances, stops, strict=True):
            text = tail(slot.incarnations[-1].stderr)
            self.note(
                f"{instance}: SIGTERM -> exit {stopped.code} in {stopped.wall_s:.2f} s"
                f" ({stopped.cpu_s:.2f} s CPU, {stopped.waited_s:.2f} s waiting for one)"
            )
            stats = self.result.stats
            stats["stops"] += 1
            for key, value in (
                ("stop ms max", stopped.wall_s),
                ("stop own ms max", stopped.own_s),
                ("stop cpu ms max", stopped.cpu_s),
            ):
                stats[key] = max(stats[key], round(value * 1000))
            clean = stopped.code in (0, -signal.SIGTERM) or (
                stopped.code == 128 + signal.SIGTERM and "stopped by SIGTERM" in text
            )
            missing = MISSING.search(text)
            if stopped.code == 2 and missing is not None:
                # it met a missing offset as it stopped: judged at the end like any stop
                # at one (a broker-lost write with gaps=stop is designed, DECISIONS 224)
                self.stopped_at_holes.append(
                    (f"engine {instance} (at its SIGTERM)", int(missing.group(1)), text)
                )
                clean = True
            slow = stopped.cpu_s >= bound or stopped.own_s >= bound + 0.5
            if not clean or slow:
                self.violate(
                    "unclean-stop",
                    f"engine {instance}: SIGTERM -> exit {stopped.code} after"
                    f" {stopped.wall_s:.2f} s ({stopped.cpu_s:.2f} s CPU,"
                    f" {stopped.waited_s:.2f} s waiting for a CPU): {text}",
                )

    # ---------------------------------------------------------- checks

    async def _check(self, settled: list[RawRecord]) -> None:
        records = await self.final_records()
        if len(records) < len(settled):
            self.violate(
                "gap",
                f"the final read found {len(records)} records, the follower saw {len(settled)}",
            )
        present = {r.offset for r in records}
        holes = set(range(max(present, default=-1) + 1)) - present
        # a ledger with a hole is audited as a gaps=fill engine reads it (DESIGN §10)
        audit = await self._audit(self.engine_url("fill" if holes else "stop"))
        ctx = CheckContext(
            seed=self.seed,
            backend=self.env.backend,
            produced=self.produced.acked,
            posts=self.server.posts,
            lease_writes=self.server.lease_writes,
            requests=[
                (slot.name, seen.at_ms, seen.path)
                for slot in self.slots
                for seen in slot.proxy.requests
                if seen.method == "POST" and seen.path.endswith("/eviction")
            ],
            instance_at={slot.name: slot.instance_at for slot in self.slots},
            now_ms=now_ms(),
            deadline_grace_ms=self.options.deadline_grace_ms,
            audit=audit,
        )
        restarted = self.broker is not None and any(
            up >= self.started_ms for _, up in self.broker.restarts
        )
        if holes and restarted:
            # the broker lost writes when it was restarted (tansu on s3 does): not the
            # engines' doing; what matters is that no acknowledged fact is among them
            self.result.stats["offsets lost by broker restarts"] += len(holes)
            ctx.broker_holes = set(holes)
        for who, offset, text in self.stopped_at_holes:
            if offset in ctx.broker_holes:
                self.result.stats["stops at a lost offset (gaps=stop)"] += 1
            else:
                self.violate("process-exit", f"{who} stopped at offset {offset}: {text}")
        if self.env.backend == "kafka":
            self.result.stats["offsets readable after a later one"] += self.tap.late
        violations, stats = check_trial(records, ctx)
        self.result.violations.extend(violations)
        self.result.stats.update(stats)
        await self._check_logs(records)

    async def _check_logs(self, records: list[RawRecord] | None) -> None:
        """Tracebacks, and offsets a reader said it filled that hold records (the raw
        records of the checks, else read now): a hole that was not one (DECISIONS 200)."""
        errs = [i.stderr for s in self.slots for i in s.incarnations] + self.tool_errs
        starts = [ms for path in errs for ms in term_starts_ms(path)]
        self.result.stats["terms"] += len(starts)
        self.result.stats["term start ms max"] = max(starts, default=0)
        for path, text in tracebacks(errs):
            self.violate("traceback", f"{path.name}: {' | '.join(text.splitlines()[-4:])}")
        fills = filled(errs)
        if not fills:
            return
        if records is None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(60):
                    records = await self.final_records()
        present = {r.offset for r in records or ()}
        for path, first, last in fills:
            held = sorted(present & set(range(first, last + 1)))
            self.result.stats["offset ranges filled"] += 1
            if held:
                self.violate(
                    "filled-record",
                    f"{path.name}: a reader filled offsets {first}..{last}, and the ledger holds"
                    f" records at {held[0]}..{held[-1]}",
                    f"{first}..{last}",
                )

    async def _audit(self, url: str) -> tuple[int, dict[str, Any] | None, str]:
        """``quotaledger audit URL --json`` (again, up to 3 times, while it cannot connect:
        a broker restart of a trial running beside this one)."""
        for _ in range(3):
            code, report, err = await self._audit_once(url)
            if not (code == 2 and "cannot connect" in err):
                break
            await asyncio.sleep(2.0)
        return code, report, err

    async def _audit_once(self, url: str) -> tuple[int, dict[str, Any] | None, str]:
        err = self.dir / "audit.err"
        self.tool_errs.append(err)
        with err.open("wb") as stderr:
            proc = await asyncio.create_subprocess_exec(
                *self.options.tool_command,
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


# ------------------------------------------------------------------ many trials


async def run_trial(env: Environment, seed: int) -> TrialResult:
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
