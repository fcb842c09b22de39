"""The engine's looks at its timers (``EngineCore.pending``/``next_deadline``/
``due``, through the state's ``projections.timers.TimerIndex``) equal a full
listing of the state (``engine.core.timers``) after every record of
engine-made histories: the same timers in the same §8 rule 27 order, the same
handled timers forgotten (DECISIONS 63), the same next deadline — also across
quota moves, pods changing quota while they starve, settings switched mid-way
and a restore from a snapshot."""

from __future__ import annotations

import dataclasses
from typing import Any

import msgspec
from hypothesis import given, settings

from quotaledger.engine.core import EngineCore, Timer, TimerKey, timers
from quotaledger.engine.simulate import Simulation
from quotaledger.events.codec import encode_event
from quotaledger.events.model import Event
from quotaledger.projections import Projection
from quotaledger.projections.snapshot import dump, load

from .scenarios import engine_facts
from .simulate_corpus import case


def reference_look(core: EngineCore, now: int) -> tuple[list[Timer], set[TimerKey], int | None]:
    """The looks as a full listing gives them: pending timers, the handled set
    after the look, the next deadline (the code before the index)."""
    state = core.state
    armed = timers(state)
    handled = core.handled & {timer.key for timer in armed}
    pending = [
        timer for timer in armed if timer.key not in handled and timer.queue not in state.occupied
    ]
    at = min((core.ready_at(timer) for timer in pending), default=None)
    return pending, handled, at


def check(core: EngineCore, now: int) -> None:
    expected, handled, at = reference_look(core, now)
    # the engine's own looks, which sweep ``handled`` from the last look's
    # sweep when no record came between (``EngineCore._look``)
    assert core.pending() == expected
    assert core.handled == handled
    assert core.next_deadline() == at
    assert core.due(now) == [timer for timer in expected if core.ready_at(timer) <= now]
    # a key handled between two looks at one offset that is not armed (a
    # timer proposed from an older look) is forgotten at the next look
    never = ("overuse", "no such quota", "", now)
    core.handled.add(never)
    assert core.pending() == expected
    assert core.handled == handled
    # and a fresh look (no sweep before it) of a copy
    probe = dataclasses.replace(core, handled=set(core.handled), backoff=dict(core.backoff))
    assert probe.pending() == expected
    assert probe.handled == handled
    probe.handled = set(core.handled)
    assert probe.next_deadline() == at
    probe.handled = set(core.handled)
    assert probe.due(now) == [timer for timer in expected if core.ready_at(timer) <= now]
    for before in (now, now + 1, now + 2000):
        probe.handled = set(core.handled)
        wanted = None if at is None or at >= before else at
        assert probe.next_deadline(before) == wanted


class Checked(Simulation):
    """A simulation that checks the index against the full listing after every record."""

    def append(self, ts: int, payload: bytes) -> Event | None:
        event = Simulation.append(self, ts, payload)
        check(self.core, self.now)
        return event


def run_checked(lines: list[tuple[int, bytes]], **kw: Any) -> Simulation:
    until = kw.pop("until", None)
    simulation = Checked(**kw)
    simulation.run(lines, until=until)
    return simulation


@settings(max_examples=60, deadline=None)
@given(engine_facts())
def test_looks_equal_a_full_listing_on_engine_histories(facts: list[tuple[int, Event]]) -> None:
    run_checked([(ts, encode_event(event)) for ts, event in facts])


def test_looks_equal_a_full_listing_on_the_corpus() -> None:
    """The simulate corpus: settings switched on, off and retuned, pods
    re-added while their starvation clock runs, removals, rejected facts."""
    for seed in range(0, 300, 3):
        item = case(seed)
        run_checked(item["lines"], executor=item["executor"], until=item["until"])


T0 = 1_767_225_600_000


def line(ts_s: float, **event: Any) -> tuple[int, bytes]:
    return (T0 + round(ts_s * 1000), msgspec.json.encode(event))


def test_moves_and_quota_changes_of_starving_pods_reorder_the_timers() -> None:
    """A queue moved deeper sorts its timers by its new depth; a starving pod
    whose quota changes carries its reclaim timer to the new queue."""
    lines = [
        line(0, kind="SettingsChanged", reclaim_after_s=5, revoke_after_s=5),
        line(0, kind="NodeUpserted", name="n", allocatable={"cpu": 4}),
        line(0, kind="QuotaUpserted", name="p", is_parent=True, min={"cpu": 2}),
        line(0, kind="QuotaUpserted", name="a", min={"cpu": 1}),
        line(0, kind="QuotaUpserted", name="b", min={"cpu": 1}),
        line(0, kind="QuotaUpserted", name="c", min={"cpu": 1}),
        line(
            1,
            kind="PodUpserted",
            uid="r1",
            name="r1",
            namespace="a",
            requests={"cpu": 2},
            phase="Running",
            node="n",
        ),
        line(
            1,
            kind="PodUpserted",
            uid="r2",
            name="r2",
            namespace="b",
            requests={"cpu": 2},
            phase="Running",
            node="n",
        ),
        line(2, kind="PodUpserted", uid="w", name="w", namespace="c", requests={"cpu": 1}),
        line(3, kind="QuotaUpserted", name="a", parent="p", min={"cpu": 1}),
        line(
            3, kind="PodUpserted", uid="w", name="w", namespace="x", quota="a", requests={"cpu": 1}
        ),
        line(4, kind="QuotaUpserted", name="b", parent="p", min={"cpu": 1}),
        line(4, kind="PodRemoved", uid="w"),
        line(4, kind="PodUpserted", uid="w", name="w", namespace="c", requests={"cpu": 1}),
        line(20, kind="SettingsChanged", revoke_enabled=False),
        line(21, kind="SettingsChanged", revoke_enabled=True, reclaim_after_s=1),
        line(40, kind="NodeUpserted", name="n2", allocatable={"cpu": 8}),
    ]
    simulation = run_checked(lines)
    assert simulation.decisions


def test_a_restored_state_is_indexed_afresh() -> None:
    """After a snapshot restore mid-way (a new state), the looks still equal
    the full listing, before and after more records."""
    item = case(7)
    lines = item["lines"]
    half = len(lines) // 2
    first = Checked()
    first.run(lines[:half])
    restored = Projection(load(dump(first.projection.state)))
    second = Checked(projection=restored, records=list(first.records))
    check(second.core, second.now)
    second.run(lines[half:])
