"""The plan of a ``quotaledger bench faults`` run (DECISIONS 220-229): its ledger backends,
the fault kinds of each, the options every trial runs with (DESIGN §12's Lease timings
shortened, what runs as what, how many producers), the fault schedule a trial draws from its
seed (:func:`draw_faults`), and what a trial ends with (:class:`TrialResult`).
"""

from __future__ import annotations

import random
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .fault_checks import Violation

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


def draw_faults(
    rng: random.Random, kinds: Sequence[str], window_s: float
) -> list[tuple[float, str]]:
    """A trial's fault schedule: 2-4 faults of ``kinds`` at times drawn in the workload
    window (from 0.3 s to 0.5 s before its end), in time order."""
    count = rng.randint(2, 4)
    return sorted(
        (round(rng.uniform(0.3, window_s - 0.5), 3), rng.choice(kinds)) for _ in range(count)
    )
