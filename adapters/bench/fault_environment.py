"""What the trials of one ``quotaledger bench faults`` run share (DESIGN §10; DECISIONS 224,
226): a work directory and, on Kafka, a moto S3 server and two tansu brokers, each behind the
fault proxy it advertises, one on ``s3://`` storage and one in memory. A broker restarts
(SIGKILL or SIGTERM) or hides each fetch's first record batch for a while on a trial's
request.
"""

from __future__ import annotations

import asyncio
import random
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .fault_cluster import now_ms
from .fault_plan import BACKENDS, Options, TrialResult
from .fault_proxy import FaultProxy


@dataclass(eq=False)
class Broker:
    """A tansu broker and the fault proxy it advertises (every client goes through it)."""

    storage: str
    tansu: Any
    proxy: FaultProxy
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    reorder_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    restarts: list[tuple[int, int]] = field(default_factory=list)  # (down ms, up ms)

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.proxy.port}"

    async def restart(self, rng: random.Random) -> str:
        """SIGKILL or SIGTERM, a pause, then the same broker on the same storage."""
        async with self.lock:
            how = rng.choice(["SIGKILL", "SIGTERM"])
            down_s = rng.uniform(0.1, 1.0)
            down = now_ms()
            await asyncio.to_thread(self.tansu.kill if how == "SIGKILL" else self.tansu.stop)
            await asyncio.sleep(down_s)
            await asyncio.to_thread(self.tansu.start)
            self.restarts.append((down, now_ms()))
            return f"broker {how}, down {down_s:.2f} s"

    async def reorder(self, rng: random.Random, patience_s: float, result: TrialResult) -> str:
        """Every fetch's first batch hidden for a while (a later batch readable first,
        DECISIONS 200), then a clear spell. One window at a time on this broker, whichever
        trial asks (trials run side by side share it): a batch is never held back longer
        than 40 % of the readers' patience, which a reader must wait out, never take for
        a hole (DECISIONS 224, 226)."""
        async with self.reorder_lock:
            for_s = rng.uniform(0.5, 0.4 * patience_s)
            before = self.proxy.batches_hidden
            self.proxy.hide_first_batch(for_s)
            await asyncio.sleep(for_s)
            hidden = self.proxy.batches_hidden - before
            result.stats["fetch responses with their first batch hidden"] += hidden
            await asyncio.sleep(0.6 * patience_s)  # readable again, before any next window
            return f"broker link: each fetch's first batch hidden for {for_s:.2f} s ({hidden})"

    async def ensure_up(self) -> None:
        async with self.lock:
            if self.tansu.proc is None or self.tansu.proc.poll() is not None:
                await asyncio.to_thread(self.tansu.start)


class Environment:
    """What trials share: a work directory; on Kafka a moto server and two tansu brokers
    behind their fault proxies, one on ``s3://`` storage (a restart keeps its log: the
    trials that restart a broker use it, and some others) and one in memory (much faster
    to read: the other trials)."""

    def __init__(self, backend: str, options: Options) -> None:
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, not {backend!r}")
        self.backend = backend
        self.options = options
        self.dir = Path(tempfile.mkdtemp(prefix=f"bench-faults-{backend}-"))
        self.moto: Any = None
        self.brokers: dict[str, Broker] = {}

    async def __aenter__(self) -> Environment:
        if self.backend == "kafka":
            from .tansu import Moto, Tansu, free_port

            self.moto = await asyncio.to_thread(lambda: Moto().start())
            for storage, env in (("s3", self.moto.tansu_env()), ("memory", None)):
                port = free_port()
                tansu = Tansu(storage=f"{storage}://tansu/", env=env, advertise=port)
                await asyncio.to_thread(tansu.start)
                proxy = await FaultProxy("127.0.0.1", tansu.port, name="broker", kafka=True).start(
                    port
                )
                self.brokers[storage] = Broker(storage, tansu, proxy)
        return self

    async def __aexit__(self, *exc: object) -> None:
        for broker in self.brokers.values():
            await broker.proxy.close()
            await asyncio.to_thread(broker.tansu.close)
        if self.moto is not None:
            await asyncio.to_thread(self.moto.stop)
        shutil.rmtree(self.dir, ignore_errors=True)
