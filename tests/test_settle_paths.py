"""The settle along the dirty paths keeps facts between settles (each parent's
group: Σ of its children's mins, whether they are all weighted; the top
quotas; the quotas that owe, for reclaim) and skips fills whose result it
knows (DECISIONS 250). Whatever mix
of path settles and full recomputes (``derive.settle``'s bulk switch, a
snapshot restore) a state goes through, its numbers equal the dictionary
reference after every event."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from hypothesis import given, settings
from hypothesis import strategies as st

from quotaledger.events.model import Event
from quotaledger.projections import derive
from quotaledger.projections.clocks import is_owing, owing_quotas

from .dict_reference import projected, reference
from .scenarios import fold, histories


@contextmanager
def bulk(on: bool) -> Iterator[None]:
    """Force the next settles to recompute everything (``on``) or to walk the paths."""
    saved = derive.BULK_MIN_QUOTAS, derive.BULK_FRACTION
    derive.BULK_MIN_QUOTAS, derive.BULK_FRACTION = (0, 10**9) if on else (10**9, 1)
    try:
        yield
    finally:
        derive.BULK_MIN_QUOTAS, derive.BULK_FRACTION = saved


@settings(max_examples=150, deadline=None)
@given(histories(), st.lists(st.booleans(), min_size=60, max_size=60))
def test_paths_and_full_recomputes_mixed_equal_the_reference(
    history: list[Event], choices: list[bool]
) -> None:
    projection = fold([])
    for offset, event in enumerate(history, start=1):
        projection.apply(offset, offset, event)
        with bulk(choices[offset % len(choices)]):
            state = projection.settled()
        assert projected(state) == reference(state)
        if choices[(offset * 7) % len(choices)]:
            # the owing quotas kept between reclaims, looked at now and then
            assert owing_quotas(state) == {
                name for name, node in state.quotas.items() if is_owing(node)
            }


def test_a_group_settled_in_bulk_forgets_its_childrens_old_weights() -> None:
    """A child's weight turns 0 and the next settle is a full recompute: a
    later path settle must not take the group as all weighted (a weightless
    borrower stays at its min, it does not get its limited request)."""
    from quotaledger.events.model import NodeUpserted, PodUpserted, QuotaUpserted

    def pod(uid: str, quota: str, cpu: int) -> PodUpserted:
        return PodUpserted(
            uid=uid, name=uid, namespace=quota, requests={"cpu": cpu}, phase="Running", node="n"
        )

    def child(name: str, weight: int) -> QuotaUpserted:
        return QuotaUpserted(name=name, parent="p", min={"cpu": 5}, shared_weight={"cpu": weight})

    projection = fold(
        [
            NodeUpserted(name="n", allocatable={"cpu": 100}),
            QuotaUpserted(name="p", is_parent=True, min={"cpu": 10}),
            child("a", 5),
            child("b", 5),
            pod("a1", "a", 8),
            pod("b1", "b", 3),
        ]
    )
    with bulk(False):
        projection.settled()
    offset = projection.state.offset
    projection.apply(offset + 1, 0, pod("b2", "b", 1))
    with bulk(False):
        projection.settled()  # the group's facts are taken: all weighted
    projection.apply(offset + 2, 0, child("a", 0))
    with bulk(True):
        projection.settled()
    projection.apply(offset + 3, 0, pod("a2", "a", 1))
    projection.apply(offset + 4, 0, pod("b3", "b", 1))
    with bulk(False):
        state = projection.settled()
    assert projected(state) == reference(state)
    assert state.quotas["a"].runtime == {"cpu": 5}
