"""A look's sweep of handled timers follows what the fold changed (DECISIONS 63,
350): after every look ``EngineCore.handled`` equals what a full
``armed_test`` sweep of every handled key leaves, and the timers a look
returns equal a full listing, on engine-made histories (hypothesis-drawn, and
the simulate corpus), with looks after every record or only every few
records (so the fold's changes pile up between two looks).

The incremental sweep re-tests only the sources the timer index reports as
changed (clocks applied, holds, finished preemptions, pods attached and
detached, quotas removed, quota-decrease deadlines) and the keys handled
since; a marking site left out leaves a handled key that is no longer armed
(or a parked timer that is pending again), which these checks catch.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from quotaledger.engine.core import EngineCore, timers
from quotaledger.engine.handled import CAUSES, TimerKey, armed_test
from quotaledger.engine.simulate import Simulation
from quotaledger.events.codec import encode_event
from quotaledger.events.model import (
    ClocksObserved,
    Event,
    PodUpserted,
    QuotaRemoved,
    QuotaUpserted,
    SettingsChanged,
)
from quotaledger.projections import Projection
from quotaledger.projections.snapshot import dump, load
from quotaledger.projections.timers import RECLAIM, TimerIndex, all_timers, timer_index
from tests.scenarios import engine_facts
from tests.simulate_corpus import case


def check_look(core: EngineCore, counts: dict[str, int]) -> None:
    """One look of ``core`` against the full sweep and the full listing."""
    state = core.state
    armed = armed_test(state)
    expected = {key for key in core.handled if armed(key)}
    incremental = core._sweep.index is not None and core._sweep.seen is core.handled
    pending = core.pending()
    assert core.handled == expected
    counts["incremental" if incremental else "full"] += 1
    counts["handled"] += len(expected)
    listed = [
        timer
        for timer in timers(state)
        if timer.key not in expected and timer.queue not in state.occupied
    ]
    assert pending == listed
    index = state.timer_index
    assert isinstance(index, TimerIndex)
    # parked entries are handled timers, and with the walked ones they are
    # every source's entry exactly once
    for source, entry in index.parked.items():
        assert index.by_source[source] == entry
        key: TimerKey = (CAUSES[entry[1]], entry[3], entry[4], entry[0])
        assert key in core.handled
        counts["parked"] += 1
    walked = sorted([*index.entries, *index.parked.values()])
    assert walked == sorted(index.by_source.values())
    live = {
        (entry[1], entry[4] if entry[1] == RECLAIM else entry[3]) for entry in all_timers(state)
    }
    assert live <= index.by_source.keys()


class Swept(Simulation):
    """A simulation whose engine looks (and is checked) every ``every`` records."""

    every: int = 1
    counts: dict[str, int] | None = None

    def append(self, ts: int, payload: bytes) -> Event | None:
        event = Simulation.append(self, ts, payload)
        if self.counts is None:
            self.counts = {"incremental": 0, "full": 0, "handled": 0, "parked": 0}
        if self.projection.state.offset % self.every == 0:
            check_look(self.core, self.counts)
        return event


def run_swept(lines: list[tuple[int, bytes]], every: int, **kw: Any) -> dict[str, int]:
    until = kw.pop("until", None)
    simulation = Swept(**kw)
    simulation.every = every
    simulation.run(lines, until=until)
    assert simulation.counts is not None
    check_look(simulation.core, simulation.counts)
    return simulation.counts


@settings(max_examples=80, deadline=None)
@given(engine_facts(), st.sampled_from([1, 1, 2, 3, 7]))
def test_the_incremental_sweep_equals_a_full_sweep(
    facts: list[tuple[int, Event]], every: int
) -> None:
    run_swept([(ts, encode_event(event)) for ts, event in facts], every)


def test_the_incremental_sweep_equals_a_full_sweep_on_the_corpus() -> None:
    """The simulate corpus (quotas removed, settings switched, pods moved
    while they starve); the incremental path is the one taken."""
    total = {"incremental": 0, "full": 0, "handled": 0, "parked": 0}
    for seed in range(0, 300, 2):
        item = case(seed)
        every = 1 + seed % 4
        counts = run_swept(item["lines"], every, executor=item["executor"], until=item["until"])
        for name, value in counts.items():
            total[name] += value
    assert total["incremental"] > 10 * total["full"]
    assert total["handled"] > 1000 and total["parked"] > 1000


def test_a_restored_state_is_swept_afresh() -> None:
    """A snapshot restored mid-way is a new state (a new index): the next look
    sweeps everything, and incrementally after."""
    item = case(11)
    lines = item["lines"]
    half = len(lines) // 2
    first = Swept()
    first.run(lines[:half])
    restored = Projection(load(dump(first.projection.state)))
    second = Swept(projection=restored, records=list(first.records))
    second.core.handled = set(first.core.handled)
    second.counts = counts = {"incremental": 0, "full": 0, "handled": 0, "parked": 0}
    check_look(second.core, counts)
    assert counts["full"] == 1
    second.run(lines[half:])


def test_a_key_handled_from_outside_is_swept() -> None:
    """``handled`` changed from outside the core (resized or replaced) makes
    the next look sweep every key."""
    item = case(5)
    simulation = Simulation(executor=item["executor"])
    simulation.run(item["lines"][: len(item["lines"]) // 2])
    core = simulation.core
    core.pending()
    never: TimerKey = ("overuse", "no such quota", "", 1)
    core.handled.add(never)
    core.pending()
    assert never not in core.handled
    core.handled = {*core.handled, never}
    core.pending()
    assert never not in core.handled


T0 = 1_767_225_600_000


def handled_overuse() -> tuple[Simulation, TimerKey]:
    """A quota whose owing clock runs though it no longer owes (no sample
    since): its overuse timer fires, proposes nothing and stays handled."""
    simulation = Simulation()
    simulation.append_event(T0, SettingsChanged(revoke_after_s=1.0))
    simulation.append_event(T0, QuotaUpserted(name="q", min={"cpu": 1}))
    simulation.append_event(T0, ClocksObserved(basis=2, owing_started={"q": T0}))
    core = simulation.core
    (timer,) = core.due(T0 + 1000)
    assert core.propose(timer) == []
    core.pending()
    assert timer.key in core.handled
    return simulation, timer.key


def test_an_owing_clock_stopped_lets_its_handled_timer_go() -> None:
    simulation, key = handled_overuse()
    simulation.append_event(T0 + 1000, ClocksObserved(basis=3, owing_stopped=["q"]))
    simulation.core.pending()
    assert key not in simulation.core.handled


def test_a_quota_removed_lets_its_handled_timer_go() -> None:
    simulation, key = handled_overuse()
    simulation.append_event(T0 + 1000, QuotaRemoved(name="q"))
    simulation.core.pending()
    assert key not in simulation.core.handled


def test_a_starving_pod_moved_to_another_quota_is_pending_again() -> None:
    """A starving pod whose reclaim found nothing stays handled (and parked);
    moved to another quota its timer is that quota's, pending again."""
    simulation = Simulation()
    simulation.append_event(T0, SettingsChanged(reclaim_after_s=1.0))
    for name in ("a", "b"):
        simulation.append_event(T0, QuotaUpserted(name=name, min={"cpu": 4}))
    pod = PodUpserted(uid="p", name="p", namespace="a", requests={"cpu": 1})
    simulation.append_event(T0, pod)
    simulation.append_event(T0, ClocksObserved(basis=4, starving_started={"p": T0}))
    core = simulation.core
    (timer,) = core.due(T0 + 1000)
    assert timer.queue == "a"
    assert core.propose(timer) == []
    assert core.pending() == []
    assert timer.key in core.handled
    moved = PodUpserted(uid="p", name="p", namespace="b", requests={"cpu": 1})
    simulation.append_event(T0 + 1000, moved)
    assert [(t.queue, t.pod_uid) for t in core.pending()] == [("b", "p")]
    assert core.handled == set()


