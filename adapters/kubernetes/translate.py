"""Kubernetes objects → quotaledger facts (DESIGN §12). Pure: no I/O, no clock.

Each function takes one object as the API server sends it (a plain dict, camelCase) and
returns the fact JSON (a dict ready for :func:`fact_payload`) or raises
:class:`Untranslatable` naming the object and the field.

Pod requests follow kube-scheduler (``PodRequests`` of k8s.io/component-helpers, KEP-753
sidecars): app containers and restartable init containers (``restartPolicy: Always``) run
together, so their requests add up; each plain init container runs alone beside the
restartable init containers started before it; the pod requests the larger of that peak and
the running sum, per resource, plus ``spec.overhead``. Pod-level ``spec.resources.requests``
(KEP-2837), when set, replaces the container sum for the resources it names.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import msgspec

from quotaledger.events.codec import EventError, decode_event
from quotaledger.events.model import Event
from quotaledger.events.quantity import QuantityError, canonical_amount

QUOTA_LABEL = "quotaledger.io/quota"
PREEMPTIBLE_ANNOTATION = "quotaledger.io/preemptible"
ORIGINATOR_ANNOTATION = "quotaledger.io/originator"
WEIGHT_ANNOTATION = "quotaledger.io/weight"
YUNIKORN_ALLOW_PREEMPTION = "yunikorn.apache.org/allow-preemption"

#: Where each quota source's own pods name their quota (DESIGN §12 "the quota source's
#: own pod label"): (labels or annotations, key, prefix to strip).
SOURCE_POD_KEYS: dict[str, tuple[tuple[str, str, str], ...]] = {
    "quotaledger": (),
    "koordinator": (("labels", "quota.scheduling.koordinator.sh/name", ""),),
    "kueue": (),
    "volcano": (("annotations", "scheduling.volcano.sh/queue-name", ""),),
    "yunikorn": (
        ("labels", "queue", "root."),
        ("annotations", "yunikorn.apache.org/queue", "root."),
    ),
}

_ENCODER = msgspec.json.Encoder()
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(9000, 1, 1, tzinfo=UTC)


class Untranslatable(ValueError):
    """An object the adapter cannot turn into a fact; the message names it and the field."""


def describe(resource: str, obj: Any) -> str:
    """``pod default/web-1``, ``node n1``: how a rejection names an object."""
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    meta = meta if isinstance(meta, dict) else {}
    name = meta.get("name", "?")
    namespace = meta.get("namespace")
    return f"{resource} {namespace}/{name}" if namespace else f"{resource} {name}"


def fact_payload(fact: dict[str, Any]) -> tuple[bytes, Event]:
    """Encode a fact and decode it back as the fold will (DESIGN §4 validation and §9
    bounds): the payload to append and the event to compare with the last appended."""
    payload = _ENCODER.encode(fact)
    try:
        return payload, decode_event(payload)
    except EventError as exc:
        raise Untranslatable(exc.reason) from None


def _map(value: Any, path: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise Untranslatable(f"{path}: expected a map")
    return value


def _list(value: Any, path: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise Untranslatable(f"{path}: expected a list")
    return value


def _strings(value: Any, path: str) -> dict[str, str]:
    out = _map(value, path)
    for key, item in out.items():
        if not isinstance(item, str):
            raise Untranslatable(f"{path}.{key}: expected a string")
    return out


def resource_list(value: Any, path: str) -> dict[str, int]:
    """A Kubernetes ResourceList as canonical integers (DESIGN §2)."""
    out: dict[str, int] = {}
    for resource, amount in _map(value, path).items():
        if isinstance(amount, bool) or not isinstance(amount, int | float | str):
            raise Untranslatable(f"{path}.{resource}: expected a quantity")
        try:
            out[resource] = canonical_amount(resource, amount)
        except QuantityError as exc:
            raise Untranslatable(f"{path}.{resource}: {exc}") from None
    return out


def _add(into: dict[str, int], more: dict[str, int]) -> None:
    for key, amount in more.items():
        into[key] = into.get(key, 0) + amount


def _max_into(into: dict[str, int], other: dict[str, int]) -> None:
    for key, amount in other.items():
        if amount > into.get(key, 0):
            into[key] = amount


def _container_requests(container: Any, path: str) -> dict[str, int]:
    container = _map(container, path)
    resources = _map(container.get("resources"), f"{path}.resources")
    return resource_list(resources.get("requests"), f"{path}.resources.requests")


def pod_requests(spec: dict[str, Any]) -> dict[str, int]:
    """What kube-scheduler reserves for the pod (module docstring), canonical integers."""
    total: dict[str, int] = {}
    for index, container in enumerate(_list(spec.get("containers"), "spec.containers")):
        _add(total, _container_requests(container, f"spec.containers[{index}]"))
    sidecars: dict[str, int] = {}
    init_peak: dict[str, int] = {}
    for index, container in enumerate(_list(spec.get("initContainers"), "spec.initContainers")):
        path = f"spec.initContainers[{index}]"
        requests = _container_requests(container, path)
        if _map(container, path).get("restartPolicy") == "Always":
            _add(total, requests)
            _add(sidecars, requests)
            running = dict(sidecars)
        else:
            running = dict(requests)
            _add(running, sidecars)
        _max_into(init_peak, running)
    _max_into(total, init_peak)
    pod_level = _map(spec.get("resources"), "spec.resources")
    total.update(resource_list(pod_level.get("requests"), "spec.resources.requests"))
    _add(total, resource_list(spec.get("overhead"), "spec.overhead"))
    return {key: amount for key, amount in total.items() if amount}


def _wire_list(amounts: dict[str, int]) -> dict[str, int | str]:
    """Canonical amounts as fact JSON: cpu as ``"<m>m"`` (a bare number is cores, §2)."""
    return {
        key: (f"{amount}m" if key == "cpu" else amount) for key, amount in sorted(amounts.items())
    }


def _phase(status: dict[str, Any], node: str | None) -> str:
    phase = status.get("phase")
    if phase in ("Pending", "Running", "Succeeded", "Failed"):
        return str(phase)
    # "Unknown" (node unreachable) or absent: the pod still holds its node's resources.
    return "Running" if node else "Pending"


def _timestamp(value: Any, path: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise Untranslatable(f"{path}: expected an RFC 3339 time")
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise Untranslatable(f"{path}: {value!r} is not an RFC 3339 time") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    if not EARLIEST <= moment < LATEST:
        raise Untranslatable(f"{path}: {value!r} is outside 1970..9000 (DESIGN §9)")
    return value


def pod_quota(meta: dict[str, Any], labels: dict[str, str], source: str | None) -> str | None:
    """Label ``quotaledger.io/quota``, else the quota source's own key (SOURCE_POD_KEYS)."""
    if QUOTA_LABEL in labels:
        return labels[QUOTA_LABEL]
    annotations = meta.get("annotations") or {}
    for where, key, strip in SOURCE_POD_KEYS.get(source or "", ()):
        table = labels if where == "labels" else annotations
        value = table.get(key) if isinstance(table, dict) else None
        if isinstance(value, str) and value:
            return value[len(strip) :] if strip and value.startswith(strip) else value
    return None


