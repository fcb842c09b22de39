"""Building blocks for projection tests: literal events and hypothesis strategies."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from hypothesis import strategies as st

from quotaledger.events.model import (
    Event,
    LedgerOpened,
    NamespaceWeighted,
    NodeRemoved,
    NodeUpserted,
    PodRemoved,
    PodUpserted,
    QuotaRemoved,
    QuotaUpserted,
    SettingsChanged,
)
from quotaledger.projections import Projection, state_json


def fold(events: Iterable[Event], *, ts_step: int = 0) -> Projection:
    """A projection of ``LedgerOpened`` followed by ``events`` at offsets 1..n."""
    projection = Projection()
    projection.apply(0, 0, LedgerOpened(ledger_id="test"))
    for offset, event in enumerate(events, start=1):
        projection.apply(offset, offset * ts_step, event)
    return projection


def state_of(events: Iterable[Event]) -> dict[str, Any]:
    return state_json(fold(events).state)


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
events = st.one_of(
    quota_upserted,
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
    tail = draw(st.lists(st.one_of(pod_upserted, pod_upserted, events), min_size=1, max_size=50))
    return prefix + tail
