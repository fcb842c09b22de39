"""Each reconciler's plan on a literal state (DESIGN §6, §8 rules 22-25, 30-32).

A tree, some pods, the expected victims: the way the seed documents tell it.
Every pod runs on node ``n`` and requests cpu only, in cores.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from quotaledger.events.model import Event, NodeUpserted, PodUpserted, QuotaUpserted
from quotaledger.projections.plans import decrease_plan, overuse_plan, reclaim_plan, split_target
from quotaledger.projections.state import ProjectedState
from tests.scenarios import fold

#: Borrowing off: a borrower's runtime is its min (§5 runtime step 3, weight 0).
NO_BORROWING = {"cpu": 0}


def at(hour: int, minute: int = 0) -> datetime:
    return datetime(2026, 1, 1, hour, minute, tzinfo=UTC)


def pod(uid: str, quota: str, cpu: int, **kw: Any) -> PodUpserted:
    fields: dict[str, Any] = {"phase": "Running", "node": "n", **kw}
    return PodUpserted(uid=uid, name=uid, namespace=quota, requests={"cpu": cpu}, **fields)


def state_of(*events: Event, cpu: int = 100) -> ProjectedState:
    return fold([NodeUpserted(name="n", allocatable={"cpu": cpu}), *events]).settled()


# ------------------------------------------------------------------ quota decrease


def test_decrease_victims_non_originator_lower_priority_preemptable_younger_then_uid() -> None:
    """DESIGN §6 rule 1, §8 rule 25: max lowered to 0 takes every pod, so the
    victims come out in the full order."""
    state = state_of(
        QuotaUpserted(name="team", max={"cpu": 0}),
        pod("orig", "team", 1, originator=True),
        pod("hi", "team", 1, priority=5),
        pod("no-preempt", "team", 1, allow_preemption=False),
        pod("old", "team", 1, created_at=at(9)),
        pod("young", "team", 1, created_at=at(10)),
        pod("never-stamped", "team", 1),
        pod("b-tie", "team", 1, created_at=at(8)),
        pod("a-tie", "team", 1, created_at=at(8)),
    )
    plan = decrease_plan(state, "team")
    assert plan is not None and plan.cause == "quota-decrease"
    assert plan.target == {"cpu": 8}
    assert [v.pod_uid for v in plan.victims] == [
        "young",  # priority 0, preemption allowed: youngest first
        "old",
        "a-tie",  # same created_at: uid
        "b-tie",
        "never-stamped",  # null created_at counts as oldest
        "no-preempt",  # allow_preemption false after those that allow it
        "hi",  # higher priority
        "orig",  # originators last
    ]
    assert [v.explain["rank"] for v in plan.victims] == list(range(8))


def test_decrease_stops_once_the_target_is_met_and_the_last_victim_may_overshoot() -> None:
    """§8 rule 22: used 10, max 7: target 3; victims 2 + 2 claim 4."""
    state = state_of(
        QuotaUpserted(name="team", max={"cpu": 7}),
        pod("a", "team", 2, created_at=at(3)),
        pod("b", "team", 2, created_at=at(2)),
        pod("c", "team", 6, created_at=at(1)),
    )
    plan = decrease_plan(state, "team")
    assert plan is not None
    assert plan.target == {"cpu": 3}
    assert [v.pod_uid for v in plan.victims] == ["a", "b"]


def test_decrease_skips_a_pod_that_would_break_the_leafs_guarantee() -> None:
    """§8 rule 23: team (min 6) uses 10, max lowered to 7: target 3. The 5-core
    pod first in line would leave 5 < 6, so it is skipped and the two 2-core
    pods go."""
    state = state_of(
        QuotaUpserted(name="team", min={"cpu": 6}, max={"cpu": 7}),
        pod("big", "team", 5),
        pod("small-1", "team", 2, priority=1),
        pod("small-2", "team", 2, priority=1),
        pod("other", "team", 1, priority=2),
    )
    plan = decrease_plan(state, "team")
    assert plan is not None
    assert plan.target == {"cpu": 3}
    assert [v.pod_uid for v in plan.victims] == ["small-1", "small-2"]


def test_decrease_skips_a_pod_that_would_break_an_ancestors_guarantee() -> None:
    """§8 rule 23: org (min 8) holds team (6) and ops (4); team's max drops to
    2: target 4, clamped by org to 10 − 8 = 2. The 3-core pod would leave org
    at 7, so the two 1-core pods go."""
    state = state_of(
        QuotaUpserted(name="org", is_parent=True, min={"cpu": 8}),
        QuotaUpserted(name="team", parent="org", max={"cpu": 2}),
        QuotaUpserted(name="ops", parent="org"),
        pod("t3", "team", 3),
        pod("t1", "team", 1, priority=1),
        pod("t1b", "team", 1, priority=1),
        pod("t1c", "team", 1, priority=1),
        pod("o4", "ops", 4),
    )
    plan = decrease_plan(state, "team")
    assert plan is not None
    assert plan.target == {"cpu": 2}
    assert [v.pod_uid for v in plan.victims] == ["t1", "t1b"]


def test_decrease_ignores_daemonset_pods_pods_without_a_node_and_other_resources() -> None:
    state = state_of(
        QuotaUpserted(name="team", max={"cpu": 0, "gpu": 10}),
        pod("daemon", "team", 1, daemonset=True),
        pod("no-cpu", "team", 0, priority=-1),
        pod("nowhere", "team", 1, node=None),
        pod("plain", "team", 1, priority=3),
    )
    plan = decrease_plan(state, "team")
    assert plan is not None
    assert [v.pod_uid for v in plan.victims] == ["plain"]


def test_parent_target_is_split_by_releasable_usage_depth_first_in_name_order() -> None:
    """§8 rule 24: org's 6 cores are split over what each child holds above its
    min — east (a parent: 6 above its min), west (3) — skipping idle and occupied
    children; east splits its share the same way among its leaves."""
    state = state_of(
        QuotaUpserted(name="org", is_parent=True, min={"cpu": 3}),
        QuotaUpserted(name="west", parent="org", min={"cpu": 1}),
        QuotaUpserted(name="east", parent="org", is_parent=True, min={"cpu": 2}),
        QuotaUpserted(name="e1", parent="east", min={"cpu": 2}),
        QuotaUpserted(name="e2", parent="east"),
        QuotaUpserted(name="idle", parent="org"),
        QuotaUpserted(name="busy", parent="org"),
        pod("w", "west", 4),
        pod("e1", "e1", 4),
        pod("e2", "e2", 4),
        pod("b", "busy", 9),
    )
    state.occupied["busy"] = "some-preemption"
    # org: east 8 − 2 = 6, west 4 − 1 = 3 → 6 × 6/9 = 4, 6 × 3/9 = 2
    # east: e1 4 − 2 = 2, e2 4 → 4 × 2/6 = 1.33, 4 × 4/6 = 2.67 → 1 + 3 (largest remainder)
    assert split_target(state, "org", {"cpu": 6}) == [
        ("e1", {"cpu": 1}),
        ("e2", {"cpu": 3}),
        ("west", {"cpu": 2}),
    ]


def test_split_ties_go_to_the_smaller_name_and_unreleasable_children_get_nothing() -> None:
    state = state_of(
        QuotaUpserted(name="org", is_parent=True, min={"cpu": 2}),
        QuotaUpserted(name="b", parent="org"),
        QuotaUpserted(name="a", parent="org"),
        QuotaUpserted(name="c", parent="org", min={"cpu": 2}),
        pod("pa", "a", 2),
        pod("pb", "b", 2),
        pod("pc", "c", 2),
    )
    # a and b hold 2 each above their min, c holds nothing above its min
    assert split_target(state, "org", {"cpu": 1}) == [("a", {"cpu": 1})]
    assert split_target(state, "org", {"cpu": 3}) == [("a", {"cpu": 2}), ("b", {"cpu": 1})]


# ------------------------------------------------------------------ overuse revoke


def test_revoke_removes_least_important_first_then_adds_back_what_still_fits() -> None:
    """DESIGN §6 rule 2: borrower (runtime 10) uses 16. Removing the priority-0
    pod (4) leaves 12, removing the priority-1 pod (6) leaves 6: it fits. Adding
    back the most important removed first: the 6 does not fit (12 > 10), the 4
    does (10). Only the priority-1 pod is evicted."""
    state = state_of(
        QuotaUpserted(name="lender", min={"cpu": 10}),
        QuotaUpserted(name="borrower", min={"cpu": 10}),
        pod("lender-wants", "lender", 10, phase="Pending", node=None),
        pod("low", "borrower", 4, priority=0),
        pod("mid", "borrower", 6, priority=1),
        pod("high", "borrower", 6, priority=2),
        cpu=20,
    )
    assert state.quotas["borrower"].runtime == {"cpu": 10}
    plan = overuse_plan(state, "borrower")
    assert plan is not None and plan.cause == "overuse"
    assert plan.target == {"cpu": 6}
    assert [v.pod_uid for v in plan.victims] == ["mid"]


def test_revoke_takes_later_started_pods_first_and_skips_unpreemptible_ones() -> None:
    """Runtime 10, used 12: the pinned pod started last but is not preemptible;
    of the two equal pods the later started goes (§8 rule 29)."""
    state = state_of(
        QuotaUpserted(name="lender", min={"cpu": 10}),
        QuotaUpserted(name="borrower", min={"cpu": 10}),
        pod("lender-wants", "lender", 10, phase="Pending", node=None),
        pod("base", "borrower", 6, priority=5),
        pod("pinned", "borrower", 2, created_at=at(9), preemptible=False),
        pod("older", "borrower", 2, created_at=at(2)),
        pod("newer", "borrower", 2, created_at=at(3)),
        cpu=20,
    )
    plan = overuse_plan(state, "borrower")
    assert plan is not None
    assert plan.target == {"cpu": 2}
    assert [v.pod_uid for v in plan.victims] == ["newer"]


def test_revoke_of_a_quota_that_no_longer_owes_is_no_plan() -> None:
    state = state_of(QuotaUpserted(name="team", min={"cpu": 10}), pod("p", "team", 4), cpu=20)
    assert overuse_plan(state, "team") is None


# ------------------------------------------------------------------ starvation reclaim


def reclaim_tree(*extra: Event) -> ProjectedState:
    """root → org (min 12) → east (min 8) → e1 (min 5), e2 (min 2); org → west
    (min 4); root → far (min 4). Borrowing is off, so each borrower's runtime is
    its min. e1 has a 3-core pod pending; the cluster (24 cores) is full."""
    return state_of(
        QuotaUpserted(name="org", is_parent=True, min={"cpu": 12}, shared_weight=NO_BORROWING),
        QuotaUpserted(
            name="east", parent="org", is_parent=True, min={"cpu": 8}, shared_weight=NO_BORROWING
        ),
        QuotaUpserted(name="e1", parent="east", min={"cpu": 5}),
        QuotaUpserted(name="e2", parent="east", min={"cpu": 2}, shared_weight=NO_BORROWING),
        QuotaUpserted(name="west", parent="org", min={"cpu": 4}, shared_weight=NO_BORROWING),
        QuotaUpserted(name="far", min={"cpu": 4}, shared_weight=NO_BORROWING),
        pod("starving", "e1", 3, phase="Pending", node=None),
        *extra,
        cpu=24,
    )


def test_reclaim_takes_from_the_nearest_owing_quota_first() -> None:
    """§8 rule 32: the sibling e2 (common ancestor east, depth 2) gives before
    the cousin west (org, depth 1) before far (root, depth 0), whatever their
    pods' priorities; e2 gives no more than it owes (4 − 2 = 2)."""
    state = reclaim_tree(
        pod("e2-young", "e2", 2, priority=5, created_at=at(9)),
        pod("e2-important", "e2", 2, priority=9),
        pod("west-pod", "west", 3, priority=5),
        pod("west-pod-2", "west", 3, priority=5),
        pod("far-pod", "far", 14, priority=0),
    )
    assert {name: state.quotas[name].runtime for name in ("e1", "e2", "west", "far")} == {
        "e1": {"cpu": 3},
        "e2": {"cpu": 2},
        "west": {"cpu": 4},
        "far": {"cpu": 4},
    }
    plan = reclaim_plan(state, "starving")
    assert plan is not None and plan.cause == "reclaim"
    assert plan.queue == "e1" and plan.pod_uid == "starving"
    assert plan.target == {"cpu": 3}
    assert [(v.pod_uid, v.explain["sort_key"]["common_ancestor_depth"]) for v in plan.victims] == [
        ("e2-young", 2),  # the sibling's lower-priority pod
        ("west-pod", 1),  # e2 has given what it owed: the cousin next
    ]


def test_reclaim_order_within_a_quota_is_lower_priority_later_start_then_uid() -> None:
    state = reclaim_tree(
        pod("e2-busy", "e2", 2, priority=1),
        pod("e2-other", "e2", 2, priority=1),
        pod("w-b", "west", 1, created_at=at(8)),
        pod("w-a", "west", 1, created_at=at(8)),
        pod("w-late", "west", 1, created_at=at(9)),
        pod("w-high", "west", 3, priority=2),
        pod("far-pod", "far", 14),
    )
    # e2 owes 2: e2-busy (uid before e2-other) gives it; then west, lower
    # priority and later start first: w-late covers the last core
    plan = reclaim_plan(state, "starving")
    assert plan is not None
    assert [v.pod_uid for v in plan.victims] == ["e2-busy", "w-late"]


def test_no_reclaim_while_free_capacity_covers_the_pod() -> None:
    state = reclaim_tree(pod("e2-pod", "e2", 4), pod("far-pod", "far", 8))
    assert reclaim_plan(state, "starving") is None
