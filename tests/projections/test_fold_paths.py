"""The fold's fast paths for pod churn equal attaching each pod afresh (DECISIONS 170, 171).

A pod upserted again takes ``replace_pod``; one that stays pending with other
requests moves only the pending-index buckets of the amounts that changed
(``tree._reindex_pending``). Whatever path an upsert takes, every pod index must
equal the one a snapshot restore rebuilds from the pods alone.
"""

from __future__ import annotations

import importlib
from sys import intern
from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from quotaledger.events.codec import EventError, _decode_full, decode_event
from quotaledger.events.ledger import Record
from quotaledger.projections import Projection
from quotaledger.projections.clocks import release_holds
from quotaledger.projections.snapshot import dump, load
from tests.projections.test_projection_properties import POD_INDEXES as INDEXES

#: The settle module (``projections.settle`` is also the package's name for its function).
settling = importlib.import_module("quotaledger.projections.settle")

#: An event as JSON-able data.
Doc = dict[str, Any]
RESOURCES = ["cpu", "memory", "nvidia.com/gpu"]
PODS = ["p0", "p1", "p2", "p3"]

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

SETUP: list[Doc] = [
    {"kind": "LedgerOpened", "ledger_id": "paths"},
    {"kind": "NodeUpserted", "name": "n0", "allocatable": {"cpu": 8, "memory": "16Gi"}},
    {"kind": "QuotaUpserted", "name": "a", "min": {"cpu": 2}},
    {"kind": "QuotaUpserted", "name": "b", "min": {"memory": "1Gi"}},
]


def records(docs: list[Doc]) -> list[Record]:
    encode = msgspec.json.Encoder().encode
    return [Record(offset=i, ts=i, payload=encode(doc)) for i, doc in enumerate(docs)]


@settings(max_examples=300, deadline=None)
@given(histories)
def test_pod_indexes_after_every_upsert_equal_a_rebuild(history: list[Doc]) -> None:
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


