"""The whole engine on a virtual clock (DESIGN §7 ``simulate``).

Facts are appended in file order; before a fact stamped ``t`` every timer with
a deadline before ``t`` fires, at exactly its deadline; a fact stamped at a
deadline is applied first (§8 rule 27). Every decision is appended to the
in-memory ledger and acted on only after the projection has accepted it. The
``simulate`` executor answers each eviction at the same instant with
``EvictionSucceeded`` and the pod's ``PodRemoved``; ``log`` is a dry run that
answers ``EvictionFailed``. Without ``until`` the run stops when no timer is
pending after the last event.

A simulation may also start from an already-folded projection (``whatif``
forks the state of a ledger at offset N): its records then continue at
N+1, N+2, ... and its clock starts at the projection's ts.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from quotaledger.events.codec import encode_event, to_builtins
from quotaledger.events.ledger import Record
from quotaledger.events.model import (
    Event,
    EvictionFailed,
    EvictionSucceeded,
    LedgerOpened,
    PodRemoved,
    is_fact,
)
from quotaledger.events.times import rfc3339
from quotaledger.projections import Projection, state_json

from .core import EngineCore

Executor = Literal["simulate", "log"]


@dataclass(slots=True)
class Simulation:
    """A deterministic engine run over an in-memory ledger.

    ``records`` holds only the records this simulation appended; with a fresh
    projection the first is ``LedgerOpened`` at offset 0.
    """

    executor: Executor = "simulate"
    ledger_id: str = "simulation"
    projection: Projection = field(default_factory=Projection)
    records: list[Record] = field(default_factory=list)
    decisions: list[tuple[Record, Event]] = field(default_factory=list)
    core: EngineCore = field(init=False)

    def __post_init__(self) -> None:
        self.core = EngineCore(self.projection, instance="simulate")
        if not self.records and self.projection.state.offset < 0:
            self.append(0, msgspec.json.encode(LedgerOpened(ledger_id=self.ledger_id)))

    @property
    def now(self) -> int:
        return self.records[-1].ts if self.records else self.projection.state.ts

    def append(self, ts: int, payload: bytes) -> Event | None:
        """Append one record (ts clamped up, DESIGN §3) and read it back."""
        offset = self.projection.state.offset + 1
        record = Record(offset=offset, ts=max(ts, self.now), payload=payload)
        self.records.append(record)
        event = self.projection.apply_record(record)
        if event is not None and not is_fact(event):
            self.decisions.append((record, event))
        return event

    def append_event(self, ts: int, event: Event) -> Event | None:
        return self.append(ts, encode_event(event))

    def act(self, now: int) -> None:
        """Drive accepted evictions and finish preemptions until nothing moves."""
        while True:
            moved = False
            for eviction in self.core.outstanding():
                moved = True
                if self.executor == "simulate":
                    self.append_event(now, EvictionSucceeded(eviction_id=eviction.eviction_id))
                    self.append_event(now, PodRemoved(uid=eviction.pod_uid))
                else:
                    self.append_event(
                        now,
                        EvictionFailed(eviction_id=eviction.eviction_id, error="dry run (log)"),
                    )
            for finished in self.core.finished():
                moved = True
                self.append_event(now, finished)
            if not moved:
                return

    def observe(self, now: int) -> None:
        """Sample the clocks at this instant (after its facts, before its timers)."""
        event = self.core.observe(now)
        if event is not None:
            self.append_event(now, event)

    def fire_due(self, now: int) -> None:
        """Fire every timer due at ``now``, in §8 rule 27 order, until none is.

        After each timer the clocks are sampled and the due timers looked at
        again; while a timer leaves the ledger as it was (it proposed nothing
        and the sample recorded nothing), the timers due are those of the last
        look but the one just handled, so the next of that look is fired
        without looking again (a burst of timers at one instant costs one
        look per record written, not one per timer)."""
        self.observe(now)
        while True:
            due = self.core.due(now)
            if not due:
                return
            for timer in due:
                offset = self.projection.state.offset
                for event in self.core.propose(timer):
                    self.append_event(now, event)
                self.act(now)
                self.observe(now)
                if self.projection.state.offset != offset:
                    break

    def run_timers(self, before: int | None) -> None:
        """Advance the virtual clock through every deadline ``< before`` (all if None)."""
        while True:
            deadline = self.core.next_deadline(before)
            if deadline is None:
                return
            self.fire_due(max(deadline, self.now))

    def run(
        self,
        lines: Iterable[tuple[int, bytes | Callable[[int], bytes]]],
        until: int | None = None,
    ) -> None:
        """Feed ``(ts, payload)`` facts in order, firing timers between them.

        A payload may be a function of the offset its record gets (a
        ``FactRejected`` names its own offset; decisions may come first)."""
        for ts, payload in lines:
            if until is not None and ts > until:
                break
            if ts > self.now:
                self.observe(self.now)
            self.run_timers(before=ts)
            if not isinstance(payload, bytes):
                payload = payload(self.projection.state.offset + 1)
            self.append(ts, payload)
            self.act(self.now)
        self.observe(self.now)
        self.run_timers(before=None if until is None else until + 1)

    def decisions_json(self) -> list[dict[str, Any]]:
        """Decision records in ledger order: the event's JSON plus offset and at."""
        out = []
        for record, event in self.decisions:
            document = to_builtins(event)
            document["offset"] = record.offset
            document["at"] = rfc3339(record.ts)
            out.append(document)
        return out

    def result(self) -> dict[str, Any]:
        """``{"decisions": [...], "state": {...}}`` as ``simulate --json`` prints."""
        return {"decisions": self.decisions_json(), "state": state_json(self.projection.state)}
