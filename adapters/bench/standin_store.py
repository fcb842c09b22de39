"""The objects of the stand-in Kubernetes API server (:mod:`.standin`; NOT Kubernetes) and
their watches (DESIGN §12).

Every object is a generic JSON document kept per resource (``(group, plural)``, and by
``(namespace, name)``); one global, increasing ``resourceVersion`` stamps every change; the
history of change events since the compaction point serves a watch from an older version
(one older than that point is ``410 Gone``); every event goes to the open watches of its
resource whose namespace and name select it. A test drives the cluster in-process
(:meth:`ObjectStore.put`, :meth:`~ObjectStore.delete`, :meth:`~ObjectStore.compact`,
:meth:`~ObjectStore.drop_watches`, :meth:`~ObjectStore.bookmark`). Also here: the
``Status`` document the server answers a failure with (and sends as an ``ERROR`` event).
"""

from __future__ import annotations

import asyncio
import copy
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


def status_document(code: int, reason: str, message: str) -> dict[str, Any]:
    """A Kubernetes ``Status`` document of a failure."""
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }


def status_answer(code: int, reason: str, message: str, **headers: str) -> web.Response:
    """An HTTP answer of status ``code`` carrying its ``Status`` document."""
    return web.json_response(status_document(code, reason, message), status=code, headers=headers)


@dataclass
class WatchEvent:
    """A change (or ``BOOKMARK``, ``ERROR``) on its way to the watches of its resource."""

    rv: int
    key: tuple[str, str]  # (group, resource)
    type: str
    obj: dict[str, Any]


@dataclass
class Watch:
    """One open watch request: its resource, namespace and name, and its queue of events."""

    key: tuple[str, str]
    namespace: str | None
    name: str | None
    queue: asyncio.Queue[WatchEvent | None] = field(default_factory=asyncio.Queue)
    response: web.StreamResponse | None = None


class ObjectStore:
    """Objects per resource, their one ``resourceVersion``, the event history since the
    compaction point and the open watches (the module docstring)."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str], dict[tuple[str, str], dict[str, Any]]] = {}
        self.rv = 1
        self.compacted = 0
        self.history: deque[WatchEvent] = deque()
        self.watches: list[Watch] = []

    # ------------------------------------------------------------ a cluster, driven in-process

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
        return self.commit(group, resource, obj, "ADDED" if old is None else "MODIFIED")

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
        self._emit(WatchEvent(self.rv, (group, resource), "DELETED", obj))
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
                    WatchEvent(
                        self.rv,
                        watch.key,
                        "ERROR",
                        status_document(410, "Expired", "too old resource version (compacted)"),
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
                WatchEvent(self.rv, watch.key, "BOOKMARK", {"metadata": {"resourceVersion": ""}})
            )

    # ------------------------------------------------------------ events to watches

    def commit(self, group: str, resource: str, obj: dict[str, Any], kind: str) -> dict[str, Any]:
        self.rv += 1
        meta = obj["metadata"]
        meta["resourceVersion"] = str(self.rv)
        self.store(group, resource)[(meta.get("namespace") or "", meta["name"])] = obj
        self._emit(WatchEvent(self.rv, (group, resource), kind, copy.deepcopy(obj)))
        return copy.deepcopy(obj)

    def _emit(self, event: WatchEvent) -> None:
        self.history.append(event)
        for watch in self.watches:
            if watch.key == event.key and self.selected(watch, event.obj):
                watch.queue.put_nowait(event)

    @staticmethod
    def selected(watch: Watch, obj: dict[str, Any]) -> bool:
        meta = obj.get("metadata", {})
        if watch.namespace is not None and meta.get("namespace") != watch.namespace:
            return False
        return watch.name is None or meta.get("name") == watch.name
