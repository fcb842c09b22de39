"""DESIGN §5/§8 rules and examples, as literal scenarios."""

from __future__ import annotations

from quotaledger.events.model import (
    NamespaceWeighted,
    NodeRemoved,
    NodeUpserted,
    PodRemoved,
    PodUpserted,
    QuotaRemoved,
    QuotaUpserted,
    SettingsChanged,
)
from quotaledger.projections import state_json
from tests.scenarios import fold, state_of

GPU = "nvidia.com/gpu"


def pod(uid: str, ns: str, requests: dict[str, int], **kw: object) -> PodUpserted:
    return PodUpserted(uid=uid, name=uid, namespace=ns, requests=requests, **kw)  # type: ignore[arg-type]


def koordinator_abcd(total: int = 100) -> list[object]:
    events: list[object] = [NodeUpserted(name="n", allocatable={GPU: total})]
    for name, mn, req, weight in [
        ("A", 10, 5, 40),
        ("B", 15, 20, 60),
        ("C", 20, 40, 50),
        ("D", 15, 70, 80),
    ]:
        events.append(QuotaUpserted(name=name, min={GPU: mn}, shared_weight={GPU: weight}))
        events.append(pod(f"p{name}", name, {GPU: req}))
    return events


def runtimes(state: dict, names: str, key: str = GPU) -> list[int]:
    return [state["quotas"][n]["runtime"].get(key, 0) for n in names]


def test_koordinator_seed_example_runtime_5_20_35_40() -> None:
    state = state_of(koordinator_abcd())
    assert runtimes(state, "ABCD") == [5, 20, 35, 40]
    assert [state["quotas"][n]["limited_request"][GPU] for n in "ABCD"] == [5, 20, 40, 70]


def test_same_example_in_millicores_under_a_parent() -> None:
    events = [
        NodeUpserted(name="n", allocatable={"cpu": 500}),
        QuotaUpserted(name="P", is_parent=True, min={"cpu": 60}, max={"cpu": 100}),
    ]
    for name, mn, req, weight in [
        ("A", 10, 5, 40),
        ("B", 15, 20, 60),
        ("C", 20, 40, 50),
        ("D", 15, 70, 80),
    ]:
        events.append(
            QuotaUpserted(name=name, parent="P", min={"cpu": mn}, shared_weight={"cpu": weight})
        )
        events.append(pod(f"p{name}", name, {"cpu": req}))
    state = state_of(events)
    assert state["quotas"]["P"]["runtime"] == {"cpu": 100}
    assert runtimes(state, "ABCD", "cpu") == [5, 20, 35, 40]


def test_fair_share_seed_8_cpu_5_10_equal_weight_gives_4_4() -> None:
    state = state_of(
        [
            NodeUpserted(name="n", allocatable={"cpu": 8000}),
            QuotaUpserted(
                name="q", min={"cpu": 8000}, max={"cpu": 8000}, namespaces=["ns1", "ns2"]
            ),
            pod("a", "ns1", {"cpu": 5000}),
            pod("b", "ns2", {"cpu": 10000}),
        ]
    )
    namespaces = state["quotas"]["q"]["namespaces"]
    assert state["quotas"]["q"]["runtime"] == {"cpu": 8000}
    assert namespaces["ns1"]["fair_share"] == {"cpu": 4000}
    assert namespaces["ns2"]["fair_share"] == {"cpu": 4000}
    assert namespaces["ns1"]["weight"] == 1


def test_fair_share_follows_namespace_weights() -> None:
    state = state_of(
        [
            NodeUpserted(name="n", allocatable={"cpu": 8000}),
            QuotaUpserted(
                name="q", min={"cpu": 8000}, max={"cpu": 8000}, namespaces=["ns1", "ns2"]
            ),
            NamespaceWeighted(namespace="ns2", weight=3),
            pod("a", "ns1", {"cpu": 5000}),
            pod("b", "ns2", {"cpu": 10000}),
        ]
    )
    namespaces = state["quotas"]["q"]["namespaces"]
    assert namespaces["ns1"]["fair_share"] == {"cpu": 2000}
    assert namespaces["ns2"]["fair_share"] == {"cpu": 6000}


