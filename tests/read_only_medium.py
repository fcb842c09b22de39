"""A directory made a read-only medium for one process: as root (chmod does not stop root)
a read-only bind mount over it in a private mount namespace (``unshare -m``), so nothing
outside the process sees it (DESIGN §9 read-only media)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

CLI = [sys.executable, "-m", "quotaledger.adapters.cli"]


def can_bind_read_only() -> bool:
    """True when this process may make read-only bind mounts in a private namespace."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "-m", "sh", "-c", "mount --bind -o ro /tmp /tmp && ! touch /tmp/.ql-probe"],
        capture_output=True,
    )
    return probe.returncode == 0


def _mount(directory: Path) -> str:
    quoted = shlex.quote(str(directory))
    return f"mount --bind -o ro {quoted} {quoted}"


def run_on_read_only_medium(
    directory: Path, commands: list[list[str]], scratch: Path
) -> list[tuple[int, str]]:
    """Run each ``quotaledger ARGV`` with ``directory`` read-only: (exit status, stderr)."""
    script = [_mount(directory)]
    for index, argv in enumerate(commands):
        line = shlex.join([*CLI, *argv])
        err, rc = scratch / f"ro-{index}.err", scratch / f"ro-{index}.rc"
        script.append(f"{line} > /dev/null 2> {shlex.quote(str(err))}; echo $? > {rc}")
    done = subprocess.run(
        ["unshare", "-m", "sh", "-c", script[0] + " && { " + "; ".join(script[1:]) + "; }"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return [
        (
            int((scratch / f"ro-{i}.rc").read_text()),
            (scratch / f"ro-{i}.err").read_text(),
        )
        for i in range(len(commands))
    ]


def spawn_on_read_only_medium(directory: Path, argv: list[str]) -> subprocess.Popen[str]:
    """``quotaledger ARGV`` running with ``directory`` read-only (stdout/stderr piped);
    signals sent to the process reach quotaledger (``exec``)."""
    line = shlex.join([*CLI, *argv])
    return subprocess.Popen(
        ["unshare", "-m", "sh", "-c", f"{_mount(directory)} && exec {line}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
