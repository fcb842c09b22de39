"""Pods, nodes, namespaces and the settings ConfigMap as facts (DESIGN §12), on literal specs.

Request arithmetic is kube-scheduler's (KEP-753 sidecars, overhead); the expected numbers are
worked out by hand in each test.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from quotaledger.adapters.kubernetes.settings import DEFAULTS, settings_change
from quotaledger.adapters.kubernetes.translate import (
    Untranslatable,
    fact_payload,
    namespace_weight,
    node_fact,
    pod_fact,
    pod_requests,
)
from quotaledger.events.model import PodUpserted


def c(cpu: str | None = None, memory: str | None = None, **extra: Any) -> dict[str, Any]:
    requests = {}
    if cpu is not None:
        requests["cpu"] = cpu
    if memory is not None:
        requests["memory"] = memory
    return {"name": "c", "resources": {"requests": requests}, **extra}


def test_app_containers_add_up() -> None:
    spec = {"containers": [c("100m", "64Mi"), c("250m", "1Gi")]}
    assert pod_requests(spec) == {"cpu": 350, "memory": 64 * 2**20 + 2**30}


def test_plain_init_container_larger_than_the_app_sets_the_request() -> None:
    spec = {"initContainers": [c("2", "16Mi")], "containers": [c("500m", "1Gi")]}
    # cpu: max(2000 init, 500 app); memory: max(16Mi, 1Gi)
    assert pod_requests(spec) == {"cpu": 2000, "memory": 2**30}


def test_sidecars_run_beside_later_init_containers_and_the_app() -> None:
    spec = {
        "initContainers": [
            c("100m", restartPolicy="Always"),  # sidecar 1
            c("700m"),  # runs beside sidecar 1: 800
            c("200m", restartPolicy="Always"),  # sidecar 2: sidecars now 300
            c("400m"),  # beside both sidecars: 700
        ],
        "containers": [c("300m")],
    }
    # running sum: app 300 + sidecars 300 = 600; init peak 800 -> 800
    assert pod_requests(spec) == {"cpu": 800}
    spec["initContainers"][1] = c("100m")
    # peaks: 100, 200, 300, 700 ; running 600 -> 700
    assert pod_requests(spec) == {"cpu": 700}
    spec["initContainers"][3] = c("50m")
    # peaks: 100, 200, 300, 350 ; running 600 -> 600
    assert pod_requests(spec) == {"cpu": 600}


def test_overhead_is_added_after_the_maximum() -> None:
    spec = {
        "initContainers": [c("1")],
        "containers": [c("300m")],
        "overhead": {"cpu": "250m", "memory": "120Mi"},
    }
    assert pod_requests(spec) == {"cpu": 1250, "memory": 120 * 2**20}


def test_pod_level_requests_replace_the_container_sum() -> None:
    spec = {
        "containers": [c("300m", "1Gi")],
        "resources": {"requests": {"cpu": "2"}},
        "overhead": {"cpu": "100m"},
    }
    assert pod_requests(spec) == {"cpu": 2100, "memory": 2**30}


def test_extended_resources_and_no_requests() -> None:
    spec = {"containers": [{"name": "x"}, c(**{"resources": {"requests": {"nvidia.com/gpu": 2}}})]}
    assert pod_requests(spec) == {"nvidia.com/gpu": 2}


def test_unparsable_quantity_names_the_field() -> None:
    with pytest.raises(Untranslatable, match=r"spec.initContainers\[0\].resources.requests.cpu"):
        pod_requests({"initContainers": [c("lots")], "containers": []})


def base_pod(**meta: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "web-1",
            "namespace": "shop",
            "uid": "u-1",
            "creationTimestamp": "2026-03-01T10:00:00Z",
            **meta,
        },
        "spec": {"containers": [c("500m")], "priority": 1000, "nodeName": "n1"},
        "status": {"phase": "Running"},
    }


def test_pod_fact_fields() -> None:
    obj = base_pod(
        labels={"app": "web", "quotaledger.io/quota": "team-a"},
        annotations={
            "quotaledger.io/preemptible": "false",
            "quotaledger.io/originator": "true",
            "yunikorn.apache.org/allow-preemption": "false",
        },
        ownerReferences=[{"kind": "DaemonSet", "name": "ds", "apiVersion": "apps/v1"}],
    )
    _, event = fact_payload(pod_fact(obj))
    assert isinstance(event, PodUpserted)
    assert (event.uid, event.name, event.namespace) == ("u-1", "web-1", "shop")
    assert event.requests == {"cpu": 500}
    assert (event.priority, event.phase, event.node, event.quota) == (
        1000,
        "Running",
        "n1",
        "team-a",
    )
    assert (
        event.created_at is not None and event.created_at.isoformat() == "2026-03-01T10:00:00+00:00"
    )
    assert not event.preemptible and event.originator and not event.allow_preemption
    assert event.daemonset
    assert event.labels == {"app": "web", "quotaledger.io/quota": "team-a"}


def test_pod_defaults_and_source_labels() -> None:
    obj = base_pod(
        labels={"queue": "root.eng.ml"},
        ownerReferences=[{"kind": "ReplicaSet", "name": "rs"}],
    )
    _, event = fact_payload(pod_fact(obj))
    assert isinstance(event, PodUpserted)
    assert event.preemptible and not event.originator and event.allow_preemption
    assert not event.daemonset and event.quota is None
    _, event = fact_payload(pod_fact(obj, "yunikorn"))
    assert isinstance(event, PodUpserted) and event.quota == "eng.ml"
    obj["metadata"]["labels"] = {"quota.scheduling.koordinator.sh/name": "q1"}
    _, event = fact_payload(pod_fact(obj, "koordinator"))
    assert isinstance(event, PodUpserted) and event.quota == "q1"


def test_unknown_phase_keeps_the_pod_on_its_node() -> None:
    obj = base_pod()
    obj["status"]["phase"] = "Unknown"
    assert pod_fact(obj)["phase"] == "Running"
    del obj["spec"]["nodeName"]
    assert pod_fact(obj)["phase"] == "Pending"


def test_out_of_bounds_creation_time_is_refused() -> None:
    obj = base_pod(creationTimestamp="9999-01-01T00:00:00Z")
    with pytest.raises(Untranslatable, match="creationTimestamp"):
        fact_payload(pod_fact(obj))


def test_node_fact() -> None:
    obj = {
        "metadata": {"name": "n1", "labels": {"zone": "a"}},
        "spec": {"unschedulable": True},
        "status": {"allocatable": {"cpu": "7910m", "memory": "31Gi", "pods": "110"}},
    }
    _, event = fact_payload(node_fact(obj))
    assert (
        event
        == fact_payload(
            {
                "kind": "NodeUpserted",
                "name": "n1",
                "allocatable": {"cpu": "7910m", "memory": 31 * 2**30, "pods": 110},
                "labels": {"zone": "a"},
                "unschedulable": True,
            }
        )[1]
    )


def test_namespace_weight() -> None:
    assert namespace_weight({"metadata": {"name": "a"}}) == ("a", 1)
    ns = {"metadata": {"name": "a", "annotations": {"quotaledger.io/weight": "3"}}}
    assert namespace_weight(ns) == ("a", 3)
    ns["metadata"]["annotations"]["quotaledger.io/weight"] = "0"
    with pytest.raises(Untranslatable, match=r"quotaledger\.io/weight"):
        namespace_weight(ns)


def test_settings_change_only_changed_keys_and_bad_values_named() -> None:
    last = dict(DEFAULTS)
    changed, bad = settings_change(
        {"revoke_after_s": "60", "reclaim_enabled": "False", "min_scaling": "true"}, last
    )
    assert changed == {"revoke_after_s": 60.0, "reclaim_enabled": False}
    assert bad == []
    last |= changed
    changed, bad = settings_change({"revoke_after_s": "soon", "reclaim_enabled": "false"}, last)
    assert changed == {}
    assert bad == [("revoke_after_s", "'soon' is not a number")]
    # a removed key returns to its default
    changed, bad = settings_change({}, last)
    assert changed == {"revoke_after_s": 120.0, "reclaim_enabled": True}
    _, bad = settings_change({"revoke_afer_s": "1"}, last)
    assert bad and bad[0][0] == "revoke_afer_s"


@given(
    st.lists(
        st.tuples(st.integers(0, 5000), st.booleans()),
        min_size=0,
        max_size=6,
    ),
    st.lists(st.integers(0, 5000), min_size=0, max_size=4),
)
def test_request_is_at_least_every_phase_of_the_pod(
    inits: list[tuple[int, bool]], apps: list[int]
) -> None:
    """Whatever runs at one time (an init container beside earlier sidecars; all sidecars
    beside the app) fits in the pod's request, and the request is one of those sums."""
    spec = {
        "initContainers": [
            c(f"{m}m", **({"restartPolicy": "Always"} if side else {})) for m, side in inits
        ],
        "containers": [c(f"{m}m") for m in apps],
    }
    cpu = pod_requests(spec).get("cpu", 0)
    sidecars = 0
    phases = []
    for m, side in inits:
        if side:
            sidecars += m
            phases.append(sidecars)
        else:
            phases.append(sidecars + m)
    phases.append(sidecars + sum(apps))
    assert cpu == max(phases)
