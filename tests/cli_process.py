"""The quotaledger command line run in a new process, as a user runs it."""

from __future__ import annotations

import subprocess
import sys


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    """``quotaledger ARGS...`` in a new interpreter; output captured as text."""
    return subprocess.run(
        [sys.executable, "-m", "quotaledger.adapters.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
