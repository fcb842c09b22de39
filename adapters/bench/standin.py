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
* every request is recorded as an :class:`.standin_requests.ApiCall` in RBAC terms (verb,
  API group, resource, namespace, subresource) for the least-privilege test.

The test drives the cluster in-process (:meth:`ApiServer.put`, :meth:`delete`,
:meth:`compact`, :meth:`drop_watches`, :attr:`evictions`). ``python -m
quotaledger.adapters.bench.standin --pods N --nodes M --url-file F`` runs it as a process
with a generated cluster and a churn generator (``POST /bench/churn?rate=R&seconds=S``),
for the benchmark.

The parts: this module is the application (the routes, list paging, watch streams, the
eviction subresource, the process the benchmark runs); the objects, their versions and the
watches they feed are :mod:`.standin_store`, a request's route and the call RBAC sees in it
:mod:`.standin_requests`, the discovery and OpenAPI documents :mod:`.standin_discovery`,
the generated cluster and churn of the benchmark :mod:`.standin_bench`.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import uuid
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from .standin_bench import Churn, generated_cluster
from .standin_discovery import Kind, discovery, served_kinds
from .standin_requests import ApiCall, Route, api_call, parse_route
from .standin_store import ObjectStore, Watch, WatchEvent, status_answer, status_document

CORE_RESOURCES = {"nodes", "pods", "namespaces", "configmaps", "services", "events"}
CLUSTER_SCOPED_CORE = {"nodes", "namespaces"}


@dataclass(frozen=True)
class EvictionAnswer:
    """A scripted answer of the eviction subresource."""

    status: int
    message: str = ""
    retry_after: int | None = None


class ApiServer(ObjectStore):
    """The stand-in API server; see the module docstring."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[ApiCall] = []
        self.evictions: deque[EvictionAnswer] = deque()
        self.eviction_posts: list[tuple[str, str, int]] = []  # (namespace, name, status)
        self.watch_timeout_cap: float | None = None
        self.fail_lists = 0  # the next N list requests answer 500
        self.refuse_watches = False  # while True, every watch request answers 500
        self.watch_params: list[dict[str, str]] = []  # query of every watch request
        self.closing = False
        self._pages: dict[str, tuple[int, list[dict[str, Any]]]] = {}  # continue token -> rest
        self._next_token = 0
        self.churn = Churn()
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

    def calls_of(self, verb: str | None = None, resource: str | None = None) -> Iterator[ApiCall]:
        for call in self.calls:
            if (verb is None or call.verb == verb) and (
                resource is None or call.resource == resource
            ):
                yield call

    def kinds(self) -> list[Kind]:
        """Built-in kinds and those of every stored CustomResourceDefinition."""
        crds = self.store("apiextensions.k8s.io", "customresourcedefinitions")
        return served_kinds(crds.values())

    # ------------------------------------------------------------ the routes

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if request.path == "/bench/churn" and request.method == "POST":
            rate = float(request.query.get("rate", "1000"))
            seconds = float(request.query.get("seconds", "10"))
            self.churn.start(self, rate, seconds)
            return web.json_response({"started": True})
        if request.path == "/bench/churn" and request.method == "GET":
            return web.json_response({"done": self.churn.done, "updates": self.churn.updates})
        if (
            request.method == "GET"
            and (discovered := discovery(request.path, self.kinds())) is not None
        ):
            return discovered
        route = parse_route(request.path)
        if route is None:
            return status_answer(404, "NotFound", f"no route {request.path}")
        self.calls.append(api_call(request, route))
        key = (route.group, route.resource)
        if route.subresource == "eviction" and request.method == "POST":
            return await self._evict(route)
        if request.method == "GET":
            if route.name is not None:
                obj = self.store(*key).get((route.namespace or "", route.name))
                if obj is None:
                    return status_answer(
                        404, "NotFound", f'{route.resource} "{route.name}" not found'
                    )
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
                    return status_answer(
                        404, "NotFound", f'namespaces "{route.namespace}" not found'
                    )
            if (route.namespace or "", meta.get("name")) in self.store(*key):
                return status_answer(
                    409, "AlreadyExists", f'{route.resource} "{meta.get("name")}" exists'
                )
            meta["uid"] = str(uuid.uuid4())
            stored = self.commit(route.group, route.resource, body, "ADDED")
            return web.json_response(stored, status=201)
        if request.method == "PUT" and route.name is not None:
            body = await request.json()
            current = self.store(*key).get((route.namespace or "", route.name))
            if current is None:
                return status_answer(404, "NotFound", f'{route.resource} "{route.name}" not found')
            sent = body.get("metadata", {}).get("resourceVersion")
            if sent != current["metadata"]["resourceVersion"]:
                return status_answer(
                    409,
                    "Conflict",
                    f'Operation cannot be fulfilled on {route.resource} "{route.name}": the object'
                    " has been modified; please apply your changes to the latest version",
                )
            body["metadata"]["uid"] = current["metadata"]["uid"]
            if route.namespace:
                body["metadata"]["namespace"] = route.namespace
            stored = self.commit(route.group, route.resource, body, "MODIFIED")
            return web.json_response(stored)
        if request.method == "DELETE" and route.name is not None:
            if self.delete(route.resource, route.name, route.namespace or "", route.group):
                return web.json_response(
                    status_document(200, "", "deleted") | {"status": "Success"}
                )
            return status_answer(404, "NotFound", f'{route.resource} "{route.name}" not found')
        return status_answer(405, "MethodNotAllowed", f"{request.method} not supported")

    def _matching(self, route: Route, selector: str | None) -> list[dict[str, Any]]:
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

    def _list(self, request: web.Request, route: Route) -> web.Response:
        """A list, paged with ``limit``/``continue`` as the API server pages it: every page
        of one list comes from the snapshot taken for its first page (one resourceVersion)."""
        if self.fail_lists > 0:
            self.fail_lists -= 1
            return status_answer(500, "InternalError", "scripted list failure")
        token = request.query.get("continue")
        if token:
            if token not in self._pages:
                return status_answer(410, "Expired", "the continue token has expired")
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

    async def _watch(self, request: web.Request, route: Route) -> web.StreamResponse:
        self.watch_params.append(dict(request.query))
        if self.refuse_watches:
            return status_answer(500, "InternalError", "scripted watch failure")
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
        watch = Watch((route.group, route.resource), route.namespace, name)
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        watch.response = response
        await response.prepare(request)
        if since_text in ("", "0"):
            backlog = [
                WatchEvent(self.rv, watch.key, "ADDED", copy.deepcopy(obj))
                for obj in self._matching(route, selector)
            ]
        else:
            since = int(since_text)
            if since < self.compacted:
                await self._send(
                    response,
                    "ERROR",
                    status_document(
                        410, "Expired", f"too old resource version: {since} ({self.compacted})"
                    ),
                )
                return response
            backlog = [
                e
                for e in self.history
                if e.rv > since and e.key == watch.key and self.selected(watch, e.obj)
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

    async def _evict(self, route: Route) -> web.Response:
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
                status_document(201, "", "evicted") | {"status": "Success"}, status=201
            )
        if status == 404:
            return status_answer(404, "NotFound", f'pods "{route.name}" not found')
        headers = {}
        if answer.retry_after is not None:
            headers["Retry-After"] = str(answer.retry_after)
        reason = {429: "TooManyRequests", 403: "Forbidden"}.get(status, "InternalError")
        message = answer.message or f"scripted {status}"
        return status_answer(status, reason, message, **headers)


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
