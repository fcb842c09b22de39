"""Reconcilers on the virtual clock: DESIGN §6 rule 1 and the YuniKorn seed's cases."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from quotaledger.engine.simulate import Simulation
from quotaledger.events.model import (
    PreemptionFinished,
    PreemptionStarted,
)

G = 2**30
T0 = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def line(ts_s: float, **event: Any) -> tuple[int, bytes]:
    return (T0 + round(ts_s * 1000), msgspec.json.encode(event))


def pod(ts_s: float, uid: str, ns: str, requests: dict[str, Any], **kw: Any) -> tuple[int, bytes]:
    fields = {"phase": "Running", "node": "n1", **kw}
    return line(
        ts_s, kind="PodUpserted", uid=uid, name=uid, namespace=ns, requests=requests, **fields
    )


def run(lines: list[tuple[int, bytes]], until: int | None = None) -> Simulation:
    simulation = Simulation()
    simulation.run(
        [
            line(0, kind="SettingsChanged", quota_preemption_enabled=True, revoke_enabled=False),
            *lines,
        ],
        until=until,
    )
    return simulation


def decisions(sim: Simulation, kind: str) -> list[dict[str, Any]]:
    return [d for d in sim.decisions_json() if d["kind"] == kind]


NODE = line(0, kind="NodeUpserted", name="n1", allocatable={"cpu": 10_000, "memory": "10000Gi"})


def _rl(spec: dict[str, int] | None) -> dict[str, str] | None:
    if spec is None:
        return None
    return {
        ("memory" if k == "M" else "cpu"): (f"{v}Gi" if k == "M" else str(v))
        for k, v in spec.items()
    }


YUNIKORN_TABLE = [
    ({"M": 100}, {"M": 50}, {"M": 80}, {"M": 30}),
    (None, {"M": 50}, {"M": 80}, {"M": 30}),
    ({"M": 100, "CPU": 100}, {"M": 50, "CPU": 50}, {"M": 80, "CPU": 80}, {"M": 30, "CPU": 30}),
    ({"M": 100, "CPU": 100}, {"M": 200, "CPU": 50}, {"M": 100, "CPU": 80}, {"CPU": 30}),
    ({"M": 100}, {"M": 100, "CPU": 100}, {"M": 50, "CPU": 500}, {"CPU": 400}),
    ({"M": 100, "CPU": 100}, {"M": 50}, {"M": 80, "CPU": 100}, {"M": 30}),
    ({"M": 100}, {"CPU": 100}, {"M": 100, "CPU": 500}, {"CPU": 400}),
]


@pytest.mark.parametrize(("current", "new", "usage", "preemptable"), YUNIKORN_TABLE)
def test_yunikorn_preemptable_table(
    current: dict[str, int] | None,
    new: dict[str, int],
    usage: dict[str, int],
    preemptable: dict[str, int],
) -> None:
    """root.a.b with the seed's seven rows: the PreemptionStarted target."""
    requests = _rl(usage)
    assert requests is not None
    sim = run(
        [
            NODE,
            line(1, kind="QuotaUpserted", name="a", is_parent=True),
            line(
                1,
                kind="QuotaUpserted",
                name="b",
                parent="a",
                max=_rl(current),
                preemption_delay_s=10,
            ),
            pod(2, "p1", "b", requests),
            line(
                3, kind="QuotaUpserted", name="b", parent="a", max=_rl(new), preemption_delay_s=10
            ),
        ]
    )
    started = decisions(sim, "PreemptionStarted")
    assert len(started) == 1
    expected = {
        ("memory" if k == "M" else "cpu"): v * (G if k == "M" else 1000)
        for k, v in preemptable.items()
    }
    assert started[0]["target"] == expected
    assert started[0]["at"] == "2026-01-01T00:00:13Z"  # change at 3 s + delay 10 s
    assert started[0]["cause"] == "quota-decrease"


BASE = [
    NODE,
    line(0, kind="QuotaUpserted", name="q", min={"cpu": 2}, max={"cpu": 10}, preemption_delay_s=60),
    pod(1, "old", "q", {"cpu": 3}, created_at="2026-01-01T00:00:00Z"),
    pod(1, "mid", "q", {"cpu": 3}, created_at="2026-01-01T00:00:01Z"),
    pod(1, "young", "q", {"cpu": 3}, created_at="2026-01-01T00:00:02Z"),
]


