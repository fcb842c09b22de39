"""Decoding events (DESIGN §4, §8 rule 4): defaults, canonical amounts, clear rejections."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from msgspec import UNSET

from quotaledger.events.codec import EventError, decode_event, encode_event, peek_kind, to_builtins
from quotaledger.events.model import (
    EvictionFailed,
    EvictionRequested,
    EvictionSucceeded,
    FactRejected,
    LeaderElected,
    LedgerOpened,
    NamespaceWeighted,
    NodeRemoved,
    NodeUpserted,
    PodRemoved,
    PodUpserted,
    PreemptionFinished,
    PreemptionStarted,
    QuotaRemoved,
    QuotaUpserted,
    SettingsChanged,
    is_fact,
    kind_of,
)

GI = 2**30
POD = {"kind": "PodUpserted", "uid": "u1", "name": "p", "namespace": "ns"}


def decode(obj: dict[str, Any]) -> Any:
    return decode_event(json.dumps(obj))


def rejected(obj: dict[str, Any] | str) -> EventError:
    payload = obj if isinstance(obj, str) else json.dumps(obj)
    with pytest.raises(EventError) as info:
        decode_event(payload)
    return info.value


# --------------------------------------------------------------------- facts


def test_node_upserted_defaults_and_canonical_allocatable() -> None:
    event = decode(
        {
            "kind": "NodeUpserted",
            "name": "n1",
            "allocatable": {"cpu": "64", "memory": "256Gi", "nvidia.com/gpu": 8},
        }
    )
    assert isinstance(event, NodeUpserted)
    assert event.name == "n1"
    assert event.allocatable == {"cpu": 64000, "memory": 256 * GI, "nvidia.com/gpu": 8}
    assert event.labels == {}
    assert event.unschedulable is False
    assert event.at is None


def test_node_upserted_minimal() -> None:
    event = decode({"kind": "NodeUpserted", "name": "n1"})
    assert isinstance(event, NodeUpserted)
    assert event.allocatable == {}


def test_node_removed() -> None:
    event = decode({"kind": "NodeRemoved", "name": "n1"})
    assert isinstance(event, NodeRemoved)
    assert event.name == "n1"


def test_pod_upserted_defaults() -> None:
    event = decode(POD)
    assert isinstance(event, PodUpserted)
    assert (event.uid, event.name, event.namespace) == ("u1", "p", "ns")
    assert event.requests == {}
    assert event.priority == 0
    assert event.phase == "Pending"
    assert event.node is None
    assert event.quota is None
    assert event.created_at is None
    assert event.preemptible is True
    assert event.daemonset is False
    assert event.originator is False
    assert event.allow_preemption is True
    assert event.labels == {}


def test_pod_upserted_all_fields() -> None:
    event = decode(
        {
            **POD,
            "requests": {"cpu": 4, "memory": "1.5Gi", "nvidia.com/gpu": "2"},
            "priority": -5,
            "phase": "Running",
            "node": "n1",
            "quota": "team-a",
            "created_at": "2026-01-01T00:00:00Z",
            "preemptible": False,
            "daemonset": True,
            "originator": True,
            "allow_preemption": False,
            "labels": {"app": "x"},
        }
    )
    assert isinstance(event, PodUpserted)
    assert event.requests == {"cpu": 4000, "memory": 3 * 2**29, "nvidia.com/gpu": 2}
    assert event.priority == -5
    assert event.phase == "Running"
    assert event.node == "n1"
    assert event.quota == "team-a"
    assert event.created_at == datetime(2026, 1, 1, tzinfo=UTC)
    assert (event.preemptible, event.daemonset, event.originator) == (False, True, True)
    assert event.allow_preemption is False
    assert event.labels == {"app": "x"}


@pytest.mark.parametrize("phase", ["Pending", "Running", "Succeeded", "Failed"])
def test_pod_phases(phase: str) -> None:
    assert decode({**POD, "phase": phase}).phase == phase


def test_pod_nullable_fields_accept_null() -> None:
    event = decode({**POD, "node": None, "quota": None, "created_at": None})
    assert (event.node, event.quota, event.created_at) == (None, None, None)


def test_pod_removed() -> None:
    event = decode({"kind": "PodRemoved", "uid": "u1"})
    assert isinstance(event, PodRemoved)
    assert event.uid == "u1"


def test_quota_upserted_defaults() -> None:
    event = decode({"kind": "QuotaUpserted", "name": "q"})
    assert isinstance(event, QuotaUpserted)
    assert event.name == "q"
    assert event.parent == "root"
    assert event.is_parent is False
    assert event.min == {}
    assert event.max is None
    assert event.shared_weight is None
    assert event.allow_lent is True
    assert event.lending_limit is None
    assert event.borrowing_limit is None
    assert event.namespaces == []
    assert event.preemption_delay_s == 0


def test_quota_upserted_canonicalises_every_resource_list() -> None:
    event = decode(
        {
            "kind": "QuotaUpserted",
            "name": "q",
            "parent": "research",
            "is_parent": True,
            "min": {"cpu": "500m", "memory": "1Gi"},
            "max": {"cpu": 4, "memory": "2Gi"},
            "shared_weight": {"cpu": "2"},
            "allow_lent": False,
            "lending_limit": {"cpu": "1.5"},
            "borrowing_limit": {"memory": "100m"},
            "namespaces": ["a", "b"],
            "preemption_delay_s": 1.5,
        }
    )
    assert event.parent == "research"
    assert event.is_parent is True
    assert event.min == {"cpu": 500, "memory": GI}
    assert event.max == {"cpu": 4000, "memory": 2 * GI}
    assert event.shared_weight == {"cpu": 2000}
    assert event.allow_lent is False
    assert event.lending_limit == {"cpu": 1500}
    assert event.borrowing_limit == {"memory": 1}
    assert event.namespaces == ["a", "b"]
    assert event.preemption_delay_s == 1.5


def test_quota_upserted_integer_delay_and_null_limits() -> None:
    event = decode(
        {
            "kind": "QuotaUpserted",
            "name": "q",
            "preemption_delay_s": 30,
            "max": None,
            "shared_weight": None,
            "lending_limit": None,
            "borrowing_limit": None,
        }
    )
    assert event.preemption_delay_s == 30
    assert event.max is None and event.lending_limit is None


def test_quota_removed() -> None:
    event = decode({"kind": "QuotaRemoved", "name": "q"})
    assert isinstance(event, QuotaRemoved)
    assert event.name == "q"


def test_namespace_weighted() -> None:
    event = decode({"kind": "NamespaceWeighted", "namespace": "ns", "weight": 3})
    assert isinstance(event, NamespaceWeighted)
    assert (event.namespace, event.weight) == ("ns", 3)


def test_settings_changed_absent_fields_stay_unset() -> None:
    event = decode({"kind": "SettingsChanged"})
    assert isinstance(event, SettingsChanged)
    for field in SettingsChanged.__struct_fields__:
        if field != "at":
            assert getattr(event, field) is UNSET, field


def test_settings_changed_fields() -> None:
    event = decode(
        {
            "kind": "SettingsChanged",
            "min_scaling": False,
            "revoke_enabled": False,
            "revoke_after_s": 60,
            "reclaim_enabled": False,
            "reclaim_after_s": 7.5,
            "quota_preemption_enabled": True,
            "preemption_miss_percent": 10,
        }
    )
    assert event.min_scaling is False
    assert event.revoke_enabled is False
    assert event.revoke_after_s == 60
    assert event.reclaim_enabled is False
    assert event.reclaim_after_s == 7.5
    assert event.quota_preemption_enabled is True
    assert event.preemption_miss_percent == 10


def test_settings_changed_partial() -> None:
    event = decode({"kind": "SettingsChanged", "quota_preemption_enabled": True})
    assert event.quota_preemption_enabled is True
    assert event.revoke_enabled is UNSET


@pytest.mark.parametrize(
    "obj",
    [
        {"kind": "NodeUpserted", "name": "n"},
        {"kind": "NodeRemoved", "name": "n"},
        POD,
        {"kind": "PodRemoved", "uid": "u"},
        {"kind": "QuotaUpserted", "name": "q"},
        {"kind": "QuotaRemoved", "name": "q"},
        {"kind": "NamespaceWeighted", "namespace": "ns", "weight": 1},
        {"kind": "SettingsChanged"},
    ],
)
def test_every_fact_kind_is_a_fact(obj: dict[str, Any]) -> None:
    event = decode(obj)
    assert is_fact(event)
    assert kind_of(event) == obj["kind"]


# ------------------------------------------------------------------ at / time


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-01-01T00:00:00Z", datetime(2026, 1, 1, tzinfo=UTC)),
        ("2026-01-01T00:00:00.250Z", datetime(2026, 1, 1, 0, 0, 0, 250000, tzinfo=UTC)),
        (
            "2026-01-01T02:00:00+02:00",
            datetime(2026, 1, 1, 2, tzinfo=timezone(timedelta(hours=2))),
        ),
    ],
)
def test_at_is_rfc3339(text: str, expected: datetime) -> None:
    event = decode({"kind": "PodRemoved", "uid": "u", "at": text})
    assert event.at == expected
    assert event.at.utcoffset() is not None


def test_at_offset_is_the_same_instant() -> None:
    a = decode({"kind": "PodRemoved", "uid": "u", "at": "2026-01-01T02:00:00+02:00"})
    b = decode({"kind": "PodRemoved", "uid": "u", "at": "2026-01-01T00:00:00Z"})
    assert a.at == b.at


def test_bad_at_is_rejected_naming_at() -> None:
    error = rejected({"kind": "PodRemoved", "uid": "u", "at": "yesterday"})
    assert "$.at" in str(error)
    assert error.kind == "PodRemoved"


# ----------------------------------------------------- forward compatibility


def test_unknown_fields_are_ignored() -> None:
    event = decode({**POD, "future_field": {"nested": [1, 2]}, "x": None})
    assert isinstance(event, PodUpserted)
    assert event.uid == "u1"
    event = decode({"kind": "QuotaUpserted", "name": "q", "cohort": "c1"})
    assert isinstance(event, QuotaUpserted)


def test_accepts_bytes_and_str() -> None:
    assert decode_event(b'{"kind":"PodRemoved","uid":"u"}') == PodRemoved(uid="u")
    assert decode_event('{"kind":"PodRemoved","uid":"u"}') == PodRemoved(uid="u")


# ----------------------------------------------------------------- decisions


def test_preemption_started_keeps_canonical_integers() -> None:
    event = decode(
        {
            "kind": "PreemptionStarted",
            "preemption_id": "p1",
            "queue": "team-a",
            "cause": "quota-decrease",
            "target": {"cpu": 4, "memory": 1024},
            "basis": 17,
        }
    )
    assert isinstance(event, PreemptionStarted)
    assert event.target == {"cpu": 4, "memory": 1024}
    assert event.basis == 17
    assert not is_fact(event)


def test_decision_quantities_must_be_integers() -> None:
    error = rejected(
        {
            "kind": "PreemptionStarted",
            "preemption_id": "p1",
            "queue": "q",
            "cause": "overuse",
            "target": {"cpu": "4"},
            "basis": 1,
        }
    )
    assert "$.target" in str(error)


def test_preemption_finished_keeps_canonical_integers() -> None:
    event = decode(
        {
            "kind": "PreemptionFinished",
            "preemption_id": "p1",
            "queue": "q",
            "outcome": "best-effort",
            "claimed": {"cpu": 2},
            "reason": "ran out of victims",
        }
    )
    assert isinstance(event, PreemptionFinished)
    assert event.claimed == {"cpu": 2}
    assert event.outcome == "best-effort"


DECISIONS = [
    LedgerOpened(ledger_id="l1"),
    LeaderElected(epoch=3, instance="host-a"),
    FactRejected(offset=7, reason="bad", rejected_kind="PodUpserted", raw="{}"),
    FactRejected(offset=8, reason="malformed JSON"),
    PreemptionStarted(
        preemption_id="p1",
        queue="q",
        cause="reclaim",
        target={"cpu": 1500},
        basis=9,
        pod_uid="u1",
        at=datetime(2026, 1, 1, tzinfo=UTC),
    ),
    EvictionRequested(
        eviction_id="e1",
        preemption_id="p1",
        pod_uid="u2",
        queue="q",
        explain={"used": {"cpu": 3000}, "rank": 1},
    ),
    EvictionSucceeded(eviction_id="e1"),
    EvictionFailed(eviction_id="e1", error="PDB"),
    PreemptionFinished(preemption_id="p1", queue="q", outcome="complete", claimed={"cpu": 1500}),
]


@pytest.mark.parametrize("event", DECISIONS, ids=lambda e: kind_of(e))
def test_decisions_round_trip(event: Any) -> None:
    payload = encode_event(event)
    assert json.loads(payload)["kind"] == kind_of(event)
    assert decode_event(payload) == event
    assert to_builtins(event)["kind"] == kind_of(event)
    assert not is_fact(event)


@pytest.mark.parametrize("cause", ["quota-decrease", "overuse", "reclaim"])
def test_preemption_causes(cause: str) -> None:
    event = PreemptionStarted(preemption_id="p", queue="q", cause=cause, target={}, basis=0)  # type: ignore[arg-type]
    assert decode_event(encode_event(event)).cause == cause


def test_unknown_preemption_cause_is_rejected() -> None:
    error = rejected(
        {
            "kind": "PreemptionStarted",
            "preemption_id": "p",
            "queue": "q",
            "cause": "boredom",
            "target": {},
            "basis": 0,
        }
    )
    assert "$.cause" in str(error)
    assert error.kind == "PreemptionStarted"


# ---------------------------------------------------------------- rejections


@pytest.mark.parametrize(
    ("obj", "kind", "field"),
    [
        pytest.param({"kind": "PodExploded", "uid": "u"}, "PodExploded", "kind", id="unknown-kind"),
        pytest.param(
            {"kind": "PodUpserted", "name": "p", "namespace": "ns"},
            "PodUpserted",
            "uid",
            id="missing-uid",
        ),
        pytest.param({"kind": "PodRemoved"}, "PodRemoved", "uid", id="missing-uid-removed"),
        pytest.param({**POD, "priority": "x"}, "PodUpserted", "$.priority", id="priority-str"),
        pytest.param({**POD, "priority": 1.5}, "PodUpserted", "$.priority", id="priority-float"),
        pytest.param({**POD, "priority": None}, "PodUpserted", "$.priority", id="priority-null"),
        pytest.param({**POD, "phase": None}, "PodUpserted", "$.phase", id="phase-null"),
        pytest.param({**POD, "phase": "Exploded"}, "PodUpserted", "$.phase", id="phase-bad"),
        pytest.param({**POD, "preemptible": None}, "PodUpserted", "$.preemptible", id="bool-null"),
        pytest.param({**POD, "preemptible": "yes"}, "PodUpserted", "$.preemptible", id="bool-str"),
        pytest.param({**POD, "labels": None}, "PodUpserted", "$.labels", id="labels-null"),
        pytest.param({**POD, "requests": None}, "PodUpserted", "$.requests", id="requests-null"),
        pytest.param({**POD, "uid": None}, "PodUpserted", "$.uid", id="uid-null"),
        pytest.param({**POD, "uid": 5}, "PodUpserted", "$.uid", id="uid-int"),
        pytest.param(
            {**POD, "requests": {"cpu": -1}}, "PodUpserted", "$.requests.cpu", id="negative-int"
        ),
        pytest.param(
            {**POD, "requests": {"cpu": "-1"}}, "PodUpserted", "$.requests.cpu", id="negative-str"
        ),
        pytest.param(
            {**POD, "requests": {"memory": -0.5}},
            "PodUpserted",
            "$.requests.memory",
            id="negative-float",
        ),
        pytest.param(
            {**POD, "requests": {"cpu": "abc"}}, "PodUpserted", "$.requests.cpu", id="unparsable"
        ),
        pytest.param(
            {**POD, "requests": {"cpu": "1.5.5"}}, "PodUpserted", "$.requests.cpu", id="1.5.5"
        ),
        pytest.param(
            {**POD, "requests": {"cpu": True}}, "PodUpserted", "$.requests.cpu", id="bool-amount"
        ),
        pytest.param(
            {**POD, "requests": {"cpu": None}}, "PodUpserted", "$.requests.cpu", id="null-amount"
        ),
        pytest.param({**POD, "requests": "4"}, "PodUpserted", "$.requests", id="requests-str"),
        pytest.param(
            {"kind": "NodeUpserted", "name": "n", "allocatable": {"memory": "8Gb"}},
            "NodeUpserted",
            "$.allocatable.memory",
            id="bad-suffix",
        ),
        pytest.param(
            {"kind": "NodeUpserted", "name": "n", "unschedulable": None},
            "NodeUpserted",
            "$.unschedulable",
            id="unschedulable-null",
        ),
        pytest.param(
            {"kind": "QuotaUpserted", "name": "q", "max": {"memory": "lots"}},
            "QuotaUpserted",
            "$.max.memory",
            id="max-unparsable",
        ),
        pytest.param(
            {"kind": "QuotaUpserted", "name": "q", "min": {"cpu": -1}},
            "QuotaUpserted",
            "$.min.cpu",
            id="min-negative",
        ),
        pytest.param(
            {"kind": "QuotaUpserted", "name": "q", "lending_limit": {"cpu": "-2"}},
            "QuotaUpserted",
            "$.lending_limit.cpu",
            id="lending-negative",
        ),
        pytest.param(
            {"kind": "QuotaUpserted", "name": "q", "borrowing_limit": {"cpu": "x"}},
            "QuotaUpserted",
            "$.borrowing_limit.cpu",
            id="borrowing-unparsable",
        ),
        pytest.param(
            {"kind": "QuotaUpserted", "name": "q", "shared_weight": {"cpu": -1}},
            "QuotaUpserted",
            "$.shared_weight.cpu",
            id="shared-weight-negative",
        ),
        pytest.param(
            {"kind": "QuotaUpserted", "name": "q", "parent": None},
            "QuotaUpserted",
            "$.parent",
            id="parent-null",
        ),
        pytest.param(
            {"kind": "QuotaUpserted", "name": "q", "min": None},
            "QuotaUpserted",
            "$.min",
            id="min-null",
        ),
        pytest.param(
            {"kind": "QuotaUpserted", "name": "q", "namespaces": None},
            "QuotaUpserted",
            "$.namespaces",
            id="namespaces-null",
        ),
        pytest.param(
            {"kind": "QuotaUpserted", "name": "q", "namespaces": "ns"},
            "QuotaUpserted",
            "$.namespaces",
            id="namespaces-str",
        ),
        pytest.param(
            {"kind": "QuotaUpserted", "name": "q", "preemption_delay_s": -1},
            "QuotaUpserted",
            "$.preemption_delay_s",
            id="delay-negative",
        ),
        pytest.param(
            {"kind": "QuotaUpserted", "name": "q", "preemption_delay_s": None},
            "QuotaUpserted",
            "$.preemption_delay_s",
            id="delay-null",
        ),
        pytest.param(
            {"kind": "QuotaUpserted", "name": "q", "preemption_delay_s": "5s"},
            "QuotaUpserted",
            "$.preemption_delay_s",
            id="delay-str",
        ),
        pytest.param(
            {"kind": "QuotaUpserted", "name": "q", "allow_lent": None},
            "QuotaUpserted",
            "$.allow_lent",
            id="allow-lent-null",
        ),
        pytest.param({"kind": "QuotaRemoved"}, "QuotaRemoved", "name", id="quota-removed-name"),
        pytest.param(
            {"kind": "NamespaceWeighted", "namespace": "ns", "weight": 0},
            "NamespaceWeighted",
            "$.weight",
            id="weight-0",
        ),
        pytest.param(
            {"kind": "NamespaceWeighted", "namespace": "ns", "weight": -3},
            "NamespaceWeighted",
            "$.weight",
            id="weight-negative",
        ),
        pytest.param(
            {"kind": "NamespaceWeighted", "namespace": "ns", "weight": 1.5},
            "NamespaceWeighted",
            "$.weight",
            id="weight-float",
        ),
        pytest.param(
            {"kind": "NamespaceWeighted", "namespace": "ns"},
            "NamespaceWeighted",
            "weight",
            id="weight-missing",
        ),
        pytest.param(
            {"kind": "SettingsChanged", "min_scaling": None},
            "SettingsChanged",
            "$.min_scaling",
            id="settings-null-bool",
        ),
        pytest.param(
            {"kind": "SettingsChanged", "revoke_after_s": None},
            "SettingsChanged",
            "$.revoke_after_s",
            id="settings-null-seconds",
        ),
        pytest.param(
            {"kind": "SettingsChanged", "reclaim_after_s": -1},
            "SettingsChanged",
            "$.reclaim_after_s",
            id="settings-negative-seconds",
        ),
        pytest.param(
            {"kind": "SettingsChanged", "quota_preemption_enabled": "true"},
            "SettingsChanged",
            "$.quota_preemption_enabled",
            id="settings-bool-str",
        ),
        pytest.param(
            {"kind": "SettingsChanged", "preemption_miss_percent": 101},
            "SettingsChanged",
            "$.preemption_miss_percent",
            id="settings-percent-over-100",
        ),
        pytest.param(
            {"kind": "SettingsChanged", "preemption_miss_percent": None},
            "SettingsChanged",
            "$.preemption_miss_percent",
            id="settings-percent-null",
        ),
    ],
)
def test_rejections_name_the_field(obj: dict[str, Any], kind: str, field: str) -> None:
    error = rejected(obj)
    assert isinstance(error, ValueError)
    assert field in str(error)
    assert field in error.reason
    assert error.kind == kind


@pytest.mark.parametrize(
    ("payload", "field"),
    [
        ('{"kind": "PodRemoved", "uid": "u"', "malformed JSON"),
        ("not json at all", "malformed JSON"),
        ("", "malformed JSON"),
        ('{"uid": "u"}', "kind"),
        ('{"kind": null, "uid": "u"}', "$.kind"),
        ('{"kind": 7, "uid": "u"}', "$.kind"),
        ("[1, 2]", "object"),
        ('"PodRemoved"', "object"),
    ],
)
def test_rejections_without_a_kind(payload: str, field: str) -> None:
    error = rejected(payload)
    assert field in str(error)
    assert error.kind is None


def test_out_of_range_number_still_reports_the_kind() -> None:
    error = rejected(
        '{"kind": "PodUpserted", "uid": "u", "name": "p", "namespace": "ns",'
        ' "requests": {"cpu": 1e400}}'
    )
    assert "$.requests" in str(error)
    assert error.kind == "PodUpserted"


def test_decision_rejection_reports_its_kind() -> None:
    error = rejected({"kind": "EvictionFailed", "eviction_id": "e1"})
    assert "error" in str(error)
    assert error.kind == "EvictionFailed"


def test_peek_kind() -> None:
    assert peek_kind('{"kind": "PodRemoved"}') == "PodRemoved"
    assert peek_kind(b'{"kind": "Whatever", "x": 1}') == "Whatever"
    assert peek_kind('{"kind": 3}') is None
    assert peek_kind("[]") is None
    assert peek_kind("{") is None


def test_facts_are_canonicalised_exactly_once() -> None:
    # The stored payload of a fact is the producer's JSON; decoding it twice
    # must give the same canonical amounts (4 cpu never becomes 4000 cpu).
    payload = json.dumps({**POD, "requests": {"cpu": 4}})
    first = decode_event(payload)
    second = decode_event(payload)
    assert first.requests == second.requests == {"cpu": 4000}
