"""Snapshots and the state hash on histories the engine made (DESIGN §5 "State hash", §9).

The histories come from :class:`~quotaledger.engine.simulate.Simulation` run
over generated facts (``scenarios.engine_facts``): they hold quota-decrease,
overuse and reclaim preemptions, evictions, ``ClocksObserved`` samples and the
holds that follow a revoke or reclaim. Three literal histories make sure each
of those is present whatever hypothesis draws.

- At every offset, a state restored from a snapshot equals the folded state in
  every field (derived numbers included) except the engine's sampling
  bookkeeping, and has the same hash.
- Snapshot + tail, a full replay and the live engine's own state agree.
- Whenever a persisted field other than ``ledger_id``, ``offset``, ``ts`` and
  ``rejected`` changes from one record to the next, the hash changes.
- Snapshots and the hash hold integers beyond 2^64.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quotaledger.engine.simulate import Simulation
from quotaledger.events.ledger import Record
from quotaledger.events.model import (
    Event,
    LedgerOpened,
    NodeUpserted,
    PodUpserted,
    PreemptionStarted,
    QuotaUpserted,
    SettingsChanged,
)
from quotaledger.projections import Projection, state_hash, state_json
from quotaledger.projections.persisted import FIELDS, stored
from quotaledger.projections.snapshot import FORMAT, SnapshotError, dump, load
from quotaledger.projections.state import PreemptionRun, ProjectedState, QuotaNode
from tests.scenarios import ENGINE_T0, assert_same_state, engine_facts, engine_run, rejections

ENGINE = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])

#: Persisted but outside the hash (DECISIONS 60): the rest must all be hashed.
#: Persisted outside the hash: where the history sits (DECISIONS 60), and node labels and
#: unschedulable, which no number reads (DECISIONS 260).
UNHASHED = {"ledger_id", "offset", "ts", "rejected", "node_meta"}


def replay(records: list[Record], state: ProjectedState | None = None) -> Projection:
    projection = Projection(state)
    for record in records:
        projection.apply_record(record)
    return projection


def hashed_content(state: ProjectedState) -> bytes:
    """The stored form of every persisted field the hash must cover."""
    body = msgspec.structs.asdict(stored(state))
    return msgspec.json.encode({k: v for k, v in body.items() if k not in UNHASHED}, order="sorted")


# ------------------------------------------------------------------ literal histories


def _pod(uid: str, ns: str, cpu: int, **kw: Any) -> PodUpserted:
    fields: dict[str, Any] = {"phase": "Running", "node": "n0", **kw}
    return PodUpserted(uid=uid, name=uid, namespace=ns, requests={"cpu": cpu}, **fields)


def _at(seconds: float, event: Event) -> tuple[int, Event]:
    return (ENGINE_T0 + round(seconds * 1000), event)


#: Quota decrease: team runs 8 cpu, its max drops to 5 with a 2 s delay.
DECREASE = [
    _at(0, SettingsChanged(quota_preemption_enabled=True, revoke_enabled=False)),
    _at(0, NodeUpserted(name="n0", allocatable={"cpu": 20})),
    _at(0, QuotaUpserted(name="team", min={"cpu": 2}, max={"cpu": 10}, preemption_delay_s=2)),
    _at(1, _pod("t1", "team", 4)),
    _at(1, _pod("t2", "team", 4, priority=1)),
    _at(3, QuotaUpserted(name="team", min={"cpu": 2}, max={"cpu": 5}, preemption_delay_s=2)),
    _at(9, _pod("t3", "team", 1)),
]
#: Overuse: lender lends its min to borrower until a pod of its own arrives.
OVERUSE = [
    _at(0, SettingsChanged(revoke_after_s=2, reclaim_enabled=False)),
    _at(0, NodeUpserted(name="n0", allocatable={"cpu": 10})),
    _at(0, QuotaUpserted(name="lender", min={"cpu": 5})),
    _at(0, QuotaUpserted(name="borrower", min={"cpu": 5})),
    _at(1, _pod("b1", "borrower", 5)),
    _at(1, _pod("b2", "borrower", 4, priority=1)),
    _at(2, _pod("l1", "lender", 5, phase="Pending", node=None)),
    _at(9, _pod("l2", "lender", 1, phase="Pending", node=None)),
]
#: Reclaim: a pending pod starves while a cousin holds the cluster.
RECLAIM = [
    _at(0, SettingsChanged(revoke_enabled=False, reclaim_after_s=1)),
    _at(0, NodeUpserted(name="n0", allocatable={"cpu": 10})),
    _at(0, QuotaUpserted(name="a", is_parent=True, min={"cpu": 6})),
    _at(0, QuotaUpserted(name="a1", parent="a", min={"cpu": 6})),
    _at(0, QuotaUpserted(name="b", min={"cpu": 4})),
    _at(1, _pod("b1", "b", 6, created_at=datetime(2026, 1, 1, tzinfo=UTC))),
    _at(1, _pod("b2", "b", 4)),
    _at(2, _pod("w", "a1", 3, phase="Pending", node=None)),
    _at(8, _pod("other", "a1", 1, phase="Pending", node=None)),
]
LITERAL = {"decrease": DECREASE, "overuse": OVERUSE, "reclaim": RECLAIM}


@pytest.mark.parametrize("name", sorted(LITERAL))
def test_literal_histories_hold_the_decisions_they_are_for(name: str) -> None:
    sim = engine_run(LITERAL[name])
    causes = [e.cause for _, e in sim.decisions if isinstance(e, PreemptionStarted)]
    expected = {"decrease": "quota-decrease", "overuse": "overuse", "reclaim": "reclaim"}[name]
    assert causes == [expected]
    held = {"decrease": set(), "overuse": {"owing_held"}, "reclaim": {"starving_held"}}[name]
    seen: set[str] = set()
    projection = Projection()
    for record in sim.records:
        projection.apply_record(record)
        seen |= {f for f in ("owing_held", "starving_held") if getattr(projection.state, f)}
    assert seen == held


# ------------------------------------------------------------------ properties


def check_every_offset(sim: Simulation) -> None:
    """Snapshot at every offset == the folded state; the hash moves with the content."""
    projection = Projection()
    previous: tuple[bytes, str] | None = None
    for record in sim.records:
        projection.apply_record(record)
        state = projection.settled()
        blob = dump(state)
        rebuilt = load(blob)
        assert_same_state(state, rebuilt)
        assert dump(rebuilt) == blob
        digest = state_hash(state)
        assert state_hash(rebuilt) == digest
        content = hashed_content(state)
        if previous is not None and previous[0] != content:
            assert previous[1] != digest, f"offset {record.offset}: content changed, hash did not"
        previous = (content, digest)


def check_snapshot_plus_tail(sim: Simulation, cut: int) -> None:
    """Snapshot at ``cut`` + the tail == full replay == the live engine's state."""
    records = sim.records
    full = replay(records)
    head = replay(records[: cut + 1])
    restored = replay(records[cut + 1 :], load(dump(head.state)))
    assert state_json(restored.state) == state_json(full.state)
    assert dump(restored.state) == dump(full.state)
    assert state_json(sim.projection.state) == state_json(full.state)
    assert dump(sim.projection.state) == dump(full.state)