def test_a_parked_entry_leaves_the_park_when_its_timer_key_changes() -> None:
    """The index's own rule, whatever its reader does: a parked entry stays
    parked while its timer key (deadline, queue) does, and is walked again
    once its clock restarts; a clock that stops takes its parked entry along."""
    simulation = Simulation()
    simulation.append_event(T0, SettingsChanged(reclaim_after_s=1.0))
    simulation.append_event(T0, QuotaUpserted(name="a", min={"cpu": 4}))
    simulation.append_event(T0, PodUpserted(uid="p", name="p", namespace="a", requests={"cpu": 1}))
    simulation.append_event(T0, ClocksObserved(basis=3, starving_started={"p": T0}))
    state = simulation.projection.state
    index = timer_index(state)
    source = (RECLAIM, "p")
    entry = index.by_source[source]
    index.park(source, entry[0], entry[3])
    assert index.parked == {source: entry} and entry not in index.entries
    simulation.append_event(T0 + 10, ClocksObserved(basis=4, starving_stopped=["p"]))
    simulation.append_event(T0 + 10, ClocksObserved(basis=5, starving_started={"p": T0 + 10}))
    index = timer_index(state)
    moved = index.by_source[source]
    assert moved[0] == T0 + 1010 and not index.parked and index.entries == [moved]
    index.park(source, moved[0], moved[3])
    simulation.append_event(T0 + 20, ClocksObserved(basis=6, starving_stopped=["p"]))
    index = timer_index(state)
    assert not index.parked and not index.entries and source not in index.by_source
