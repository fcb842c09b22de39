"""The incremental state hash (``projections.state_digest``; DESIGN §5 "State hash",
§9; DECISIONS 230-235).

A state keeps the digests of its large maps and of its quotas' numbers and
brings them up to date from the fold's marks and the changed number rows when
a hash is asked for. Whatever the history, that value must equal the hash
computed from nothing (:func:`full_state_hash`), and a state restored from a
snapshot and folded on must hash like the full replay at every offset:

- on engine-made histories (preemptions, evictions, re-upserted and removed
  pods, clocks, quota edits), hashed at checkpoints hypothesis draws, with the
  row comparison and the numbers read on numpy or in Python;
- with a snapshot restored mid-way and the tail folded into it;
- with amounts up to 2^62, whose sums leave int64 (Python-int columns);
- from a fresh process under other ``PYTHONHASHSEED``, ``TZ`` and locale.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quotaledger.events.model import (
    Event,
    NamespaceWeighted,
    NodeRemoved,
    NodeUpserted,
    PodRemoved,
    PodUpserted,
    QuotaRemoved,
    QuotaUpserted,
)
from quotaledger.projections import Projection, number_digest
from quotaledger.projections.snapshot import dump, load
from quotaledger.projections.state_digest import (
    MapDigest,
    full_state_hash,
    state_hash,
)
from tests.paths import REPO
from tests.projections.test_arrays_differential import big_histories
from tests.scenarios import engine_facts, engine_run, fold, histories

ENGINE = settings(max_examples=60, deadline=None)
EXAMPLES = REPO / "examples"


@contextlib.contextmanager
def numpy_rows(fast: bool) -> Iterator[None]:
    """Read and compare the number rows on numpy (any size) or in Python only."""
    before = number_digest.NUMPY_ROWS
    number_digest.NUMPY_ROWS = 0 if fast else 1 << 40
    try:
        yield
    finally:
        number_digest.NUMPY_ROWS = before


def assert_incremental_is_full(projection: Projection) -> str:
    state = projection.state
    kept = state_hash(state)
    assert kept == full_state_hash(state)
    return kept


# ------------------------------------------------------------------ engine-made histories


@ENGINE
@given(engine_facts(), st.data())
def test_incremental_equals_full_at_every_checkpoint(facts: Any, data: st.DataObject) -> None:
    records = engine_run(facts).records
    checkpoints = data.draw(st.sets(st.integers(0, len(records) - 1)))
    with numpy_rows(data.draw(st.booleans(), label="numpy")):
        projection = Projection()
        for record in records:
            projection.apply_record(record)
            if record.offset in checkpoints:
                assert_incremental_is_full(projection)
        assert_incremental_is_full(projection)


@ENGINE
@given(engine_facts(), st.data())
def test_a_snapshot_restored_mid_way_hashes_like_the_replay(
    facts: Any, data: st.DataObject
) -> None:
    records = engine_run(facts).records
    cut = data.draw(st.integers(0, len(records) - 1), label="cut")
    checkpoints = data.draw(st.sets(st.integers(0, len(records) - 1)), label="checkpoints")
    with numpy_rows(data.draw(st.booleans(), label="numpy")):
        replayed = Projection()
        expected: dict[int, str] = {}
        for record in records:
            replayed.apply_record(record)
            if record.offset in checkpoints or record.offset >= cut:
                expected[record.offset] = full_state_hash(replayed.state)
        head = Projection()
        for record in records[: cut + 1]:
            head.apply_record(record)
            if record.offset in checkpoints:  # the live state hashed before the snapshot
                assert state_hash(head.state) == expected[record.offset]
        restored = Projection(load(dump(head.settled())))
        assert assert_incremental_is_full(restored) == expected[cut]
        for record in records[cut + 1 :]:
            restored.apply_record(record)
            head.apply_record(record)
            if record.offset in checkpoints:
                assert assert_incremental_is_full(restored) == expected[record.offset]
                assert state_hash(head.state) == expected[record.offset]
        assert assert_incremental_is_full(restored) == expected[records[-1].offset]


# ------------------------------------------------------------------ generated histories


@settings(max_examples=100, deadline=None)
@given(histories(), st.data())
def test_incremental_equals_full_after_any_events(
    history: list[Event], data: st.DataObject
) -> None:
    """Quota removals and re-parenting, node removals, namespace weights and
    pods moving between quotas, hashed after a random subset of the events."""
    extra = data.draw(
        st.lists(
            st.one_of(
                st.builds(
                    NamespaceWeighted,
                    namespace=st.sampled_from(["ns0", "ns1", "q0"]),
                    weight=st.integers(1, 5),
                ),
                st.builds(NodeRemoved, name=st.sampled_from(["n0", "n1", "n2"])),
                st.builds(QuotaRemoved, name=st.sampled_from(["q0", "q1", "q2", "q3"])),
                st.builds(PodRemoved, uid=st.sampled_from([f"p{i}" for i in range(16)])),
            ),
            max_size=6,
        ),
        label="extra",
    )
    events = [*history, *extra]
    hashed_after = data.draw(st.sets(st.integers(0, len(events))), label="hashed after")
    with numpy_rows(data.draw(st.booleans(), label="numpy")):
        projection = fold([])
        for offset, event in enumerate(events, start=1):
            projection.apply(offset, 0, event)
            if offset in hashed_after:
                assert_incremental_is_full(projection)
        assert_incremental_is_full(projection)


@settings(max_examples=100, deadline=None)
@given(big_histories(), st.data())
def test_incremental_equals_full_with_amounts_up_to_the_bound(
    history: list[Event], data: st.DataObject
) -> None:
    """Sums beyond int64 (Python-int columns) hash the same whether read on
    numpy or in Python, kept or computed afresh."""
    hashed_after = data.draw(st.sets(st.integers(0, len(history))), label="hashed after")
    results = []
    for fast in (False, True):
        with numpy_rows(fast):
            projection = fold([])
            for offset, event in enumerate(history, start=1):
                projection.apply(offset, 0, event)
                if offset in hashed_after:
                    assert_incremental_is_full(projection)
            results.append(assert_incremental_is_full(projection))
    assert results[0] == results[1]


# ------------------------------------------------------------------ what the hash covers


def _base() -> list[Event]:
    return [
        NodeUpserted(name="n", allocatable={"cpu": 10}),
        QuotaUpserted(name="q", min={"cpu": 4}, max={"cpu": 8}),
    ]


def _pod(**fields: Any) -> PodUpserted:
    values: dict[str, Any] = {
        "uid": "p",
        "name": "p",
        "namespace": "q",
        "requests": {"cpu": 2},
        "phase": "Running",
        "node": "n",
        **fields,
    }
    return PodUpserted(**values)


@pytest.mark.parametrize("size", [3, 40])
def test_the_order_of_labels_and_requests_does_not_change_the_hash(size: int) -> None:
    """Small maps are sorted by the encoder, large ones by ``compact``; either
    way the hash and the snapshot do not depend on the order they came in."""
    labels = {f"l{i:03d}": str(i) for i in range(size)}
    requests = {f"r{i:03d}": 1 for i in range(size)}
    forward = fold([*_base(), _pod(labels=labels, requests=requests)])
    backward = fold(
        [
            *_base(),
            _pod(labels=dict(reversed(labels.items())), requests=dict(reversed(requests.items()))),
        ]
    )
    assert state_hash(forward.state) == state_hash(backward.state)
    assert dump(forward.state) == dump(backward.state)
    if size > 16:
        assert list(backward.state.pods["p"].labels) == sorted(labels)
        assert list(backward.state.pods["p"].requests) == sorted(requests)


@pytest.mark.parametrize(
    "change",
    [
        _pod(priority=1),  # the pod itself
        _pod(namespace="other"),  # its quota (rule 7): default
        NodeUpserted(name="n", allocatable={"cpu": 11}),  # a node
        NamespaceWeighted(namespace="q", weight=2),  # a weight
        QuotaUpserted(name="q", min={"cpu": 4}, max={"cpu": 9}),  # a configuration
        QuotaUpserted(name="orphan", parent="missing"),  # an orphan
    ],
    ids=["pod", "association", "node", "weight", "config", "orphan"],
)
def test_every_kind_of_entry_moves_the_hash(change: Event) -> None:
    projection = fold([*_base(), _pod()])
    before = assert_incremental_is_full(projection)
    projection.apply(projection.state.offset + 1, 0, change)
    assert assert_incremental_is_full(projection) != before


@pytest.mark.parametrize(
    "claim",
    [
        QuotaUpserted(name="team"),  # a quota named like the namespace
        QuotaUpserted(name="other", namespaces=["team"]),  # a quota listing it
    ],
    ids=["named", "listed"],
)
def test_pods_moved_by_a_new_quota_are_hashed_with_their_new_quota(claim: Event) -> None:
    """§8 rule 7: a quota that appears takes the pods of its namespace from
    default; each moved pod's entry (which names its quota) is re-hashed."""
    projection = fold([*_base(), _pod(namespace="team"), _pod(uid="p2", namespace="team")])
    assert projection.state.pod_quota == {"p": "default", "p2": "default"}
    assert_incremental_is_full(projection)
    projection.apply(projection.state.offset + 1, 0, claim)
    assert set(projection.state.pod_quota.values()) == {claim.name}  # type: ignore[attr-defined]
    assert_incremental_is_full(projection)