def lower(ts: float, cpu: int, delay: float = 60, **kw: Any) -> tuple[int, bytes]:
    return line(
        ts,
        kind="QuotaUpserted",
        name="q",
        min={"cpu": 2},
        max={"cpu": cpu},
        preemption_delay_s=delay,
        **kw,
    )


def test_decrease_fires_at_deadline_and_evicts_youngest_first() -> None:
    sim = run([*BASE, lower(10, 5)])
    started = decisions(sim, "PreemptionStarted")
    assert [d["at"] for d in started] == ["2026-01-01T00:01:10Z"]
    assert started[0]["target"] == {"cpu": 4000}
    evicted = [d["pod_uid"] for d in decisions(sim, "EvictionRequested")]
    assert evicted == ["young", "mid"]  # the last victim may overshoot (rule 22)
    finished = decisions(sim, "PreemptionFinished")
    assert finished[0]["outcome"] == "complete"
    assert finished[0]["claimed"] == {"cpu": 6000}
    assert sim.projection.settled().quotas["q"].used == {"cpu": 3000}
    assert sim.result()["state"]["preemptions"] == {}


def test_decrease_then_increase_before_expiry_causes_no_preemption() -> None:
    sim = run([*BASE, lower(10, 5), lower(30, 6)])
    assert decisions(sim, "PreemptionStarted") == []
    assert sim.projection.state.decrease_deadlines == {}


def test_change_during_pending_timer_restarts_it_from_that_change() -> None:
    sim = run([*BASE, lower(10, 6), lower(40, 5)])
    started = decisions(sim, "PreemptionStarted")
    assert [d["at"] for d in started] == ["2026-01-01T00:01:40Z"]
    assert started[0]["target"] == {"cpu": 4000}


def test_preemption_never_takes_a_queue_below_its_guarantee() -> None:
    sim = run(
        [
            NODE,
            line(
                0,
                kind="QuotaUpserted",
                name="q",
                min={"cpu": 7},
                max={"cpu": 10},
                preemption_delay_s=5,
            ),
            pod(1, "a", "q", {"cpu": 3}),
            pod(1, "b", "q", {"cpu": 3}),
            pod(1, "c", "q", {"cpu": 3}),
            line(
                2,
                kind="QuotaUpserted",
                name="q",
                min={"cpu": 7},
                max={"cpu": 8},
                preemption_delay_s=5,
            ),
        ]
    )
    # used 9, max 8 -> 1 over, but min 7 allows releasing 2: one pod of 3 would leave 6 < 7
    started = decisions(sim, "PreemptionStarted")
    assert started[0]["target"] == {"cpu": 1000}
    assert decisions(sim, "EvictionRequested") == []
    finished = decisions(sim, "PreemptionFinished")
    assert finished[0]["outcome"] == "not-helpful"
    assert "guarantee" in finished[0]["reason"]
    assert sim.projection.settled().quotas["q"].used == {"cpu": 9000}


def test_guarantee_clamp_makes_an_empty_target_and_records_nothing() -> None:
    sim = run(
        [
            NODE,
            line(
                0,
                kind="QuotaUpserted",
                name="q",
                min={"cpu": 9},
                max={"cpu": 20},
                preemption_delay_s=5,
            ),
            pod(1, "a", "q", {"cpu": 9}),
            line(
                2,
                kind="QuotaUpserted",
                name="q",
                min={"cpu": 9},
                max={"cpu": 10},
                preemption_delay_s=5,
            ),
            pod(2, "b", "q", {"cpu": 1}),
        ]
    )
    assert decisions(sim, "PreemptionStarted") == []


