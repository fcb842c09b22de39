"""What one trial of ``quotaledger bench faults`` holds, which each part of it reads and
writes: the runner (:mod:`.fault_trial`), the faults (:mod:`.fault_injection`), the outside
producers (:mod:`.fault_producers`) and the checks at its end (:mod:`.fault_verdict`).

A trial's seed decides everything drawn (DECISIONS 220): what :class:`TrialState` draws at
once, in this order, is the stand-in server's and the cluster's randomness, the topic, the
fault schedule (:func:`.fault_plan.draw_faults`) and, on Kafka, the broker; then come its
ledger's URLs and raw reads (:mod:`.fault_records`, never quotaledger's readers), the
engines' slots, the facts produced, and the trial's log (notes and violations).
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

from .fault_checks import Violation
from .fault_cluster import Cluster, FaultApiServer
from .fault_environment import Broker, Environment
from .fault_plan import FAULT_KINDS, TrialResult, draw_faults
from .fault_processes import MISSING, EngineSlot
from .fault_records import KafkaTap, RawRecord, read_sqlite


@dataclass
class Produced:
    """Facts an outside producer wrote, by id: acknowledged or not."""

    acked: dict[str, bool] = field(default_factory=dict)


class TrialState:
    """One trial's draws, ledger, engines, facts and log (the module docstring)."""

    #: when :meth:`.fault_trial.Trial.run` began (monotonic seconds, wall ms)
    started: float
    started_ms: int

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
        self.faults = draw_faults(
            self.rng, self.options.fault_kinds or FAULT_KINDS[env.backend], self.options.workload_s
        )
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
        clear error), which :func:`.fault_verdict.check` finds out at the end."""
        found = MISSING.search(text)
        if code == 2 and found is not None:
            self.stopped_at_holes.append((who, int(found.group(1)), text))
            return
        self.violate("process-exit", f"{who} exited {code}: {text}")

    def violate(self, check: str, detail: str, offsets: str = "") -> None:
        self.result.violations.append(Violation(self.seed, check, offsets, detail))

    def instance_name(self, slot: EngineSlot, new: bool) -> str:
        if not new and slot.instance is not None:
            return slot.instance
        self.instances += 1
        return f"{slot.name}-{self.instances}"

    def leader_slot(self) -> EngineSlot | None:
        holder = self.server.holder()
        for slot in self.slots:
            if slot.alive() and not slot.paused and slot.instance == holder:
                return slot
        return None
