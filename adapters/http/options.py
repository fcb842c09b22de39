"""What one ``serve`` process is told (DESIGN §11), and the error for options it
cannot use.

Kept free of aiohttp and prometheus-client, so that the ``serve`` command
(:mod:`.command`) can build its options without importing the server; the
server (:mod:`.server`) raises :class:`ServeError` too, so it lives here, below
both of them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from quotaledger.events.ledger import LedgerError

from ..kubernetes.options import ClusterOptions


class ServeError(LedgerError):
    """A ``serve``/``demo`` argument that cannot be used (printed, exit 2)."""


@dataclass(slots=True)
class ServeOptions:
    host: str = "127.0.0.1"
    port: int = 8080
    token: bytes | None = None
    executor: str = "simulate"
    read_only: bool = False
    instance: str = "serve"
    snapshot_every: int = 50_000
    #: the engine's clock (ms); ``demo --speed`` runs it faster than the wall clock
    clock_ms: Callable[[], int] | None = None
    #: longest the reconciler sleeps without news (seconds)
    idle_poll_s: float = 0.5
    #: the parsed ``--kubeconfig``/``--in-cluster`` options (DESIGN §12): engine and
    #: watcher only while holding the Lease, reads on every replica
    cluster: ClusterOptions | None = None
