"""A TCP fault proxy for ``quotaledger bench faults`` (DESIGN §3, §6, §12: the links an engine
depends on, the broker's and the API server's).

One :class:`FaultProxy` listens on a 127.0.0.1 port and forwards every connection to one
upstream address, byte for byte, until told to misbehave:

* :meth:`FaultProxy.delay` holds every chunk, in both directions, for a while before it is
  forwarded (order kept), for a given time;
* :meth:`FaultProxy.stall` forwards nothing, in either direction, for a given time; then what
  was held flows again;
* :meth:`FaultProxy.cut` aborts the connections open now, each in the middle of the next
  chunk the server sends (the client receives part of a response, then a reset), or after a
  short wait when the server sends nothing;
* :meth:`FaultProxy.hide_first_batch` (a Kafka link, ``kafka=True``): for a given time,
  every Fetch response loses its first record batch, as a broker that makes a later batch
  readable before an earlier one does (DESIGN §10; DECISIONS 200): a reader asking from
  offset 50 is handed the batch at 54 while 50..53 are not readable yet; a response left
  with no batch is held a moment, as a broker with nothing readable would hold it;
* :meth:`FaultProxy.heal` ends every fault at once.

What it records, for checks that must not believe the processes it serves: which upstream
connection (its local port, as the server sees it) belongs to which proxy
(:attr:`FaultProxy.upstream_ports`), and, on an HTTP link, the wall-clock time each request
line left the client (:attr:`FaultProxy.requests`) - when the process behind the proxy sent
it, not when the server got it.

Nothing here is the engine: it is tooling for the fault harness (:mod:`.bench_faults`).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from dataclasses import dataclass, field
from typing import Any

#: Bytes read per chunk.
CHUNK = 65536
#: A cut waits this long for the server to send something it can cut in half.
CUT_WAIT_S = 0.5
#: Kafka's Fetch API key, and the newest version whose response is not "flexible" (the
#: versions aiokafka's protocol classes decode, the only ones this proxy rewrites)
FETCH_API_KEY = 1
FETCH_MAX_VERSION = 11
#: a Fetch response left with no batch is held this long (a broker's wait for records)
EMPTY_FETCH_HOLD_S = 0.05


@dataclass(frozen=True, slots=True)
class RequestSeen:
    """An HTTP request line as it left the client (wall-clock ms), on one proxy."""

    at_ms: int
    method: str
    path: str


@dataclass(eq=False)
class _Connection:
    client: asyncio.StreamWriter
    upstream: asyncio.StreamWriter | None = None
    cut_armed: bool = False
    closed: bool = False
    #: Kafka requests in flight on this connection: correlation id -> (api key, version)
    kafka_requests: dict[int, tuple[int, int]] = field(default_factory=dict)

    def abort(self) -> None:
        """Reset both sides at once (no orderly close: the peer sees a broken link)."""
        if self.closed:
            return
        self.closed = True
        for writer in (self.client, self.upstream):
            if writer is not None:
                writer.transport.abort()


@dataclass(eq=False)
class FaultProxy:
    """See the module docstring. ``registry`` (shared by several proxies) maps the local port
    of every upstream connection to ``name``."""

    upstream_host: str
    upstream_port: int
    name: str = "proxy"
    http: bool = False
    kafka: bool = False
    registry: dict[int, str] = field(default_factory=dict)
    rng: random.Random = field(default_factory=random.Random)
    port: int = 0
    requests: list[RequestSeen] = field(default_factory=list)
    upstream_ports: set[int] = field(default_factory=set)
    connections_made: int = 0
    batches_hidden: int = 0
    _server: asyncio.Server | None = None
    _connections: set[_Connection] = field(default_factory=set)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _delay_s: tuple[float, float] = (0.0, 0.0)
    _delay_until: float = 0.0
    _flowing: asyncio.Event = field(default_factory=asyncio.Event)
    _stall_task: asyncio.Task[None] | None = None
    _hide_until: float = 0.0

    async def start(self, port: int = 0) -> FaultProxy:
        """Listen on 127.0.0.1 (``port`` 0: a free one); returns self."""
        self._flowing.set()
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", port)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def close(self) -> None:
        """Stop listening and reset every connection."""
        self.heal()
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
            self._server = None
        for conn in list(self._connections):
            conn.abort()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    # ------------------------------------------------------------ faults

    def delay(self, low_s: float, high_s: float, for_s: float) -> None:
        """Hold each chunk ``low_s``..``high_s`` (uniform) before forwarding it, for ``for_s``."""
        self._delay_s = (low_s, high_s)
        self._delay_until = time.monotonic() + for_s

    def stall(self, for_s: float) -> None:
        """Forward nothing for ``for_s`` seconds."""
        if self._stall_task is not None:
            self._stall_task.cancel()
        self._flowing.clear()
        self._stall_task = asyncio.get_running_loop().create_task(self._unstall(for_s))

    async def _unstall(self, after_s: float) -> None:
        await asyncio.sleep(after_s)
        self._flowing.set()

    def cut(self, share: float = 1.0) -> int:
        """Cut ``share`` of the open connections mid-response; returns how many."""
        chosen = [c for c in self._connections if not c.closed and self.rng.random() < share]
        for conn in chosen:
            conn.cut_armed = True
            task = asyncio.get_running_loop().create_task(self._cut_later(conn))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return len(chosen)

    async def _cut_later(self, conn: _Connection) -> None:
        await asyncio.sleep(CUT_WAIT_S)
        conn.abort()

    def hide_first_batch(self, for_s: float) -> None:
        """For ``for_s`` seconds every Fetch response loses its first record batch (a
        Kafka link only)."""
        if not self.kafka:
            raise ValueError(f"{self.name}: not a Kafka link")
        self._hide_until = time.monotonic() + for_s

    def heal(self) -> None:
        """End every fault now."""
        self._delay_until = 0.0
        self._hide_until = 0.0
        if self._stall_task is not None:
            self._stall_task.cancel()
            self._stall_task = None
        self._flowing.set()

    @property
    def open_connections(self) -> int:
        return sum(1 for c in self._connections if not c.closed)

    # ------------------------------------------------------------ forwarding

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = _Connection(writer)
        self._connections.add(conn)
        self.connections_made += 1
        try:
            try:
                up_reader, up_writer = await asyncio.open_connection(
                    self.upstream_host, self.upstream_port
                )
            except OSError:
                conn.abort()  # the upstream is down: so is the link
                return
            conn.upstream = up_writer
            local = up_writer.get_extra_info("sockname")
            if local is not None:
                self.registry[int(local[1])] = self.name
                self.upstream_ports.add(int(local[1]))
            async with asyncio.TaskGroup() as group:
                group.create_task(self._pump(conn, reader, up_writer, to_server=True))
                group.create_task(self._pump(conn, up_reader, writer, to_server=False))
        except* (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            conn.abort()
            self._connections.discard(conn)

    async def _pump(
        self,
        conn: _Connection,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        to_server: bool,
    ) -> None:
        """Copy one direction until EOF or a fault ends the connection."""
        while not conn.closed:
            data = await (self._frame(reader) if self.kafka else reader.read(CHUNK))
            if not data:
                # an orderly end on one side ends the other (no half-open links)
                conn.abort()
                return
            if to_server and self.http:
                self._note_requests(data)
            if self.kafka:
                data = await self._kafka_frame(conn, data, to_server=to_server)
            if self._delay_until > time.monotonic():
                await asyncio.sleep(self.rng.uniform(*self._delay_s))
            await self._flowing.wait()
            if conn.closed:
                return
            if conn.cut_armed and not to_server:
                keep = self.rng.randrange(0, len(data)) if len(data) > 1 else 0
                writer.write(data[:keep])
                with contextlib.suppress(OSError):
                    await writer.drain()
                conn.abort()
                return
            writer.write(data)
            await writer.drain()

    @staticmethod
    async def _frame(reader: asyncio.StreamReader) -> bytes:
        """One Kafka frame (a 4-byte size, then the request or response), b"" at EOF."""
        try:
            head = await reader.readexactly(4)
        except asyncio.IncompleteReadError:
            return b""
        return head + await reader.readexactly(int.from_bytes(head, "big"))

    async def _kafka_frame(self, conn: _Connection, frame: bytes, *, to_server: bool) -> bytes:
        """Note a request's API; a Fetch response while hiding: without its first batch."""
        if to_server:
            if len(frame) >= 12:
                key = int.from_bytes(frame[4:6], "big")
                version = int.from_bytes(frame[6:8], "big")
                conn.kafka_requests[int.from_bytes(frame[8:12], "big")] = (key, version)
            return frame
        if len(frame) < 8:
            return frame
        api = conn.kafka_requests.pop(int.from_bytes(frame[4:8], "big"), None)
        if (
            api is None
            or api[0] != FETCH_API_KEY
            or api[1] > FETCH_MAX_VERSION
            or self._hide_until <= time.monotonic()
        ):
            return frame
        body, left = without_first_batch(api[1], frame[8:])
        if body is None:
            return frame
        self.batches_hidden += 1
        if not left:
            await asyncio.sleep(EMPTY_FETCH_HOLD_S)
        return (4 + len(body)).to_bytes(4, "big") + frame[4:8] + body

    def _note_requests(self, data: bytes) -> None:
        """Record the request line of each HTTP request starting in ``data``."""
        at_ms = time.time_ns() // 1_000_000
        for method in (b"POST ", b"PUT ", b"GET ", b"DELETE ", b"PATCH "):
            start = 0
            while True:
                found = data.find(method, start)
                if found < 0:
                    break
                if found == 0 or data[found - 2 : found] == b"\r\n":
                    end = data.find(b" ", found + len(method))
                    path = data[found + len(method) : end if end > 0 else len(data)]
                    self.requests.append(
                        RequestSeen(at_ms, method.decode().strip(), path.decode(errors="replace"))
                    )
                start = found + len(method)


def without_first_batch(version: int, body: bytes) -> tuple[bytes | None, int]:
    """A Fetch response body (after the correlation id) whose partitions lost their first
    complete record batch, and how many bytes of batches it still holds; (None, 0) when
    no partition held a complete batch."""
    from aiokafka.protocol import fetch  # type: ignore[import-untyped]

    response: Any = getattr(fetch, f"FetchResponse_v{version}").decode(body)
    hidden = False
    left = 0
    topics = []
    for topic, partitions in response.topics:
        kept = []
        for partition in partitions:
            fields = list(partition)
            records = fields[-1] or b""
            if len(records) >= 12:
                end = 12 + int.from_bytes(records[8:12], "big", signed=True)
                if end <= len(records):
                    fields[-1] = records[end:]
                    hidden = True
            left += len(fields[-1] or b"")
            kept.append(tuple(fields))
        topics.append((topic, kept))
    if not hidden:
        return None, 0
    response.topics = topics
    return bytes(response.encode()), left
