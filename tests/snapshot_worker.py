"""Helper process for ``test_snapshot_off_loop``: ``quotaledger run`` with slow snapshot writes.

    python tests/snapshot_worker.py LEDGER [quotaledger run options]

Runs the CLI's ``run`` (the simulate executor, SIGTERM handling and all) with
snapshot blobs stored in parts of 500 bytes; before each part (and before the
row that makes a snapshot visible) it prints ``part N`` on stderr and waits
20 ms, so a test can send SIGTERM while a snapshot is being written.
"""

from __future__ import annotations

import sys
import threading
import time

from quotaledger.adapters.cli import main
from quotaledger.adapters.ledgers.sqlite import snapshots
from quotaledger.adapters.ledgers.sqlite.snapshots import SnapshotRows

snapshots.SNAPSHOT_PART_BYTES = 500
_real = SnapshotRows.before_part
_count = 0


def _before_part(self: SnapshotRows, cancel: threading.Event) -> None:
    global _count
    _count += 1
    print(f"part {_count}", file=sys.stderr, flush=True)
    time.sleep(0.02)
    _real(self, cancel)


SnapshotRows.before_part = _before_part  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(main(["run", *sys.argv[1:], "--instance", "worker"]))
