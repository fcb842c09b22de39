"""Raw Kafka record batches for tests: data batches and control batches
(transaction markers) built with aiokafka's own batch builder, and a produce
request that puts them in a partition as any client may (tansu stores what a
client sends, so a transaction marker can be put in a ledger: DESIGN §10, a
marker holds offsets but no record).
"""

from __future__ import annotations

import struct

from aiokafka import TopicPartition  # type: ignore[import-untyped]
from aiokafka.client import AIOKafkaClient  # type: ignore[import-untyped]
from aiokafka.protocol.produce import ProduceRequest  # type: ignore[import-untyped]
from aiokafka.record.default_records import (  # type: ignore[import-untyped]
    DefaultRecordBatch,
    DefaultRecordBatchBuilder,
)
from aiokafka.record.util import calc_crc32c  # type: ignore[import-untyped]

_ATTRIBUTES = 21  # byte offset of a v2 batch's attributes (int16); the CRC covers from here
_CRC = 17  # byte offset of the CRC (uint32)
_CONTROL = 0x20


def batch_bytes(base: int, values: list[bytes], ts: int = 1_000, control: bool = False) -> bytes:
    """One v2 record batch at ``base``: a data batch, or a control batch (a marker)."""
    builder = DefaultRecordBatchBuilder(2, 0, int(control), -1, -1, -1, 1 << 22)
    for i, value in enumerate(values):
        key = struct.pack(">hh", 0, 1) if control else None
        builder.append(i, ts + i, key, value, [])
    buf = builder.build()
    struct.pack_into(">q", buf, 0, base)  # the base offset a broker assigns
    if control:
        attributes = struct.unpack_from(">h", buf, _ATTRIBUTES)[0] | _CONTROL
        struct.pack_into(">h", buf, _ATTRIBUTES, attributes)
        struct.pack_into(">I", buf, _CRC, calc_crc32c(bytes(buf[_ATTRIBUTES:])))
    out = bytes(buf)
    assert DefaultRecordBatch(out).is_control_batch == control
    return out


async def publish_raw(bootstrap: str, topic: str, data: bytes) -> None:
    """Send ``data`` (record batches) as one produce request, as any client may."""
    client = AIOKafkaClient(bootstrap_servers=bootstrap)
    await client.bootstrap()
    try:
        await client.add_topic(topic)
        leader = client.cluster.leader_for_partition(TopicPartition(topic, 0))
        response = await client.send(
            leader, ProduceRequest(None, -1, 10_000, [(topic, [(0, data)])])
        )
        assert response.topics[0][1][0][1] == 0, response
    finally:
        await client.close()
