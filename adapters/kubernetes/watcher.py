"""The cluster watcher: Kubernetes objects → facts on the ledger (DESIGN §12).

One :class:`~.reflector.Reflector` per collection (nodes, pods of all namespaces,
namespaces, the settings ConfigMap, the quota source's objects) feeds handlers that
translate each object (:mod:`.translate`, :mod:`.settings`, :mod:`.sources`) and append
only what changed:

* the watcher remembers, per object, the last fact it appended (or found in the ledger when
  it started: ``baseline``); an update whose translated fact equals it appends nothing;
* after a list (the first one, or a re-list after ``410 Gone``) it appends an upsert for
  every object whose fact differs and a removal for every remembered object the list no
  longer holds: a watch restart loses nothing and repeats nothing;
* an object that cannot be translated appends one ``FactRejected`` naming the object and
  the field (once per distinct reason), never an exception.

Facts are appended by one writer task in batches (group commit), in the order the
handlers produced them.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec

from quotaledger.events.codec import encode_event
from quotaledger.events.ledger import Append, Ledger
from quotaledger.events.model import (
    Event,
    FactRejected,
    NodeRemoved,
    NodeUpserted,
    PodRemoved,
    QuotaRemoved,
)
from quotaledger.projections.state import BUILTIN, NodeMeta, ProjectedState, builtin_config

from . import settings as settings_map
from .reflector import Pages, Reflector
from .sources import COLLECTIONS, Collection, translate_source
from .translate import (
    DEFAULT_WEIGHT,
    Untranslatable,
    describe,
    fact_payload,
    namespace_fact,
    namespace_weight,
    node_fact,
    pod_fact,
)

log = logging.getLogger("quotaledger.kubernetes")

#: At most this many records per append (one transaction).
BATCH = 5000
#: A refused object's text kept in ``FactRejected.raw`` is cut at this many characters.
RAW_LIMIT = 65_536


@dataclass(frozen=True, slots=True)
class Refusal:
    """A ``FactRejected`` to append; its offset is filled in by the sink."""

    reason: str
    kind: str | None
    raw: str | None


Item = bytes | Refusal


class NotLeader(RuntimeError):
    """The sink refused to append: this replica no longer holds the lease."""


class FactSink(Protocol):
    async def append(self, items: Sequence[Item]) -> None: ...


@dataclass(slots=True)
class LedgerSink:
    """Appends to a ledger while ``may_append()`` holds (the lease, DESIGN §12)."""

    ledger: Ledger
    may_append: Callable[[], bool] = lambda: True
    appended: int = 0

    async def append(self, items: Sequence[Item]) -> None:
        if not self.may_append():
            raise NotLeader("not the lease holder: facts not appended")
        payloads: list[bytes] = []
        first: int | None = None
        for index, item in enumerate(items):
            if isinstance(item, Refusal):
                if first is None:
                    # The offset the record is expected at (DECISIONS 103).
                    first = await self.ledger.last_offset() + 1
                event = FactRejected(
                    offset=first + index,
                    reason=item.reason,
                    rejected_kind=item.kind,
                    raw=item.raw,
                )
                payloads.append(encode_event(event))
            else:
                payloads.append(item)
        await self.ledger.append([Append(payload=p) for p in payloads])
        self.appended += len(payloads)


@dataclass(slots=True)
class Baseline:
    """What the ledger already holds per object, so a (re)start appends only changes."""

    pods: dict[str, Event] = field(default_factory=dict)
    nodes: dict[str, Event] = field(default_factory=dict)
    weights: dict[str, int] = field(default_factory=dict)
    settings: dict[str, Any] = field(default_factory=lambda: dict(settings_map.DEFAULTS))
    quotas: dict[str, Event] = field(default_factory=dict)

    @classmethod
    def of(cls, state: ProjectedState) -> Baseline:
        """From the projected state: every object's last fact as the ledger holds it, so
        a new leader (a restart, a takeover) appends only what changed (DESIGN §12). A
        node's fact is its allocatable with its labels and ``unschedulable``
        (``state.node_meta``, DECISIONS 260)."""
        meta = state.node_meta
        none = NodeMeta()
        return cls(
            pods=dict(state.pods),
            nodes={
                name: NodeUpserted(
                    name=name,
                    allocatable=dict(allocatable),
                    labels=dict(meta.get(name, none).labels),
                    unschedulable=meta.get(name, none).unschedulable,
                )
                for name, allocatable in state.nodes.items()
            },
            weights=dict(state.namespace_weights),
            settings=settings_map.current(state.settings),
            quotas={
                name: node.config
                for name, node in state.quotas.items()
                if name not in BUILTIN or node.config != builtin_config(name)
            },
        )


@dataclass(slots=True)
class WatchOptions:
    quota_source: str | None = "quotaledger"
    settings_configmap: tuple[str, str] = ("quotaledger", "quotaledger-settings")
    watch_timeout_s: int = 300
    page_size: int = 500  # objects per list page (limit/continue)


def _raw(obj: Any) -> str:
    text = json.dumps(obj, sort_keys=True, default=str)
    return text[:RAW_LIMIT]


@dataclass
class ClusterWatcher:
    """Lists and watches the cluster and appends facts through ``sink`` (module docstring).

    ``core`` and ``custom`` are kubernetes_asyncio ``CoreV1Api`` and ``CustomObjectsApi``.
    """

    core: Any
    custom: Any
    sink: FactSink
    options: WatchOptions = field(default_factory=WatchOptions)
    baseline: Baseline = field(default_factory=Baseline)
    reflectors: dict[str, Reflector] = field(default_factory=dict)
    _pending: list[Item] = field(default_factory=list)
    _wake: asyncio.Event = field(default_factory=asyncio.Event)
    _idle: asyncio.Event = field(default_factory=asyncio.Event)
    _refused: dict[tuple[str, str], str] = field(default_factory=dict)
    _source_objects: dict[Collection, dict[tuple[str, str], dict[str, Any]]] = field(
        default_factory=dict
    )
    _source_listed: set[Collection] = field(default_factory=set)

    def __post_init__(self) -> None:
        timeout = self.options.watch_timeout_s
        self.reflectors["nodes"] = Reflector("nodes", self.core.list_node, {}, timeout)
        self.reflectors["pods"] = Reflector(
            "pods", self.core.list_pod_for_all_namespaces, {}, timeout
        )
        self.reflectors["namespaces"] = Reflector(
            "namespaces", self.core.list_namespace, {}, timeout
        )
        namespace, name = self.options.settings_configmap
        self.reflectors["settings"] = Reflector(
            "settings",
            self.core.list_namespaced_config_map,
            {"namespace": namespace, "field_selector": f"metadata.name={name}"},
            timeout,
        )
        source = self.options.quota_source
        for collection in COLLECTIONS.get(source or "", ()):
            self.reflectors[f"quota:{collection.name}"] = self._collection_reflector(collection)
        for reflector in self.reflectors.values():
            reflector.page_size = self.options.page_size

    def _collection_reflector(self, collection: Collection) -> Reflector:
        timeout = self.options.watch_timeout_s
        name = f"{collection.name} ({collection.api_version})"
        kwargs: dict[str, Any] = {}
        if collection.object_name is not None:
            kwargs["field_selector"] = f"metadata.name={collection.object_name}"
        if not collection.group:
            assert collection.namespace is not None
            kwargs["namespace"] = collection.namespace
            return Reflector(name, self.core.list_namespaced_config_map, kwargs, timeout)
        base = {"group": collection.group, "version": collection.version}
        if collection.scope == "cluster":
            call = self.custom.list_cluster_custom_object
            kwargs |= base | {"plural": collection.plural}
        elif collection.scope == "all-namespaces":
            call = self.custom.list_custom_object_for_all_namespaces
            kwargs |= base | {"resource_plural": collection.plural}
        else:
            call = self.custom.list_namespaced_custom_object
            kwargs |= base | {"plural": collection.plural, "namespace": collection.namespace}
        return Reflector(name, call, kwargs, timeout)

    # ------------------------------------------------------------ running

    async def run(self) -> None:
        """Until cancelled; raises :class:`NotLeader` when the sink refuses."""
        try:
            await self._run()
        except* NotLeader as group:
            raise NotLeader(str(group.exceptions[0])) from None

    async def _run(self) -> None:
        async with asyncio.TaskGroup() as group:
            group.create_task(self._writer())
            handlers: dict[str, tuple[Any, Any]] = {
                "nodes": (self._nodes_listed, self._node_event),
                "pods": (self._pods_listed, self._pod_event),
                "namespaces": (self._namespaces_listed, self._namespace_event),
                "settings": (self._settings_listed, self._settings_event),
            }
            for key, reflector in self.reflectors.items():
                if key in handlers:
                    on_list, on_event = handlers[key]
                else:
                    on_list, on_event = self._source_handlers(key)
                group.create_task(reflector.run(on_list, on_event))

    async def flushed(self) -> None:
        """Wait until every fact produced so far has been appended."""
        while self._pending or not self._idle.is_set():
            self._wake.set()
            await asyncio.sleep(0.01)

    async def _writer(self) -> None:
        while True:
            if not self._pending:
                self._idle.set()
                await self._wake.wait()
            self._wake.clear()
            self._idle.clear()
            batch, self._pending = self._pending[:BATCH], self._pending[BATCH:]
            if batch:
                await self.sink.append(batch)

    def _emit(self, payload: bytes) -> None:
        self._pending.append(payload)
        self._idle.clear()
        self._wake.set()

    def _emit_event(self, event: Event) -> None:
        self._emit(encode_event(event))

    def _refuse(self, key: tuple[str, str], reason: str, kind: str, obj: Any) -> None:
        if self._refused.get(key) == reason:
            return
        self._refused[key] = reason
        log.warning("fact rejected: %s", reason)
        self._pending.append(Refusal(reason, kind, _raw(obj)))
        self._idle.clear()
        self._wake.set()

    # ------------------------------------------------------------ nodes and pods

    def _upsert(
        self,
        table: dict[str, Event],
        key: str,
        resource: str,
        kind: str,
        obj: Any,
        make: Callable[[Any], dict[str, Any]],
    ) -> None:
        try:
            payload, event = fact_payload(make(obj))
        except Untranslatable as exc:
            self._refuse((resource, key), f"{describe(resource, obj)}: {exc}", kind, obj)
            return
        self._refused.pop((resource, key), None)
        if table.get(key) != event:
            table[key] = event
            self._emit(payload)

    async def _nodes_listed(self, pages: Pages) -> None:
        seen = set()
        async for page in pages:
            for obj in page:
                name = _name(obj)
                seen.add(name)
                self._upsert(self.baseline.nodes, name, "node", "NodeUpserted", obj, node_fact)
        for name in sorted(set(self.baseline.nodes) - seen):
            del self.baseline.nodes[name]
            self._emit_event(NodeRemoved(name=name))

    async def _node_event(self, kind: str, obj: dict[str, Any]) -> None:
        name = _name(obj)
        if kind == "DELETED":
            self._refused.pop(("node", name), None)
            if self.baseline.nodes.pop(name, None) is not None:
                self._emit_event(NodeRemoved(name=name))
            return
        self._upsert(self.baseline.nodes, name, "node", "NodeUpserted", obj, node_fact)

    def _pod_fact(self, obj: Any) -> dict[str, Any]:
        return pod_fact(obj, self.options.quota_source)

    async def _pods_listed(self, pages: Pages) -> None:
        seen = set()
        async for page in pages:
            for obj in page:
                uid = _uid(obj)
                seen.add(uid)
                self._upsert(self.baseline.pods, uid, "pod", "PodUpserted", obj, self._pod_fact)
        for uid in sorted(set(self.baseline.pods) - seen):
            del self.baseline.pods[uid]
            self._emit_event(PodRemoved(uid=uid))
        await asyncio.sleep(0)

    async def _pod_event(self, kind: str, obj: dict[str, Any]) -> None:
        uid = _uid(obj)
        if kind == "DELETED":
            self._refused.pop(("pod", uid), None)
            if self.baseline.pods.pop(uid, None) is not None:
                self._emit_event(PodRemoved(uid=uid))
            return
        self._upsert(self.baseline.pods, uid, "pod", "PodUpserted", obj, self._pod_fact)

    # ------------------------------------------------------------ namespaces, settings

    def _weigh(self, obj: Any) -> None:
        try:
            name, weight = namespace_weight(obj)
        except Untranslatable as exc:
            key = ("namespace", _name(obj))
            self._refuse(key, f"{describe('namespace', obj)}: {exc}", "NamespaceWeighted", obj)
            return
        self._refused.pop(("namespace", name), None)
        if self.baseline.weights.get(name, DEFAULT_WEIGHT) != weight:
            self.baseline.weights[name] = weight
            payload, _ = fact_payload(namespace_fact(name, weight))
            self._emit(payload)

    async def _namespaces_listed(self, pages: Pages) -> None:
        async for page in pages:
            for obj in page:
                self._weigh(obj)

    async def _namespace_event(self, kind: str, obj: dict[str, Any]) -> None:
        if kind != "DELETED":
            self._weigh(obj)

    def _apply_settings(self, obj: dict[str, Any]) -> None:
        data = obj.get("data")
        if data is not None and not isinstance(data, dict):
            self._refuse(("settings", "data"), "settings ConfigMap: data: expected a map", "", obj)
            return
        changed, bad = settings_map.settings_change(data, self.baseline.settings)
        namespace, name = self.options.settings_configmap
        for key, reason in bad:
            value = (data or {}).get(key)
            self._refuse(
                ("settings", key),
                f"ConfigMap {namespace}/{name}: data.{key}: {reason}",
                "SettingsChanged",
                {key: value},
            )
        still_bad = {key for key, _ in bad}
        for refused in list(self._refused):
            if refused[0] == "settings" and refused[1] not in still_bad:
                del self._refused[refused]
        if changed:
            self.baseline.settings.update(changed)
            self._emit(msgspec.json.encode({"kind": "SettingsChanged", **changed}))

    async def _settings_listed(self, pages: Pages) -> None:
        # An absent ConfigMap has no opinion: the settings in force stay (DECISIONS 102).
        async for page in pages:
            for obj in page:
                self._apply_settings(obj)

    async def _settings_event(self, kind: str, obj: dict[str, Any]) -> None:
        if kind != "DELETED":
            self._apply_settings(obj)

    # ------------------------------------------------------------ quota source

    def _source_handlers(
        self, key: str
    ) -> tuple[
        Callable[[Pages], Awaitable[None]],
        Callable[[str, dict[str, Any]], Awaitable[None]],
    ]:
        source = self.options.quota_source
        assert source is not None
        collection = next(c for c in COLLECTIONS[source] if f"quota:{c.name}" == key)

        async def listed(pages: Pages) -> None:
            objects: dict[tuple[str, str], dict[str, Any]] = {}
            async for page in pages:
                objects.update((_key(obj), obj) for obj in page)
            self._source_objects[collection] = objects
            self._source_listed.add(collection)
            self._translate_quotas()

        async def changed(kind: str, obj: dict[str, Any]) -> None:
            objects = self._source_objects.setdefault(collection, {})
            if kind == "DELETED":
                objects.pop(_key(obj), None)
            else:
                objects[_key(obj)] = obj
            self._translate_quotas()

        return listed, changed

    def _translate_quotas(self) -> None:
        source = self.options.quota_source
        assert source is not None
        if len(self._source_listed) < len(COLLECTIONS[source]):
            return  # wait for every collection's first list: no half tree
        result = translate_source(source, self._source_objects)
        refused_now = set()
        for subject, reason in result.rejected:
            refused_now.add(("quota", subject))
            self._refuse(("quota", subject), f"{subject}: {reason}", "QuotaUpserted", subject)
        known = self.baseline.quotas
        for name in _parents_first(result.facts):
            try:
                payload, event = fact_payload(result.facts[name])
            except Untranslatable as exc:
                refused_now.add(("quota", name))
                self._refuse(("quota", name), f"quota {name}: {exc}", "QuotaUpserted", name)
                continue
            if known.get(name) != event:
                known[name] = event
                self._emit(payload)
        for name in sorted(set(known) - set(result.facts), reverse=True):
            del known[name]
            self._emit_event(QuotaRemoved(name=name))
        for key in [k for k in self._refused if k[0] == "quota" and k not in refused_now]:
            del self._refused[key]


def _parents_first(facts: dict[str, dict[str, Any]]) -> list[str]:
    """Quota names ordered by depth in the given tree, then by name."""

    def depth(name: str) -> int:
        seen = set()
        level = 0
        while name in facts and name not in seen:
            seen.add(name)
            parent = facts[name].get("parent", "root")
            name = parent if isinstance(parent, str) else "root"
            level += 1
        return level

    return sorted(facts, key=lambda name: (depth(name), name))


def _meta(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def _name(obj: dict[str, Any]) -> str:
    return str(_meta(obj).get("name", ""))


def _uid(obj: dict[str, Any]) -> str:
    return str(_meta(obj).get("uid", ""))


def _key(obj: dict[str, Any]) -> tuple[str, str]:
    meta = _meta(obj)
    return (str(meta.get("namespace") or ""), str(meta.get("name", "")))