@pytest.mark.parametrize("name", sorted(LITERAL))
def test_literal_history_snapshots_at_every_offset(name: str) -> None:
    sim = engine_run(LITERAL[name])
    check_every_offset(sim)
    for cut in range(len(sim.records)):
        check_snapshot_plus_tail(sim, cut)


@ENGINE
@given(engine_facts())
def test_engine_history_snapshot_at_every_offset_equals_the_folded_state(
    facts: list[tuple[int, Event]],
) -> None:
    check_every_offset(engine_run(facts))


@ENGINE
@given(engine_facts(), st.data())
def test_engine_history_snapshot_plus_tail_equals_replay_and_the_live_engine(
    facts: list[tuple[int, Event]], data: st.DataObject
) -> None:
    sim = engine_run(facts)
    cut = data.draw(st.integers(min_value=0, max_value=len(sim.records) - 1))
    check_snapshot_plus_tail(sim, cut)


@ENGINE
@given(engine_facts(), rejections)
def test_a_rejected_record_after_an_engine_history_changes_nothing_but_rejected(
    facts: list[tuple[int, Event]], extra: Event
) -> None:
    sim = engine_run(facts)
    projection = replay(sim.records)
    state = projection.settled()
    before, content = state_hash(state), hashed_content(state)
    offset = state.offset + 1
    assert not projection.apply(offset, state.ts, extra)
    assert state_hash(projection.state) == before
    assert hashed_content(projection.state) == content
    assert projection.state.rejected[-1].offset == offset


# ------------------------------------------------------------------ the one field list


def test_every_persisted_field_but_the_listed_ones_is_hashed() -> None:
    assert {item.name for item in FIELDS if not item.hashed} == UNHASHED
    # and the snapshot stores exactly the persisted fields
    assert set(msgspec.structs.asdict(stored(ProjectedState.empty()))) == {
        item.name for item in FIELDS
    }


