"""API discovery and OpenAPI documents of the stand-in Kubernetes API server
(:mod:`.standin`; NOT Kubernetes; DESIGN §12): what ``kubectl`` reads before an apply to map
a manifest's kind to its resource. ``/version``; the legacy discovery documents (``/api``,
``/apis``, ``/api/v1``, ``/apis/G/V``) listing the built-in kinds (those quotaledger reads
and those its manifests create) and those of every stored CustomResourceDefinition; and the
least of OpenAPI v3 that makes kubectl leave validation to the server.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from .standin_store import status_answer


@dataclass(frozen=True)
class Kind:
    """A resource type as API discovery describes it (what ``kubectl`` maps kinds by)."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool

    @property
    def group_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


#: The built-in kinds discovery lists: those quotaledger reads, and those its manifests
#: (deploy/kubernetes/) create. Custom resources are added by creating their CRD.
BUILTIN_KINDS = (
    Kind("", "v1", "namespaces", "Namespace", False),
    Kind("", "v1", "nodes", "Node", False),
    Kind("", "v1", "pods", "Pod", True),
    Kind("", "v1", "configmaps", "ConfigMap", True),
    Kind("", "v1", "services", "Service", True),
    Kind("", "v1", "serviceaccounts", "ServiceAccount", True),
    Kind("", "v1", "persistentvolumeclaims", "PersistentVolumeClaim", True),
    Kind("", "v1", "events", "Event", True),
    Kind("apps", "v1", "deployments", "Deployment", True),
    Kind("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True),
    Kind("coordination.k8s.io", "v1", "leases", "Lease", True),
    Kind("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", False),
    Kind("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", False),
    Kind("rbac.authorization.k8s.io", "v1", "roles", "Role", True),
    Kind("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", True),
    Kind(
        "apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", False
    ),
)
#: The verbs discovery lists for every kind.
VERBS = ["create", "delete", "get", "list", "patch", "update", "watch"]


def served_kinds(crds: Iterable[dict[str, Any]]) -> list[Kind]:
    """Built-in kinds and those of every CustomResourceDefinition of ``crds``."""
    out = list(BUILTIN_KINDS)
    for crd in crds:
        spec = crd.get("spec") or {}
        names = spec.get("names") or {}
        for version in spec.get("versions") or []:
            if isinstance(version, dict) and version.get("served", True):
                out.append(
                    Kind(
                        str(spec.get("group", "")),
                        str(version.get("name", "")),
                        str(names.get("plural", "")),
                        str(names.get("kind", "")),
                        spec.get("scope") != "Cluster",
                    )
                )
    return out


def discovery(path: str, kinds: list[Kind]) -> web.Response | None:
    """Legacy API discovery (``/api``, ``/apis``, ``/api/v1``, ``/apis/G/V``) and
    ``/version``: what ``kubectl`` needs to map a manifest's kind to its resource."""
    parts = [p for p in path.split("/") if p]
    if parts == ["version"]:
        return web.json_response(
            {"major": "1", "minor": "32", "gitVersion": "v1.32.0-standin", "platform": ""}
        )
    if parts == ["api"]:
        return web.json_response(
            {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
        )
    if parts == ["apis"]:
        groups: dict[str, list[str]] = {}
        for kind in kinds:
            if kind.group and kind.version not in groups.setdefault(kind.group, []):
                groups[kind.group].append(kind.version)
        return web.json_response(
            {
                "kind": "APIGroupList",
                "apiVersion": "v1",
                "groups": [
                    {
                        "name": group,
                        "versions": [
                            {"groupVersion": f"{group}/{v}", "version": v} for v in versions
                        ],
                        "preferredVersion": {
                            "groupVersion": f"{group}/{versions[0]}",
                            "version": versions[0],
                        },
                    }
                    for group, versions in sorted(groups.items())
                ],
            }
        )
    if parts[:2] == ["openapi", "v3"]:
        return openapi(parts[2:], kinds)
    if parts == ["api", "v1"]:
        group_version = "v1"
    elif len(parts) == 3 and parts[0] == "apis":
        group_version = f"{parts[1]}/{parts[2]}"
    else:
        return None
    listed = [k for k in kinds if k.group_version == group_version]
    if not listed:
        return status_answer(404, "NotFound", f"no API group version {group_version}")
    return web.json_response(
        {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": group_version,
            "resources": [
                {
                    "name": k.plural,
                    "singularName": k.kind.lower(),
                    "namespaced": k.namespaced,
                    "kind": k.kind,
                    "verbs": VERBS,
                }
                for k in listed
            ],
        }
    )


def openapi(rest: list[str], kinds: list[Kind]) -> web.Response:
    """The least of OpenAPI v3 kubectl reads before an apply: for each group version, a
    PATCH operation per kind that takes ``fieldValidation``, so kubectl leaves
    validation to the server (which accepts the parameter and checks nothing)."""
    by_gv: dict[str, list[Kind]] = {}
    for kind in kinds:
        prefix = "api" if not kind.group else "apis"
        by_gv.setdefault(f"{prefix}/{kind.group_version}", []).append(kind)
    if not rest:
        return web.json_response(
            {"paths": {gv: {"serverRelativeURL": f"/openapi/v3/{gv}"} for gv in by_gv}}
        )
    listed = by_gv.get("/".join(rest))
    if listed is None:
        return status_answer(404, "NotFound", f"no OpenAPI document for {'/'.join(rest)}")
    paths = {}
    for kind in listed:
        scope = "namespaces/{namespace}/" if kind.namespaced else ""
        path = f"/{'/'.join(rest)}/{scope}{kind.plural}/{{name}}"
        gvk = {"group": kind.group, "version": kind.version, "kind": kind.kind}
        parameter = {"name": "fieldValidation", "in": "query", "schema": {"type": "string"}}
        paths[path] = {
            "patch": {
                "operationId": f"patch{kind.kind}",
                "parameters": [parameter],
                "x-kubernetes-group-version-kind": gvk,
                "responses": {"200": {"description": "OK"}},
            }
        }
    return web.json_response(
        {"openapi": "3.0.0", "info": {"title": "stand-in", "version": "v1"}, "paths": paths}
    )
