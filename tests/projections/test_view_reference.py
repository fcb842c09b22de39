"""The state JSON's body read in bulk (``projections.view``: every quota's
numbers read column by column, available from those dicts, the fair-share
shortcut) against the quota-by-quota reading they replaced
(:mod:`tests.view_reference`), on generated histories, engine-made histories
at every offset and amounts up to the 2^62 bound (DESIGN §5, §7, §9). Equal
bodies encode to equal bytes, key order included, so the state JSON is
unchanged. The state hash kept along the way equals the one computed from
nothing at every step (the hash itself: ``tests/projections/test_state_digest.py``)."""

from __future__ import annotations

from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from quotaledger.events.model import (
    Event,
    NamespaceWeighted,
    NodeUpserted,
    PodUpserted,
    QuotaUpserted,
)
from quotaledger.projections import Projection
from quotaledger.projections.fair_share import fair_shares
from quotaledger.projections.state import NamespaceUsage, ProjectedState
from quotaledger.projections.state_digest import full_state_hash
from quotaledger.projections.view import _body, quota_view, state_hash
from tests.projections.test_arrays_differential import big_histories
from tests.scenarios import engine_facts, engine_run, fold, histories
from tests.view_reference import reference_body

_AS_IS = msgspec.json.Encoder()


def assert_reads_like_reference(state: ProjectedState) -> None:
    expected = reference_body(state)
    body = _body(state)
    assert body == expected
    assert _AS_IS.encode(body) == _AS_IS.encode(expected)  # same key order too
    assert state_hash(state) == full_state_hash(state)
    for name, view in expected["quotas"].items():  # one quota at a time (HTTP, §11)
        single = quota_view(state, name, {})
        assert single == view
        assert _AS_IS.encode(single) == _AS_IS.encode(view)


weights = st.lists(
    st.builds(
        NamespaceWeighted,
        namespace=st.sampled_from(["a", "b", "c", "ns1", "ns2", "kube-system"]),
        weight=st.integers(0, 5),
    ),
    max_size=4,
)


@settings(max_examples=150, deadline=None)
@given(histories(), weights)
def test_body_and_hash_equal_the_reference_after_every_event(
    history: list[Event], weighted: list[Event]
) -> None:
    projection = fold([])
    for offset, event in enumerate([*weighted, *history], start=1):
        projection.apply(offset, 0, event)
        assert_reads_like_reference(projection.state)


@settings(max_examples=30, deadline=None)
@given(engine_facts())
def test_body_and_hash_equal_the_reference_on_engine_made_histories(facts: Any) -> None:
    projection = Projection()
    for record in engine_run(facts).records:
        projection.apply_record(record)
        assert_reads_like_reference(projection.state)


@settings(max_examples=150, deadline=None)
@given(big_histories())
def test_body_and_hash_equal_the_reference_with_amounts_up_to_the_bound(
    history: list[Event],
) -> None:
    assert_reads_like_reference(fold(history).settled())


def test_a_zero_weight_namespace_gets_nothing_even_when_every_cap_fits() -> None:
    """The shortcut (every cap fits the pool) holds only when all weights are
    positive: water-filling never hands a weight-0 namespace anything."""
    projection = fold(
        [
            NodeUpserted(name="n", allocatable={"cpu": 100}),
            QuotaUpserted(name="q", min={"cpu": 10}, namespaces=["x", "y"]),
            NamespaceWeighted(namespace="y", weight=0),
            PodUpserted(uid="p1", name="p1", namespace="x", requests={"cpu": 3}, phase="Running"),
            PodUpserted(uid="p2", name="p2", namespace="y", requests={"cpu": 4}, phase="Running"),
        ]
    )
    state = projection.settled()
    shares = _body(state)["quotas"]["q"]["namespaces"]
    assert state.quotas["q"].runtime["cpu"] >= 7  # both caps fit the pool
    assert shares["x"]["fair_share"] == {"cpu": 3}
    assert shares["y"]["fair_share"] == {}
    assert_reads_like_reference(state)


def test_caps_that_fit_are_given_whole_and_caps_that_do_not_are_water_filled() -> None:
    node = (
        fold(
            [
                NodeUpserted(name="n", allocatable={"cpu": 10}),
                QuotaUpserted(name="q", min={"cpu": 10}),
            ]
        )
        .settled()
        .quotas["q"]
    )
    usage = {
        "a": NamespaceUsage(request={"cpu": 2}),
        "b": NamespaceUsage(request={"cpu": 3}),
    }
    assert fair_shares(node, usage, {}, {"cpu": 5}) == {"a": {"cpu": 2}, "b": {"cpu": 3}}
    assert fair_shares(node, usage, {}, {"cpu": 4}) == {"a": {"cpu": 2}, "b": {"cpu": 2}}
    assert fair_shares(node, usage, {"a": 3}, {"cpu": 4}) == {"a": {"cpu": 2}, "b": {"cpu": 2}}
    assert fair_shares(node, usage, {"b": 3}, {"cpu": 4}) == {"a": {"cpu": 1}, "b": {"cpu": 3}}