@pytest.mark.parametrize("item", [item for item in FIELDS if item.hashed], ids=lambda i: i.name)
def test_changing_any_hashed_field_changes_the_hash(item: Any) -> None:
    """Each hashed field, changed alone on a restored state, changes the hash."""
    sim = engine_run(RECLAIM)
    state = load(dump(sim.projection.state))
    before = state_hash(state)
    value = getattr(state, item.name)
    changed = _changed(item.name, value)
    setattr(state, item.name, changed)
    assert state_hash(state) != before


def _changed(name: str, value: Any) -> Any:
    """A different value of the same type."""
    if name == "settings":
        return msgspec.structs.replace(value, reclaim_after_s=value.reclaim_after_s + 1)
    if name == "quotas":
        out = dict(value)
        out["extra"] = QuotaNode(config=QuotaUpserted(name="extra"))
        return out
    if name == "pods":
        return {**value, "extra": PodUpserted(uid="extra", name="extra", namespace="ns")}
    if name == "preemptions":
        run = PreemptionRun(
            preemption_id="x", queue="b", cause="overuse", target={}, started_offset=1, started_ts=0
        )
        return {**value, "x": run}
    if name == "evictions":
        return {"x": None, **value}
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, str):
        return value + "-other"
    if isinstance(value, set):
        return {*value, "extra"}
    if isinstance(value, dict):
        return {**value, "extra": 1}
    raise AssertionError(f"no change known for {name}")


# ------------------------------------------------------------------ integers beyond 2^64


def test_snapshot_and_hash_hold_sums_beyond_two_to_the_64() -> None:
    """DESIGN §9: each amount ≤ 2^62, but 40 nodes of 2^62 cpu sum to 10 × 2^64,
    and a preemption's target may be as large."""
    projection = Projection()
    projection.apply(0, 0, LedgerOpened(ledger_id="big"))
    offset = 0
    for i in range(40):
        offset += 1
        assert projection.apply(offset, 0, NodeUpserted(name=f"n{i}", allocatable={"cpu": 2**62}))
    for i in range(40):
        offset += 1
        assert projection.apply(offset, 0, _pod(f"p{i}", "big", 2**62, node=f"n{i}"))
    state = projection.settled()
    assert state.allocatable == {"cpu": 40 * 2**62}
    assert state.quotas["default"].used == {"cpu": 40 * 2**62}
    big = 40 * 2**62 + 12345
    assert big > 2**64
    state.preemptions["p"] = PreemptionRun(
        preemption_id="p",
        queue="default",
        cause="overuse",
        target={"cpu": big},
        started_offset=offset,
        started_ts=0,
        occupied=["default"],
    )
    state.occupied["default"] = "p"
    blob = dump(state)
    rebuilt = load(blob)
    assert rebuilt.preemptions["p"].target == {"cpu": big}
    assert rebuilt.allocatable == {"cpu": 40 * 2**62}
    assert rebuilt.occupied == {"default": "p"}
    assert state_hash(rebuilt) == state_hash(state)
    assert state_json(rebuilt)["cluster"]["allocatable"] == {"cpu": 40 * 2**62}


def test_a_format_1_snapshot_is_refused_by_name() -> None:
    old = msgspec.msgpack.encode({"format": 1, "offset": 3})
    with pytest.raises(SnapshotError, match="format 1"):
        load(old)
    newer = msgspec.json.encode({"format": FORMAT + 1})
    with pytest.raises(SnapshotError, match=f"format {FORMAT + 1} is not {FORMAT}"):
        load(newer)
    with pytest.raises(SnapshotError, match="unreadable"):
        load(msgspec.json.encode({"format": FORMAT, "state": {"offset": "x"}}))


def test_settings_given_as_integers_hash_as_the_decoded_ones_and_their_snapshot() -> None:
    """``SettingsChanged`` built in Python with whole seconds (``whatif``, tests)
    gives the state a decoded record gives: the seconds and the percentage are
    numbers of the float fields (DESIGN §4), so the hash does not change when a
    snapshot restores them as floats."""
    given_ints = SettingsChanged(revoke_after_s=0, reclaim_after_s=5, preemption_miss_percent=3)
    decoded = msgspec.json.decode(msgspec.json.encode(given_ints), type=SettingsChanged)
    hashes = []
    for event in (given_ints, decoded):
        projection = Projection()
        projection.apply(0, ENGINE_T0, LedgerOpened(ledger_id="ints"))
        projection.apply(1, ENGINE_T0, event)
        state = projection.settled()
        assert state_hash(load(dump(state))) == state_hash(state)
        assert isinstance(state.settings.revoke_after_s, float)
        hashes.append(state_hash(state))
    assert hashes[0] == hashes[1]
