"""The fold's fast paths for pod churn equal attaching each pod afresh (issue #11).

A pod upserted again takes ``replace_pod``; one that stays pending with other
requests moves only the pending-index buckets of the amounts that changed
(``tree._reindex_pending``). Whatever path an upsert takes, every pod index must
equal the one a snapshot restore rebuilds from the pods alone.
"""

from __future__ import annotations

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from quotaledger.events.ledger import Record
from quotaledger.projections import Projection
from quotaledger.projections.snapshot import dump, load

RESOURCES = ["cpu", "memory", "nvidia.com/gpu"]
PODS = ["p0", "p1", "p2", "p3"]
INDEXES = (
    "pod_quota",
    "namespace_pods",
    "field_pods",
    "pending_pods",
    "pending_by_quota",
    "pending_index",
    "pending_amounts",
)

#: Requests as they come on the wire: a few shared amounts (so buckets are
#: shared between pods), zeros (never indexed) and missing resources.
requests = st.dictionaries(
    st.sampled_from(RESOURCES), st.sampled_from([0, 1, 2, 3, "500m", "2Gi"]), max_size=3
)
upsert = st.fixed_dictionaries(
    {
        "kind": st.just("PodUpserted"),
        "uid": st.sampled_from(PODS),
        "namespace": st.sampled_from(["a", "b"]),
        "requests": requests,
        # mostly Pending without a node: the pending index's paths
        "phase": st.sampled_from(["Pending", "Pending", "Pending", "Running", "Succeeded"]),
        "node": st.sampled_from([None, None, None, "n0"]),
    }
).map(lambda doc: {**doc, "name": doc["uid"]})
removal = st.builds(lambda uid: {"kind": "PodRemoved", "uid": uid}, st.sampled_from(PODS))
histories = st.lists(st.one_of(upsert, upsert, upsert, removal), min_size=1, max_size=60)

SETUP = [
    {"kind": "LedgerOpened", "ledger_id": "paths"},
    {"kind": "NodeUpserted", "name": "n0", "allocatable": {"cpu": 8, "memory": "16Gi"}},
    {"kind": "QuotaUpserted", "name": "a", "min": {"cpu": 2}},
    {"kind": "QuotaUpserted", "name": "b", "min": {"memory": "1Gi"}},
]


def records(docs: list[dict[str, object]]) -> list[Record]:
    encode = msgspec.json.Encoder().encode
    return [Record(offset=i, ts=i, payload=encode(doc)) for i, doc in enumerate(docs)]


@settings(max_examples=300, deadline=None)
@given(histories)
def test_pod_indexes_after_every_upsert_equal_a_rebuild(history: list[dict[str, object]]) -> None:
    projection = Projection()
    for record in records(SETUP + history):
        projection.apply_record(record)
        state = projection.state
        if record.offset < len(SETUP):
            continue
        rebuilt = load(dump(state))
        for index in INDEXES:
            assert getattr(state, index) == getattr(rebuilt, index), index
        # a pending pod is in the starvation re-check set until the next sample
        assert state.pending_pods <= state.touched_pods
    assert not projection.state.rejected


def test_a_pending_pod_resized_keeps_shared_buckets() -> None:
    """Two pending pods share an amount; one of them changes only its other
    resource: the shared bucket keeps both, the changed one moves."""
    docs: list[dict[str, object]] = [
        {"kind": "PodUpserted", "uid": uid, "name": uid, "namespace": "a", "requests": req}
        for uid, req in (
            ("p0", {"cpu": 1, "memory": "2Gi"}),
            ("p1", {"cpu": 1, "memory": 3}),
            ("p0", {"cpu": 1, "memory": 3}),
            ("p1", {"cpu": 2, "memory": 3}),
        )
    ]
    projection = Projection()
    for record in records(SETUP + docs):
        projection.apply_record(record)
    state = projection.state
    assert state.pending_index == {"cpu": {1000: {"p0"}, 2000: {"p1"}}, "memory": {3: {"p0", "p1"}}}
    assert state.pending_amounts == {"cpu": [1000, 2000], "memory": [3]}
    assert state.pending_by_quota == {"a": {"p0", "p1"}}
