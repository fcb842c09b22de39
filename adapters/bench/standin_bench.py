"""What ``quotaledger bench k8s`` asks of the stand-in Kubernetes API server
(:mod:`.standin`, run as a process; docs/PERFORMANCE.md): a generated cluster of nodes and
pods, deterministic, and a churn of pod updates at a given rate whose labels carry the
wall-clock time of each update (the benchmark's lag probe).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from .standin_store import ObjectStore


class Churn:
    """Pod updates round-robin (``POST /bench/churn?rate=R&seconds=S``), counted."""

    def __init__(self) -> None:
        self.updates = 0
        self.task: asyncio.Task[None] | None = None

    def start(self, store: ObjectStore, rate: float, seconds: float) -> None:
        self.task = asyncio.create_task(self.churn_pods(store, rate, seconds))

    @property
    def done(self) -> bool:
        return self.task is not None and self.task.done()

    async def churn_pods(self, store: ObjectStore, rate: float, seconds: float) -> None:
        """Update pods round-robin at ``rate`` per second: label ``bench-sent-ms`` carries
        the wall-clock time of the update (the benchmark's lag probe), and every third
        update flips the phase."""
        loop = asyncio.get_running_loop()
        keys = sorted(store.store("", "pods"))
        start = loop.time()
        index = 0
        while loop.time() - start < seconds:
            due = int((loop.time() - start) * rate)
            while self.updates < due:
                key = keys[index % len(keys)]
                index += 1
                obj = store.store("", "pods")[key]
                obj = dict(obj, metadata=dict(obj["metadata"]), status=dict(obj["status"]))
                labels = dict(obj["metadata"].get("labels") or {})
                labels["bench-sent-ms"] = str(time.time_ns() // 1_000_000)
                obj["metadata"]["labels"] = labels
                if self.updates % 3 == 0:
                    running = obj["status"].get("phase") == "Running"
                    obj["status"]["phase"] = "Pending" if running else "Running"
                store.commit("", "pods", obj, "MODIFIED")
                store.history.clear()  # nothing re-watches from old versions in the bench
                self.updates += 1
            await asyncio.sleep(0.005)


def generated_cluster(pods: int, nodes: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``nodes`` nodes and ``pods`` pods (70 % Running), deterministic."""
    node_objs = [
        {
            "metadata": {"name": f"node-{i}", "labels": {"zone": f"z{i % 3}"}},
            "spec": {},
            "status": {"allocatable": {"cpu": "64", "memory": "256Gi", "pods": "110"}},
        }
        for i in range(nodes)
    ]
    pod_objs = []
    for i in range(pods):
        running = i % 10 < 7
        pod_objs.append(
            {
                "metadata": {
                    "name": f"pod-{i}",
                    "namespace": f"ns-{i % 500}",
                    "uid": f"uid-{i}",
                    "creationTimestamp": "2026-01-01T00:00:00Z",
                    "labels": {"app": f"app-{i % 1000}", "quotaledger.io/quota": f"q-{i % 500}"},
                    "ownerReferences": [{"kind": "ReplicaSet", "name": f"rs-{i % 1000}"}],
                },
                "spec": {
                    "nodeName": f"node-{i % nodes}" if running else None,
                    "priority": i % 3 * 100,
                    "containers": [
                        {
                            "name": "app",
                            "resources": {"requests": {"cpu": "250m", "memory": "512Mi"}},
                        },
                        {
                            "name": "sidecar",
                            "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}},
                        },
                    ],
                },
                "status": {"phase": "Running" if running else "Pending"},
            }
        )
    return pod_objs, node_objs
