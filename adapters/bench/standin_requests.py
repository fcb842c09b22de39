"""A request to the stand-in Kubernetes API server (:mod:`.standin`; NOT Kubernetes) in the
API's terms (DESIGN §12): the route its path names (API group and version, resource,
namespace, name, subresource) and the call RBAC sees in it (:class:`ApiCall`: the verb, a
``fieldSelector`` on ``metadata.name`` authorized by ``resourceNames``), which the server
records for the least-privilege test.
"""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import web


@dataclass(frozen=True)
class ApiCall:
    """One request, as RBAC sees it."""

    verb: str  # get, list, watch, create, update, patch, delete
    group: str  # "" for the core group
    resource: str
    namespace: str | None
    subresource: str | None = None
    name: str | None = None


@dataclass
class Route:
    """What a request's path names."""

    group: str
    version: str
    resource: str
    namespace: str | None
    name: str | None
    subresource: str | None


def parse_route(path: str) -> Route | None:
    """The route of an API path (``/api/v1/...``, ``/apis/GROUP/VERSION/...``), else None."""
    parts = [p for p in path.split("/") if p]
    if parts[:2] == ["api", "v1"]:
        group, version, rest = "", "v1", parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        return None
    namespace = None
    if len(rest) >= 2 and rest[0] == "namespaces" and len(rest) != 2:
        namespace, rest = rest[1], rest[2:]
    if not rest:
        return None
    resource = rest[0]
    name = rest[1] if len(rest) > 1 else None
    sub = rest[2] if len(rest) > 2 else None
    return Route(group, version, resource, namespace, name, sub)


def api_call(request: web.Request, route: Route) -> ApiCall:
    """The call RBAC sees in a request to ``route``."""
    method = request.method
    watching = request.query.get("watch") in ("1", "true", "True")
    if method == "GET":
        verb = "watch" if watching else ("get" if route.name else "list")
    elif method == "POST":
        verb = "create"
    elif method == "PUT":
        verb = "update"
    elif method == "PATCH":
        verb = "patch"
    else:
        verb = "delete"
    name = route.name
    selector = request.query.get("fieldSelector", "")
    if verb in ("list", "watch") and selector.startswith("metadata.name="):
        name = selector.split("=", 1)[1]  # RBAC authorizes it by resourceNames
    return ApiCall(verb, route.group, route.resource, route.namespace, route.subresource, name)
