"""A Kafka-protocol proxy that hides record batches from Fetch responses (DESIGN §10 tests).

tansu with several concurrent producers sometimes makes a later batch readable
before an earlier one: a fetch from offset 50 returns the batch at 54 while
50..53 are not readable yet. That happens by itself a few times in ten thousand
records; this proxy makes it happen on purpose, on a real broker, so a test can
reproduce it exactly: while :attr:`HidingProxy.hide` is set, every Fetch
response that passes through leaves out the record batches it picks (by offsets
or by content); the bytes of the other batches, and everything else, pass
unchanged.

The broker must advertise the proxy's address (:class:`ProxiedTansu`), so that
clients reach the partition leader through the proxy too. Requests pass as they
are; the proxy reads each request's header (api key, version, correlation id) to
know which responses are Fetch responses, and decodes and re-encodes only those
with aiokafka's protocol classes.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
from collections.abc import Callable
from io import BytesIO
from typing import Any

from aiokafka.protocol import fetch  # type: ignore[import-untyped]

from tests.tansu import Tansu, free_port

_FETCH = 1
_RESPONSES: dict[int, Any] = {
    cls.API_VERSION: cls for name, cls in vars(fetch).items() if name.startswith("FetchResponse_v")
}
_BATCH_HEADER = struct.Struct(">qi")  # base offset, batch length (after these 12 bytes)


#: Which batches to leave out: (base offset, last offset, the batch's bytes) -> hide?
Hide = Callable[[int, int, bytes], bool]


def hiding_offsets(first: int, stop: int) -> Hide:
    """Hide the batches that hold any offset of ``first..stop-1``."""
    return lambda base, last, _batch: first <= last and base < stop


def hiding_bytes(needle: bytes) -> Hide:
    """Hide the batches whose bytes contain ``needle`` (uncompressed values do)."""
    return lambda _base, _last, batch: needle in batch


def without(data: bytes, hide: Hide) -> bytes:
    """``data`` (record batches) without the batches ``hide`` picks."""
    out: list[bytes] = []
    at = 0
    while at + _BATCH_HEADER.size <= len(data):
        base, length = _BATCH_HEADER.unpack_from(data, at)
        end = at + _BATCH_HEADER.size + length
        if end > len(data):
            break  # a batch the fetch size cut: passed on as it is, below
        # the v2 batch's last offset delta sits 23 bytes into it (after the header,
        # partition leader epoch, magic, crc and attributes)
        last = base + struct.unpack_from(">i", data, at + 23)[0]
        if not hide(base, last, data[at:end]):
            out.append(data[at:end])
        at = end
    out.append(data[at:])
    return b"".join(out)


class HidingProxy:
    """Forwards 127.0.0.1:``port`` to ``upstream``; hides batches while asked to."""

    def __init__(self, upstream_port: int, port: int | None = None) -> None:
        self.upstream_port = upstream_port
        self.port = port if port is not None else free_port()
        #: Which batches Fetch responses leave out (None: none).
        self.hide: Hide | None = None
        #: The log start offset Fetch responses (v5+) report, leaving out the
        #: batches wholly before it, as a broker whose retention deleted them
        #: (None: as the broker says).
        self.log_start: int | None = None
        #: Fetch responses from which a batch was left out.
        self.altered = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> HidingProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=5)
        if self._server is not None:
            with contextlib.suppress(Exception):
                await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            writer.close()
            return
        asked: dict[int, tuple[int, int]] = {}  # correlation id -> (api key, version)
        tasks = [
            asyncio.create_task(self._requests(reader, up_writer, asked)),
            asyncio.create_task(self._responses(up_reader, writer, asked)),
        ]
        self._tasks.update(tasks)
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
                self._tasks.discard(task)
            for w in (writer, up_writer):
                w.close()

    @staticmethod
    async def _frame(reader: asyncio.StreamReader) -> bytes | None:
        try:
            size = struct.unpack(">i", await reader.readexactly(4))[0]
            return await reader.readexactly(size)
        except (asyncio.IncompleteReadError, ConnectionError):
            return None

    async def _requests(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        asked: dict[int, tuple[int, int]],
    ) -> None:
        while (frame := await self._frame(reader)) is not None:
            key, version, correlation = struct.unpack_from(">hhi", frame)
            asked[correlation] = (key, version)
            writer.write(struct.pack(">i", len(frame)) + frame)
            await writer.drain()

    async def _responses(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        asked: dict[int, tuple[int, int]],
    ) -> None:
        while (frame := await self._frame(reader)) is not None:
            (correlation,) = struct.unpack_from(">i", frame)
            key, version = asked.pop(correlation, (-1, -1))
            if key == _FETCH and (self.hide is not None or self.log_start is not None):
                frame = frame[:4] + self._hide(_RESPONSES[version], frame[4:])
            writer.write(struct.pack(">i", len(frame)) + frame)
            await writer.drain()

    def _hide(self, response_type: Any, body: bytes) -> bytes:
        response = response_type.decode(BytesIO(body))
        changed = False
        topics = []
        hide, start = self.hide, self.log_start
        if start is not None:
            hide = _deleted_before(start, hide)
        for topic, partitions in response.topics:
            kept = []
            for partition in partitions:
                *head, data = partition
                # head: partition, error, highwater, last stable, log start (v5+), ...
                if start is not None and response_type.API_VERSION >= 5 and head[4] < start:
                    head[4] = start
                    changed = True
                if data and hide is not None:
                    shown = without(data, hide)
                    changed = changed or shown != data
                    data = shown
                kept.append((*head, data))
            topics.append((topic, kept))
        if not changed:
            return body
        self.altered += 1
        fields = [getattr(response, name) for name in response.SCHEMA.names]
        fields[response.SCHEMA.names.index("topics")] = topics
        return bytes(response_type(*fields).encode())


def _deleted_before(start: int, hide: Hide | None) -> Hide:
    """``hide``, and also the batches wholly before offset ``start``."""
    return lambda base, last, batch: last < start or (hide is not None and hide(base, last, batch))


class ProxiedTansu(Tansu):
    """A tansu broker whose clients all go through a :class:`HidingProxy`: it
    listens on its own port and advertises the proxy's."""

    def __init__(self) -> None:
        super().__init__()
        self.proxy_port = free_port()

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.proxy_port}"

    def command(self, listener: str) -> list[str]:
        command = super().command(listener)
        command[command.index("--advertised-listener-url") + 1] = (
            f"tcp://127.0.0.1:{self.proxy_port}"
        )
        return command
