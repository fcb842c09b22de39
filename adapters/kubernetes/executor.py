"""Executor ``kubernetes``: the policy/v1 Eviction subresource (DESIGN §6, §12).

For one accepted eviction:

* the pod is already gone from the projected state, or its eviction already has an outcome
  (a restart, a failover): nothing is sent again;
* ``201``: the API server accepted; success is the pod's deletion or terminal phase, which
  the watcher appends and the projection counts (DESIGN §6). The executor waits for it and
  appends nothing itself;
* ``404``: the pod is already gone: ``EvictionSucceeded``; ``409`` on the uid precondition:
  the pod of that uid is gone (a new pod took its name): ``EvictionSucceeded``;
* ``429`` (a PodDisruptionBudget) and ``5xx`` and network errors: retried with exponential
  backoff, or after ``Retry-After`` when the server gives it, until ``retry_for_s`` after the
  ``EvictionRequested`` record's ts (so a restart or failover never extends it); then
  ``EvictionFailed`` with the server's message;
* ``403`` and every other answer: ``EvictionFailed`` at once, with the server's message;
* before every POST, ``may_evict()`` must hold (on a cluster: this replica holds the Lease
  and its engine the newest epoch, DESIGN §12), and again at the last moment: once the
  request has its connection, and right before its bytes are written (aiohttp trace hooks on
  the client's session, :func:`fence_evictions`; DECISIONS 304), since a replica paused while
  it opened a connection or between the two (SIGSTOP, a GC pause) would otherwise send a POST
  checked seconds earlier. A
  replica that lost them sends nothing more and appends no outcome: the eviction stays
  outstanding for the new leader.

Idempotent by ``eviction_id``: the engine drives an eviction once per process, and the
state check above keeps a restarted engine from evicting a pod that is already gone. The
eviction carries the pod's uid as a precondition, so a replacement pod of the same name is
never evicted by mistake.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from quotaledger.events.ledger import Ledger
from quotaledger.events.model import Event, EvictionFailed, EvictionSucceeded
from quotaledger.projections.state import ACTIVE_PHASES, EvictionRun, ProjectedState

from .reflector import Backoff

log = logging.getLogger("quotaledger.kubernetes")


def wall_clock_s() -> float:
    return time.time()


def always() -> bool:
    return True


class EvictionFenced(RuntimeError):
    """An eviction POST stopped right before it left: this replica may no longer evict."""


@dataclass
class _Fence:
    may_evict: Callable[[], bool] = always


#: one fence per client session (the executor of the current term sets its check)
_FENCES: weakref.WeakKeyDictionary[Any, _Fence] = weakref.WeakKeyDictionary()


def fence_evictions(core: Any, may_evict: Callable[[], bool]) -> None:
    """Check ``may_evict()`` for every eviction POST of ``core``'s client session once the
    request holds its connection, just before it is written (module docstring)."""
    session = getattr(
        getattr(getattr(core, "api_client", None), "rest_client", None), "pool_manager", None
    )
    if not isinstance(session, aiohttp.ClientSession):
        return
    fence = _FENCES.get(session)
    if fence is None:
        fence = _FENCES[session] = _Fence()
        session.trace_configs.append(_trace(fence))
    fence.may_evict = may_evict


def _trace(fence: _Fence) -> aiohttp.TraceConfig:
    async def started(
        session: aiohttp.ClientSession,
        ctx: SimpleNamespace,
        params: aiohttp.TraceRequestStartParams,
    ) -> None:
        ctx.eviction = params.method == "POST" and params.url.path.endswith("/eviction")

    async def connected(session: aiohttp.ClientSession, ctx: SimpleNamespace, params: Any) -> None:
        if getattr(ctx, "eviction", False) and not fence.may_evict():
            raise EvictionFenced("no longer the leader: the eviction was not sent")

    config = aiohttp.TraceConfig()
    config.on_request_start.append(started)
    config.on_connection_reuseconn.append(connected)
    config.on_connection_create_end.append(connected)
    # aiohttp holds the request line and headers back and writes them with the body,
    # from a task of its own that runs a loop turn (or a pause) later; this hook runs
    # in that task right before the bytes go to the socket, nothing awaited between
    config.on_request_chunk_sent.append(connected)
    config.freeze()
    return config


def _fenced(exc: BaseException) -> bool:
    """Did a fence stop this request (an :class:`EvictionFenced` in its causes)?"""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, EvictionFenced):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def server_message(exc: ApiException) -> str:
    """The ``message`` of a Kubernetes Status body, else the HTTP reason."""
    try:
        body = json.loads(exc.body) if exc.body else {}
    except (TypeError, ValueError):
        body = {}
    message = body.get("message") if isinstance(body, dict) else None
    return f"{exc.status} {message or exc.reason}"


def retry_after_s(exc: ApiException) -> float | None:
    headers: Any = exc.headers or {}
    value = headers.get("Retry-After") if hasattr(headers, "get") else None
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


@dataclass
class KubernetesExecutor:
    """See the module docstring. ``core`` is a kubernetes_asyncio ``CoreV1Api``."""

    core: Any
    ledger: Ledger
    retry_for_s: float = 300.0
    poll_s: float = 0.1
    clock_s: Callable[[], float] = wall_clock_s
    backoff_first_s: float = 0.5
    backoff_cap_s: float = 30.0
    may_evict: Callable[[], bool] = always
    _requested_ts: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        fence_evictions(self.core, self.may_evict)

    async def evict(self, eviction: EvictionRun, state: ProjectedState) -> list[Event]:
        run = state.evictions.get(eviction.eviction_id)
        if run is None or run.outcome is not None:
            return []
        pod = state.pods.get(eviction.pod_uid)
        if pod is None or pod.phase not in ACTIVE_PHASES:
            return [EvictionSucceeded(eviction_id=eviction.eviction_id)]
        deadline = await self._deadline(eviction)
        body = client.V1Eviction(
            metadata=client.V1ObjectMeta(name=pod.name, namespace=pod.namespace),
            delete_options=client.V1DeleteOptions(
                preconditions=client.V1Preconditions(uid=eviction.pod_uid)
            ),
        )
        backoff = Backoff(self.backoff_first_s, self.backoff_cap_s)
        while True:
            if not self.may_evict():
                log.info("not evicting %s: no longer the leader", eviction.eviction_id)
                await asyncio.sleep(self.poll_s)  # the term ends: no busy re-drive meanwhile
                return []
            try:
                await self.core.create_namespaced_pod_eviction(pod.name, pod.namespace, body)
            except EvictionFenced:
                log.info("not evicting %s: no longer the leader", eviction.eviction_id)
                await asyncio.sleep(self.poll_s)
                return []
            except ApiException as exc:
                status = exc.status or 0
                message = server_message(exc)
                if status == 404:
                    return [EvictionSucceeded(eviction_id=eviction.eviction_id)]
                if status == 409:
                    return [EvictionSucceeded(eviction_id=eviction.eviction_id)]
                if status != 429 and status < 500:
                    return [EvictionFailed(eviction_id=eviction.eviction_id, error=message)]
                delay = retry_after_s(exc)
                failed = await self._wait_to_retry(delay, backoff, deadline, message)
            except (TimeoutError, aiohttp.ClientError, OSError) as exc:
                if _fenced(exc):  # the fence of the body's write, reported as a failed send
                    log.info("not evicting %s: no longer the leader", eviction.eviction_id)
                    await asyncio.sleep(self.poll_s)
                    return []
                failed = await self._wait_to_retry(None, backoff, deadline, f"network: {exc}")
            else:
                return await self._await_removal(eviction, state, deadline)
            if failed is not None:
                return [EvictionFailed(eviction_id=eviction.eviction_id, error=failed)]
            if self._settled(eviction, state):
                return []

    @staticmethod
    def _settled(eviction: EvictionRun, state: ProjectedState) -> bool:
        run = state.evictions.get(eviction.eviction_id)
        if run is None or run.outcome is not None:
            return True
        pod = state.pods.get(eviction.pod_uid)
        return pod is None or pod.phase not in ACTIVE_PHASES

    async def _deadline(self, eviction: EvictionRun) -> float:
        """``retry_for_s`` after the ``EvictionRequested`` record's ts (seconds)."""
        ts = self._requested_ts.get(eviction.eviction_id)
        if ts is None:
            ts = 0
            async for batch in self.ledger.read(eviction.requested_offset):
                ts = batch[0].ts
                break
            self._requested_ts[eviction.eviction_id] = ts
        return ts / 1000 + self.retry_for_s

    async def _wait_to_retry(
        self, delay: float | None, backoff: Backoff, deadline: float, message: str
    ) -> str | None:
        """Sleep before the next try; the error to record when the deadline comes first."""
        wait = delay if delay is not None else backoff.delay()
        now = self.clock_s()
        if now + wait > deadline:
            return f"{message} (retried for {self.retry_for_s:g} s)"
        log.info("eviction refused (%s); retrying in %.1f s", message, wait)
        await asyncio.sleep(wait)
        return None

    async def _await_removal(
        self, eviction: EvictionRun, state: ProjectedState, deadline: float
    ) -> list[Event]:
        """After 201: the watcher's PodRemoved/terminal phase settles it (DESIGN §12)."""
        while not self._settled(eviction, state):
            if self.clock_s() > deadline:
                return [
                    EvictionFailed(
                        eviction_id=eviction.eviction_id,
                        error="evicted (201) but the pod was not seen removed within"
                        f" {self.retry_for_s:g} s",
                    )
                ]
            await asyncio.sleep(self.poll_s)
        return []
