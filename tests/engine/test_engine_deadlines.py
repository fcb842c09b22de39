"""No quota-decrease deadline is left armed in the past (DESIGN §6 rule 1, §8 rules 21, 27).

The race: at a parent's deadline D the parent sits exactly at its min (the
target is empty), and the leaf's new pods are stamped at D but land just after
the engine looked. ``simulate`` applies the facts stamped at D first and
preempts at D. A live engine that looked at D on the state without the pods
saw nothing to do; the fold keeps a passed deadline armed while its target is
not empty (DECISIONS 14), so the engine must look again on the state that has
the pods (DECISIONS 210). And when the target stays empty, the ledger itself
must show the deadline disarmed: the engine appends a record stamped after D
for the fold to disarm it at.

The live engine runs on a SQLite ledger; the engine's clock and the ledger's
are one clock in the test's hands, and the facts carry their own ts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from quotaledger.adapters.ledgers.sqlite.ledger import SqliteLedger
from quotaledger.engine.core import EngineCore
from quotaledger.engine.executors import SimulateExecutor
from quotaledger.engine.live import LiveEngine
from quotaledger.engine.simulate import Simulation
from quotaledger.events.codec import decode_event
from quotaledger.events.ledger import Append, Record
from quotaledger.events.model import (
    ClocksObserved,
    Event,
    EvictionRequested,
    LedgerOpened,
    PreemptionFinished,
    PreemptionStarted,
)
from quotaledger.projections import Projection
from quotaledger.projections.state import ProjectedState
from tests.engine.test_engine_guard import (
    SETTINGS,
    Engines,
    _wait_for,
    cpu,
    encode_fact,
    read_records,
)

Fact = dict[str, Any]
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z
LOWERED = T0 + 1_000
DEADLINE = LOWERED + 1_000  # p's preemption_delay_s: 1

NODE: Fact = {"kind": "NodeUpserted", "name": "n1", "allocatable": {"cpu": 1000}}
PARENT: Fact = {
    "kind": "QuotaUpserted",
    "name": "p",
    "is_parent": True,
    "min": cpu(4000),
    "max": cpu(100_000),
    "preemption_delay_s": 1,
}
LEAF: Fact = {"kind": "QuotaUpserted", "name": "l", "parent": "p"}


def pod(uid: str, created_s: int) -> Fact:
    return {
        "kind": "PodUpserted",
        "uid": uid,
        "name": uid,
        "namespace": "team",
        "quota": "l",
        "requests": cpu(1000),
        "phase": "Running",
        "node": "n1",
        "created_at": f"2026-01-01T00:00:{created_s:02d}Z",
    }


def at_min_until_the_deadline() -> list[tuple[int, Fact]]:
    """p (min 4 cpu) uses 6 cpu; its max is lowered to 5 (armed, deadline D);
    two pods leave, so p sits at its min: at D the target is empty, unless
    something arrives by then."""
    return [
        (T0, SETTINGS),
        (T0, NODE),
        (T0, PARENT),
        (T0, LEAF),
        *((T0, pod(f"a{i}", i)) for i in range(6)),
        (LOWERED, {**PARENT, "max": cpu(5000)}),
        (LOWERED + 100, {"kind": "PodRemoved", "uid": "a4"}),
        (LOWERED + 100, {"kind": "PodRemoved", "uid": "a5"}),
    ]


#: The leaf's new pods: with them p uses 6 cpu again, 1 over its new max.
ARRIVALS: list[Fact] = [pod("b0", 30), pod("b1", 31)]


@dataclass
class Clock:
    """The engine's clock, set by the test."""

    now: int

    def __call__(self) -> int:
        return self.now


def simulated(facts: Sequence[tuple[int, Fact]]) -> Simulation:
    simulation = Simulation(ledger_id="deadlines")
    simulation.run([(ts, encode_fact(fact)) for ts, fact in facts])
    return simulation


def decided(events: Sequence[Event]) -> list[tuple[Any, ...]]:
    """What the preemptions did, without offsets, ids or times: each start's
    queue, cause and target, each eviction's pod, each finish's outcome."""
    out: list[tuple[Any, ...]] = []
    for event in events:
        if isinstance(event, PreemptionStarted):
            out.append(("started", event.queue, event.cause, dict(event.target)))
        elif isinstance(event, EvictionRequested):
            out.append(("evict", event.pod_uid))
        elif isinstance(event, PreemptionFinished):
            out.append(("finished", event.queue, event.outcome))
    return out


def accepted(records: Sequence[Record]) -> tuple[list[Event], ProjectedState]:
    """The accepted events of a ledger, and its state."""
    projection = Projection()
    events = [e for r in records if (e := projection.apply_record(r)) is not None]
    return events, projection.state


def passed_armed(state: ProjectedState, now: int) -> dict[str, int]:
    """Quota-decrease deadlines still armed although passed (the setting is on)."""
    assert state.settings.quota_preemption_enabled
    return {q: d for q, d in state.decrease_deadlines.items() if d <= now}


