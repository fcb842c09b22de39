"""Executor ``kafka``: eviction commands on a topic for an external agent (DESIGN §6, §10).

For each accepted eviction the engine drives, the executor publishes to
``TOPIC.evictions`` (key: the eviction id)::

    {"eviction_id", "preemption_id", "pod_uid", "namespace", "name", "queue"}

and waits for the agent's answer on ``TOPIC.outcomes``::

    {"eviction_id", "ok": true|false, "error": "..."}

which becomes ``EvictionSucceeded`` / ``EvictionFailed`` in the ledger. Rules:

* commands are idempotent by ``eviction_id``: after a restart the engine drives
  its outstanding evictions again and the command is published again;
* the outcomes topic is read from its beginning, so an answer given while the
  engine was down is not lost; an answer for an eviction the engine is not
  waiting for is kept only while that eviction is outstanding in the state
  (the engine will drive it), otherwise logged and ignored, as is a malformed
  answer;
* without an answer within ``outcome_timeout_s`` the eviction fails with that
  reason (its preemption must finish and free its queues).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any

import msgspec
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition  # type: ignore[import-untyped]
from aiokafka.admin import AIOKafkaAdminClient, NewTopic  # type: ignore[import-untyped]
from aiokafka.errors import KafkaError  # type: ignore[import-untyped]

from quotaledger.events.ledger import LedgerError
from quotaledger.events.model import Event, EvictionFailed, EvictionSucceeded
from quotaledger.projections.state import EvictionRun, ProjectedState

from .stopping import stop_client

__all__ = ["EvictionCommand", "EvictionOutcome", "KafkaExecutor"]

log = logging.getLogger("quotaledger.executor.kafka")


class EvictionCommand(msgspec.Struct, kw_only=True):
    """What the agent is asked to do (a message on ``TOPIC.evictions``)."""

    eviction_id: str
    preemption_id: str
    pod_uid: str
    namespace: str | None
    name: str | None
    queue: str


class EvictionOutcome(msgspec.Struct, kw_only=True):
    """The agent's answer (a message on ``TOPIC.outcomes``)."""

    eviction_id: str
    ok: bool
    error: str | None = None


_OUTCOME = msgspec.json.Decoder(EvictionOutcome)
_ENCODER = msgspec.json.Encoder()