def test_numbers_move_the_hash_when_nothing_else_does() -> None:
    """A derived number changed without a fact (a test reaching into the
    columns) is found by the row comparison."""
    projection = fold([*_base(), _pod()])
    state = projection.settled()
    before = assert_incremental_is_full(projection)
    node = state.quotas["q"]
    state.columns.write("runtime", node.row, {"cpu": 7})
    assert state_hash(state) != before
    assert state_hash(state) == full_state_hash(state)


def test_an_entry_added_without_its_mark_is_caught() -> None:
    """The kept digests count the entries: a pod put in by hand (no mark)
    makes the next hash start afresh rather than miss it."""
    projection = fold([*_base(), _pod()])
    state = projection.state
    state_hash(state)
    state.pods["extra"] = _pod(uid="extra", name="extra", phase="Succeeded")
    assert state_hash(state) == full_state_hash(state)


def test_marks_stay_bounded_when_nobody_hashes() -> None:
    projection = fold(_base())
    state = projection.state
    state_hash(state)
    offset = state.offset
    for i in range(3000):
        for event in (_pod(uid=f"u{i}", name="u"), PodRemoved(uid=f"u{i}")):
            offset += 1
            projection.apply(offset, 0, event)
    assert len(state.hash_pods) <= 4096 + 1
    assert state_hash(state) == full_state_hash(state)


