"""The quotas' numbers in columns (``projections.columns``), computed on arrays
(``projections.recompute``, the full recompute) and on rows (``settle``, the
incremental path and the full recompute's fallback), against the per-quota
dictionary recompute they replaced, kept here as the reference
(:mod:`tests.dict_reference`; DECISIONS 153): every derived field and pod
sum of every quota, the cluster total and root's sums, the state hash and the
state JSON, on generated histories, engine-made histories (decisions
included: the engine decided on the column state, and at every offset the
state it decided on equals the reference) and amounts up to the 2^62 bound
(DESIGN §9), where sums and products leave int64 far behind."""

from __future__ import annotations

import copy
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from quotaledger.events.codec import decode_event
from quotaledger.events.model import (
    Event,
    NodeUpserted,
    PodRemoved,
    PodUpserted,
    QuotaUpserted,
    SettingsChanged,
)
from quotaledger.projections import Projection, state_json
from quotaledger.projections.recompute.arrays import recompute_arrays
from quotaledger.projections.request import terms_for
from quotaledger.projections.settle import recompute_all, recompute_all_rows
from quotaledger.projections.state import ProjectedState
from quotaledger.projections.view import state_hash
from tests.dict_reference import FIELDS, projected, reference
from tests.scenarios import engine_facts, engine_run, fold, histories

PROPERTY = settings(max_examples=150, deadline=None)
MAX = 2**62


def derived(state: ProjectedState) -> dict[str, Any]:
    return {
        **projected(state),
        "touched": state.touched,
        "pending": (state.dirty, state.refill, state.total_dirty),
    }


def assert_same_recompute(state: ProjectedState) -> None:
    """Both recomputes of copies of ``state`` (arrays, rows) agree with each
    other on everything and with the dictionary reference on every number."""
    expected = reference(state)
    by_rows, by_arrays = copy.deepcopy(state), copy.deepcopy(state)
    recompute_all_rows(by_rows)
    if not recompute_arrays(by_arrays):
        # declined (a cap above 2^62 that a request may exceed): what
        # production does then, the row path
        assert any(
            cap > 2**62 for node in state.quotas.values() for cap in terms_for(node).caps.values()
        )
        recompute_all(by_arrays)
    assert projected(by_rows) == expected
    assert derived(by_arrays) == derived(by_rows)
    assert state_hash(by_arrays) == state_hash(by_rows)
    assert state_json(by_arrays) == state_json(by_rows)


def assert_settled_like_reference(projection: Projection) -> None:
    """The incremental settle of the live state gives the reference's numbers,
    and the same state JSON (hash included) as a full recompute of a copy."""
    state = projection.settled()
    assert projected(state) == reference(state)
    again = copy.deepcopy(state)
    recompute_all(again)
    assert state_json(again) == state_json(state)


@PROPERTY
@given(histories())
def test_arrays_equal_dicts_after_every_event(history: list[Event]) -> None:
    projection = fold([])
    for offset, event in enumerate(history, start=1):
        projection.apply(offset, offset, event)
        assert_same_recompute(projection.state)  # unsettled: dirty quotas, unflushed sums
        assert_settled_like_reference(projection)
        assert_same_recompute(projection.state)


@PROPERTY
@given(histories())
def test_cached_tree_arrays_follow_every_change(history: list[Event]) -> None:
    """One state recomputed on arrays after every event keeps its tree arrays
    between events (patched on numbers-only quota edits, rebuilt when the shape
    changes): it always equals a copy recomputed quota by quota."""
    projection = fold([])
    for offset, event in enumerate(history, start=1):
        projection.apply(offset, offset, event)
        by_rows = copy.deepcopy(projection.state)
        recompute_all_rows(by_rows)
        assert recompute_arrays(projection.state)
        assert derived(projection.state) == derived(by_rows)
        assert projected(projection.state) == reference(projection.state)
        assert state_json(projection.state) == state_json(by_rows)


