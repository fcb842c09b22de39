"""What the engine and the projection remember stays bounded (DECISIONS 62, 63).

``finished_preemptions`` is persisted state, so its bound is a function of the
ledger alone: the last ``FINISHED_KEPT`` finished ids. ``EngineCore.handled``
holds only timers that are still armed.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings

from quotaledger.engine.core import timers
from quotaledger.events.model import (
    ClocksObserved,
    Event,
    LedgerOpened,
    NamespaceWeighted,
    PreemptionFinished,
    PreemptionStarted,
    SettingsChanged,
)
from quotaledger.projections import Projection, state_hash
from quotaledger.projections.snapshot import dump, load
from quotaledger.projections.state import FINISHED_KEPT
from tests.projections.test_persisted_state import LITERAL
from tests.scenarios import engine_facts, engine_run


def started(n: int) -> PreemptionStarted:
    return PreemptionStarted(
        preemption_id=f"overuse/default/{n}", queue="default", cause="overuse", target={}, basis=n
    )


def finished(n: int) -> PreemptionFinished:
    return PreemptionFinished(
        preemption_id=f"overuse/default/{n}", queue="default", outcome="not-helpful"
    )


def owe(projection: Projection) -> None:
    """Start default's overuse clock, due at once: the timer each revoke answers
    (the guard admits a decision only while its timer is due, DECISIONS 211). A
    fact first releases the clock held by the previous revoke (§8 rule 29)."""
    state = projection.state
    if state.settings.revoke_after_s:
        assert projection.apply(state.offset + 1, 0, SettingsChanged(revoke_after_s=0.0))
    assert projection.apply(state.offset + 1, 0, NamespaceWeighted(namespace="ns", weight=1))
    started = ClocksObserved(basis=state.offset, owing_started={"default": 0})
    assert projection.apply(state.offset + 1, 0, started)


def run_preemptions(projection: Projection, first: int, count: int) -> None:
    for n in range(first, first + count):
        owe(projection)
        offset = projection.state.offset
        assert projection.apply(offset + 1, 0, started(n))
        assert projection.apply(offset + 2, 0, finished(n))


def test_the_guard_remembers_the_last_finished_preemptions_only() -> None:
    projection = Projection()
    projection.apply(0, 0, LedgerOpened(ledger_id="bounds"))
    run_preemptions(projection, 0, FINISHED_KEPT + 2)
    kept = projection.state.finished_preemptions
    assert len(kept) == FINISHED_KEPT
    assert "overuse/default/0" not in kept and "overuse/default/1" not in kept
    assert "overuse/default/2" in kept
    # a duplicate of a remembered id is refused; a forgotten one is not
    owe(projection)
    offset = projection.state.offset
    assert not projection.apply(offset + 1, 0, started(2))
    assert "already used" in projection.state.rejected[-1].reason
    assert projection.apply(offset + 2, 0, started(0))


def test_the_bound_is_the_same_after_a_snapshot() -> None:
    """Which id is dropped next depends on the ledger only, not on whether the
    state was restored from a snapshot in between."""
    projection = Projection()
    projection.apply(0, 0, LedgerOpened(ledger_id="bounds"))
    run_preemptions(projection, 0, FINISHED_KEPT)
    restored = Projection(load(dump(projection.state)))
    for each in (projection, restored):
        run_preemptions(each, FINISHED_KEPT, 3)
    assert projection.state.finished_preemptions == restored.state.finished_preemptions
    assert "overuse/default/2" not in restored.state.finished_preemptions
    assert state_hash(projection.state) == state_hash(restored.state)


def test_handled_timers_are_forgotten_once_no_longer_armed() -> None:
    for facts in LITERAL.values():
        sim = engine_run(facts)
        assert sim.decisions  # each fired a timer
        armed = {timer.key for timer in timers(sim.projection.state)}
        assert sim.core.handled <= armed
        assert not armed and not sim.core.handled


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(engine_facts())
def test_handled_holds_only_armed_timers(facts: list[tuple[int, Event]]) -> None:
    sim = engine_run(facts)
    sim.core.pending()
    assert sim.core.handled <= {timer.key for timer in timers(sim.projection.state)}