def test_kueue_lending_limit_example_available_29_and_30() -> None:
    state = state_of(
        [
            QuotaUpserted(name="parent", is_parent=True, min={"cpu": 30}),
            QuotaUpserted(name="leaf1", parent="parent", min={"cpu": 10}),
            QuotaUpserted(name="leaf2", parent="parent", min={"cpu": 10}, lending_limit={"cpu": 9}),
        ]
    )
    quotas = state["quotas"]
    assert quotas["leaf1"]["available"] == {"cpu": 29}
    assert quotas["leaf2"]["available"] == {"cpu": 30}
    assert quotas["parent"]["available"] == {"cpu": 29}


def test_available_borrowing_limit_caps_inherited_headroom() -> None:
    state = state_of(
        [
            QuotaUpserted(name="a", min={"cpu": 10}, borrowing_limit={"cpu": 2}),
            QuotaUpserted(name="b", min={"cpu": 10}),
            pod("x", "a", {"cpu": 4}, node="n"),
        ]
    )
    # a: subtree 10, used 4 -> may reach 10 + 2 = 12, so 8 more
    assert state["quotas"]["a"]["available"] == {"cpu": 8}
    assert state["quotas"]["b"]["available"] == {"cpu": 16}


def test_min_scaling_scales_mins_when_total_is_short() -> None:
    events = [
        NodeUpserted(name="n", allocatable={"cpu": 50}),
        QuotaUpserted(name="a", min={"cpu": 60}),
        QuotaUpserted(name="b", min={"cpu": 40}),
        pod("x", "a", {"cpu": 100}),
        pod("y", "b", {"cpu": 100}),
    ]
    state = state_of(events)
    assert state["quotas"]["a"]["effective_min"] == {"cpu": 30}
    assert state["quotas"]["b"]["effective_min"] == {"cpu": 20}
    assert runtimes(state, "ab", "cpu") == [30, 20]
    unscaled = state_of([SettingsChanged(min_scaling=False), *events])
    assert unscaled["quotas"]["a"]["effective_min"] == {"cpu": 60}
    assert runtimes(unscaled, "ab", "cpu") == [60, 40]


def test_request_masked_to_max_keys_and_limited_by_max_and_borrowing() -> None:
    state = state_of(
        [
            QuotaUpserted(name="q", min={"cpu": 2}, max={"cpu": 10}, borrowing_limit={"cpu": 3}),
            pod("x", "q", {"cpu": 20, "memory": 7}, node="n"),
        ]
    )
    q = state["quotas"]["q"]
    assert q["request"] == {"cpu": 20}
    assert q["limited_request"] == {"cpu": 5}
    assert q["used"] == {"cpu": 20, "memory": 7}


def test_allow_lent_false_reserves_min_as_request() -> None:
    state = state_of(
        [
            NodeUpserted(name="n", allocatable={"cpu": 100}),
            QuotaUpserted(name="keeper", min={"cpu": 30}, allow_lent=False),
            QuotaUpserted(name="partial", min={"cpu": 30}, lending_limit={"cpu": 10}),
            QuotaUpserted(name="greedy", min={"cpu": 0}),
            pod("g", "greedy", {"cpu": 100}),
        ]
    )
    q = state["quotas"]
    assert q["keeper"]["request"] == {"cpu": 30}
    assert q["partial"]["request"] == {"cpu": 20}
    assert q["greedy"]["runtime"] == {"cpu": 50}


def test_cluster_total_subtracts_system_and_default_used_and_floors_at_zero() -> None:
    state = state_of(
        [
            NodeUpserted(name="n", allocatable={"cpu": 10}),
            pod("k", "kube-system", {"cpu": 3}, node="n"),
            pod("d", "nowhere", {"cpu": 4}, node="n", phase="Running"),
            pod("d2", "nowhere", {"cpu": 100}),
            pod("m", "nowhere", {"memory": 5}, node="n"),
        ]
    )
    cluster = state["cluster"]
    assert cluster["system_used"] == {"cpu": 3}
    assert cluster["default_used"] == {"cpu": 4, "memory": 5}
    assert cluster["total"] == {"cpu": 3}
    assert state["quotas"]["default"]["request"] == {"cpu": 104, "memory": 5}
    assert state["quotas"]["system"]["pods"] == ["k"]