def test_parent_decrease_is_split_by_releasable_usage() -> None:
    sim = run(
        [
            NODE,
            line(
                0,
                kind="QuotaUpserted",
                name="p",
                is_parent=True,
                min={"cpu": 4},
                max={"cpu": 100},
                preemption_delay_s=5,
            ),
            line(0, kind="QuotaUpserted", name="a", parent="p", min={"cpu": 4}),
            line(0, kind="QuotaUpserted", name="b", parent="p"),
            line(0, kind="QuotaUpserted", name="idle", parent="p"),
            *[pod(1, f"a{i}", "a", {"cpu": 1}) for i in range(10)],
            *[pod(1, f"b{i}", "b", {"cpu": 1}) for i in range(3)],
            line(
                2,
                kind="QuotaUpserted",
                name="p",
                is_parent=True,
                min={"cpu": 4},
                max={"cpu": 9},
                preemption_delay_s=5,
            ),
        ]
    )
    # used 13, max 9 -> target 4000m; releasable a: 10-4 = 6, b: 3 -> 2666.7 / 1333.3
    # largest remainder -> a 2667m (3 pods of 1 cpu), b 1333m (2 pods)
    started = decisions(sim, "PreemptionStarted")
    assert started[0]["queue"] == "p" and started[0]["target"] == {"cpu": 4000}
    targets = {d["queue"]: d["explain"]["target"] for d in decisions(sim, "EvictionRequested")}
    assert targets == {"a": {"cpu": 2667}, "b": {"cpu": 1333}}
    by_queue: dict[str, int] = {}
    for eviction in decisions(sim, "EvictionRequested"):
        by_queue[eviction["queue"]] = by_queue.get(eviction["queue"], 0) + 1
    assert by_queue == {"a": 3, "b": 2}
    assert sim.projection.settled().quotas["p"].used == {"cpu": 8000}


def test_a_second_deadline_waits_for_the_running_preemption() -> None:
    """Drive the core by hand: with a preemption running on q, q's timer is not due."""
    sim = Simulation(executor="log")
    sim.run(
        [
            line(0, kind="SettingsChanged", quota_preemption_enabled=True, revoke_enabled=False),
            *BASE[:1],
            line(
                0,
                kind="QuotaUpserted",
                name="q",
                min={"cpu": 2},
                max={"cpu": 10},
                preemption_delay_s=60,
            ),
            pod(1, "a", "q", {"cpu": 6}),
            lower(2, 5, delay=1),
        ],
        until=T0 + 2000,
    )
    now = T0 + 10_000
    # a preemption answering the deadline at 3 s (the guard admits only a
    # decision whose timer is due, DECISIONS 211) holds q; q's max is then
    # lowered again: a new deadline at 70 s, which must wait for it
    sim.append_event(
        now,
        PreemptionStarted(
            preemption_id="manual", queue="q", cause="quota-decrease", target={"cpu": 1}, basis=0
        ),
    )
    sim.append(*lower(10, 5))
    assert sim.projection.state.decrease_deadlines == {"q": T0 + 70_000}
    sim.run_timers(before=T0 + 300_000)
    assert decisions(sim, "PreemptionStarted")[-1]["preemption_id"] == "manual"
    assert len(decisions(sim, "PreemptionStarted")) == 1  # the deadline at 62 s waited
    sim.append_event(
        T0 + 100_000, PreemptionFinished(preemption_id="manual", queue="q", outcome="not-helpful")
    )
    sim.fire_due(sim.now)
    started = decisions(sim, "PreemptionStarted")
    assert [d["at"] for d in started][-1] == "2026-01-01T00:01:40Z"
    assert started[-1]["cause"] == "quota-decrease"


def test_timers_do_not_fire_while_quota_preemption_is_disabled() -> None:
    sim = Simulation()
    sim.run([line(0, kind="SettingsChanged", revoke_enabled=False), *BASE, lower(10, 5)])
    assert decisions(sim, "PreemptionStarted") == []
    state = sim.result()["state"]
    assert state["preemptions"]["q"]["deadline"] == "2026-01-01T00:01:10Z"
    # the overdue deadline fires as soon as the setting turns on (rule 19)
    sim.run([line(500, kind="SettingsChanged", quota_preemption_enabled=True)])
    assert [d["at"] for d in decisions(sim, "PreemptionStarted")] == ["2026-01-01T00:08:20Z"]


def test_simulate_is_deterministic() -> None:
    first = run([*BASE, lower(10, 5)]).result()
    second = run([*BASE, lower(10, 5)]).result()
    assert first == second


def reclaim_run(lines: list[tuple[int, bytes]]) -> Simulation:
    simulation = Simulation()
    simulation.run(
        [line(0, kind="SettingsChanged", reclaim_after_s=30, revoke_after_s=3600), *lines]
    )
    return simulation


