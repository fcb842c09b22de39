"""A deterministic corpus of ``simulate`` inputs (tests/test_simulate_identical.py).

Each case is a list of ``(ts, payload)`` fact lines built from
``random.Random(seed).random()`` alone: that method's sequence is the one part
of :mod:`random` Python guarantees across versions, so the same seed gives the
same bytes on every machine and Python. The histories crowd pods into a
contended tree and move it: lowered and raised maxes with delays (quota
decrease), leaves that hold more than their runtime (overuse), pending pods
with room in their quota but not in the cluster (reclaim), settings switched
on, off and retuned mid-way, nodes coming and going, removals, and facts the
fold rejects.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from typing import Any, TypeVar

T = TypeVar("T")

#: 2026-01-01T00:00:00Z in ms.
T0 = 1_767_225_600_000

Line = tuple[int, bytes]


class _Draw:
    """Integers and choices from ``random()`` only (see the module docstring)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def real(self) -> float:
        return self.rng.random()

    def int(self, low: int, high: int) -> int:
        return low + min(high - low, int(self.rng.random() * (high - low + 1)))

    def pick(self, items: Sequence[T]) -> T:
        return items[min(len(items) - 1, int(self.rng.random() * len(items)))]

    def chance(self, p: float) -> bool:
        return self.rng.random() < p


RESOURCES = ("cpu", "memory", "nvidia.com/gpu")


def _wire(amounts: dict[str, int]) -> dict[str, Any]:
    """cpu in millicores, memory in Gi, gpus as counts (the wire's quantities)."""
    out: dict[str, Any] = {}
    for key, value in amounts.items():
        if key == "cpu":
            out[key] = f"{value}m"
        elif key == "memory":
            out[key] = f"{value}Gi"
        else:
            out[key] = value
    return out


