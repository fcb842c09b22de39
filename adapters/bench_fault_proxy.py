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

#: Bytes read per chunk.
CHUNK = 65536
#: A cut waits this long for the server to send something it can cut in half.
CUT_WAIT_S = 0.5


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
    registry: dict[int, str] = field(default_factory=dict)
    rng: random.Random = field(default_factory=random.Random)
    port: int = 0
    requests: list[RequestSeen] = field(default_factory=list)
    upstream_ports: set[int] = field(default_factory=set)
    connections_made: int = 0
    _server: asyncio.Server | None = None
    _connections: set[_Connection] = field(default_factory=set)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _delay_s: tuple[float, float] = (0.0, 0.0)
    _delay_until: float = 0.0
    _flowing: asyncio.Event = field(default_factory=asyncio.Event)
    _stall_task: asyncio.Task[None] | None = None

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

    def heal(self) -> None:
        """End every fault now."""
        self._delay_until = 0.0
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
            data = await reader.read(CHUNK)
            if not data:
                # an orderly end on one side ends the other (no half-open links)
                conn.abort()
                return
            if to_server and self.http:
                self._note_requests(data)
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
