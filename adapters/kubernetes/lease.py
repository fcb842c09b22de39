"""Leader election with a ``coordination.k8s.io/v1`` Lease (DESIGN §12), as client-go's
leaderelection does it:

* a candidate takes the Lease when it does not exist (create; ``409 AlreadyExists`` means
  another was faster), when it names no holder, or when the holder's record has not
  changed for ``leaseDurationSeconds`` *as observed by this candidate's own clock* (no
  clock comparison across machines);
* the holder renews every ``retry_period``; every write is a replace carrying the
  ``resourceVersion`` it read, so of two concurrent writers one gets ``409 Conflict``;
* the holder counts itself the holder only until ``renew_deadline`` after the start of its
  last successful renew, then steps down (stops appending). Since
  ``renew_deadline < lease_duration``, the old holder has stopped before any other replica
  can see the lease expire: never two holders appending at once;
* on a clean stop the holder releases the Lease (no holder), so a successor need not wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import aiohttp
from kubernetes_asyncio.client.exceptions import ApiException

log = logging.getLogger("quotaledger.kubernetes")

_ERRORS = (ApiException, aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError)


def micro_time(moment: datetime) -> str:
    """A Kubernetes MicroTime: RFC 3339 with microseconds, UTC."""
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class LeaseElector:
    """One candidate for the Lease ``namespace/name``; ``coordination`` is a
    kubernetes_asyncio ``CoordinationV1Api``."""

    coordination: Any
    namespace: str
    name: str
    identity: str
    lease_duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0
    clock: Callable[[], float] = time.monotonic
    _observed: tuple[Any, ...] | None = None
    _observed_at: float = 0.0
    _renewed_at: float | None = None
    terms: int = 0  # how many times this candidate took the Lease

    def __post_init__(self) -> None:
        if not 0 < self.retry_period_s < self.renew_deadline_s < self.lease_duration_s:
            raise ValueError(
                "need 0 < --retry-period < --renew-deadline < --lease-duration"
                f" (got {self.retry_period_s:g}, {self.renew_deadline_s:g},"
                f" {self.lease_duration_s:g})"
            )

    def holding(self) -> bool:
        """True while a renew started less than ``renew_deadline`` ago succeeded."""
        return (
            self._renewed_at is not None and self.clock() - self._renewed_at < self.renew_deadline_s
        )

    async def acquire(self) -> None:
        """Return once this candidate holds the Lease (retrying every retry period)."""
        while not await self.try_acquire_or_renew():
            await asyncio.sleep(self.retry_period_s * (1 + random.random() * 0.2))
        self.terms += 1
        log.info("lease %s/%s taken by %s", self.namespace, self.name, self.identity)

    async def keep(self) -> None:
        """Renew every retry period; return when the Lease is lost."""
        while True:
            if self._renewed_at is None:
                return
            left = self._renewed_at + self.renew_deadline_s - self.clock()
            await asyncio.sleep(max(0.0, min(self.retry_period_s, left)))
            if self._renewed_at is None:
                return
            budget = self.renew_deadline_s - (self.clock() - self._renewed_at)
            if budget > 0:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(budget):
                        await self.try_acquire_or_renew()
            if not self.holding():
                log.warning("lease %s/%s lost by %s", self.namespace, self.name, self.identity)
                self._renewed_at = None
                return

    async def release(self) -> None:
        """Give the Lease up (holder none, as client-go's ReleaseOnCancel) if held."""
        if not self.holding():
            self._renewed_at = None
            return
        self._renewed_at = None
        with contextlib.suppress(*_ERRORS):
            lease = await self._read()
            if lease is None or lease["spec"].get("holderIdentity") != self.identity:
                return
            lease["spec"].update(
                holderIdentity=None,
                leaseDurationSeconds=1,
                renewTime=micro_time(datetime.now(UTC)),
            )
            await self.coordination.replace_namespaced_lease(self.name, self.namespace, lease)

    async def _read(self) -> dict[str, Any] | None:
        response = await self.coordination.read_namespaced_lease(
            self.name, self.namespace, _preload_content=False
        )
        try:
            if response.status == 404:
                return None
            if response.status >= 400:
                raise ApiException(status=response.status, reason=response.reason)
            body: dict[str, Any] = json.loads(await response.read())
        finally:
            response.release()
        body.setdefault("spec", {})
        return body

    async def try_acquire_or_renew(self) -> bool:
        """One attempt (module docstring); True when this candidate holds the Lease."""
        started = self.clock()
        now = micro_time(datetime.now(UTC))
        duration = math.ceil(self.lease_duration_s)
        try:
            lease = await self._read()
            # when the record reached this candidate (a late answer only makes it wait
            # longer; DECISIONS 109, 229), not when it asked
            seen = self.clock()
            if lease is None:
                body = {
                    "apiVersion": "coordination.k8s.io/v1",
                    "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace},
                    "spec": {
                        "holderIdentity": self.identity,
                        "leaseDurationSeconds": duration,
                        "acquireTime": now,
                        "renewTime": now,
                        "leaseTransitions": 0,
                    },
                }
                await self.coordination.create_namespaced_lease(self.namespace, body)
                self._renewed_at = started
                return True
            spec = lease["spec"]
            holder = spec.get("holderIdentity") or None
            record = (
                holder,
                spec.get("renewTime"),
                spec.get("acquireTime"),
                spec.get("leaseTransitions"),
                spec.get("leaseDurationSeconds"),
            )
            if record != self._observed:
                self._observed = record
                self._observed_at = seen
            if holder is not None and holder != self.identity:
                self._renewed_at = None  # someone else holds it: step down at once
                held_for = spec.get("leaseDurationSeconds") or duration
                if seen - self._observed_at < held_for:
                    return False
            mine = holder == self.identity
            transitions = spec.get("leaseTransitions") or 0
            spec.update(
                holderIdentity=self.identity,
                leaseDurationSeconds=duration,
                renewTime=now,
                acquireTime=spec.get("acquireTime") if mine else now,
                leaseTransitions=transitions if mine else transitions + 1,
            )
            await self.coordination.replace_namespaced_lease(self.name, self.namespace, lease)
        except _ERRORS as exc:
            status = getattr(exc, "status", None)
            if status != 409:
                log.info("lease %s/%s: %s", self.namespace, self.name, exc)
            return False
        self._renewed_at = started
        return True