def pod_fact(pod: Any, source: str | None = None) -> dict[str, Any]:
    """``PodUpserted`` for one pod (DESIGN §12)."""
    pod = _map(pod, "pod")
    meta = _map(pod.get("metadata"), "metadata")
    spec = _map(pod.get("spec"), "spec")
    status = _map(pod.get("status"), "status")
    labels = _strings(meta.get("labels"), "metadata.labels")
    annotations = _strings(meta.get("annotations"), "metadata.annotations")
    node = spec.get("nodeName") or None
    daemonset = any(
        isinstance(owner, dict) and owner.get("kind") == "DaemonSet"
        for owner in _list(meta.get("ownerReferences"), "metadata.ownerReferences")
    )
    priority = spec.get("priority")
    if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)):
        raise Untranslatable("spec.priority: expected an integer")
    return {
        "kind": "PodUpserted",
        "uid": meta.get("uid"),
        "name": meta.get("name"),
        "namespace": meta.get("namespace"),
        "requests": _wire_list(pod_requests(spec)),
        "priority": priority or 0,
        "phase": _phase(status, node),
        "node": node,
        "quota": pod_quota(meta, labels, source),
        "created_at": _timestamp(meta.get("creationTimestamp"), "metadata.creationTimestamp"),
        "preemptible": annotations.get(PREEMPTIBLE_ANNOTATION) != "false",
        "daemonset": daemonset,
        "originator": annotations.get(ORIGINATOR_ANNOTATION) == "true",
        "allow_preemption": annotations.get(YUNIKORN_ALLOW_PREEMPTION) != "false",
        "labels": dict(sorted(labels.items())),
    }


def node_fact(node: Any) -> dict[str, Any]:
    """``NodeUpserted``: allocatable, labels, unschedulable (DESIGN §12)."""
    node = _map(node, "node")
    meta = _map(node.get("metadata"), "metadata")
    spec = _map(node.get("spec"), "spec")
    status = _map(node.get("status"), "status")
    labels = _strings(meta.get("labels"), "metadata.labels")
    return {
        "kind": "NodeUpserted",
        "name": meta.get("name"),
        "allocatable": _wire_list(resource_list(status.get("allocatable"), "status.allocatable")),
        "labels": dict(sorted(labels.items())),
        "unschedulable": spec.get("unschedulable") is True,
    }


#: The weight of a namespace without the annotation (DESIGN §5 default).
DEFAULT_WEIGHT = 1


def namespace_weight(namespace: Any) -> tuple[str, int]:
    """(namespace, weight) from annotation ``quotaledger.io/weight`` (absent: 1)."""
    namespace = _map(namespace, "namespace")
    meta = _map(namespace.get("metadata"), "metadata")
    annotations = _strings(meta.get("annotations"), "metadata.annotations")
    name = meta.get("name")
    if not isinstance(name, str):
        raise Untranslatable("metadata.name: expected a string")
    text = annotations.get(WEIGHT_ANNOTATION)
    if text is None:
        return name, DEFAULT_WEIGHT
    try:
        weight = int(text.strip())
    except ValueError:
        weight = 0
    if weight < 1:
        raise Untranslatable(
            f"metadata.annotations.{WEIGHT_ANNOTATION}: {text!r} is not an integer >= 1"
        )
    return name, weight


def namespace_fact(name: str, weight: int) -> dict[str, Any]:
    return {"kind": "NamespaceWeighted", "namespace": name, "weight": weight}
