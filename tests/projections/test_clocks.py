"""Overuse and starvation clocks (DESIGN §6 rules 2-3, §8 rules 28-31; DECISIONS 13):
the engine's incremental samples, written as ``ClocksObserved`` records and
folded, equal a brute-force sampler that recomputes everything at each sample."""

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
    SettingsChanged,
)
from quotaledger.projections import Projection
from quotaledger.projections.clocks import (
    free_capacity,
    is_owing,
    is_starving,
    observation,
    owed,
)
from quotaledger.projections.snapshot import dump, load
from quotaledger.projections.state import BUILTIN, QuotaNode


class EngineSampler:
    """Folds events like a ledger with an engine attached: at each new second
    of ledger time the engine samples the clocks and its ``ClocksObserved``
    record is folded before the next event (what ``simulate`` and the live
    engine do, at their own instants)."""

    def __init__(self) -> None:
        self.projection = Projection()
        self.projection.apply(0, 0, LedgerOpened(ledger_id="t"))
        self.offset = 0
        self.observations = 0

    @property
    def state(self):  # type: ignore[no-untyped-def]
        return self.projection.state

    def apply(self, ts: int, event: Event) -> None:
        state = self.projection.state
        if self.offset > 0 and ts // 1000 > state.ts // 1000:
            observed = observation(state, state.ts)
            if observed is not None:
                self.offset += 1
                self.observations += 1
                assert self.projection.apply(self.offset, state.ts, observed)
        self.offset += 1
        self.projection.apply(self.offset, ts, event)


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


def _owes(node: QuotaNode) -> bool:
    """§8 rule 28 read literally from the quota's dicts: a connected leaf (not
    system/default) with ``min(used, max) > runtime`` on a resource its max
    lists (every resource when max is null)."""
    config = node.config
    if config.is_parent or not node.connected or config.name in BUILTIN:
        return False
    used, runtime = node.used, node.runtime
    if config.max is None:
        return any(used.get(k, 0) > runtime.get(k, 0) for k in used.keys() | runtime.keys())
    return any(min(used.get(k, 0), cap) > runtime.get(k, 0) for k, cap in config.max.items())


def _owed(node: QuotaNode) -> dict[str, int]:
    """``owed`` read from the quota's dicts: ``min(used, max) − runtime`` where
    positive, in max's order (sorted when max is null), key order included."""
    used, runtime, cap = node.used, node.runtime, node.config.max
    keys = sorted(used.keys() | runtime.keys()) if cap is None else list(cap)
    gaps = [
        (k, min(used.get(k, 0), (cap or {}).get(k, used.get(k, 0))) - runtime.get(k, 0))
        for k in keys
    ]
    return {k: gap for k, gap in gaps if gap > 0}


def _owing_now(projection: Projection) -> set[str]:
    copy = load(dump(projection.state))
    owing = {name for name, node in copy.quotas.items() if _owes(node)}
    assert owing == {name for name, node in copy.quotas.items() if is_owing(node)}
    for node in copy.quotas.values():
        assert list(owed(node).items()) == list(_owed(node).items())
    return owing


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
    sampler = EngineSampler()
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
        sampler.apply(ts, event)
    assert sampler.state.owing_since == expected
    assert sampler.state.starving_since == starving


def test_owing_clock_starts_at_the_sample_and_stops_when_it_no_longer_owes() -> None:
    sampler = EngineSampler()
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
    for ts, event in events:
        sampler.apply(ts, event)
        history.append(dict(sampler.state.owing_since))
    # a owes from the b1 record (1.5 s): sampled at the end of second 1, i.e. at 1800
    assert history[5] == {}
    assert history[6] == {"a": 1800}
    assert history[7] == {"a": 1800}
    assert history[8] == {}  # b1 gone: at the next sample a no longer owes


def test_starvation_ends_when_free_capacity_grows_though_its_quota_is_unchanged() -> None:
    """Only the free-capacity index notices this flip: quota a's numbers stay put."""
    sampler = EngineSampler()
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
    for ts, event in events:
        sampler.apply(ts, event)
        quotas = sampler.projection.settled().quotas
        runtime = dict(quotas["a"].runtime) if "a" in quotas else {}
        seen.append((dict(sampler.state.starving_since), runtime))
    assert seen[5][0] == {"a1": 1000}  # sampled at the end of second 1
    assert seen[6][0] == {}  # free grew to 5 >= 3 at second 2
    assert seen[5][1] == seen[6][1] == {"cpu": 3}


def test_pods_that_stop_pending_without_a_clock_are_not_kept_for_the_next_sample() -> None:
    """A replay never samples, so ``touched_pods`` must not grow with every pod
    that was ever pending: one that leaves the pending index with no starvation
    clock needs no re-check."""
    projection = Projection()
    projection.apply(0, 0, LedgerOpened(ledger_id="t"))
    offset = 0
    for i in range(200):
        for event in (
            PodUpserted(uid=f"p{i}", name="p", namespace="a", requests={"cpu": 1}),
            PodUpserted(
                uid=f"p{i}", name="p", namespace="a", requests={"cpu": 1}, phase="Running", node="n"
            ),
            PodRemoved(uid=f"p{i}"),
        ):
            offset += 1
            projection.apply(offset, offset, event)
    assert projection.state.touched_pods == set()
    assert projection.state.pending_pods == set()


def test_a_quota_changed_while_reclaim_is_off_is_read_afresh() -> None:
    """Samples with reclaim off consume the change bookkeeping without reading
    any pod or quota; switched on again, the sample reads everything afresh
    (nothing kept from before is trusted: DECISIONS 353)."""
    sampler = EngineSampler()
    events: list[tuple[int, Event]] = [
        (1000, NodeUpserted(name="n", allocatable={"cpu": 4})),
        (1000, QuotaUpserted(name="a", min={"cpu": 2})),
        (1000, QuotaUpserted(name="b", min={"cpu": 2})),
        (
            1000,
            PodUpserted(
                uid="r", name="r", namespace="b", requests={"cpu": 4}, phase="Running", node="n"
            ),
        ),
        (1000, PodUpserted(uid="w", name="w", namespace="a", requests={"cpu": 2})),
        (2000, SettingsChanged(reclaim_enabled=False)),
        (3000, QuotaUpserted(name="a", min={"cpu": 1}, max={"cpu": 1})),
        (4000, SettingsChanged(reclaim_enabled=True)),
        (5000, NodeUpserted(name="n2", allocatable={"cpu": 0})),
    ]
    starving: list[set[str]] = []
    for ts, event in events:
        sampler.apply(ts, event)
        starving.append(set(sampler.state.starving_since))
    assert starving[5] == {"w"}  # a has room for w, the cluster has none
    # a's max now leaves no room for w: no clock starts once reclaim is back
    assert set(sampler.state.starving_since) == _starving_now(sampler.projection) == set()