class KafkaExecutor:
    """Publishes eviction commands and turns the answers into outcome records."""

    def __init__(
        self,
        bootstrap: Sequence[str],
        topic: str,
        *,
        client_options: Mapping[str, Any] | None = None,
        outcome_timeout_s: float = 300.0,
    ) -> None:
        self.bootstrap = list(bootstrap)
        self.evictions_topic = f"{topic}.evictions"
        self.outcomes_topic = f"{topic}.outcomes"
        self.outcome_timeout_s = outcome_timeout_s
        self._options = dict(client_options or {})
        self._producer: Any = None
        self._consumer: Any = None
        self._reader: asyncio.Task[None] | None = None
        self._waiting: dict[str, asyncio.Future[EvictionOutcome]] = {}
        self._early: dict[str, EvictionOutcome] = {}
        self._state: Callable[[], ProjectedState] | None = None
        #: Answers that matched no eviction (logged and ignored).
        self.ignored = 0

    def bind(self, state: Callable[[], ProjectedState]) -> None:
        """Let the executor see the engine's state (which evictions are outstanding)."""
        self._state = state

    async def start(self) -> KafkaExecutor:
        """Create both topics when missing, start the producer and the outcome reader."""
        admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap, **self._options)
        try:
            await admin.start()
            existing = set(await admin.list_topics())
            missing = [t for t in (self.evictions_topic, self.outcomes_topic) if t not in existing]
            if missing:
                await admin.create_topics([NewTopic(t, 1, 1) for t in missing])
        except KafkaError as exc:
            raise LedgerError(f"executor kafka: cannot create its topics: {exc}") from None
        finally:
            await stop_client(admin.close())
        self._producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap, acks="all", enable_idempotence=False, **self._options
        )
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap,
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            fetch_max_wait_ms=100,
            **self._options,
        )
        try:
            await self._producer.start()
            await self._consumer.start()
        except KafkaError as exc:
            await self.close()
            raise LedgerError(f"executor kafka: cannot connect: {exc}") from None
        tp = TopicPartition(self.outcomes_topic, 0)
        self._consumer.assign([tp])
        self._consumer.seek(tp, 0)
        self._reader = asyncio.get_running_loop().create_task(self._read_outcomes(tp))
        return self

    async def __aenter__(self) -> KafkaExecutor:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop the outcome reader and the clients; a cancellation of the caller on the
        way is raised, not swallowed (:func:`.stopping.stop_client`)."""
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.cancel()
            await asyncio.wait({reader})
            if not reader.cancelled() and reader.exception() is not None:
                log.warning(
                    "executor kafka: the outcome reader had stopped: %s", reader.exception()
                )
        for client in (self._consumer, self._producer):
            if client is not None:
                await stop_client(client.stop())
        self._consumer = self._producer = None

    # ------------------------------------------------------------ executor

    async def evict(self, eviction: EvictionRun, state: ProjectedState) -> list[Event]:
        """Publish the command, wait for its answer, return the outcome record."""
        eid = eviction.eviction_id
        pod = state.pods.get(eviction.pod_uid)
        command = EvictionCommand(
            eviction_id=eid,
            preemption_id=eviction.preemption_id,
            pod_uid=eviction.pod_uid,
            namespace=pod.namespace if pod is not None else None,
            name=pod.name if pod is not None else None,
            queue=eviction.queue,
        )
        outcome = self._early.pop(eid, None)
        if outcome is None:
            future = self._waiting.get(eid)
            if future is None or future.done():
                future = asyncio.get_running_loop().create_future()
                self._waiting[eid] = future
            await self._publish(command)
            try:
                async with asyncio.timeout(self.outcome_timeout_s):
                    outcome = await asyncio.shield(future)
            except TimeoutError:
                outcome = EvictionOutcome(
                    eviction_id=eid,
                    ok=False,
                    error=f"no outcome on {self.outcomes_topic} within"
                    f" {self.outcome_timeout_s:g} s",
                )
            finally:
                self._waiting.pop(eid, None)
        if outcome.ok:
            return [EvictionSucceeded(eviction_id=eid)]
        return [EvictionFailed(eviction_id=eid, error=outcome.error or "failed (no reason given)")]

    async def _publish(self, command: EvictionCommand) -> None:
        value = _ENCODER.encode(command)
        while True:
            try:
                await self._producer.send_and_wait(
                    self.evictions_topic, value, key=command.eviction_id.encode(), partition=0
                )
                return
            except KafkaError as exc:
                log.warning(
                    "executor kafka: publishing %s failed (%s); retrying", command.eviction_id, exc
                )
                await asyncio.sleep(0.5)

    async def _read_outcomes(self, tp: Any) -> None:
        while True:
            try:
                fetched = await self._consumer.getmany(tp, timeout_ms=500)
            except KafkaError as exc:
                log.warning("executor kafka: reading %s failed (%s)", self.outcomes_topic, exc)
                await asyncio.sleep(0.5)
                continue
            for message in fetched.get(tp, []):
                self.on_outcome(message.offset, message.value or b"")

    def on_outcome(self, offset: int, value: bytes) -> None:
        """One answer from the agent: resolve its eviction, or log and ignore it."""
        try:
            outcome = _OUTCOME.decode(value)
        except msgspec.DecodeError as exc:
            self.ignored += 1
            log.warning("%s@%d: malformed outcome ignored: %s", self.outcomes_topic, offset, exc)
            return
        eid = outcome.eviction_id
        future = self._waiting.get(eid)
        if future is not None:
            if not future.done():
                future.set_result(outcome)
            return
        if self._outstanding(eid):
            self._early[eid] = outcome  # answered before (re)driven: used when it is
            return
        self.ignored += 1
        log.info("%s@%d: outcome for unknown eviction %r ignored", self.outcomes_topic, offset, eid)

    def _outstanding(self, eviction_id: str) -> bool:
        if self._state is None:
            return False
        run = self._state().evictions.get(eviction_id)
        return run is not None and run.outcome is None