def test_pod_association_first_match_rule_7() -> None:
    state = state_of(
        [
            QuotaUpserted(name="team", namespaces=["web", "other"]),
            QuotaUpserted(name="web"),
            QuotaUpserted(name="parent", is_parent=True),
            pod("by-field", "web", {"cpu": 1}, quota="team"),
            pod("by-system-field", "web", {"cpu": 1}, quota="system"),
            pod("kube", "kube-system", {"cpu": 1}, quota="missing"),
            pod("by-name", "web", {"cpu": 1}),
            pod("by-list", "other", {"cpu": 1}, quota="missing"),
            pod("to-parent", "x", {"cpu": 1}, quota="parent"),
            pod("nothing", "x", {"cpu": 1}),
            pod("done", "web", {"cpu": 1}, phase="Succeeded"),
        ]
    )
    q = state["quotas"]
    assert q["team"]["pods"] == ["by-field", "by-list"]
    assert q["system"]["pods"] == ["by-system-field", "kube"]
    assert q["web"]["pods"] == ["by-name"]
    assert q["default"]["pods"] == ["nothing", "to-parent"]


def test_namespace_list_claims_pods_and_moves_them_on_change() -> None:
    events = [QuotaUpserted(name="team", namespaces=["ns"]), pod("a", "ns", {"cpu": 1})]
    assert state_of(events)["quotas"]["team"]["pods"] == ["a"]
    moved = state_of([*events, QuotaUpserted(name="team", namespaces=[])])
    assert moved["quotas"]["team"]["pods"] == []
    assert moved["quotas"]["default"]["pods"] == ["a"]


def test_orphans_are_kept_out_of_sums_until_parent_appears() -> None:
    events = [
        NodeUpserted(name="n", allocatable={"cpu": 100}),
        QuotaUpserted(name="child", parent="later", min={"cpu": 5}),
        pod("a", "child", {"cpu": 7}, node="n"),
    ]
    state = state_of(events)
    child = state["quotas"]["child"]
    assert child["orphan"] is True
    assert child["runtime"] == {} and child["available"] == {} and child["effective_min"] == {}
    assert child["used"] == {"cpu": 7}
    joined = state_of([*events, QuotaUpserted(name="later", is_parent=True, min={"cpu": 5})])
    assert joined["quotas"]["child"]["orphan"] is False
    assert joined["quotas"]["later"]["used"] == {"cpu": 7}
    assert joined["quotas"]["child"]["runtime"] == {"cpu": 7}
    # a parent that cannot cover its waiting orphans' mins is rejected
    short = state_of([*events, QuotaUpserted(name="later", is_parent=True, min={"cpu": 4})])
    assert "later" not in short["quotas"]
    assert short["rejected"][-1]["kind"] == "QuotaUpserted"


def reasons(events: list[object]) -> list[str]:
    return [item["reason"] for item in state_of(events)["rejected"]]


def test_validation_rules_reject_and_keep_last_valid_config() -> None:
    base = [
        QuotaUpserted(name="p", is_parent=True, min={"cpu": 10}),
        QuotaUpserted(name="c", parent="p", is_parent=True, min={"cpu": 6}),
        QuotaUpserted(name="leaf", min={"cpu": 1}),
        pod("x", "leaf", {"cpu": 1}),
    ]
    assert reasons(base) == []
    cases = {
        "min.cpu is positive but max does not list": QuotaUpserted(
            name="a", min={"cpu": 1}, max={"gpu": 1}
        ),
        "exceeds max": QuotaUpserted(name="a", min={"cpu": 5}, max={"cpu": 4}),
        "not a parent quota": QuotaUpserted(name="a", parent="leaf"),
        "cycle": QuotaUpserted(name="p", parent="c", is_parent=True, min={"cpu": 10}),
        "does not cover": QuotaUpserted(name="c2", parent="p", min={"cpu": 5}),
        "has children": QuotaUpserted(name="p", min={"cpu": 10}),
        "active pods": QuotaUpserted(name="leaf", is_parent=True, min={"cpu": 1}),
        "built in": QuotaUpserted(name="system"),
        "preemption_delay_s": QuotaUpserted(
            name="a", min={"cpu": 4}, max={"cpu": 4}, preemption_delay_s=1
        ),
    }
    for needle, event in cases.items():
        found = reasons([*base, event])
        assert len(found) == 1 and needle in found[0], (needle, found)
    removals = {
        "unknown quota": QuotaRemoved(name="ghost"),
        "has children": QuotaRemoved(name="p"),
        "active pods": QuotaRemoved(name="leaf"),
        "built in": QuotaRemoved(name="default"),
    }
    for needle, event in removals.items():
        found = reasons([*base, event])
        assert len(found) == 1 and needle in found[0], (needle, found)
    # the parent side of rule 14: lowering p's min below its children's sum
    assert (
        "does not cover"
        in reasons([*base, QuotaUpserted(name="p", is_parent=True, min={"cpu": 5})])[0]
    )
    kept = state_of([*base, QuotaUpserted(name="c", parent="p", is_parent=True, min={"cpu": 11})])
    assert kept["quotas"]["c"]["min"] == {"cpu": 6}