async def run_race(tmp_path: Path, arrivals: Sequence[tuple[int, Fact]]) -> list[Record]:
    """The engine looks at D on the state without ``arrivals``; then they land
    (their own ts), and the engine's clock moves on well past D. Returns the
    ledger at quiescence: nothing running, nothing outstanding, no passed
    deadline armed (or a timeout naming what is left)."""
    path = tmp_path / "race.db"
    clock = Clock(T0)  # the engine's and the ledger's
    ledger = await SqliteLedger.open(path, poll_interval=0.01, clock_ms=clock)
    engine = LiveEngine(
        ledger, SimulateExecutor(), instance="A", election=False, clock_ms=clock, idle_poll_s=0.02
    )
    try:
        setup = at_min_until_the_deadline()
        await ledger.append([Append(encode_fact(f), ts=ts) for ts, f in setup])
        clock.now = LOWERED + 100
        async with Engines() as engines:
            engines.start(engine)
            await _wait_for(lambda: engine.state.decrease_deadlines == {"p": DEADLINE})
            clock.now = DEADLINE
            # the engine looks at D: p at its min, the target is empty
            await _wait_for(lambda: any(key[1] == "p" for key in engine.core.handled))
            tail = engine.state.offset
            assert engine.state.decrease_deadlines == {"p": DEADLINE}
            if arrivals:
                await ledger.append([Append(encode_fact(f), ts=ts) for ts, f in arrivals])
                await _wait_for(lambda: engine.state.offset >= tail + len(arrivals))
            clock.now = DEADLINE + 60_000

            def settled() -> bool:
                state = engine.state
                return (
                    not state.preemptions
                    and not engine.core.outstanding()
                    and not passed_armed(state, clock.now)
                )

            try:
                await _wait_for(settled, timeout=20)
            except TimeoutError:
                state = engine.state
                raise AssertionError(
                    f"not settled: deadlines {state.decrease_deadlines} (now {clock.now}),"
                    f" running {sorted(state.preemptions)}"
                ) from None
    finally:
        await ledger.close()
    return read_records(path)


async def test_pods_stamped_at_the_deadline_that_land_after_the_look_are_preempted(
    tmp_path: Path,
) -> None:
    """The race itself: the engine saw an empty target at D; the pods stamped D
    land after it looked. The engine looks again on the state that has them and
    preempts, as ``simulate`` does at D; no passed deadline stays armed."""
    arrivals = [(DEADLINE, fact) for fact in ARRIVALS]
    records = await run_race(tmp_path, arrivals)
    events, state = accepted(records)
    assert passed_armed(state, DEADLINE + 60_000) == {}
    assert state.decrease_deadlines == {}

    reference = simulated([*at_min_until_the_deadline(), *arrivals])
    want = decided([event for _, event in reference.decisions])
    assert want == [
        ("started", "p", "quota-decrease", {"cpu": 1000}),
        ("evict", "b1"),  # the youngest pod of the leaf
        ("finished", "p", "complete"),
    ]
    assert decided(events) == want
    # simulate preempts at D, on the facts stamped at D
    [(started_record, _)] = [d for d in reference.decisions if isinstance(d[1], PreemptionStarted)]
    assert started_record.ts == DEADLINE
    # the live engine proposed from a state that has the pods: its basis is after them
    [started] = [e for e in events if isinstance(e, PreemptionStarted)]
    arrived = max(r.offset for r in records if b'"b1"' in r.payload and r.ts == DEADLINE)
    assert started.basis >= arrived


async def test_an_empty_target_at_the_deadline_is_disarmed_in_the_ledger(tmp_path: Path) -> None:
    """Nothing arrives: the target stays empty. The engine records no preemption
    (§8 rule 21) and appends one record stamped after D, at which every reader's
    fold disarms the deadline (DECISIONS 14, 210): the ledger shows it disarmed."""
    records = await run_race(tmp_path, [])
    events, state = accepted(records)
    assert state.decrease_deadlines == {}
    assert decided(events) == []
    setup = len(at_min_until_the_deadline())
    tail = [decode_event(r.payload) for r in records[setup + 1 :]]
    assert tail == [ClocksObserved(basis=setup)]  # starts and stops nothing
    assert records[-1].ts > DEADLINE
    # a second reader disarms it at that record, and not before
    before = Projection()
    for record in records[:-1]:
        before.apply_record(record)
    assert before.state.decrease_deadlines == {"p": DEADLINE}
    # simulate of the same facts records no preemption either
    assert decided([e for _, e in simulated(at_min_until_the_deadline()).decisions]) == []


async def test_pods_stamped_after_the_deadline_change_nothing(tmp_path: Path) -> None:
    """The pods arrive 1 ms after D: at D the target was empty, and the fold
    disarms the deadline at their record (the state before it decides). Live
    and ``simulate`` agree: no preemption."""
    arrivals = [(DEADLINE + 1, fact) for fact in ARRIVALS]
    records = await run_race(tmp_path, arrivals)
    events, state = accepted(records)
    assert state.decrease_deadlines == {}
    assert decided(events) == []
    reference = simulated([*at_min_until_the_deadline(), *arrivals])
    assert decided([e for _, e in reference.decisions]) == []
    assert not any(isinstance(decode_event(r.payload), ClocksObserved) for r in records)


