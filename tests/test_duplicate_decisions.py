"""A retried append may write a decision twice (DESIGN §10): the copy changes no state.

Decisions are idempotent by id: a repeated ``PreemptionStarted``,
``EvictionRequested``, ``EvictionSucceeded``, ``PreemptionFinished`` or
``LeaderElected`` is refused or ignored by the fold and leaves the state, its
hash and every outstanding eviction as they were, so no eviction runs twice.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from quotaledger.adapters.ledgers.jsonl import ledger_id_for, read_lines
from quotaledger.engine.core import EngineCore
from quotaledger.engine.simulate import Simulation
from quotaledger.events.codec import decode_event, encode_event
from quotaledger.events.ledger import Record
from quotaledger.events.model import LeaderElected, LedgerOpened, is_fact
from quotaledger.projections import Projection
from quotaledger.projections.view import state_hash

EXAMPLES = Path(__file__).parent.parent / "examples"
REPEATED = {
    "PreemptionStarted",
    "EvictionRequested",
    "EvictionSucceeded",
    "EvictionFailed",
    "PreemptionFinished",
    "LeaderElected",
    "ClocksObserved",
}


def simulated(name: str) -> list[Record]:
    path = EXAMPLES / name
    simulation = Simulation(executor="simulate", ledger_id=ledger_id_for(path))
    simulation.run((line.ts, line.payload) for line in read_lines(path, skip_invalid=False))
    return simulation.records


LEDGERS = {
    name: simulated(name) for name in ("quota-decrease.jsonl", "overuse.jsonl", "reclaim.jsonl")
}


def fingerprint(projection: Projection) -> tuple[str, bytes, bytes, bytes, int]:
    state = projection.settled()
    return (
        state_hash(state),
        msgspec.msgpack.encode(state.evictions),
        msgspec.msgpack.encode(state.preemptions),
        msgspec.msgpack.encode(sorted(state.occupied.items())),
        state.leader_epoch,
    )


def test_examples_have_every_decision_kind() -> None:
    kinds = {
        msgspec.json.decode(r.payload)["kind"] for records in LEDGERS.values() for r in records
    }
    assert {
        "PreemptionStarted",
        "EvictionRequested",
        "EvictionSucceeded",
        "PreemptionFinished",
    } <= kinds


@settings(max_examples=200, deadline=None)
@given(name=st.sampled_from(sorted(LEDGERS)), data=st.data())
def test_a_repeated_decision_changes_no_state(name: str, data: st.DataObject) -> None:
    records = LEDGERS[name]
    decisions = [
        i for i, r in enumerate(records) if msgspec.json.decode(r.payload)["kind"] in REPEATED
    ]
    i = data.draw(st.sampled_from(decisions), label="decision")
    # The copy lands right after the original, or after facts other producers
    # published meanwhile, but before the engine's next record: the engine's
    # append (and its retry) returns before it writes anything else.
    last = i
    while last + 1 < len(records) and is_fact(decode_event(records[last + 1].payload)):
        last += 1
    j = data.draw(st.integers(min_value=i, max_value=last), label="copy after")
    projection = Projection()
    for record in records[: j + 1]:
        projection.apply_record(record)
    before = fingerprint(projection)
    outstanding = [e.eviction_id for e in EngineCore(projection).outstanding(mine_only=False)]
    state = projection.state
    copy = Record(offset=state.offset + 1, ts=state.ts, payload=records[i].payload)
    projection.apply_record(copy)
    assert fingerprint(projection) == before
    again = [e.eviction_id for e in EngineCore(projection).outstanding(mine_only=False)]
    assert again == outstanding  # nothing to evict a second time


def test_a_repeated_leader_elected_changes_no_state() -> None:
    projection = Projection()
    opened = encode_event(LedgerOpened(ledger_id="x"))
    elected = encode_event(LeaderElected(epoch=1, instance="a"))
    for offset, payload in enumerate([opened, elected]):
        projection.apply_record(Record(offset, 0, payload))
    before = fingerprint(projection)
    projection.apply_record(Record(2, 0, elected))
    assert fingerprint(projection) == before
    assert projection.state.leader_epoch == 1
    assert isinstance(decode_event(elected), LeaderElected)