def test_starving_pod_reclaims_nearest_owing_quota_first() -> None:
    """Cousins under another department give only after siblings (§8 rule 32)."""
    sim = reclaim_run(
        [
            line(0, kind="NodeUpserted", name="n1", allocatable={"cpu": 12}),
            line(0, kind="QuotaUpserted", name="d1", is_parent=True, min={"cpu": 6}),
            line(0, kind="QuotaUpserted", name="d2", is_parent=True, min={"cpu": 6}),
            line(0, kind="QuotaUpserted", name="a", parent="d1", min={"cpu": 3}),
            line(0, kind="QuotaUpserted", name="sib", parent="d1", min={"cpu": 3}),
            line(0, kind="QuotaUpserted", name="far", parent="d2", min={"cpu": 6}),
            *[pod(1, f"sib{i}", "sib", {"cpu": 1}, priority=5) for i in range(5)],
            *[pod(1, f"far{i}", "far", {"cpu": 1}, priority=0) for i in range(7)],
            pod(60, "want", "a", {"cpu": 2}, phase="Pending", node=None),
        ]
    )
    started = decisions(sim, "PreemptionStarted")
    assert len(started) == 1
    assert started[0]["cause"] == "reclaim" and started[0]["queue"] == "a"
    assert started[0]["pod_uid"] == "want" and started[0]["target"] == {"cpu": 2000}
    assert started[0]["at"] == "2026-01-01T00:01:30Z"  # pending since 60 s + 30 s
    evicted = [
        (d["queue"], d["explain"]["sort_key"]["common_ancestor_depth"])
        for d in decisions(sim, "EvictionRequested")
    ]
    # the sibling (common ancestor d1, depth 1) gives before the cousin (root, depth 0),
    # even though the cousin's pods have lower priority; but sib owes only 1 cpu
    # (used 5, runtime 4), so the second cpu comes from the cousin
    assert evicted == [("sib", 1), ("far", 0)]
    assert [d["explain"]["owed"] for d in decisions(sim, "EvictionRequested")] == [
        {"cpu": 1000},
        {"cpu": 1000},
    ]
    assert decisions(sim, "PreemptionFinished")[0]["outcome"] == "complete"


def test_reclaim_takes_no_more_than_a_quota_owes_and_records_nothing_without_victims() -> None:
    lines = [
        line(0, kind="NodeUpserted", name="n1", allocatable={"cpu": 10}),
        line(0, kind="QuotaUpserted", name="a", min={"cpu": 5}),
        line(0, kind="QuotaUpserted", name="b", min={"cpu": 5}),
        *[pod(1, f"b{i}", "b", {"cpu": 1}, preemptible=(i < 6)) for i in range(10)],
        pod(60, "want", "a", {"cpu": 5}, phase="Pending", node=None),
    ]
    sim = reclaim_run(lines)
    evictions = decisions(sim, "EvictionRequested")
    assert len(evictions) == 5  # b owed 10 - 5 = 5; 6 preemptible pods
    assert all(d["explain"]["owed"] == {"cpu": 5000} for d in evictions)
    # nobody preemptible -> nothing recorded at all (rule 33)
    sim = reclaim_run(
        [
            *lines[:3],
            *[pod(1, f"b{i}", "b", {"cpu": 1}, preemptible=False) for i in range(10)],
            lines[-1],
        ]
    )
    assert [d for d in decisions(sim, "PreemptionStarted") if d["cause"] == "reclaim"] == []


def test_revoke_never_enforces_a_lowered_max() -> None:
    """DESIGN §6 rule 2: without quota-decrease preemption a lowered max binds new
    admissions only; min(used, max) ≤ runtime, so the quota does not owe."""
    sim = Simulation()
    sim.run(
        [
            line(0, kind="SettingsChanged", revoke_after_s=10),
            NODE,
            line(0, kind="QuotaUpserted", name="q", min={"cpu": 2}, max={"cpu": 10}),
            *[pod(1, f"r{i}", "q", {"cpu": 2}) for i in range(4)],
            line(5, kind="QuotaUpserted", name="q", min={"cpu": 2}, max={"cpu": 5}),
            line(600, kind="NodeUpserted", name="n2", allocatable={"cpu": 1}),
        ]
    )
    assert decisions(sim, "PreemptionStarted") == []
    state = sim.projection.settled()
    assert state.quotas["q"].used == {"cpu": 8000}
    assert state.quotas["q"].runtime == {"cpu": 5000}
    assert state.owing_since == {}
