"""A settle with many dirty quotas recomputes everything on arrays
(``settle.settle``, DECISIONS 193) instead of along the dirty paths: the same
numbers, the same state JSON and hash, and the same decisions. The switch is
forced here (``BULK_MIN_QUOTAS`` 0: any settle with a dirty quota goes the
bulk way) and compared with the paths-only settle on generated histories
after every event, and on engine-made histories, whose whole ledger
(preemptions, evictions, clock observations) must come out byte for byte the
same: the clocks re-check every quota after a bulk settle, and re-checking a
quota that did not change leaves its clock as it was."""

from __future__ import annotations

import copy
import importlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from hypothesis import Phase, find, given, settings

from quotaledger.events.model import Event, NodeUpserted, PodUpserted, QuotaUpserted
from quotaledger.projections import state_json
from quotaledger.projections.view import state_hash
from tests.dict_reference import projected, reference
from tests.scenarios import engine_facts, engine_run, fold, histories

#: The settle module (``projections.settle`` is the package's name for its
#: function, so the module is taken from the import system).
settling = importlib.import_module("quotaledger.projections.settle")


@contextmanager
def full_recomputes() -> Iterator[list[int]]:
    """Counts the full recomputes ``settle`` starts meanwhile."""
    original = settling.recompute_all
    calls: list[int] = []

    def counted(state: Any) -> None:
        calls.append(1)
        original(state)

    settling.recompute_all = counted  # type: ignore[assignment]
    try:
        yield calls
    finally:
        settling.recompute_all = original


@contextmanager
def bulk(always: bool) -> Iterator[list[int]]:
    """Every settle with a dirty quota in bulk (``always``), or never; yields
    the count of full recomputes meanwhile."""
    saved = settling.BULK_MIN_QUOTAS, settling.BULK_FRACTION
    if always:
        settling.BULK_MIN_QUOTAS, settling.BULK_FRACTION = 0, 10**9
    else:
        settling.BULK_MIN_QUOTAS = 10**9
    try:
        with full_recomputes() as calls:
            yield calls
    finally:
        settling.BULK_MIN_QUOTAS, settling.BULK_FRACTION = saved


@settings(max_examples=150, deadline=None)
@given(histories())
def test_a_bulk_settle_equals_the_paths_after_every_event(history: list[Event]) -> None:
    by_paths = fold([])
    for offset, event in enumerate(history, start=1):
        by_paths.apply(offset, offset, event)
        in_bulk = copy.deepcopy(by_paths.state)
        dirty = bool(in_bulk.dirty)
        with bulk(always=True) as calls:
            bulk_json = state_json(in_bulk)
        assert len(calls) == dirty
        with bulk(always=False) as calls:
            paths_json = state_json(by_paths.state)
        assert not calls
        assert bulk_json == paths_json
        assert state_hash(in_bulk) == state_hash(by_paths.state)
        assert projected(in_bulk) == reference(in_bulk)
        assert by_paths.state.touched <= in_bulk.touched  # bulk touches every quota


@settings(max_examples=40, deadline=None)
@given(engine_facts())
def test_an_engine_settling_in_bulk_writes_the_same_ledger(facts: Any) -> None:
    with bulk(always=False):
        by_paths = engine_run(facts).records
    with bulk(always=True) as calls:
        in_bulk = engine_run(facts).records
    assert len(calls) > 0 or not any(b"Preemption" in r.payload for r in in_bulk)
    assert [(r.offset, r.ts, r.payload) for r in in_bulk] == [
        (r.offset, r.ts, r.payload) for r in by_paths
    ]


def test_an_engine_run_that_preempts_and_settles_in_bulk_writes_the_same_ledger() -> None:
    """One engine history found to preempt and evict while settling in bulk
    many times: the property above is not vacuous."""

    def bulk_and_evicts(facts: Any) -> bool:
        with bulk(always=True) as calls:
            records = engine_run(facts).records
        return len(calls) >= 5 and any(b'"EvictionRequested"' in r.payload for r in records)

    facts = find(
        engine_facts(),
        bulk_and_evicts,
        settings=settings(
            max_examples=500, database=None, derandomize=True, phases=[Phase.generate]
        ),  # the first such history, unshrunk: shrinking one took minutes of CI
    )
    with bulk(always=False) as none:
        by_paths = engine_run(facts).records
    with bulk(always=True) as calls:
        in_bulk = engine_run(facts).records
    assert not none and len(calls) >= 5
    assert [r.payload for r in in_bulk] == [r.payload for r in by_paths]


def test_many_dirty_quotas_of_a_big_tree_settle_in_bulk() -> None:
    """The default switch: a tree of ``BULK_MIN_QUOTAS`` quotas or more with at
    least one in ``BULK_FRACTION`` dirty goes the bulk way, fewer do not."""
    leaves = settling.BULK_MIN_QUOTAS
    projection = fold(
        [
            NodeUpserted(name="n", allocatable={"cpu": 10**6}),
            *(QuotaUpserted(name=f"q{i:05}", min={"cpu": 10}) for i in range(leaves)),
        ]
    )
    state = projection.state
    with bulk(always=False) as calls:
        state_json(state)  # settled along the paths: every quota new
    share = len(state.quotas) // settling.BULK_FRACTION
    for i, count in ((1, 1), (2, share - 1), (3, share + 1)):
        events = [
            PodUpserted(uid=f"p{i}-{j}", name="p", namespace=f"q{j:05}", requests={"cpu": i})
            for j in range(count)
        ]
        for event in events:
            projection.apply(state.offset + 1, state.ts, event)
        before = len(state.dirty)
        expected = state_json(copy.deepcopy(state))  # a copy settled the default way
        with full_recomputes() as calls:
            assert state_json(state) == expected
        assert bool(calls) == (before * settling.BULK_FRACTION >= len(state.quotas)), before
