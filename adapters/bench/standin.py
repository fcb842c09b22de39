"""A stand-in for the Kubernetes API server, written for the tests and for
``quotaledger bench k8s`` (DESIGN §12). Benchmark and test tooling, not an adapter: it
lives in ``adapters/bench/`` because ``bench k8s`` runs it as a process; the Kubernetes
adapter itself (``adapters/kubernetes/``) never imports it.

This is NOT Kubernetes: it is a small aiohttp application that speaks the parts of the
Kubernetes REST protocol that quotaledger's adapter uses, so the adapter can be tested
with the real ``kubernetes_asyncio`` client over real sockets. What it does:

* every object is a generic JSON document kept per resource (nodes, pods, namespaces,
  configmaps, leases, and any custom resource ``/apis/GROUP/VERSION/PLURAL``);
* one global, increasing ``resourceVersion``; list answers carry the list's version;
  ``watch=1`` streams ``ADDED``/``MODIFIED``/``DELETED`` after the given version,
  ``BOOKMARK`` events when the client allowed them (``allowWatchBookmarks`` is accepted as
  ``true`` or ``True``, the way kubernetes-asyncio sends it), and ``410 Gone`` (an
  ``ERROR`` event, or a 410 answer) for a version older than the compaction point;
* ``fieldSelector=metadata.name=N`` on list and watch; ``limit``/``continue`` paging of lists;
* pods' ``eviction`` subresource answers what the test scripted (201 deletes the pod);
* Leases (and every object) are replaced only with the current ``resourceVersion``:
  otherwise ``409 Conflict``; create of an existing name is ``409 AlreadyExists``;
* every request is recorded as an :class:`ApiCall` in RBAC terms (verb, API group,
  resource, namespace, subresource) for the least-privilege test.

The test drives the cluster in-process (:meth:`ApiServer.put`, :meth:`delete`,
:meth:`compact`, :meth:`drop_watches`, :attr:`evictions`). ``python -m
quotaledger.adapters.bench.standin --pods N --nodes M --url-file F`` runs it as a process
with a generated cluster and a churn generator (``POST /bench/churn?rate=R&seconds=S``),
for the benchmark.

Longer than 600 lines: it is one protocol (list/watch, 410, bookmarks, eviction, Lease
concurrency, discovery and OpenAPI documents) served by one application; the pieces share
the object store and its resourceVersion.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import uuid
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

CORE_RESOURCES = {"nodes", "pods", "namespaces", "configmaps", "services", "events"}
CLUSTER_SCOPED_CORE = {"nodes", "namespaces"}


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
_VERBS = ["create", "delete", "get", "list", "patch", "update", "watch"]


@dataclass(frozen=True)
class ApiCall:
    """One request, as RBAC sees it."""

    verb: str  # get, list, watch, create, update, patch, delete
    group: str  # "" for the core group
    resource: str
    namespace: str | None
    subresource: str | None = None
    name: str | None = None


@dataclass(frozen=True)
class EvictionAnswer:
    """A scripted answer of the eviction subresource."""

    status: int
    message: str = ""
    retry_after: int | None = None


@dataclass
class _Event:
    rv: int
    key: tuple[str, str]  # (group, resource)
    type: str
    obj: dict[str, Any]


@dataclass
class _Watch:
    key: tuple[str, str]
    namespace: str | None
    name: str | None
    queue: asyncio.Queue[_Event | None] = field(default_factory=asyncio.Queue)
    response: web.StreamResponse | None = None


@dataclass
class _Route:
    group: str
    version: str
    resource: str
    namespace: str | None
    name: str | None
    subresource: str | None


def _parse(path: str) -> _Route | None:
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
    return _Route(group, version, resource, namespace, name, sub)


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def _answer(code: int, reason: str, message: str, **headers: str) -> web.Response:
    return web.json_response(_status(code, reason, message), status=code, headers=headers)


class ApiServer:
    """The stand-in API server; see the module docstring."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[tuple[str, str], dict[str, Any]]] = {}
        self.rv = 1
        self.compacted = 0
        self.history: deque[_Event] = deque()
        self.watches: list[_Watch] = []
        self.calls: list[ApiCall] = []
        self.evictions: deque[EvictionAnswer] = deque()
        self.eviction_posts: list[tuple[str, str, int]] = []  # (namespace, name, status)
        self.watch_timeout_cap: float | None = None
        self.fail_lists = 0  # the next N list requests answer 500
        self.refuse_watches = False  # while True, every watch request answers 500
        self.watch_params: list[dict[str, str]] = []  # query of every watch request
        self.closing = False
        self._churn: asyncio.Task[None] | None = None
        self._pages: dict[str, tuple[int, list[dict[str, Any]]]] = {}  # continue token -> rest
        self._next_token = 0
        self.churned = 0
        self._runner: web.AppRunner | None = None
        self.url = ""
        #: When True, creating a namespaced object in a namespace that does not exist
        #: answers 404 as the real API server does (``kubectl apply`` order checks).
        self.require_namespaces = False

    # ------------------------------------------------------------ lifecycle

    async def start(self) -> str:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, shutdown_timeout=0.5)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        sockets = getattr(site._server, "sockets", None)
        assert sockets
        port = sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self.url

    async def stop(self) -> None:
        self.closing = True
        for watch in list(self.watches):
            watch.queue.put_nowait(None)
        if self._runner is not None:
            await self._runner.cleanup()

    def kubeconfig(self, path: Path, namespace: str = "quotaledger") -> Path:
        """A kubeconfig file pointing at this server (no credentials)."""
        path.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "standin", "cluster": {"server": self.url}}],
                    "users": [{"name": "tester", "user": {}}],
                    "contexts": [
                        {
                            "name": "standin",
                            "context": {
                                "cluster": "standin",
                                "user": "tester",
                                "namespace": namespace,
                            },
                        }
                    ],
                    "current-context": "standin",
                }
            )
        )
        return path

    # ------------------------------------------------------------ test controls

    def store(self, group: str, resource: str) -> dict[tuple[str, str], dict[str, Any]]:
        return self.objects.setdefault((group, resource), {})

    def put(self, resource: str, obj: dict[str, Any], group: str = "") -> dict[str, Any]:
        """Create or update an object (as a controller would); returns the stored copy."""
        obj = copy.deepcopy(obj)
        meta = obj.setdefault("metadata", {})
        namespace = meta.get("namespace") or ""
        store = self.store(group, resource)
        old = store.get((namespace, meta["name"]))
        if old is None:
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", "2026-01-01T00:00:00Z")
        else:
            meta["uid"] = old["metadata"]["uid"]
            meta.setdefault("creationTimestamp", old["metadata"].get("creationTimestamp"))
        return self._commit(group, resource, obj, "ADDED" if old is None else "MODIFIED")

    def load(self, resource: str, objects: list[dict[str, Any]], group: str = "") -> None:
        """Objects that existed before any watch (no events, no history): bulk set-up."""
        store = self.store(group, resource)
        for obj in objects:
            self.rv += 1
            meta = obj["metadata"]
            meta["resourceVersion"] = str(self.rv)
            meta.setdefault("uid", str(uuid.uuid4()))
            store[(meta.get("namespace") or "", meta["name"])] = obj
        self.compacted = self.rv

    def delete(self, resource: str, name: str, namespace: str = "", group: str = "") -> bool:
        store = self.store(group, resource)
        obj = store.pop((namespace, name), None)
        if obj is None:
            return False
        self.rv += 1
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self._emit(_Event(self.rv, (group, resource), "DELETED", obj))
        return True

    def get(self, resource: str, name: str, namespace: str = "", group: str = "") -> Any:
        """A copy of one object (None when absent)."""
        return copy.deepcopy(self.store(group, resource).get((namespace, name)))

    def items(self, resource: str, group: str = "") -> list[dict[str, Any]]:
        return list(self.store(group, resource).values())

    def compact(self, *, expire_watches: bool = True) -> None:
        """Forget the event history: any older version now answers 410 Gone; open
        watches receive an ``ERROR`` 410 event when ``expire_watches``."""
        self.compacted = self.rv
        self.history.clear()
        if expire_watches:
            for watch in list(self.watches):
                watch.queue.put_nowait(
                    _Event(
                        self.rv,
                        watch.key,
                        "ERROR",
                        _status(410, "Expired", "too old resource version (compacted)"),
                    )
                )

    def drop_watches(self) -> None:
        """Cut every open watch connection abruptly (a network failure)."""
        for watch in list(self.watches):
            if watch.response is not None and watch.response.task is not None:
                transport = watch.response._req.transport if watch.response._req else None
                if transport is not None:
                    transport.abort()
            watch.queue.put_nowait(None)

    def bookmark(self) -> None:
        """Send a BOOKMARK with the current version to every watch that allows them."""
        for watch in list(self.watches):
            watch.queue.put_nowait(
                _Event(self.rv, watch.key, "BOOKMARK", {"metadata": {"resourceVersion": ""}})
            )

    def calls_of(self, verb: str | None = None, resource: str | None = None) -> Iterator[ApiCall]:
        for call in self.calls:
            if (verb is None or call.verb == verb) and (
                resource is None or call.resource == resource
            ):
                yield call

    # ------------------------------------------------------------ internals

    def _commit(self, group: str, resource: str, obj: dict[str, Any], kind: str) -> dict[str, Any]:
        self.rv += 1
        meta = obj["metadata"]
        meta["resourceVersion"] = str(self.rv)
        self.store(group, resource)[(meta.get("namespace") or "", meta["name"])] = obj
        self._emit(_Event(self.rv, (group, resource), kind, copy.deepcopy(obj)))
        return copy.deepcopy(obj)

    def _emit(self, event: _Event) -> None:
        self.history.append(event)
        for watch in self.watches:
            if watch.key == event.key and self._selected(watch, event.obj):
                watch.queue.put_nowait(event)

    @staticmethod
    def _selected(watch: _Watch, obj: dict[str, Any]) -> bool:
        meta = obj.get("metadata", {})
        if watch.namespace is not None and meta.get("namespace") != watch.namespace:
            return False
        return watch.name is None or meta.get("name") == watch.name

    def _record(self, request: web.Request, route: _Route) -> None:
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
        self.calls.append(
            ApiCall(verb, route.group, route.resource, route.namespace, route.subresource, name)
        )

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if request.path == "/bench/churn" and request.method == "POST":
            rate = float(request.query.get("rate", "1000"))
            seconds = float(request.query.get("seconds", "10"))
            self._churn = asyncio.create_task(self._churn_pods(rate, seconds))
            return web.json_response({"started": True})
        if request.path == "/bench/churn" and request.method == "GET":
            done = self._churn is not None and self._churn.done()
            return web.json_response({"done": done, "updates": self.churned})
        if request.method == "GET" and (discovered := self._discovery(request.path)) is not None:
            return discovered
        route = _parse(request.path)
        if route is None:
            return _answer(404, "NotFound", f"no route {request.path}")
        self._record(request, route)
        key = (route.group, route.resource)
        if route.subresource == "eviction" and request.method == "POST":
            return await self._evict(route)
        if request.method == "GET":
            if route.name is not None:
                obj = self.store(*key).get((route.namespace or "", route.name))
                if obj is None:
                    return _answer(404, "NotFound", f'{route.resource} "{route.name}" not found')
                return web.json_response(obj)
            if request.query.get("watch") in ("1", "true", "True"):
                return await self._watch(request, route)
            return self._list(request, route)
        if request.method == "POST":
            body = await request.json()
            meta = body.setdefault("metadata", {})
            if route.namespace:
                meta["namespace"] = route.namespace
                if self.require_namespaces and ("", route.namespace) not in self.store(
                    "", "namespaces"
                ):
                    return _answer(404, "NotFound", f'namespaces "{route.namespace}" not found')
            if (route.namespace or "", meta.get("name")) in self.store(*key):
                return _answer(
                    409, "AlreadyExists", f'{route.resource} "{meta.get("name")}" exists'
                )
            meta["uid"] = str(uuid.uuid4())
            stored = self._commit(route.group, route.resource, body, "ADDED")
            return web.json_response(stored, status=201)
        if request.method == "PUT" and route.name is not None:
            body = await request.json()
            current = self.store(*key).get((route.namespace or "", route.name))
            if current is None:
                return _answer(404, "NotFound", f'{route.resource} "{route.name}" not found')
            sent = body.get("metadata", {}).get("resourceVersion")
            if sent != current["metadata"]["resourceVersion"]:
                return _answer(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on {route.resource} "{route.name}": the object'
                    " has been modified; please apply your changes to the latest version",
                )
            body["metadata"]["uid"] = current["metadata"]["uid"]
            if route.namespace:
                body["metadata"]["namespace"] = route.namespace
            stored = self._commit(route.group, route.resource, body, "MODIFIED")
            return web.json_response(stored)
        if request.method == "DELETE" and route.name is not None:
            if self.delete(route.resource, route.name, route.namespace or "", route.group):
                return web.json_response(_status(200, "", "deleted") | {"status": "Success"})
            return _answer(404, "NotFound", f'{route.resource} "{route.name}" not found')
        return _answer(405, "MethodNotAllowed", f"{request.method} not supported")

    # ------------------------------------------------------------ discovery

    def kinds(self) -> list[Kind]:
        """Built-in kinds and those of every stored CustomResourceDefinition."""
        out = list(BUILTIN_KINDS)
        for crd in self.store("apiextensions.k8s.io", "customresourcedefinitions").values():
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

    def _discovery(self, path: str) -> web.Response | None:
        """Legacy API discovery (``/api``, ``/apis``, ``/api/v1``, ``/apis/G/V``) and
        ``/version``: what ``kubectl`` needs to map a manifest's kind to its resource."""
        parts = [p for p in path.split("/") if p]
        kinds = self.kinds()
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
            return self._openapi(parts[2:], kinds)
        if parts == ["api", "v1"]:
            group_version = "v1"
        elif len(parts) == 3 and parts[0] == "apis":
            group_version = f"{parts[1]}/{parts[2]}"
        else:
            return None
        listed = [k for k in kinds if k.group_version == group_version]
        if not listed:
            return _answer(404, "NotFound", f"no API group version {group_version}")
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
                        "verbs": _VERBS,
                    }
                    for k in listed
                ],
            }
        )

    @staticmethod
    def _openapi(rest: list[str], kinds: list[Kind]) -> web.Response:
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
            return _answer(404, "NotFound", f"no OpenAPI document for {'/'.join(rest)}")
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

    def _matching(self, route: _Route, selector: str | None) -> list[dict[str, Any]]:
        name = None
        if selector and selector.startswith("metadata.name="):
            name = selector.split("=", 1)[1]
        out = []
        for (namespace, obj_name), obj in self.store(route.group, route.resource).items():
            if route.namespace is not None and namespace != route.namespace:
                continue
            if name is not None and obj_name != name:
                continue
            out.append(obj)
        return out

    def _list(self, request: web.Request, route: _Route) -> web.Response:
        """A list, paged with ``limit``/``continue`` as the API server pages it: every page
        of one list comes from the snapshot taken for its first page (one resourceVersion)."""
        if self.fail_lists > 0:
            self.fail_lists -= 1
            return _answer(500, "InternalError", "scripted list failure")
        token = request.query.get("continue")
        if token:
            if token not in self._pages:
                return _answer(410, "Expired", "the continue token has expired")
            version, items = self._pages.pop(token)
        else:
            version = self.rv
            items = [
                copy.deepcopy(obj)
                for obj in self._matching(route, request.query.get("fieldSelector"))
            ]
        limit = int(request.query.get("limit", "0") or 0)
        meta: dict[str, Any] = {"resourceVersion": str(version)}
        if limit and len(items) > limit:
            items, rest = items[:limit], items[limit:]
            self._next_token += 1
            meta["continue"] = f"{version}-{self._next_token}"
            self._pages[meta["continue"]] = (version, rest)
        kind = route.resource[:-1].capitalize() + "List"
        return web.json_response(
            {
                "kind": kind,
                "apiVersion": f"{route.group}/{route.version}" if route.group else "v1",
                "metadata": meta,
                "items": items,
            }
        )

    async def _watch(self, request: web.Request, route: _Route) -> web.StreamResponse:
        self.watch_params.append(dict(request.query))
        if self.refuse_watches:
            return _answer(500, "InternalError", "scripted watch failure")
        since_text = request.query.get("resourceVersion", "")
        bookmarks = request.query.get("allowWatchBookmarks") in ("true", "True", "1")
        timeout = float(request.query.get("timeoutSeconds", "0") or 0) or None
        if self.watch_timeout_cap is not None:
            timeout = min(timeout or self.watch_timeout_cap, self.watch_timeout_cap)
        selector = request.query.get("fieldSelector")
        name = (
            selector.split("=", 1)[1]
            if selector and selector.startswith("metadata.name=")
            else None
        )
        watch = _Watch((route.group, route.resource), route.namespace, name)
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        watch.response = response
        await response.prepare(request)
        if since_text in ("", "0"):
            backlog = [
                _Event(self.rv, watch.key, "ADDED", copy.deepcopy(obj))
                for obj in self._matching(route, selector)
            ]
        else:
            since = int(since_text)
            if since < self.compacted:
                await self._send(
                    response,
                    "ERROR",
                    _status(
                        410, "Expired", f"too old resource version: {since} ({self.compacted})"
                    ),
                )
                return response
            backlog = [
                e
                for e in self.history
                if e.rv > since and e.key == watch.key and self._selected(watch, e.obj)
            ]
        self.watches.append(watch)
        try:
            for event in backlog:
                await self._send(response, event.type, event.obj)
            loop = asyncio.get_running_loop()
            deadline = None if timeout is None else loop.time() + timeout
            while not self.closing:
                remaining = None if deadline is None else deadline - loop.time()
                if remaining is not None and remaining <= 0:
                    break
                try:
                    async with asyncio.timeout(remaining):
                        next_event = await watch.queue.get()
                except TimeoutError:
                    break
                if next_event is None:
                    return response
                if next_event.type == "BOOKMARK":
                    if bookmarks:
                        await self._send(
                            response,
                            "BOOKMARK",
                            {"kind": "Bookmark", "metadata": {"resourceVersion": str(self.rv)}},
                        )
                    continue
                await self._send(response, next_event.type, next_event.obj)
                if next_event.type == "ERROR":
                    return response
            if bookmarks and not self.closing:
                await self._send(
                    response,
                    "BOOKMARK",
                    {"kind": "Bookmark", "metadata": {"resourceVersion": str(self.rv)}},
                )
        except (ConnectionResetError, RuntimeError):
            pass
        finally:
            with contextlib.suppress(ValueError):
                self.watches.remove(watch)
        return response

    @staticmethod
    async def _send(response: web.StreamResponse, kind: str, obj: dict[str, Any]) -> None:
        line = json.dumps({"type": kind, "object": obj}) + "\n"
        await response.write(line.encode())

    async def _evict(self, route: _Route) -> web.Response:
        namespace = route.namespace or ""
        assert route.name is not None
        pod = self.store("", "pods").get((namespace, route.name))
        answer = self.evictions.popleft() if self.evictions else EvictionAnswer(201)
        status = answer.status
        if pod is None and status == 201:
            status = 404
        self.eviction_posts.append((namespace, route.name, status))
        if status == 201:
            self.delete("pods", route.name, namespace)
            return web.json_response(
                _status(201, "", "evicted") | {"status": "Success"}, status=201
            )
        if status == 404:
            return _answer(404, "NotFound", f'pods "{route.name}" not found')
        headers = {}
        if answer.retry_after is not None:
            headers["Retry-After"] = str(answer.retry_after)
        reason = {429: "TooManyRequests", 403: "Forbidden"}.get(status, "InternalError")
        message = answer.message or f"scripted {status}"
        return _answer(status, reason, message, **headers)

    async def _churn_pods(self, rate: float, seconds: float) -> None:
        """Update pods round-robin at ``rate`` per second: label ``bench-sent-ms`` carries
        the wall-clock time of the update (the benchmark's lag probe), and every third
        update flips the phase."""
        import time

        loop = asyncio.get_running_loop()
        keys = sorted(self.store("", "pods"))
        start = loop.time()
        index = 0
        while loop.time() - start < seconds:
            due = int((loop.time() - start) * rate)
            while self.churned < due:
                key = keys[index % len(keys)]
                index += 1
                obj = self.store("", "pods")[key]
                obj = dict(obj, metadata=dict(obj["metadata"]), status=dict(obj["status"]))
                labels = dict(obj["metadata"].get("labels") or {})
                labels["bench-sent-ms"] = str(time.time_ns() // 1_000_000)
                obj["metadata"]["labels"] = labels
                if self.churned % 3 == 0:
                    running = obj["status"].get("phase") == "Running"
                    obj["status"]["phase"] = "Pending" if running else "Running"
                self._commit("", "pods", obj, "MODIFIED")
                self.history.clear()  # nothing re-watches from old versions in the bench
                self.churned += 1
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


async def _serve(pods: int, nodes: int, url_file: str) -> None:
    server = ApiServer()
    pod_objs, node_objs = generated_cluster(pods, nodes)
    server.load("nodes", node_objs)
    server.load("pods", pod_objs)
    url = await server.start()
    with open(url_file + ".tmp", "w") as handle:
        handle.write(url)
    import os

    os.replace(url_file + ".tmp", url_file)
    await asyncio.Event().wait()


def main() -> None:
    import argparse

    parser = argparse.ArgumentParser(description="stand-in Kubernetes API server (not Kubernetes)")
    parser.add_argument("--pods", type=int, default=0)
    parser.add_argument("--nodes", type=int, default=0)
    parser.add_argument("--url-file", required=True)
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(args.pods, args.nodes, args.url_file))


if __name__ == "__main__":
    main()