def test_namespace_claimed_twice_is_rejected() -> None:
    found = reasons(
        [QuotaUpserted(name="a", namespaces=["ns"]), QuotaUpserted(name="b", namespaces=["ns"])]
    )
    assert len(found) == 1 and "already belongs to quota 'a'" in found[0]


def test_default_can_be_configured_but_stays_out_of_runtime() -> None:
    state = state_of(
        [
            NodeUpserted(name="n", allocatable={"cpu": 10}),
            QuotaUpserted(name="default", max={"cpu": 3}),
            pod("x", "ns", {"cpu": 5}, node="n"),
        ]
    )
    d = state["quotas"]["default"]
    assert d["max"] == {"cpu": 3} and d["runtime"] == {} and d["used"] == {"cpu": 5}
    assert "must have parent root" in reasons([QuotaUpserted(name="default", is_parent=True)])[0]


def test_removal_of_pods_nodes_and_unknown_names() -> None:
    state = state_of(
        [
            NodeUpserted(name="n", allocatable={"cpu": 10}),
            NodeRemoved(name="n"),
            NodeRemoved(name="ghost"),
            pod("a", "ns", {"cpu": 1}, node="n"),
            PodRemoved(uid="a"),
            PodRemoved(uid="ghost"),
        ]
    )
    assert state["rejected"] == []
    assert state["cluster"]["allocatable"] == {}
    assert state["quotas"]["default"]["pods"] == []


def test_used_counts_pods_on_removed_nodes_rule_12() -> None:
    state = state_of(
        [
            QuotaUpserted(name="q"),
            pod("a", "q", {"cpu": 2}, node="gone", phase="Running"),
            pod("b", "q", {"cpu": 3}, phase="Running"),
        ]
    )
    assert state["quotas"]["q"]["used"] == {"cpu": 2}
    assert state["quotas"]["q"]["request"] == {"cpu": 5}


def test_quota_decrease_timer_arms_resets_and_disarms() -> None:
    base = [
        QuotaUpserted(name="q", min={"cpu": 1}, max={"cpu": 10}, preemption_delay_s=30),
        pod("a", "q", {"cpu": 8}, node="n", phase="Running"),
    ]
    p = fold(
        [*base, QuotaUpserted(name="q", min={"cpu": 1}, max={"cpu": 5}, preemption_delay_s=30)],
        ts_step=1000,
    )
    assert p.state.decrease_deadlines == {"q": 3000 + 30_000}
    state = state_json(p.state)
    assert state["preemptions"]["q"] == {"deadline": "1970-01-01T00:00:33Z", "running": None}
    # a later change resets from that change
    p2 = fold(
        [
            *base,
            QuotaUpserted(name="q", min={"cpu": 1}, max={"cpu": 5}, preemption_delay_s=30),
            QuotaUpserted(name="q", min={"cpu": 1}, max={"cpu": 4}, preemption_delay_s=30),
        ],
        ts_step=1000,
    )
    assert p2.state.decrease_deadlines == {"q": 4000 + 30_000}
    # an increase only: disarmed
    p3 = fold(
        [
            *base,
            QuotaUpserted(name="q", min={"cpu": 1}, max={"cpu": 5}, preemption_delay_s=30),
            QuotaUpserted(name="q", min={"cpu": 1}, max={"cpu": 6}, preemption_delay_s=30),
        ],
        ts_step=1000,
    )
    assert p3.state.decrease_deadlines == {}
    # used fits the new max: disarmed; delay 0: disarmed
    assert (
        fold(
            [*base, QuotaUpserted(name="q", min={"cpu": 1}, max={"cpu": 8}, preemption_delay_s=30)]
        ).state.decrease_deadlines
        == {}
    )
    assert (
        fold(
            [*base, QuotaUpserted(name="q", min={"cpu": 1}, max={"cpu": 5})]
        ).state.decrease_deadlines
        == {}
    )
