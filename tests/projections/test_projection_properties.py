"""Invariants of the fold, property-tested (DESIGN §5)."""

from __future__ import annotations

import copy

from hypothesis import given, settings
from hypothesis import strategies as st

from quotaledger.events.model import Event, LedgerOpened
from quotaledger.projections import Projection, state_json
from quotaledger.projections.snapshot import dump, load
from quotaledger.projections.state import BUILTIN, ROOT
from tests.scenarios import assert_same_state, fold, histories, rejections

#: The pod indexes a snapshot restore rebuilds (compared with the fold's own).
POD_INDEXES = (
    "pod_quota",
    "namespace_pods",
    "field_pods",
    "pending_pods",
    "pending_by_quota",
    "pending_index",
    "pending_amounts",
)

PROPERTY = settings(max_examples=150, deadline=None)


@PROPERTY
@given(histories())
def test_same_input_twice_gives_the_same_state_and_hash(history: list[Event]) -> None:
    first = state_json(fold(history).state)
    second = state_json(fold(copy.deepcopy(history)).state)
    assert first == second


@PROPERTY
@given(histories())
def test_incremental_settle_equals_a_state_rebuilt_from_scratch(history: list[Event]) -> None:
    """After every event, the incrementally settled state equals one rebuilt
    from scratch out of its persisted fields (fresh quotas, pod sums from the
    pods, a full recompute), on every derived field of every quota."""
    projection = Projection()
    projection.apply(0, 0, LedgerOpened(ledger_id="test"))
    # read the state after every event, so every incremental path is exercised
    for offset, event in enumerate(history, start=1):
        projection.apply(offset, offset, event)
        assert_same_state(projection.settled(), load(dump(projection.state)))
    # and the same records folded afresh, settled once at the end
    assert_same_state(projection.state, fold(history, ts_step=1).settled())


@PROPERTY
@given(histories(), st.data())
def test_snapshot_plus_tail_equals_full_replay(history: list[Event], data: st.DataObject) -> None:
    cut = data.draw(st.integers(min_value=0, max_value=len(history)))
    full = fold(history, ts_step=350)
    head = fold(history[:cut], ts_step=350)
    restored = Projection(load(dump(head.state)))
    for offset, event in enumerate(history[cut:], start=cut + 1):
        restored.apply(offset, offset * 350, event)
    assert state_json(restored.state) == state_json(full.state)


@PROPERTY
@given(histories())
def test_runtime_never_exceeds_limited_request_and_children_fit_parent(
    history: list[Event],
) -> None:
    state = fold(history).settled()
    for node in state.quotas.values():
        for key, value in node.runtime.items():
            assert value <= node.limited_request.get(key, 0), (node.name, key)
    if not state.settings.min_scaling:
        return
    parents = {ROOT: state.cluster_total}
    parents.update({n.name: n.runtime for n in state.quotas.values() if n.config.is_parent})
    for parent, runtime in parents.items():
        children = [
            state.quotas[c]
            for c in state.children(parent)
            if state.quotas[c].connected and c not in BUILTIN
        ]
        for key in {k for child in children for k in child.runtime}:
            assert sum(child.runtime.get(key, 0) for child in children) <= runtime.get(key, 0)


@PROPERTY
@given(histories(), rejections)
def test_a_rejected_fact_leaves_the_state_hash_unchanged(
    history: list[Event], extra: Event
) -> None:
    """Every example applies a fact or decision the fold must refuse."""
    projection = fold(history)
    before = state_json(projection.state)
    accepted = projection.apply(len(history) + 1, 0, extra)
    after = state_json(projection.state)
    assert not accepted
    assert after["hash"] == before["hash"]
    assert after["rejected"][:-1] == before["rejected"]
    assert after["rejected"][-1]["offset"] == len(history) + 1


@PROPERTY
@given(histories())
def test_pod_sums_match_their_pods(history: list[Event]) -> None:
    state = fold(history).settled()
    for node in state.quotas.values():
        expected: dict[str, int] = {}
        for uid in node.pods:
            for key, value in state.pods[uid].requests.items():
                expected[key] = expected.get(key, 0) + value
        assert node.pod_request == {k: v for k, v in expected.items() if v}
        assert not node.config.is_parent or not node.pods


@PROPERTY
@given(histories())
def test_pod_indexes_equal_those_rebuilt_from_scratch(history: list[Event]) -> None:
    """The fold's in-place pod updates (``replace_pod``) leave every pod index as
    attaching each pod afresh would (snapshot restore rebuilds them that way)."""
    state = fold(history).settled()
    rebuilt = load(dump(state))
    for index in POD_INDEXES:
        assert getattr(state, index) == getattr(rebuilt, index), index
    for name, node in state.quotas.items():
        again = rebuilt.quotas[name]
        assert node.pods == again.pods
        assert node.pod_used == again.pod_used