def test_map_digest_does_not_depend_on_the_order_of_changes() -> None:
    entries = {f"k{i}": bytes([i]) * 32 for i in range(200)}
    built = MapDigest.of(entries.items())
    grown = MapDigest()
    for key in reversed(list(entries)):
        grown.put(key, b"\0" * 32)
    grown.put("gone", b"\1" * 32)
    grown.root()
    for key, digest in entries.items():
        grown.put(key, digest)
    grown.remove("gone")
    grown.remove("never there")
    assert grown.root() == built.root()
    assert grown.size == built.size == 200
    assert MapDigest().root() == MapDigest.of([]).root()


# ------------------------------------------------------------------ determinism


def test_the_hash_is_the_same_under_any_hash_seed_time_zone_and_locale() -> None:
    code = (
        "import sys; from quotaledger.adapters.cli import main;"
        f" sys.exit(main(['replay', {str(EXAMPLES / 'reclaim.jsonl')!r}, '--json']))"
    )
    outputs = set()
    for seed, zone, locale in (("0", "UTC", "C"), ("12345", "Asia/Kolkata", "C.UTF-8")):
        env = {**os.environ, "PYTHONHASHSEED": seed, "TZ": zone, "LC_ALL": locale}
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, env=env, check=False, timeout=120
        )
        assert done.returncode == 0, done.stderr
        outputs.add(done.stdout)
    assert len(outputs) == 1
