"""The memoised decode path gives exactly the full path's result
(DECISIONS 120): same event, same type, same error for bad input."""

from __future__ import annotations

import json
from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from quotaledger.events.codec import EventError, _decode_full, decode_event
from quotaledger.events.model import PodUpserted

AMOUNTS = st.one_of(
    st.sampled_from(["1", "100m", "1.5", "2Gi", "-1", "1e3", "abc", "", "1Ei", "5Ei", "0.0001"]),
    st.integers(min_value=-3, max_value=2**63),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.none(),
    st.lists(st.integers(), max_size=1),
)
REQUESTS = st.one_of(
    st.dictionaries(st.sampled_from(["cpu", "memory", "nvidia.com/gpu", "é"]), AMOUNTS, max_size=3),
    st.none(),
    st.integers(),
    st.text(max_size=3),
)
TIMES = st.sampled_from(
    [None, "2026-01-01T00:00:00Z", "2026-01-01T00:00:00", "0001-01-01T00:00:00Z", "bad", 5]
)


def outcome(payload: bytes, decode: Any) -> tuple[str, Any, Any]:
    try:
        event = decode(payload)
    except EventError as exc:
        return ("error", exc.reason, exc.kind)
    return ("event", type(event).__name__, msgspec.json.encode(event))


@settings(max_examples=400, deadline=None)
@given(
    requests=REQUESTS,
    at=TIMES,
    created=TIMES,
    phase=st.sampled_from(["Pending", "Running", "Lost"]),
    spaced=st.booleans(),
    drop_uid=st.booleans(),
)
def test_fast_path_matches_the_full_path(
    requests: Any, at: Any, created: Any, phase: str, spaced: bool, drop_uid: bool
) -> None:
    doc: dict[str, Any] = {"kind": "PodUpserted", "uid": "p", "name": "p", "namespace": "n"}
    doc |= {"requests": requests, "phase": phase, "at": at, "created_at": created}
    if drop_uid:
        del doc["uid"]
    payload = json.dumps(doc, separators=(", ", ": ") if spaced else (",", ":")).encode()
    # twice: the second call may be answered from the memo
    assert outcome(payload, decode_event) == outcome(payload, _decode_full)
    assert outcome(payload, decode_event) == outcome(payload, _decode_full)


def test_a_decoded_pod_is_a_plain_pod_with_canonical_requests() -> None:
    payload = b'{"kind":"PodUpserted","uid":"u","name":"u","namespace":"n","requests":{"cpu":"1"}}'
    first, second = decode_event(payload), decode_event(payload)
    assert type(first) is PodUpserted and type(second) is PodUpserted
    assert first.requests == {"cpu": 1000}
    assert first == second and first is not second


def test_bad_requests_report_the_field_on_a_memo_miss_and_after() -> None:
    payload = b'{"kind":"PodUpserted","uid":"u","name":"u","namespace":"n","requests":{"cpu":"x"}}'
    for _ in range(2):
        try:
            decode_event(payload)
        except EventError as exc:
            assert "`$.requests.cpu`" in exc.reason
            assert exc.kind == "PodUpserted"
        else:
            raise AssertionError("accepted a bad quantity")