@settings(max_examples=40, deadline=None)
@given(engine_facts())
def test_arrays_equal_dicts_on_engine_made_histories(facts: Any) -> None:
    """Ledgers the engine wrote (preemptions, evictions, clocks): at every offset."""
    projection = Projection()
    for record in engine_run(facts).records:
        projection.apply_record(record)
        assert_settled_like_reference(projection)
        assert_same_recompute(projection.state)


# ------------------------------------------------------------------ big amounts

BIG = st.one_of(
    st.integers(min_value=0, max_value=MAX),
    st.sampled_from([0, 1, 2, 3, MAX, MAX - 1, 2**56, 2**31, 2**32 + 1]),
)
NAMES = ["a", "b", "c", "d", "e", "f", "g"]
KEYS = ["cpu", "memory"]
big_rl = st.dictionaries(st.sampled_from(KEYS), BIG, max_size=2)
small_rl = st.dictionaries(st.sampled_from(KEYS), st.integers(0, 1000), max_size=2)


@st.composite
def big_histories(draw: st.DrawFn) -> list[Event]:
    """A random tree (parents first) with amounts anywhere up to 2^62, nodes,
    pods and min scaling on or off; invalid configurations are simply refused."""
    events: list[Event] = [
        SettingsChanged(min_scaling=draw(st.booleans())),
        # a small cluster keeps a resource in int64 while weights stay huge
        NodeUpserted(name="n1", allocatable=draw(big_rl | small_rl)),
        NodeUpserted(name="n2", allocatable=draw(big_rl | small_rl)),
    ]
    parents = ["root"]
    for name in NAMES[: draw(st.integers(1, len(NAMES)))]:
        is_parent = draw(st.booleans())
        events.append(
            QuotaUpserted(
                name=name,
                parent=draw(st.sampled_from(parents)),
                is_parent=is_parent,
                min=draw(big_rl),
                max=draw(st.none() | big_rl),
                shared_weight=draw(st.none() | big_rl),
                allow_lent=draw(st.booleans()),
                lending_limit=draw(st.none() | big_rl),
                borrowing_limit=draw(st.none() | big_rl),
            )
        )
        if is_parent:
            parents.append(name)
    for i in range(draw(st.integers(0, 12))):
        events.append(
            PodUpserted(
                uid=f"p{i}",
                name=f"p{i}",
                namespace=draw(st.sampled_from(NAMES)),
                requests=draw(big_rl),
                phase=draw(st.sampled_from(["Pending", "Running"])),
                node=draw(st.sampled_from([None, "n1"])),
            )
        )
    return events


@settings(max_examples=300, deadline=None)
@given(big_histories())
def test_arrays_equal_dicts_with_amounts_up_to_the_bound(history: list[Event]) -> None:
    projection = fold(history)
    assert_same_recompute(projection.settled())


def test_a_cap_above_2_62_is_never_clipped() -> None:
    """min 2^62 + borrowing_limit 1 caps at 2^62 + 1, and pods request that much:
    the array path declines (it would clip the cap at 2^62) and the dict path
    gives limited_request 2^62 + 1 (found by the property above)."""
    events: list[Event] = [
        QuotaUpserted(name="c", min={"cpu": MAX}, allow_lent=False, borrowing_limit={"cpu": 1}),
        PodUpserted(uid="p0", name="p0", namespace="c", requests={"cpu": 1}),
        PodUpserted(uid="p1", name="p1", namespace="c", requests={"cpu": MAX}),
    ]
    state = fold(events).settled()
    assert state.quotas["c"].limited_request == {"cpu": MAX + 1}
    assert not recompute_arrays(copy.deepcopy(state))
    assert_same_recompute(state)


