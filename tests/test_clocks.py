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
from quotaledger.projections.clocks import is_owing
from quotaledger.projections.snapshot import dump, load

LEAVES = ["a", "b", "c"]

contended = st.lists(
    st.one_of(
        st.builds(
            PodUpserted,
            uid=st.sampled_from([f"p{i}" for i in range(10)]),
            name=st.just("p"),
            namespace=st.sampled_from(LEAVES),
            requests=st.fixed_dictionaries({"cpu": st.integers(1, 8)}),
            phase=st.sampled_from(["Running", "Running", "Pending"]),
            node=st.sampled_from(["n", "n", None]),
        ),
        st.builds(PodRemoved, uid=st.sampled_from([f"p{i}" for i in range(10)])),
        st.builds(
            QuotaUpserted,
            name=st.sampled_from(LEAVES),
            min=st.just({"cpu": 3}),
            max=st.none() | st.just({"cpu": 12}) | st.just({"cpu": 5}),
        ),
        st.builds(NodeUpserted, name=st.just("n2"), allocatable=st.fixed_dictionaries({"cpu": st.integers(0, 6)})),
    ),
    min_size=1,
    max_size=40,
)
gaps = st.lists(st.sampled_from([0, 0, 200, 700, 1000, 2500]), min_size=40, max_size=40)


def _owing_now(projection: Projection) -> set[str]:
    copy = load(dump(projection.state))
    return {name for name, node in copy.quotas.items() if is_owing(node)}


@settings(max_examples=200, deadline=None)
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
    ts = 0
    seen_owing = 0
    for offset, event in enumerate(events, start=1):
        ts += steps[(offset - 1) % len(steps)]
        if offset > 1 and ts // 1000 > reference.state.ts // 1000:
            owing = _owing_now(reference)
            seen_owing += len(owing)
            for name in list(expected):
                if name not in owing:
                    del expected[name]
            for name in owing:
                expected.setdefault(name, reference.state.ts)
        reference.apply(offset, ts, event)
        projection.apply(offset, ts, event)
    assert projection.state.owing_since == expected


def test_owing_clock_starts_at_the_sample_and_stops_when_it_no_longer_owes() -> None:
    projection = Projection()
    projection.apply(0, 0, LedgerOpened(ledger_id="t"))
    events: list[tuple[int, Event]] = [
        (0, NodeUpserted(name="n", allocatable={"cpu": 10})),
        (0, QuotaUpserted(name="a", min={"cpu": 2})),
        (0, QuotaUpserted(name="b", min={"cpu": 8})),
        (100, PodUpserted(uid="a1", name="a1", namespace="a", requests={"cpu": 10}, phase="Running", node="n")),
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
