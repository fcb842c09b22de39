"""``quotaledger`` with a bug planted, for showing that ``bench faults`` reports it.

Usage: ``python tests/planted_engine.py BUG quotaledger-arguments...``; the bug is planted
by monkeypatching this process only (nothing in the package knows about it), then the
command line runs as ``quotaledger`` would. ``bench faults --engine-command "python
tests/planted_engine.py BUG"`` runs every engine of the trials this way.

Bugs:

* ``no-lease-check``: an engine that forgets to check the Lease and its epoch before an
  eviction POST or an append: a leader paused past its Lease and resumed evicts and
  appends as a zombie;
* ``fill-at-once``: a Kafka reader that fills any gap at once with filler records, however
  soon the missing offsets would have become readable.
"""

from __future__ import annotations

import sys
from typing import Any


def plant(bug: str) -> None:
    if bug == "no-lease-check":
        from quotaledger.adapters.kubernetes import cluster, executor

        evict = executor.KubernetesExecutor.evict

        async def evict_unchecked(self: Any, eviction: Any, state: Any) -> Any:
            self.may_evict = executor.always
            return await evict(self, eviction, state)

        async def append_unchecked(self: Any, batch: Any) -> Any:
            return await self.inner.append(batch)

        executor.KubernetesExecutor.evict = evict_unchecked  # type: ignore[method-assign]
        executor.fence_evictions = lambda core, may_evict: None  # no last-moment check
        cluster.LeaseGatedLedger.append = append_unchecked  # type: ignore[method-assign]
    elif bug == "fill-at-once":
        from quotaledger.adapters.ledgers.kafka import ledger as kafka_ledger

        open_ledger = kafka_ledger.KafkaLedger.open.__func__  # type: ignore[attr-defined]

        async def open_filling(cls: Any, *args: Any, **kwargs: Any) -> Any:
            kwargs["gaps"] = "fill"
            kwargs["gap_patience_s"] = 0.0  # no wait for the offsets to become readable
            return await open_ledger(cls, *args, **kwargs)

        kafka_ledger.KafkaLedger.open = classmethod(open_filling)  # type: ignore[assignment]
    else:
        raise SystemExit(f"planted_engine: unknown bug {bug!r}")


if __name__ == "__main__":
    plant(sys.argv[1])
    from quotaledger.adapters.cli import main

    sys.exit(main(sys.argv[2:]))