# ------------------------------------------------------------------ the core alone


def core_at_the_deadline() -> tuple[Projection, EngineCore]:
    projection = Projection()
    projection.apply(0, T0, LedgerOpened(ledger_id="deadlines"))
    for offset, (ts, fact) in enumerate(at_min_until_the_deadline(), start=1):
        assert projection.apply(offset, ts, decode_event(msgspec.json.encode(fact)))
    return projection, EngineCore(projection, instance="A")


def test_a_timer_that_found_nothing_is_evaluated_again_once_the_state_moved() -> None:
    projection, core = core_at_the_deadline()
    state = projection.state
    [timer] = core.due(DEADLINE)
    assert core.propose(timer) == []  # p at its min: empty target, nothing recorded
    assert core.due(DEADLINE) == []
    core.revisit()  # same state: still handled
    assert core.due(DEADLINE) == []
    # a record stamped after D is due for the fold to disarm it
    assert core.disarm_at() == DEADLINE + 1
    # the pods stamped D land: the state moved, the timer is evaluated again
    for fact in ARRIVALS:
        assert projection.apply(state.offset + 1, DEADLINE, decode_event(encode_fact(fact)))
    assert core.disarm_at() is None  # nothing found empty on this state yet
    core.revisit()
    assert core.due(DEADLINE + 5) == [timer]
    proposal = core.propose(timer)
    assert isinstance(proposal[0], PreemptionStarted) and proposal[0].target == {"cpu": 1000}


def test_the_disarm_record_is_the_first_after_both_the_deadline_and_the_ts() -> None:
    projection, core = core_at_the_deadline()
    state = projection.state
    [timer] = core.due(DEADLINE)
    assert core.propose(timer) == []
    # a record at D (not after it) disarms nothing: the fold needs a later ts
    record = core.disarm_record(DEADLINE)
    assert record == ClocksObserved(basis=state.offset)
    assert projection.apply(state.offset + 1, DEADLINE, record)
    assert state.decrease_deadlines == {"p": DEADLINE}
    core.revisit()
    [timer] = core.due(DEADLINE)
    assert core.propose(timer) == []
    assert core.disarm_at() == DEADLINE + 1
    assert projection.apply(state.offset + 1, DEADLINE + 1, core.disarm_record(DEADLINE + 1))
    assert state.decrease_deadlines == {}
    core.revisit()
    assert core.disarm_at() is None and core.empty_at == {} and core.due(DEADLINE + 1) == []


def test_no_disarm_record_while_the_setting_is_off_or_the_queue_is_occupied() -> None:
    projection, core = core_at_the_deadline()
    state = projection.state
    [timer] = core.due(DEADLINE)
    assert core.propose(timer) == []
    state.occupied["p"] = "another"  # as a running preemption holds it (§8 rule 34)
    assert core.disarm_at() is None
    del state.occupied["p"]
    state.settings.quota_preemption_enabled = False  # the fold disarms nothing then (rule 19)
    assert core.disarm_at() is None
    state.settings.quota_preemption_enabled = True
    assert core.disarm_at() == DEADLINE + 1


async def test_a_ledger_clock_behind_the_engine_costs_one_record_a_second(
    tmp_path: Path,
) -> None:
    """The ledger stamps records by its own clock, here stuck behind the
    engine's: a record appended to carry the time past D lands at the old ts
    and disarms nothing. The engine tries again a second later, not in a loop;
    once the ledger's clock has moved past D, the next one disarms it."""
    path = tmp_path / "behind.db"
    ledger_clock, engine_clock = Clock(T0), Clock(LOWERED + 100)
    ledger = await SqliteLedger.open(path, poll_interval=0.01, clock_ms=ledger_clock)
    engine = LiveEngine(
        ledger,
        SimulateExecutor(),
        instance="A",
        election=False,
        clock_ms=engine_clock,
        idle_poll_s=0.02,
    )
    try:
        setup = at_min_until_the_deadline()
        await ledger.append([Append(encode_fact(f), ts=ts) for ts, f in setup])
        ledger_clock.now = LOWERED + 100
        async with Engines() as engines:
            engines.start(engine)
            await _wait_for(lambda: engine.state.decrease_deadlines == {"p": DEADLINE})
            engine_clock.now = DEADLINE + 5_000
            await _wait_for(lambda: engine.state.offset > len(setup))
            await asyncio.sleep(0.5)
            assert engine.state.offset == len(setup) + 1  # one record, no loop
            assert engine.state.decrease_deadlines == {"p": DEADLINE}
            ledger_clock.now = DEADLINE + 5_000
            engine_clock.now = DEADLINE + 6_000  # a second later
            await _wait_for(lambda: not engine.state.decrease_deadlines, timeout=10)
    finally:
        await ledger.close()
    records = read_records(path)
    assert [type(decode_event(r.payload)) for r in records[len(setup) + 1 :]] == [
        ClocksObserved,
        ClocksObserved,
    ]
    assert records[-1].ts == DEADLINE + 5_000
