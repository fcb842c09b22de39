"""Building blocks for projection tests: literal events and hypothesis strategies."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

import msgspec
from hypothesis import strategies as st

from quotaledger.engine.simulate import Simulation
from quotaledger.events.codec import encode_event
from quotaledger.events.model import (
    Event,
    EvictionRequested,
    LeaderElected,
    LedgerOpened,
    NamespaceWeighted,
    NodeRemoved,
    NodeUpserted,
    PodRemoved,
    PodUpserted,
    PreemptionFinished,
    PreemptionStarted,
    QuotaRemoved,
    QuotaUpserted,
    SettingsChanged,
)
from quotaledger.projections import Projection, state_json
from quotaledger.projections.columns import FIELDS
from quotaledger.projections.state import ProjectedState, QuotaNode


def fold(events: Iterable[Event], *, ts_step: int = 0) -> Projection:
    """A projection of ``LedgerOpened`` followed by ``events`` at offsets 1..n."""
    projection = Projection()
    projection.apply(0, 0, LedgerOpened(ledger_id="test"))
    for offset, event in enumerate(events, start=1):
        projection.apply(offset, offset * ts_step, event)
    return projection


def state_of(events: Iterable[Event]) -> dict[str, Any]:
    return state_json(fold(events).state)


#: The engine's sampling bookkeeping (what changed since its last sample of the
#: clocks): a restored state starts with a full sample instead (DECISIONS 13);
#: and its timers in firing order, which a restored state lists afresh.
SAMPLING = {
    "touched",
    "touched_pods",
    "free_at_sample",
    "starving_full",
    "sample_inputs",
    "timer_index",
    "owing_index",
}
#: The array recompute's walk of the tree and its version (``projections.recompute``):
#: a cache, rebuilt when missing, not part of what a state is.
TREE_CACHE = {"tree_version", "tree_arrays", "sorted_children", "reconfigured", "finished_order"}
#: Where the quotas' numbers are stored (``projections.columns``): compared
#: through each quota's numbers (``NUMBERS``), not as storage.
STORAGE = {"columns"}
#: A quota's caches, unflushed changes and storage place; everything else of a
#: node is compared, and every number it reads from its row.
NODE_CACHES = {"terms", "sum_log", "sums_stale", "store", "row"}
#: The incremental state hash's marks and kept digests (``projections.state_digest``):
#: a cache, rebuilt when missing; the hash itself is compared instead.
HASH_MEMO = {"hash_pods", "hash_quotas", "hash_nodes", "hash_weights", "hash_memo"}
NUMBERS = FIELDS


def assert_same_state(live: ProjectedState, rebuilt: ProjectedState) -> None:
    """Every field of two settled states equal — persisted fields, indexes and
    every derived number of every quota — except the sampling bookkeeping.
    ``rebuilt`` is typically ``load(dump(live))``: a state built from scratch
    out of the persisted fields (fresh quotas, pod sums and a full recompute)."""
    for item in dataclasses.fields(ProjectedState):
        if item.name in SAMPLING | TREE_CACHE | STORAGE | HASH_MEMO or item.name == "quotas":
            continue
        assert getattr(live, item.name) == getattr(rebuilt, item.name), item.name
    assert live.quotas.keys() == rebuilt.quotas.keys()
    for name, node in live.quotas.items():
        again = rebuilt.quotas[name]
        assert not node.sum_log and not node.sums_stale, name
        for item in dataclasses.fields(QuotaNode):
            if item.name not in NODE_CACHES:
                assert getattr(node, item.name) == getattr(again, item.name), (name, item.name)
        for number in NUMBERS:
            assert getattr(node, number) == getattr(again, number), (name, number)


QUOTAS = ["q0", "q1", "q2", "q3", "q4", "q5"]
NAMESPACES = ["ns0", "ns1", "kube-system", *QUOTAS]
RESOURCES = ["cpu", "gpu"]
PODS = [f"p{i}" for i in range(16)]

amount = st.integers(min_value=0, max_value=40)
rl = st.dictionaries(st.sampled_from(RESOURCES), amount, max_size=2)
optional_rl = st.none() | rl

quota_upserted = st.builds(
    QuotaUpserted,
    name=st.sampled_from([*QUOTAS, "default"]),
    parent=st.sampled_from(["root", "root", *QUOTAS]),
    is_parent=st.booleans(),
    min=rl,
    max=optional_rl,
    shared_weight=st.none() | rl,
    allow_lent=st.booleans(),
    lending_limit=st.none() | rl,
    borrowing_limit=st.none() | rl,
    namespaces=st.lists(st.sampled_from(["ns0", "ns1"]), max_size=2, unique=True),
    preemption_delay_s=st.sampled_from([0.0, 0.0, 5.0]),
)
nonempty_requests = st.dictionaries(st.sampled_from(RESOURCES), st.integers(1, 60), min_size=1)
pod_upserted = st.builds(
    PodUpserted,
    uid=st.sampled_from(PODS),
    name=st.just("pod"),
    namespace=st.sampled_from(NAMESPACES),
    requests=st.dictionaries(st.sampled_from(RESOURCES), st.integers(0, 60), max_size=2),
    priority=st.integers(min_value=0, max_value=3),
    phase=st.sampled_from(["Pending", "Running", "Running", "Succeeded"]),
    node=st.none() | st.sampled_from(["n0", "n1", "n1"]),
    quota=st.none() | st.none() | st.sampled_from([*QUOTAS, "system", "nope"]),
)
node_upserted = st.builds(
    NodeUpserted,
    name=st.sampled_from(["n0", "n1", "n2"]),
    allocatable=st.dictionaries(st.sampled_from(RESOURCES), st.integers(0, 200), max_size=2),
)
#: A quota moved under a parent that does not exist: an orphan (§8 rule 10).
orphaned = st.builds(
    QuotaUpserted,
    name=st.sampled_from(QUOTAS),
    parent=st.just("gone"),
    is_parent=st.booleans(),
    min=rl,
)
events = st.one_of(
    quota_upserted,
    orphaned,
    pod_upserted,
    pod_upserted,
    pod_upserted,
    pod_upserted,
    node_upserted,
    st.builds(PodRemoved, uid=st.sampled_from(PODS)),
    st.builds(NodeRemoved, name=st.sampled_from(["n0", "n1", "n2"])),
    st.builds(QuotaRemoved, name=st.sampled_from(QUOTAS)),
    st.builds(SettingsChanged, min_scaling=st.booleans()),
    st.builds(NamespaceWeighted, namespace=st.sampled_from(NAMESPACES), weight=st.integers(1, 4)),
)


@st.composite
def trees(draw: st.DrawFn) -> list[Event]:
    """Nodes and a valid quota tree up to three levels deep, parents first."""
    out: list[Event] = [
        NodeUpserted(
            name=f"n{i}",
            allocatable={"cpu": draw(st.integers(0, 90)), "gpu": draw(st.integers(0, 40))},
        )
        for i in range(draw(st.integers(1, 2)))
    ]
    parents: list[str] = []
    room: dict[str, dict[str, int]] = {}
    for name in QUOTAS:
        parent = draw(st.sampled_from(["root", *parents]))
        is_parent = draw(st.booleans()) and len(parents) < 3
        minimum: dict[str, int] = {}
        for key in RESOURCES:
            cap = room[parent][key] if parent != "root" else 60
            value = draw(st.integers(0, max(0, cap)))
            if value:
                minimum[key] = value
        if parent != "root":
            for key, value in minimum.items():
                room[parent][key] -= value
        maximum = draw(
            st.none() | st.just({k: v + draw(st.integers(0, 80)) for k, v in minimum.items()})
        )
        if is_parent:
            parents.append(name)
            room[name] = dict(minimum)
            for key in RESOURCES:
                room[name].setdefault(key, 0)
        out.append(
            QuotaUpserted(
                name=name,
                parent=parent,
                is_parent=is_parent,
                min=minimum,
                max=maximum,
                shared_weight=draw(st.none() | rl),
                allow_lent=draw(st.booleans()),
                lending_limit=draw(st.none() | rl),
                borrowing_limit=draw(st.none() | rl),
            )
        )
    return out


@st.composite
def histories(draw: st.DrawFn) -> list[Event]:
    """A tree, then pods and edits in random order."""
    prefix = draw(trees())
    tail = draw(st.lists(st.one_of(pod_upserted, pod_upserted, events), min_size=10, max_size=50))
    # half the re-upserts of a pod keep its namespace and quota field: an
    # in-place update of the same pod (the fold's ``replace_pod`` path)
    last: dict[str, PodUpserted] = {}
    for i, event in enumerate(tail):
        if isinstance(event, PodUpserted):
            prior = last.get(event.uid)
            if prior is not None and draw(st.booleans()):
                event = tail[i] = msgspec.structs.replace(
                    event,
                    namespace=prior.namespace,
                    quota=prior.quota,
                    requests=draw(nonempty_requests),
                )
            last[event.uid] = event
    return prefix + tail


# ------------------------------------------------------------------ engine-made histories

#: 2026-01-01T00:00:00Z in ms: engine histories start here.
ENGINE_T0 = 1_767_225_600_000
RUNNING_PODS = [f"r{i}" for i in range(10)]
PENDING_PODS = [f"w{i}" for i in range(4)]
ENGINE_PODS = RUNNING_PODS + PENDING_PODS
_CREATED = [None, *(datetime(2026, 1, 1, 0, m, tzinfo=UTC) for m in (1, 2, 3))]


@st.composite
def contended_tree(draw: st.DrawFn) -> list[Event]:
    """One node and a tree whose mins nearly cover it, so quotas borrow, owe
    and starve: root → a (parent) → a1, a2; root → b, c (siblings and cousins
    for reclaim's nearest-first order)."""
    cpu, gpu = draw(st.integers(20, 80)), draw(st.integers(0, 30))

    def part(total: int) -> int:
        return draw(st.integers(0, max(0, total)))

    a1, a2 = {"cpu": part(cpu // 4), "gpu": part(gpu // 3)}, {"cpu": part(cpu // 4)}
    a = {"cpu": a1["cpu"] + a2["cpu"] + part(5), "gpu": a1["gpu"] + part(3)}
    b, c = {"cpu": part(cpu // 3)}, {"cpu": part(cpu // 3), "gpu": part(gpu // 2)}

    def maximum(minimum: dict[str, int]) -> dict[str, int] | None:
        if draw(st.booleans()):
            return None
        return {key: minimum.get(key, 0) + draw(st.integers(1, 40)) for key in RESOURCES}

    def quota(name: str, minimum: dict[str, int], **kw: Any) -> QuotaUpserted:
        return QuotaUpserted(
            name=name,
            min={key: value for key, value in minimum.items() if value},
            max=maximum(minimum),
            allow_lent=draw(st.sampled_from([True, True, False])),
            **kw,
        )

    return [
        NodeUpserted(name="n0", allocatable={"cpu": cpu, "gpu": gpu}),
        quota("a", a, is_parent=True),
        quota("a1", a1, parent="a"),
        quota("a2", a2, parent="a"),
        quota("b", b),
        quota("c", c),
    ]


@st.composite
def engine_facts(draw: st.DrawFn) -> list[tuple[int, Event]]:
    """Timed facts that make the engine decide: settings with short revoke and
    reclaim delays and quota-decrease preemption on, a valid tree, then pods
    (running, pending, removed), node changes and lowered maxes with a delay
    (valid by §8 rule 15), at gaps that let timers fire between them."""
    head: list[Event] = [
        SettingsChanged(
            quota_preemption_enabled=draw(st.sampled_from([True, True, False])),
            revoke_enabled=draw(st.booleans()),
            revoke_after_s=draw(st.sampled_from([1.0, 5.0])),
            reclaim_enabled=draw(st.sampled_from([True, True, False])),
            reclaim_after_s=draw(st.sampled_from([1.0, 2.0])),
            preemption_miss_percent=draw(st.sampled_from([0.0, 0.0, 25.0])),
        ),
        *draw(st.one_of(contended_tree(), contended_tree(), trees())),
    ]
    configs = {event.name: event for event in head if isinstance(event, QuotaUpserted)}
    leaves = [name for name, config in configs.items() if not config.is_parent]
    # pods crowd into a few leaves, whose maxes the edits lower
    owners = draw(st.lists(st.sampled_from(leaves), min_size=1, max_size=3, unique=True))
    edited = sorted({*owners, *(configs[name].parent for name in owners)} & set(configs))

    def pods(
        uids: list[str], namespaces: list[str], phase: str, node: str | None, most: int
    ) -> st.SearchStrategy[PodUpserted]:
        return st.builds(
            PodUpserted,
            uid=st.sampled_from(uids),
            name=st.just("pod"),
            namespace=st.sampled_from(namespaces),
            requests=st.fixed_dictionaries(
                {"cpu": st.integers(1, most)}, optional={"gpu": st.integers(1, most // 2)}
            ),
            priority=st.integers(0, 2),
            phase=st.just(phase),
            node=st.just(node),
            created_at=st.sampled_from(_CREATED),
            originator=st.booleans(),
            allow_preemption=st.booleans(),
            preemptible=st.sampled_from([True, True, False]),
            daemonset=st.sampled_from([False, False, False, True]),
        )

    running = pods(RUNNING_PODS, [*owners, "default"], "Running", "n0", 30)
    pending = pods(PENDING_PODS, leaves, "Pending", None, 8)

    @st.composite
    def lowered(draw: st.DrawFn) -> QuotaUpserted:
        config = configs[draw(st.sampled_from(edited))]
        new_max = {key: config.min.get(key, 0) + draw(st.integers(1, 6)) for key in RESOURCES}
        return QuotaUpserted(
            name=config.name,
            parent=config.parent,
            is_parent=config.is_parent,
            min=config.min,
            max=new_max,
            shared_weight=config.shared_weight,
            allow_lent=config.allow_lent,
            lending_limit=config.lending_limit,
            borrowing_limit=config.borrowing_limit,
            preemption_delay_s=draw(st.sampled_from([0.5, 2.5])),
        )

    tail = draw(
        st.lists(
            st.one_of(
                running,
                running,
                running,
                pending,
                st.builds(PodRemoved, uid=st.sampled_from(ENGINE_PODS)),
                lowered(),
                st.builds(
                    NodeUpserted,
                    name=st.just("n1"),
                    allocatable=st.dictionaries(
                        st.sampled_from(RESOURCES), st.integers(0, 60), max_size=2
                    ),
                ),
            ),
            min_size=8,
            max_size=30,
        )
    )
    out: list[tuple[int, Event]] = []
    ts = ENGINE_T0
    for event in head:
        out.append((ts, event))
    for event in tail:
        ts += draw(st.sampled_from([0, 400, 1000, 1000, 2500]))
        out.append((ts, event))
    return out


def engine_run(facts: list[tuple[int, Event]]) -> Simulation:
    """Run the whole engine (``simulate`` executor) over timed facts: its
    records are a ledger the engine made, decisions and clocks included."""
    simulation = Simulation(ledger_id="engine-history")
    simulation.run((ts, encode_event(event)) for ts, event in facts)
    return simulation


# ------------------------------------------------------------------ rejections on purpose

_quota_names = st.sampled_from([*QUOTAS, "default", "fresh"])
#: Facts and decisions the fold refuses in any state (§5 Validation, §6 guard,
#: §8 rules 4-5, 9, 15): applying one must change nothing but ``rejected``.
rejections = st.one_of(
    st.builds(QuotaUpserted, name=_quota_names, min=st.just({"cpu": 5}), max=st.just({"cpu": 4})),
    st.builds(QuotaUpserted, name=_quota_names, min=st.just({"gpu": 1}), max=st.just({"cpu": 4})),
    st.builds(
        QuotaUpserted,
        name=_quota_names,
        min=st.just({"cpu": 3}),
        max=st.just({"cpu": 3}),
        preemption_delay_s=st.just(1.0),
    ),
    st.builds(QuotaUpserted, name=st.sampled_from(["root", "system"])),
    st.builds(QuotaUpserted, name=st.just("default"), is_parent=st.just(True)),
    st.sampled_from(QUOTAS).map(lambda name: QuotaUpserted(name=name, parent=name)),
    st.builds(QuotaRemoved, name=st.sampled_from(["root", "system", "default", "unknown"])),
    st.builds(LedgerOpened, ledger_id=st.just("again")),
    st.builds(LeaderElected, epoch=st.integers(-3, 0), instance=st.just("stale")),
    st.builds(
        PreemptionStarted,
        preemption_id=st.just("x"),
        queue=st.just("no-such-quota"),
        cause=st.sampled_from(["quota-decrease", "overuse", "reclaim"]),
        target=st.just({"cpu": 1}),
        basis=st.just(0),
    ),
    st.builds(
        EvictionRequested,
        eviction_id=st.just("x/p"),
        preemption_id=st.just("not-running"),
        pod_uid=st.sampled_from(PODS),
        queue=st.sampled_from(QUOTAS),
    ),
    st.builds(
        PreemptionFinished,
        preemption_id=st.just("not-running"),
        queue=st.sampled_from(QUOTAS),
        outcome=st.sampled_from(["complete", "best-effort", "not-helpful"]),
    ),
)
