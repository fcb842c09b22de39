"""Quota sources: which objects define the quota tree on a cluster (DESIGN §12, §13).

* ``quotaledger``: the cluster-scoped CRD ``quotas.quotaledger.io/v1alpha1`` kind ``Quota``;
  ``metadata.name`` is the quota name, ``spec`` holds the other ``QuotaUpserted`` fields with
  their snake_case names (an unknown field is refused, naming it).
* ``koordinator``, ``kueue``, ``volcano``, ``yunikorn``: the peer's own objects, translated
  by :func:`quotaledger.adapters.importers.translate`, the code ``import`` runs. The whole
  current set is translated after each change (``translate`` is pure and order-free), and
  names no longer emitted become ``QuotaRemoved`` (the watcher's diff).

Only ``QuotaUpserted`` facts are taken from a peer's translation: settings and namespace
weights come from the settings ConfigMap and Namespace annotations (DECISIONS 104).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from quotaledger.events.model import QuotaUpserted

from ..importers import SourceDocument, translate


@dataclass(frozen=True, slots=True)
class Collection:
    """One kind of object a source watches."""

    name: str  # "Quota", "ClusterQueue"...
    group: str
    version: str
    plural: str
    scope: str  # "cluster", "all-namespaces", or "namespace"
    namespace: str | None = None
    object_name: str | None = None  # watch one object (field selector)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


QUOTA_CRD = Collection("Quota", "quotaledger.io", "v1alpha1", "quotas", "cluster")

COLLECTIONS: dict[str, tuple[Collection, ...]] = {
    "quotaledger": (QUOTA_CRD,),
    "koordinator": (
        Collection(
            "ElasticQuota", "scheduling.sigs.k8s.io", "v1alpha1", "elasticquotas", "all-namespaces"
        ),
    ),
    "kueue": (
        Collection("ClusterQueue", "kueue.x-k8s.io", "v1beta1", "clusterqueues", "cluster"),
        Collection("Cohort", "kueue.x-k8s.io", "v1alpha1", "cohorts", "cluster"),
    ),
    "volcano": (Collection("Queue", "scheduling.volcano.sh", "v1beta1", "queues", "cluster"),),
    "yunikorn": (
        Collection(
            "ConfigMap",
            "",
            "v1",
            "configmaps",
            "namespace",
            namespace="yunikorn",
            object_name="yunikorn-configs",
        ),
    ),
}

SOURCES = tuple(COLLECTIONS)  # the same names as options.SOURCES
_QUOTA_FIELDS = frozenset(QuotaUpserted.__struct_fields__) - {"name", "at"}


@dataclass(slots=True)
class SourceResult:
    """Quota facts by quota name, and (subject, reason) for every object refused."""

    facts: dict[str, dict[str, Any]]
    rejected: list[tuple[str, str]]


def subject(collection: Collection, obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), dict) else {}
    assert isinstance(meta, dict)
    name = meta.get("name", "?")
    namespace = meta.get("namespace")
    return f"{collection.name}/{namespace}/{name}" if namespace else f"{collection.name}/{name}"


def quota_crd_fact(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The ``QuotaUpserted`` JSON of one ``Quota`` object; ValueError naming the field."""
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    if not isinstance(name, str) or not name:
        raise ValueError("metadata.name: missing")
    spec = obj.get("spec")
    if spec is None:
        spec = {}
    if not isinstance(spec, dict):
        raise ValueError("spec: expected a map")
    for key in sorted(spec):
        if key not in _QUOTA_FIELDS:
            raise ValueError(f"spec.{key}: not a QuotaUpserted field (DESIGN §4)")
    return {"kind": "QuotaUpserted", "name": name, **spec}


def translate_source(
    source: str, objects: Mapping[Collection, Mapping[tuple[str, str], dict[str, Any]]]
) -> SourceResult:
    """Every current object of ``source`` → quota facts (module docstring)."""
    facts: dict[str, dict[str, Any]] = {}
    rejected: list[tuple[str, str]] = []
    if source == "quotaledger":
        for obj in objects.get(QUOTA_CRD, {}).values():
            try:
                fact = quota_crd_fact(obj)
            except ValueError as exc:
                rejected.append((subject(QUOTA_CRD, obj), str(exc)))
                continue
            facts[fact["name"]] = fact
        return SourceResult(facts, rejected)
    documents = []
    for collection in COLLECTIONS[source]:
        for key in sorted(objects.get(collection, {})):
            obj = dict(objects[collection][key])
            # List items carry no apiVersion/kind; translate reads them.
            obj.setdefault("apiVersion", collection.api_version)
            obj.setdefault("kind", collection.name)
            documents.append(SourceDocument(subject(collection, obj), obj))
    result = translate(source, documents)
    for item in result.rejected:
        rejected.append((item.subject, item.text))
    for fact in result.facts:
        if fact.get("kind") == "QuotaUpserted" and isinstance(fact.get("name"), str):
            facts[fact["name"]] = fact
    return SourceResult(facts, rejected)