def test_a_wide_level_with_big_weights_fills_exactly() -> None:
    """Thirty borrowers under one parent, weights and amounts near 2^62: the
    largest remainders and the capped rounds as ``distribute`` gives them."""
    events: list[Event] = [
        NodeUpserted(name="n", allocatable={"memory": MAX}),
        QuotaUpserted(name="top", is_parent=True, min={"memory": 2**61}),
    ]
    for i in range(30):
        name = f"q{i:02d}"
        events.append(
            QuotaUpserted(
                name=name,
                parent="top",
                min={"memory": (i * 7919) % 1000},
                shared_weight={"memory": MAX - i * 3 if i % 3 else 2**40 + i},
            )
        )
        requests = {"memory": (2**57 // (i + 1)) + i}
        events.append(PodUpserted(uid=name, name=name, namespace=name, requests=requests))
    state = fold(events).settled()
    assert not state.rejected
    assert_same_recompute(state)


def test_a_cycle_or_a_child_under_a_leaf_is_declined() -> None:
    """Shapes the array path does not handle leave the state untouched."""
    state = fold([QuotaUpserted(name="a", is_parent=True), QuotaUpserted(name="b", parent="a")])
    settled = state.settled()
    settled.quotas["a"].config = decode_event(b'{"kind":"QuotaUpserted","name":"a"}')  # type: ignore[assignment]
    before = derived(settled)
    assert not recompute_arrays(settled)
    assert derived(settled) == before


def test_sums_past_int64_widen_a_resource_and_stay_exact() -> None:
    """Pods of 2^62 each sum past 2^63 in one quota: storing the sum widens
    that resource's columns (Python ints) in the incremental settle, and every
    number still equals the reference, as the sums rise and fall again."""
    events: list[Event] = [
        NodeUpserted(name="n", allocatable={"cpu": MAX, "memory": 7}),
        QuotaUpserted(name="top", is_parent=True, min={"cpu": 5}),
        QuotaUpserted(name="big", parent="top", min={"cpu": 5}),
    ]
    projection = fold(events)
    offset = len(events)
    for i in range(4):
        offset += 1
        pod = PodUpserted(
            uid=f"p{i}", name=f"p{i}", namespace="big", requests={"cpu": MAX, "memory": 1}, node="n"
        )
        projection.apply(offset, offset, pod)
        assert_settled_like_reference(projection)
    state = projection.settled()
    assert state.quotas["big"].used == {"cpu": 4 * MAX, "memory": 4}
    assert state.quotas["top"].request == {"cpu": 4 * MAX, "memory": 4}
    assert state.columns.columns["cpu"].wide
    assert not state.columns.columns["memory"].wide
    for i in range(4):
        offset += 1
        projection.apply(offset, offset, PodRemoved(uid=f"p{i}"))
        assert_settled_like_reference(projection)
    assert projection.settled().quotas["big"].used == {}
    assert_same_recompute(projection.state)


def test_a_removed_quota_leaves_its_row_clean_for_the_next() -> None:
    """A quota removed hands its row to the next new quota, zeroed: the new one
    starts with no numbers of the old one's."""
    events: list[Event] = [
        NodeUpserted(name="n", allocatable={"cpu": 100}),
        QuotaUpserted(name="old", min={"cpu": 10}, allow_lent=False),
        PodUpserted(uid="p", name="p", namespace="old", requests={"cpu": 30}, node="n"),
    ]
    projection = fold(events)
    state = projection.settled()
    assert state.quotas["old"].runtime == {"cpu": 30}
    row = state.quotas["old"].row
    projection.apply(4, 4, PodRemoved(uid="p"))
    projection.apply(5, 5, decode_event(b'{"kind":"QuotaRemoved","name":"old"}'))
    projection.apply(6, 6, QuotaUpserted(name="new"))
    # before any settle: nothing of the old quota's (its request, subtree and
    # local were 10 when it was removed)
    fresh = projection.state.quotas["new"]
    assert [getattr(fresh, item) for item in FIELDS] == [{}] * len(FIELDS)
    state = projection.settled()
    assert "old" not in state.quotas and not state.rejected
    assert state.quotas["new"].row == row
    assert_settled_like_reference(projection)
    assert state.quotas["new"].pod_request == {} and state.quotas["new"].subtree == {}


def test_shared_weights_summing_past_int64_on_a_small_cluster() -> None:
    """Three borrowers with shared weights near 2^62 on a 1000-cpu cluster:
    the amounts fit int64 but the weights' sum does not (the array recompute
    once took it in int64 and gave every quota -1000)."""
    events: list[Event] = [NodeUpserted(name="n", allocatable={"cpu": 1000})]
    for name in ("a", "b", "c"):
        events.append(QuotaUpserted(name=name, shared_weight={"cpu": MAX - 1}))
        events.append(PodUpserted(uid=name, name=name, namespace=name, requests={"cpu": 900}))
    state = fold(events).settled()
    assert [state.quotas[name].runtime for name in "abc"] == [
        {"cpu": 334},
        {"cpu": 333},
        {"cpu": 333},
    ]
    assert recompute_arrays(copy.deepcopy(state))
    assert_same_recompute(state)


@st.composite
def products(draw: st.DrawFn) -> tuple[list[int], list[int], list[int]]:
    """Rows of (left, right, divisor) as the water-fill and min scaling form
    them: a share of a pool (left ≤ divisor) or of a total, products anywhere
    up to 2^124, divisors below 2^62."""
    count = draw(st.integers(1, 20))
    lefts, rights, divisors = [], [], []
    # where the float estimate is off by one either way: products past 2^64,
    # quotients just below the estimate's limit (2^49)
    rounding = draw(st.booleans())
    for _ in range(count):
        if rounding:
            divisor = draw(st.integers(2**55, MAX - 1))
            right = draw(st.integers(2**40, 2**49 - 1))
        else:
            divisor = draw(st.integers(1, MAX - 1) | st.sampled_from([1, 3, 2**31 + 1, MAX - 1]))
            right = draw(st.integers(0, MAX) | st.sampled_from([0, 1, 2**49, 2**53 + 1, MAX]))
        lefts.append(draw(st.integers(0, divisor)))
        rights.append(right)
        divisors.append(divisor)
    return lefts, rights, divisors


@settings(max_examples=400, deadline=None)
@given(products())
def test_products_past_int64_divide_exactly(rows: tuple[list[int], list[int], list[int]]) -> None:
    """The float-estimated, integer-corrected quotient (or the Python-integer
    fallback) is exactly ⌊l·r/d⌋ with its remainder."""
    import numpy as np

    from quotaledger.projections.recompute.exact import mul_divmod

    lefts, rights, divisors = rows
    quotient, remainder = mul_divmod(
        np.array(lefts, dtype=np.int64),
        np.array(rights, dtype=np.int64),
        np.array(divisors, dtype=np.int64),
    )
    expected = [divmod(a * b, d) for a, b, d in zip(lefts, rights, divisors, strict=True)]
    assert list(zip(quotient.tolist(), remainder.tolist(), strict=True)) == expected


def test_the_float_estimate_is_corrected_both_ways() -> None:
    """Seeded rows where the float64 quotient is one too high or too low (both
    happen): the corrected quotients are exact, and the estimate path took them."""
    import random

    import numpy as np

    from quotaledger.projections.recompute.exact import estimate_divmod

    rng = random.Random(11)
    divisors = [rng.randrange(2**55, MAX) for _ in range(4000)]
    lefts = [rng.randrange(0, d + 1) for d in divisors]
    rights = [rng.randrange(2**40, 2**49) for _ in divisors]
    left, right, divisor = (np.array(v, dtype=np.int64) for v in (lefts, rights, divisors))
    estimate = np.floor(left.astype(float) * right.astype(float) / divisor.astype(float))
    exact = [a * b // d for a, b, d in zip(lefts, rights, divisors, strict=True)]
    assert (estimate > np.array(exact, dtype=float)).any()
    assert (estimate < np.array(exact, dtype=float)).any()
    corrected = estimate_divmod(left, right, divisor)
    assert corrected is not None
    assert corrected[0].tolist() == exact
    assert corrected[1].tolist() == [
        a * b - q * d for a, b, d, q in zip(lefts, rights, divisors, exact, strict=True)
    ]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 40),
            st.one_of(st.integers(0, 5), st.integers(0, 2**20), st.integers(0, MAX)),
        ),
        max_size=40,
    )
)
def test_the_largest_remainders_order(rows: list[tuple[int, int]]) -> None:
    """``rank_order`` sorts by segment, then remainder from the largest, then
    position (the water-fill's tie-break: the smaller quota name), whether its
    single-key sort applies or not."""
    import numpy as np

    from quotaledger.projections.recompute.exact import rank_order

    rows = sorted(rows, key=lambda row: row[0])  # a level's rows come by segment
    segments = np.array([seg for seg, _ in rows], dtype=np.intp)
    remainders = np.array([rest for _, rest in rows], dtype=np.int64)
    expected = sorted(range(len(rows)), key=lambda i: (rows[i][0], -rows[i][1], i))
    assert rank_order(segments, remainders).tolist() == expected
    assert rank_order(segments, remainders.astype(object)).tolist() == expected


