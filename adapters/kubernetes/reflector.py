"""List, then watch one collection of the Kubernetes API (DESIGN §12).

A :class:`Reflector` keeps one collection in step with the API server the way client-go's
reflector does:

1. list (in pages of 500, ``limit``/``continue``; the list's ``resourceVersion`` is the
   version to watch from) and hand the pages to ``on_list``, which replaces what the caller
   knew once it has read them all;
2. watch from that version with bookmarks allowed, handing each ``ADDED``/``MODIFIED``/
   ``DELETED`` to ``on_event`` and remembering the version of every event and bookmark;
3. when a watch ends (the server's timeout), watch again from the remembered version, so
   nothing is lost or seen twice; on ``410 Gone`` list again (step 1); on any other error
   (network, 5xx, ...) wait with exponential backoff and resume from the remembered version.

Objects stay plain dicts as the server sent them (no model classes: cheaper, and custom
resources have none). Uses ``kubernetes_asyncio``'s API methods and its ``watch.Watch``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from kubernetes_asyncio import watch
from kubernetes_asyncio.client.exceptions import ApiException

log = logging.getLogger("quotaledger.kubernetes")

ListCall = Callable[..., Awaitable[Any]]
Pages = AsyncIterator[list[dict[str, Any]]]
OnList = Callable[[Pages], Awaitable[None]]
OnEvent = Callable[[str, dict[str, Any]], Awaitable[None]]


class RawWatch(watch.Watch):
    """``watch.Watch`` that leaves objects as dicts (``raw_object``): no model
    deserialisation, so no ApiClient of its own either."""

    def __init__(self) -> None:
        self._raw_return_type = None
        self._stop = False
        self.resource_version = None
        self.resp = None
        self._api_client = None  # type: ignore[assignment]

    def get_return_type(self, func: object) -> str:
        return ""  # falsy: unmarshal_event keeps the dict

    async def close(self) -> None:
        if self.resp is not None:
            self.resp.release()
            self.resp = None


@dataclass(slots=True)
class Backoff:
    """Exponential backoff with jitter, reset after a watch that worked."""

    first_s: float = 0.2
    cap_s: float = 10.0
    _next: float = 0.0

    def delay(self) -> float:
        self._next = min(self.cap_s, self._next * 2 if self._next else self.first_s)
        return self._next * (0.5 + random.random() / 2)

    def reset(self) -> None:
        self._next = 0.0


#: Errors after which a watch is resumed (not re-listed): the connection or the server
#: failed, not our version.
NETWORK_ERRORS: tuple[type[BaseException], ...] = (
    aiohttp.ClientError,
    asyncio.TimeoutError,
    OSError,
    ValueError,  # a truncated JSON line
)


@dataclass(slots=True)
class Reflector:
    """One collection: ``list_call`` is a kubernetes_asyncio list method (bound), called
    with ``kwargs`` (namespace, field selector...)."""

    name: str
    list_call: ListCall
    kwargs: dict[str, Any] = field(default_factory=dict)
    watch_timeout_s: int = 300
    backoff: Backoff = field(default_factory=Backoff)
    resource_version: str | None = None
    lists: int = 0  # how many complete lists (1 + one per 410)
    page_size: int = 500
    relist_hook: Callable[[], None] | None = None

    async def run(self, on_list: OnList, on_event: OnEvent) -> None:
        """Forever (until cancelled): list, watch, recover (module docstring)."""
        while True:
            try:
                if self.resource_version is None:
                    await self._list(on_list)
                await self._watch(on_event)
                self.backoff.reset()
            except ApiException as exc:
                if exc.status == 410:
                    log.info("%s: resource version expired (410), listing again", self.name)
                    self.resource_version = None
                    continue
                await self._pause(f"API error {exc.status} {exc.reason}")
            except NETWORK_ERRORS as exc:
                await self._pause(f"{type(exc).__name__}: {exc}")

    async def _pause(self, why: str) -> None:
        delay = self.backoff.delay()
        log.warning("%s: %s; retrying in %.1fs", self.name, why, delay)
        await asyncio.sleep(delay)

    async def _list(self, on_list: OnList) -> None:
        """List in pages of ``page_size`` (as client-go's pager: bounded memory); ``on_list``
        consumes the pages as they arrive. The version to watch from is the first page's."""
        version: str | None = None

        async def fetch(token: str | None) -> dict[str, Any]:
            kwargs = dict(self.kwargs, limit=self.page_size)
            if token:
                kwargs["_continue"] = token
            response = await self.list_call(**kwargs, _preload_content=False)
            try:
                if response.status >= 400:
                    raise ApiException(status=response.status, reason=response.reason)
                body: dict[str, Any] = json.loads(await response.read())
            finally:
                response.release()
            return body

        async def pages() -> Pages:
            """The pages in order; the next one is fetched while the caller handles this one."""
            nonlocal version
            upcoming: asyncio.Task[dict[str, Any]] | None = asyncio.ensure_future(fetch(None))
            try:
                while upcoming is not None:
                    body = await upcoming
                    meta = body.get("metadata") or {}
                    if version is None:
                        version = meta.get("resourceVersion") or None
                    token = meta.get("continue") or None
                    upcoming = asyncio.ensure_future(fetch(token)) if token else None
                    yield body.get("items") or []
            finally:
                if upcoming is not None:
                    upcoming.cancel()
                    with contextlib.suppress(asyncio.CancelledError, *NETWORK_ERRORS, ApiException):
                        await upcoming

        await on_list(pages())
        self.lists += 1
        if version is None:
            raise ApiException(status=500, reason="list without a resourceVersion")
        self.resource_version = version

    async def _watch(self, on_event: OnEvent) -> None:
        stream = RawWatch()
        timeout = aiohttp.ClientTimeout(sock_connect=30, sock_read=self.watch_timeout_s + 30)
        stream.stream(
            self.list_call,
            resource_version=self.resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=self.watch_timeout_s,
            _request_timeout=timeout,
            **self.kwargs,
        )
        try:
            async for event in stream:
                kind = event["type"]
                raw = event["raw_object"]
                version = (raw.get("metadata") or {}).get("resourceVersion")
                if kind != "BOOKMARK":
                    await on_event(kind, raw)
                if version:
                    self.resource_version = version
        finally:
            await stream.close()