def case(seed: int) -> dict[str, Any]:
    """One simulate input: ``{"seed", "executor", "until", "lines"}``."""
    d = _Draw(seed)
    size = d.pick((3, 4, 5, 6, 8, 12, 20, 40))
    nodes = d.int(1, 3)
    cpu_per_node = d.pick((4000, 8000, 16000))
    lines: list[Line] = []
    ts = T0

    def emit(doc: dict[str, Any]) -> None:
        lines.append((ts, json.dumps(doc).encode()))

    def settings_doc() -> dict[str, Any]:
        doc: dict[str, Any] = {"kind": "SettingsChanged"}
        if d.chance(0.8):
            doc["quota_preemption_enabled"] = d.chance(0.8)
        if d.chance(0.7):
            doc["revoke_enabled"] = d.chance(0.7)
        if d.chance(0.7):
            doc["revoke_after_s"] = d.pick((0, 0.5, 1, 2, 5, 30))
        if d.chance(0.7):
            doc["reclaim_enabled"] = d.chance(0.7)
        if d.chance(0.7):
            doc["reclaim_after_s"] = d.pick((0, 0.5, 1, 3, 10))
        if d.chance(0.3):
            doc["preemption_miss_percent"] = d.pick((0, 10, 25, 50))
        if d.chance(0.2):
            doc["min_scaling"] = d.chance(0.5)
        return doc

    emit(settings_doc())
    for i in range(nodes):
        allocatable: dict[str, int] = {"cpu": cpu_per_node, "memory": 64}
        if d.chance(0.4):
            allocatable["nvidia.com/gpu"] = d.pick((2, 4, 8))
        emit({"kind": "NodeUpserted", "name": f"n{i}", "allocatable": _wire(allocatable)})

    # the tree: parents drawn among earlier parents, leaves' mins from the
    # cluster, parents' mins covering their children's (§8 rule 14)
    names = [f"q{i}" for i in range(size)]
    parent_of: dict[str, str] = {}
    is_parent: dict[str, bool] = {}
    parents: list[str] = []
    for name in names:
        parent_of[name] = d.pick(["root", "root", *parents]) if parents else "root"
        is_parent[name] = len(parents) < max(1, size // 4) and d.chance(0.35)
        if is_parent[name]:
            parents.append(name)
    # a parent without children stays a parent (empty): fine for the fold
    total = cpu_per_node * nodes
    mins: dict[str, dict[str, int]] = {}
    for name in reversed(names):
        if is_parent[name]:
            own: dict[str, int] = {}
            for child in names:
                if parent_of[child] == name:
                    for key, value in mins[child].items():
                        own[key] = own.get(key, 0) + value
            if d.chance(0.5):
                own["cpu"] = own.get("cpu", 0) + d.int(0, total // (2 * size))
            mins[name] = {k: v for k, v in own.items() if v > 0}
        else:
            leaf: dict[str, int] = {}
            if d.chance(0.85):
                leaf["cpu"] = d.int(0, 2 * total // size)
            if d.chance(0.4):
                leaf["memory"] = d.int(0, 16)
            if d.chance(0.2):
                leaf["nvidia.com/gpu"] = d.int(0, 2)
            mins[name] = {k: v for k, v in leaf.items() if v > 0}
    maxes: dict[str, dict[str, int] | None] = {}
    delays: dict[str, float] = {}
    configs: dict[str, dict[str, Any]] = {}
    for name in names:
        minimum = mins[name]
        delay = d.pick((0, 0, 0.5, 1, 2.5, 5)) if d.chance(0.6) else 0
        maximum: dict[str, int] | None = None
        if d.chance(0.75):
            maximum = {k: v + d.int(1, total // 2) for k, v in minimum.items()}
            if "cpu" not in maximum and d.chance(0.7):
                maximum["cpu"] = d.int(1, total)
        maxes[name], delays[name] = maximum, delay
        doc: dict[str, Any] = {
            "kind": "QuotaUpserted",
            "name": name,
            "parent": parent_of[name],
            "is_parent": is_parent[name],
            "min": _wire(minimum),
            "max": None if maximum is None else _wire(maximum),
            "preemption_delay_s": delay,
        }
        if d.chance(0.2):
            doc["shared_weight"] = {"cpu": d.int(1, 10)}
        if d.chance(0.2):
            doc["allow_lent"] = False
        if d.chance(0.15):
            doc["lending_limit"] = _wire({"cpu": d.int(0, total // size)})
        if d.chance(0.15):
            doc["borrowing_limit"] = _wire({"cpu": d.int(0, total // size)})
        if not is_parent[name] and d.chance(0.2):
            doc["namespaces"] = [f"ns-{name}"]
        configs[name] = doc
        emit(doc)

    leaves = [name for name in names if not is_parent[name]] or ["default"]
    crowded = [d.pick(leaves) for _ in range(d.int(1, 3))]
    uids = [f"p{i}" for i in range(d.int(4, 6 + 3 * size))]
    created = [None, "2026-01-01T00:00:00Z", "2026-01-01T00:00:01Z", "2026-01-01T00:01:00Z"]
    settings_changes = d.int(0, 3)

    def pod(uid: str, running: bool) -> dict[str, Any]:
        owner = d.pick(crowded) if d.chance(0.6) else d.pick([*leaves, "default"])
        requests = {"cpu": d.pick((100, 250, 500, 1000, 2000, 4000))}
        if d.chance(0.4):
            requests["memory"] = d.pick((1, 2, 4, 8))
        if d.chance(0.15):
            requests["nvidia.com/gpu"] = d.int(1, 2)
        doc: dict[str, Any] = {
            "kind": "PodUpserted",
            "uid": uid,
            "name": uid,
            "requests": _wire(requests),
            "priority": d.int(0, 3),
            "phase": "Running" if running else "Pending",
        }
        if d.chance(0.5):
            doc["namespace"] = owner
        else:
            doc["namespace"] = d.pick(("ns-x", "kube-system", f"ns-{owner}"))
            doc["quota"] = owner
        if running:
            doc["node"] = f"n{d.int(0, nodes - 1)}"
        stamp = d.pick(created)
        if stamp is not None:
            doc["created_at"] = stamp
        for flag, p in (("preemptible", 0.15), ("daemonset", 0.1), ("originator", 0.2)):
            if d.chance(p):
                doc[flag] = flag != "preemptible"
        if d.chance(0.15):
            doc["allow_preemption"] = False
        return doc

    for _ in range(d.int(10, 40 + 4 * size)):
        ts += d.pick((0, 0, 100, 250, 500, 1000, 1000, 2000, 3000, 10_000))
        roll = d.real()
        if roll < 0.40:
            emit(pod(d.pick(uids), running=True))
        elif roll < 0.55:
            emit(pod(d.pick(uids), running=False))
        elif roll < 0.62:
            emit({"kind": "PodRemoved", "uid": d.pick(uids)})
        elif roll < 0.66:
            doc = pod(d.pick(uids), running=True)
            doc["phase"] = d.pick(("Succeeded", "Failed"))
            emit(doc)
        elif roll < 0.78:
            # a lowered (or raised) max, valid by §8 rule 15 when it has a delay
            name = d.pick(crowded) if d.chance(0.6) else d.pick(names)
            doc = dict(configs[name])
            base = mins[name]
            new_max = {k: v + d.int(1, max(1, total // (2 * size))) for k, v in base.items()}
            room = total // (4 * size) if d.chance(0.6) else total // 2
            new_max["cpu"] = base.get("cpu", 0) + d.int(1, max(1, room))
            doc["max"] = _wire(new_max)
            doc["preemption_delay_s"] = d.pick((0, 0.5, 1, 1, 2.5, delays[name]))
            configs[name] = doc
            emit(doc)
        elif roll < 0.82:
            allocatable = {"cpu": d.pick((0, 2000, cpu_per_node, 2 * cpu_per_node)), "memory": 64}
            emit(
                {
                    "kind": "NodeUpserted",
                    "name": f"n{d.int(0, nodes)}",
                    "allocatable": _wire(allocatable),
                }
            )
        elif roll < 0.84:
            emit({"kind": "NodeRemoved", "name": f"n{d.int(0, nodes)}"})
        elif roll < 0.87 and settings_changes:
            settings_changes -= 1
            emit(settings_doc())
        elif roll < 0.89:
            emit({"kind": "QuotaRemoved", "name": d.pick(names)})
        elif roll < 0.91:
            emit({"kind": "NamespaceWeighted", "namespace": d.pick(("ns-x", *leaves)), "weight": 2})
        elif roll < 0.93:
            # rejected: min above max, an unknown kind, a wrong type
            bad = d.pick(
                (
                    {
                        "kind": "QuotaUpserted",
                        "name": d.pick(names),
                        "min": {"cpu": 5},
                        "max": {"cpu": 4},
                    },
                    {"kind": "NoSuchKind", "x": 1},
                    {"kind": "PodUpserted", "uid": 3, "name": "x", "namespace": "y"},
                )
            )
            emit(bad)
        else:
            # many pods at one instant: timers and clocks meet facts at the same ts
            for _ in range(d.int(2, 6)):
                emit(pod(d.pick(uids), running=d.chance(0.6)))
    until = None
    if d.chance(0.15):
        until = ts + d.pick((-5000, 0, 1000, 60_000))
    return {
        "seed": seed,
        "executor": "log" if d.chance(0.1) else "simulate",
        "until": until,
        "lines": lines,
    }