#: Amounts up to the bound (2^62): four pods of a quota overflow int64 sums.
large_requests = st.dictionaries(
    st.sampled_from(["memory", "nvidia.com/gpu"]),
    st.sampled_from([0, 1, 3, 2**61, 2**62 - 1, 2**62]),
    max_size=2,
)
large_upsert = st.fixed_dictionaries(
    {
        "kind": st.just("PodUpserted"),
        "uid": st.sampled_from(PODS),
        "namespace": st.sampled_from(["a", "b"]),
        "requests": large_requests,
        "phase": st.sampled_from(["Pending", "Running", "Running", "Succeeded"]),
        "node": st.sampled_from([None, "n0", "n0"]),
    }
).map(lambda doc: {**doc, "name": doc["uid"]})
SETTLE: Doc = {"kind": "settle"}
settled_histories = st.lists(
    st.one_of(large_upsert, large_upsert, large_upsert, removal, st.just(SETTLE)),
    min_size=1,
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(settled_histories)
def test_pod_sums_after_each_settle_equal_their_pods(history: list[Doc]) -> None:
    """``flush_sums`` adds a quota's logged pod changes as one net change per
    resource (``tree.flush_sums``): after every settle, each quota's
    ``pod_request`` is the sum of its active pods' requests and ``pod_used`` of
    those with a node, also where the sums leave int64."""
    projection = Projection()
    folded = iter(records([doc for doc in SETUP + history if doc is not SETTLE]))
    for doc in SETUP + history:
        if doc is SETTLE:
            _check_pod_sums(projection.settled())
        else:
            projection.apply_record(next(folded))
    _check_pod_sums(projection.settled())
    assert not projection.state.rejected


#: Upserts that keep a pod active in its quota (``replace_pod`` logs them):
#: resized, bound and unbound, resources appearing and disappearing.
resize_upsert = st.fixed_dictionaries(
    {
        "kind": st.just("PodUpserted"),
        "uid": st.sampled_from(PODS),
        "namespace": st.just("a"),
        "requests": large_requests,
        "phase": st.sampled_from(["Pending", "Running", "Running", "Running", "Succeeded"]),
        "node": st.sampled_from([None, "n0", "n0"]),
    }
).map(lambda doc: {**doc, "name": doc["uid"]})
resize_histories = st.lists(
    st.one_of(resize_upsert, resize_upsert, resize_upsert, large_upsert, removal, st.just(SETTLE)),
    min_size=1,
    max_size=60,
)


def check_with_bulk_settles(history: list[Doc]) -> None:
    """The pod-sums check of ``history`` with every settle taking the full
    recompute (the bulk path's thresholds set so that it always applies)."""
    saved = settling.BULK_MIN_QUOTAS, settling.BULK_FRACTION
    settling.BULK_MIN_QUOTAS, settling.BULK_FRACTION = 0, 10**9
    try:
        test_pod_sums_after_each_settle_equal_their_pods.hypothesis.inner_test(history)  # type: ignore[attr-defined]
    finally:
        settling.BULK_MIN_QUOTAS, settling.BULK_FRACTION = saved


@settings(max_examples=300, deadline=None)
@given(resize_histories)
def test_pod_sums_after_each_bulk_settle_equal_their_pods(history: list[Doc]) -> None:
    """The same with every settle taking the full recompute (``pods.flush_all``
    adds each logged change straight into the columns), on histories that
    mostly resize, bind and unbind active pods, with sums leaving int64."""
    check_with_bulk_settles(history)


def test_a_bulk_flush_past_int64_widens_the_resource() -> None:
    """Four bound pods of 1 byte, settled (int64 columns), then each resized to
    2^62 - 1 between two settles: the flush's adds leave int64 and the
    resource's columns turn wide, exact."""
    small = [
        {
            "kind": "PodUpserted",
            "uid": uid,
            "name": uid,
            "namespace": "a",
            "phase": "Running",
            "node": "n0",
            "requests": {"memory": 1},
        }
        for uid in PODS
    ]
    large = [{**doc, "requests": {"memory": 2**62 - 1}} for doc in small]
    history: list[Doc] = [*small, SETTLE, *large, SETTLE]
    check_with_bulk_settles(history)


def _check_pod_sums(state: Any) -> None:
    for node in state.quotas.values():
        request: dict[str, int] = {}
        used: dict[str, int] = {}
        for uid in node.pods:
            pod = state.pods[uid]
            for key, value in pod.requests.items():
                request[key] = request.get(key, 0) + value
                if pod.node is not None:
                    used[key] = used.get(key, 0) + value
        assert node.pod_request == {k: v for k, v in request.items() if v}, node.name
        assert node.pod_used == {k: v for k, v in used.items() if v}, node.name


def test_a_pending_pod_resized_keeps_shared_buckets() -> None:
    """Two pending pods share an amount; one of them changes only its other
    resource: the shared bucket keeps both, the changed one moves."""
    docs: list[Doc] = [
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


def _evicted_and_finished(remove_before_finish: bool) -> list[Doc]:
    """An overuse preemption of quota ``a`` evicts ``p0``; the pod's removal
    comes before or after the preemption finishes (which holds ``a``'s clock)."""
    pod = {"kind": "PodUpserted", "namespace": "a", "phase": "Running", "node": "n0"}
    docs: list[Doc] = [
        {**pod, "uid": "p0", "name": "p0", "requests": {"cpu": 3}},
        {**pod, "uid": "p1", "name": "p1", "requests": {"cpu": 3}},
        # the revoke's timer: a's overuse clock, due at once (DECISIONS 211)
        {"kind": "SettingsChanged", "revoke_after_s": 0},
        {"kind": "ClocksObserved", "basis": 6, "owing_started": {"a": 0}},
        {"kind": "PreemptionStarted", "preemption_id": "x", "queue": "a", "cause": "overuse"}
        | {"target": {"cpu": 3}, "basis": 5},
        {"kind": "EvictionRequested", "eviction_id": "e", "preemption_id": "x"}
        | {"pod_uid": "p0", "queue": "a"},
        {"kind": "EvictionSucceeded", "eviction_id": "e"},
    ]
    finished = {"kind": "PreemptionFinished", "preemption_id": "x", "queue": "a"}
    removed = {"kind": "PodRemoved", "uid": "p0"}
    docs += [removed, finished | {"outcome": "complete"}]
    if not remove_before_finish:
        docs[-2:] = docs[-1:] + docs[-2:-1]
    return docs


def test_the_removal_answering_an_eviction_keeps_a_held_clock_held() -> None:
    """§8 rule 29: the PodRemoved that answers an eviction does not release a
    held clock; the next fact does."""
    projection = Projection()
    docs = SETUP + _evicted_and_finished(remove_before_finish=False)
    for record in records(docs):
        assert projection.apply_record(record) is not None
    state = projection.state
    assert state.owing_held == {"a"} and not state.evicted_pods
    later = {"kind": "PodUpserted", "uid": "p1", "name": "p1", "namespace": "a"}
    projection.apply_record(records([*docs, later])[-1])
    assert not state.owing_held and "a" in state.touched


def test_the_answer_to_an_eviction_is_consumed_with_nothing_held() -> None:
    """The removal answers the eviction even while nothing is held: the later
    finish holds the clock and no fact has released it."""
    projection = Projection()
    for record in records(SETUP + _evicted_and_finished(remove_before_finish=True)):
        assert projection.apply_record(record) is not None
    state = projection.state
    assert not state.evicted_pods and state.owing_held == {"a"}


AMOUNTS = st.one_of(
    st.sampled_from(["1", "250m", "2Gi", "-1", "abc", "5Ei"]),
    st.integers(min_value=-1, max_value=2**63),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
)
LISTS = st.one_of(st.none(), st.dictionaries(st.sampled_from(["cpu", "memory"]), AMOUNTS))
TIMES = st.sampled_from(
    [None, "2026-01-01T00:00:00Z", "2026-01-01T00:00:00", "0001-01-01T00:00:00Z"]
)
OTHER_KINDS = st.one_of(
    st.fixed_dictionaries(
        {"kind": st.just("QuotaUpserted"), "name": st.just("q"), "min": LISTS, "max": LISTS}
    ),
    st.fixed_dictionaries(
        {"kind": st.just("NodeUpserted"), "name": st.just("n"), "allocatable": LISTS}
    ),
    st.fixed_dictionaries({"kind": st.just("PodRemoved"), "uid": st.sampled_from(["p", 3])}),
    st.fixed_dictionaries({"kind": st.just("EvictionSucceeded"), "eviction_id": st.just("e")}),
)


def _outcome(payload: bytes, decode: Any) -> tuple[object, ...]:
    try:
        event = decode(payload)
    except EventError as exc:
        return ("error", exc.reason, exc.kind)
    return ("event", type(event).__name__, msgspec.json.encode(event))


@settings(max_examples=300, deadline=None)
@given(OTHER_KINDS, TIMES)
def test_decoding_any_kind_fast_equals_the_full_path(doc: Doc, at: object) -> None:
    """The decode fast path canonicalises every kind that has amounts and defers
    anything odd to the full path: same event or same error (DECISIONS 120)."""
    payload = msgspec.json.encode({**doc, "at": at})
    assert _outcome(payload, decode_event) == _outcome(payload, _decode_full)


# ------------------------------------------------------------ Projection.apply_pod

#: Upserts varying every field ``apply_pod``'s usual path keeps or shares: the
#: name (the uid or not), the namespace and ``quota`` field (another quota: the
#: general path), the node, the labels (more than ``SMALL_DICT`` keys too),
#: ``created_at`` and the requests.
MANY_LABELS = {f"k{i}": "v" for i in range(9)}
any_upsert = st.fixed_dictionaries(
    {
        "kind": st.just("PodUpserted"),
        "uid": st.sampled_from(PODS),
        "name": st.sampled_from(["p0", "p1", "other"]),
        "namespace": st.sampled_from(["a", "a", "b"]),
        "quota": st.sampled_from([None, None, "a", "b"]),
        "requests": requests,
        "phase": st.sampled_from(["Pending", "Running", "Running", "Succeeded"]),
        "node": st.sampled_from([None, "n0", "n0", "n1"]),
        "labels": st.sampled_from([{}, {"app": "x"}, {"app": "y"}, MANY_LABELS]),
        "created_at": st.sampled_from([None, "2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z"]),
        "at": st.just("2026-01-03T00:00:00Z"),
    }
)
pod_histories = st.lists(
    st.one_of(any_upsert, any_upsert, any_upsert, removal, st.just(SETTLE)),
    min_size=1,
    max_size=60,
)


class GeneralPath(Projection):
    """Every ``PodUpserted`` through the general path, as before ``apply_pod``'s inline one."""

    def apply_pod(self, offset: int, ts: int, pod: Any) -> None:
        self._advance(offset, ts)
        self._pod_upserted(offset, ts, pod)
        if self.state.owing_held or self.state.starving_held:
            release_holds(self.state)


@settings(max_examples=300, deadline=None)
@given(pod_histories)
def test_apply_pod_folds_like_the_general_path(history: list[Doc]) -> None:
    """DECISIONS 400: ``apply_pod``'s inline path for the usual upsert and the
    general path give the same state: the persisted state, every pod index, the
    pod sums, the state hash (incremental and full) and what the pods share."""
    from quotaledger.projections.state_digest import full_state_hash, state_hash

    general, fast = GeneralPath(), Projection()
    encode = msgspec.json.Encoder().encode
    offset = 0
    for doc in SETUP + history:
        if doc is SETTLE:  # the incremental hashes follow the marks each fold leaves
            assert state_hash(general.state) == state_hash(fast.state)
            assert state_hash(fast.state) == full_state_hash(fast.state)
            continue
        record = Record(offset=offset, ts=offset, payload=encode(doc))
        offset += 1
        general.apply_record(record)
        fast.apply_record(record)
    one, two = general.state, fast.state
    assert dump(one) == dump(two)
    for index in (*INDEXES, "touched_pods", "dirty"):
        assert getattr(one, index) == getattr(two, index), index
    assert state_hash(one) == state_hash(two) == full_state_hash(two)
    _check_pod_sums(two)
    for state in (one, two):
        for uid, pod in state.pods.items():
            assert pod.at is None
            assert pod.uid is uid
            assert (pod.name is uid) == (pod.name == uid)
            assert intern(pod.namespace) is pod.namespace
            assert pod.node is None or intern(pod.node) is pod.node
    shared = [(uid, pod.labels is one.pods[uid].labels) for uid, pod in two.pods.items()]
    assert all(same or not two.pods[uid].labels for uid, same in shared)
