"""A Kafka ledger's topic and producer settings (DESIGN §3, §10).

A ledger is one topic with exactly one partition (total order), created by
``init`` (or ``run``/``serve`` on an empty ledger) with :data:`TOPIC_CONFIG`:
kept forever, never compacted. An existing topic with more partitions is
refused. Appends go with ``acks=all`` and without idempotence (tansu has no
idempotent producer), one record batch per request (:func:`producer_settings`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from aiokafka.admin import AIOKafkaAdminClient, NewTopic  # type: ignore[import-untyped]
from aiokafka.errors import KafkaError  # type: ignore[import-untyped]

from quotaledger.events.ledger import LedgerError

from .stopping import stop_client

__all__ = ["PRODUCER_BATCH_BYTES", "TOPIC_CONFIG", "ensure_topic", "producer_settings"]

#: Topic settings of a new ledger (§10): kept forever, never compacted.
TOPIC_CONFIG = {"retention.ms": "-1", "cleanup.policy": "delete"}
#: Bigger batches than aiokafka's defaults: a ledger is read and written in bulk.
PRODUCER_BATCH_BYTES = 1_000_000


def producer_settings() -> dict[str, Any]:
    """The producer settings of a ledger's appends (DESIGN §3, §10: ``acks=all``; tansu has
    no idempotent producer): one record batch of up to ``PRODUCER_BATCH_BYTES`` per request,
    sent at once. ``bench kafka`` gives plain aiokafka the same settings."""
    return {
        "acks": "all",
        "enable_idempotence": False,
        "max_batch_size": PRODUCER_BATCH_BYTES,
        "max_request_size": PRODUCER_BATCH_BYTES + 65536,
        "linger_ms": 0,
    }


async def ensure_topic(
    servers: list[str], topic: str, options: dict[str, Any], create: bool, where: str
) -> None:
    """Check the topic has one partition; create it (§10 settings) when missing."""
    admin = AIOKafkaAdminClient(bootstrap_servers=servers, request_timeout_ms=10_000, **options)
    try:
        try:
            await admin.start()
        except KafkaError as exc:
            raise LedgerError(f"{where}: cannot connect: {exc}") from None
        try:
            partitions = await _partitions_or_create(admin, topic, create, where)
        except KafkaError as exc:  # the link lost after connecting: a clear refusal too
            raise LedgerError(f"{where}: cannot connect: {exc}") from None
        if partitions is not None and partitions != 1:
            raise LedgerError(
                f"{where}: the topic has {partitions} partitions; a ledger is one partition"
                " (total order)"
            )
    finally:
        await stop_client(admin.close())


async def _partitions_or_create(admin: Any, topic: str, create: bool, where: str) -> int | None:
    """The topic's partition count, after creating it (with §10's settings) when missing
    and ``create``; None when it exists without partitions the broker describes."""
    # Existence from the topic list: tansu creates a topic (with 4 partitions)
    # on a metadata request naming it, which describe_topics sends.
    exists = topic in await admin.list_topics()
    partitions = await _partitions(admin, topic) if exists else None
    if partitions is None:
        if not create:
            raise LedgerError(f"{where}: no such topic (create it with `quotaledger init`)")
        response = await admin.create_topics(
            [NewTopic(topic, 1, 1, topic_configs=dict(TOPIC_CONFIG))]
        )
        for _name, code, message in _topic_errors(response):
            if code not in (0, 36):  # 36: created meanwhile by someone else
                raise LedgerError(f"{where}: cannot create the topic: {message} ({code})")
        partitions = await _partitions(admin, topic)
    return partitions


async def _partitions(admin: Any, topic: str) -> int | None:
    described = await admin.describe_topics([topic])
    for entry in described:
        if entry.get("topic") != topic:
            continue
        if entry.get("error_code", 0) != 0:
            return None
        return len(entry.get("partitions", []))
    return None


def _topic_errors(response: Any) -> Iterable[tuple[str, int, str | None]]:
    for entry in getattr(response, "topic_errors", []):
        yield entry[0], entry[1], entry[2] if len(entry) > 2 else None