def _same_tree_arrays(state: ProjectedState) -> None:
    """The state's kept tree arrays (patched) equal ones built afresh."""
    import numpy as np

    from quotaledger.projections.recompute.shape import tree_arrays

    kept = tree_arrays(state)
    fresh_state = copy.deepcopy(state)
    fresh_state.tree_arrays = None
    fresh = tree_arrays(fresh_state)
    assert (kept is None) == (fresh is None)
    if kept is None or fresh is None:
        return
    assert kept.keys == fresh.keys
    for mine, theirs in zip(kept.terms, fresh.terms, strict=True):
        assert mine.configs == theirs.configs
        assert mine.clipped == theirs.clipped
        for name in ("is_parent", "has_max", "no_lent"):
            assert np.array_equal(getattr(mine, name), getattr(theirs, name)), name
        for key in mine.columns:
            for name, column in mine.columns[key].items():
                assert np.array_equal(column, theirs.columns[key][name]), (key, name)


def test_tree_arrays_patch_several_quotas_of_a_level_at_once() -> None:
    """Three leaves of one level reconfigured between two recomputes (numbers
    only: max set and dropped, lending turned off, mins, weights): patched
    together, the kept arrays equal a rebuild and the numbers a row recompute."""
    leaves = ["l1", "l2", "l3", "l4"]
    tree: list[Event] = [
        NodeUpserted(name="n", allocatable={"cpu": 100, "memory": 1000}),
        QuotaUpserted(name="p", is_parent=True, min={"cpu": 40}),
        *(
            QuotaUpserted(name=leaf, parent="p", min={"cpu": 10}, max={"cpu": 30})
            for leaf in leaves
        ),
    ]
    projection = fold(tree)
    assert recompute_arrays(projection.state)
    kept = projection.state.tree_arrays
    edits: list[Event] = [
        QuotaUpserted(name="l1", parent="p", min={"cpu": 5}),
        QuotaUpserted(name="l2", parent="p", min={"cpu": 10}, max={"cpu": 20}, allow_lent=False),
        QuotaUpserted(
            name="l4",
            parent="p",
            min={"cpu": 10},
            max={"cpu": 30},
            shared_weight={"cpu": 3},
            lending_limit={"cpu": 2},
            borrowing_limit={"cpu": 5},
        ),
    ]
    for offset, event in enumerate(edits, start=len(tree) + 1):
        projection.apply(offset, offset, event)
    assert not projection.state.rejected
    _same_tree_arrays(projection.state)
    assert projection.state.tree_arrays is kept  # patched, not rebuilt
    by_rows = copy.deepcopy(projection.state)
    recompute_all_rows(by_rows)
    assert recompute_arrays(projection.state)
    assert derived(projection.state) == derived(by_rows)


@PROPERTY
@given(histories(), st.integers(2, 8))
def test_tree_arrays_patched_in_batches_equal_a_rebuild(history: list[Event], every: int) -> None:
    """Recomputed on arrays only every few events, so several quotas may be
    reconfigured between two recomputes (patched together, per level): the
    kept tree arrays equal ones built afresh from the same state."""
    projection = fold([])
    for offset, event in enumerate(history, start=1):
        projection.apply(offset, offset, event)
        if offset % every == 0:
            _same_tree_arrays(projection.state)
