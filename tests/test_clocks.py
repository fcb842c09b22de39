"""Overuse clocks (DESIGN §6 rule 2, §8 rules 28-29; DECISIONS 13): the fold's
incremental per-second sampling equals a brute-force sampler that recomputes
everything at every second boundary."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from quotaledger.events.model import (
    Event,
    LedgerOpened,
    NodeUpserted,
    PodRemoved,
    PodUpserted,
    QuotaUpserted,
)
from quotaledger.projections import Projection
from quotaledger.projections.clocks import free_capacity, is_owing, is_starving
from quotaledger.projections.snapshot import dump, load

LEAVES = ["a", "b", "c"]

running_pod = st.builds(
    PodUpserted,
    uid=st.sampled_from([f"p{i}" for i in range(10)]),
    name=st.just("p"),
    namespace=st.sampled_from(LEAVES),
    requests=st.fixed_dictionaries({"cpu": st.integers(1, 8)}),
    phase=st.just("Running"),
    node=st.just("n"),
)
pending_pod = st.builds(
    PodUpserted,
    uid=st.sampled_from([f"w{i}" for i in range(6)]),
    name=st.just("w"),
    namespace=st.sampled_from(LEAVES),
    requests=st.fixed_dictionaries({"cpu": st.integers(1, 4)}),
    phase=st.just("Pending"),
)
contended = st.lists(
    st.one_of(
        running_pod,
        running_pod,
        pending_pod,
        st.builds(PodRemoved, uid=st.sampled_from([f"p{i}" for i in range(10)] + ["w0", "w1"])),
        st.builds(
            QuotaUpserted,
            name=st.sampled_from(LEAVES),
            min=st.just({"cpu": 3}),
            max=st.none() | st.just({"cpu": 12}) | st.just({"cpu": 5}),
        ),
        st.builds(
            NodeUpserted,
            name=st.just("n2"),
            allocatable=st.fixed_dictionaries({"cpu": st.integers(0, 6)}),
        ),
        st.builds(
            NodeUpserted,
            name=st.just("n2"),
            allocatable=st.fixed_dictionaries({"cpu": st.integers(0, 6)}),
        ),
        pending_pod,
    ),
    min_size=1,
    max_size=40,
)
gaps = st.lists(st.sampled_from([0, 300, 1000, 1000, 1000, 2500]), min_size=40, max_size=40)


def _owing_now(projection: Projection) -> set[str]:
    copy = load(dump(projection.state))
    return {name for name, node in copy.quotas.items() if is_owing(node)}


def _starving_now(projection: Projection) -> set[str]:
    """Every pending pod checked from scratch on a recomputed copy."""
    copy = load(dump(projection.state))
    free = free_capacity(copy)
    return {
        uid
        for uid, pod in copy.pods.items()
        if uid in copy.pod_quota
        and pod.phase == "Pending"
        and pod.node is None
        and is_starving(copy, uid, free)
    }


@settings(max_examples=400, deadline=None)
@given(contended, gaps)
def test_clocks_equal_a_brute_force_sampler(history: list[Event], steps: list[int]) -> None:
    setup: list[Event] = [NodeUpserted(name="n", allocatable={"cpu": 12})]
    setup += [QuotaUpserted(name=leaf, min={"cpu": 3}) for leaf in LEAVES]
    events = setup + history
    projection = Projection()
    projection.apply(0, 0, LedgerOpened(ledger_id="t"))
    reference = Projection()
    reference.apply(0, 0, LedgerOpened(ledger_id="t"))
    expected: dict[str, int] = {}
    starving: dict[str, int] = {}
    ts = 0
    for offset, event in enumerate(events, start=1):
        ts += steps[(offset - 1) % len(steps)]
        if offset > 1 and ts // 1000 > reference.state.ts // 1000:
            for clocks, now in (
                (expected, _owing_now(reference)),
                (starving, _starving_now(reference)),
            ):
                for name in list(clocks):
                    if name not in now:
                        del clocks[name]
                for name in now:
                    clocks.setdefault(name, reference.state.ts)
        reference.apply(offset, ts, event)
        projection.apply(offset, ts, event)
    assert projection.state.owing_since == expected
    assert projection.state.starving_since == starving


def test_owing_clock_starts_at_the_sample_and_stops_when_it_no_longer_owes() -> None:
    projection = Projection()
    projection.apply(0, 0, LedgerOpened(ledger_id="t"))
    events: list[tuple[int, Event]] = [
        (0, NodeUpserted(name="n", allocatable={"cpu": 10})),
        (0, QuotaUpserted(name="a", min={"cpu": 2})),
        (0, QuotaUpserted(name="b", min={"cpu": 8})),
        (
            100,
            PodUpserted(
                uid="a1", name="a1", namespace="a", requests={"cpu": 10}, phase="Running", node="n"
            ),
        ),
        (1500, PodUpserted(uid="b1", name="b1", namespace="b", requests={"cpu": 8})),
        (1800, NodeUpserted(name="m", allocatable={"cpu": 1})),
        (3200, NodeUpserted(name="m", allocatable={"cpu": 1})),
        (4100, PodRemoved(uid="b1")),
        (5000, NodeUpserted(name="m", allocatable={"cpu": 1})),
    ]
    history = []
    for offset, (ts, event) in enumerate(events, start=1):
        projection.apply(offset, ts, event)
        history.append(dict(projection.state.owing_since))
    # a owes from the b1 record (1.5 s): sampled at the end of second 1, i.e. at 1800
    assert history[5] == {}
    assert history[6] == {"a": 1800}
    assert history[7] == {"a": 1800}
    assert history[8] == {}  # b1 gone: at the next sample a no longer owes


def test_starvation_ends_when_free_capacity_grows_though_its_quota_is_unchanged() -> None:
    """Only the free-capacity index notices this flip: quota a's numbers stay put."""
    projection = Projection()
    projection.apply(0, 0, LedgerOpened(ledger_id="t"))
    events: list[tuple[int, Event]] = [
        (0, NodeUpserted(name="n", allocatable={"cpu": 10})),
        (0, QuotaUpserted(name="a", min={"cpu": 5})),
        (0, QuotaUpserted(name="b", min={"cpu": 5})),
        (
            0,
            PodUpserted(
                uid="b1", name="b1", namespace="b", requests={"cpu": 10}, phase="Running", node="n"
            ),
        ),
        (1000, PodUpserted(uid="a1", name="a1", namespace="a", requests={"cpu": 3})),
        (2000, NodeUpserted(name="x", allocatable={"cpu": 5})),
        (3000, NodeUpserted(name="y", allocatable={})),
    ]
    seen = []
    for offset, (ts, event) in enumerate(events, start=1):
        projection.apply(offset, ts, event)
        quotas = projection.settled().quotas
        runtime = dict(quotas["a"].runtime) if "a" in quotas else {}
        seen.append((dict(projection.state.starving_since), runtime))
    assert seen[5][0] == {"a1": 1000}  # sampled at the end of second 1
    assert seen[6][0] == {}  # free grew to 5 >= 3 at second 2
    assert seen[5][1] == seen[6][1] == {"cpu": 3}
