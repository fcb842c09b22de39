"""The processes of a ``quotaledger bench faults`` trial (DECISIONS 220, 225, 227): each
engine's slot (its API-server proxy, kubeconfig and successive processes, started, killed,
paused and resumed by pid), how a process met its SIGTERM (:class:`Stopped`: its CPU time and
its waits for a CPU, from ``/proc``, DESIGN §9, DECISIONS 180), and what the processes' logs
say (tracebacks, an offset a reader stopped at or filled, a refusal at start, the time from
a Lease taken to leading).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from .fault_cluster import now_ms
from .fault_proxy import FaultProxy

URL = "{ledger}"  # where a command line takes the ledger's URL
#: the error of a reader that stops at a missing offset (DESIGN §10)
MISSING = re.compile(r"offset (\d+) is missing")


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
