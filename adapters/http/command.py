"""The ``serve`` command's arguments and entry point (DESIGN §11).

Kept apart from :mod:`.server` so that building the CLI parser does not
import aiohttp and prometheus-client for every other command.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from typing import TYPE_CHECKING, Any, TextIO

from quotaledger.events.ledger import LedgerError

from ..kubernetes.options import ClusterOptions, check_arguments, on_cluster
from ..kubernetes.options import add_arguments as add_cluster_arguments
from .options import ServeError, ServeOptions

if TYPE_CHECKING:
    from .server import Server


def read_token(token_file: str | None) -> bytes | None:
    """The bearer token: ``--token-file`` (stripped), else ``QUOTALEDGER_TOKEN``."""
    if token_file is not None:
        try:
            with open(token_file, "rb") as handle:
                token = handle.read().strip()
        except OSError as exc:
            raise ServeError(f"--token-file {token_file}: {exc.strerror}") from None
        if not token:
            raise ServeError(f"--token-file {token_file} is empty")
        return token
    env = os.environ.get("QUOTALEDGER_TOKEN", "").strip()
    return env.encode() if env else None


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6); port 0 picks a free one."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise ServeError(f"--listen {text!r}: expected HOST:PORT, e.g. 127.0.0.1:8080")
    return host.strip("[]") or "127.0.0.1", int(port)


def base_url(server: Server) -> str:
    host = server.options.host
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{server.port}"


def print_urls(server: Server, out: TextIO | None = None) -> None:
    """The URLs a person opens, on stdout (the first line is machine-readable)."""
    out = out or sys.stdout
    base = base_url(server)
    print(f"quotaledger serving {base}/", file=out)
    print(f"  page     {base}/", file=out)
    print(f"  API      {base}/v1/state  {base}/v1/tree  {base}/v1/decisions", file=out)
    print(f"  stream   {base}/v1/stream", file=out)
    print(f"  metrics  {base}/metrics", file=out)
    print(f"  writes   {writes_status(server)}", file=out, flush=True)


def writes_status(server: Server) -> str:
    """Whether ``POST /v1/events`` accepts writes, said at start (DESIGN §11: never
    open by default, so a server without a token refuses every write)."""
    if server.options.read_only:
        return "disabled: --read-only (POST /v1/events answers 403)"
    if server.options.token is None:
        return (
            "disabled: no token configured (set QUOTALEDGER_TOKEN or --token-file;"
            " POST /v1/events answers 403)"
        )
    return f"POST {base_url(server)}/v1/events with Authorization: Bearer <token>"


def run_server(coroutine: Any, listen: str) -> None:
    """``asyncio.run`` with the TaskGroup's errors unwrapped for the CLI."""
    try:
        asyncio.run(coroutine)
    except* LedgerError as group:
        raise group.exceptions[0] from None
    except* OSError as group:
        raise ServeError(f"cannot listen on {listen}: {group.exceptions[0]}") from None


SERVE_EPILOG = """\
examples:
  quotaledger serve ledger.db                                  # http://127.0.0.1:8080/
  QUOTALEDGER_TOKEN=s3cret quotaledger serve ledger.db --listen 0.0.0.0:8080
  quotaledger serve ledger.db --token-file /run/secrets/token --executor log
  quotaledger serve ledger.db --read-only --listen 127.0.0.1:9090   # a read replica
  quotaledger serve kafka://kafka:9092/quotaledger --in-cluster --executor log
      # one replica of several: the Lease holder runs engine + watcher, all serve reads
  curl -H "Authorization: Bearer s3cret" --data-binary @events.jsonl \\
       http://127.0.0.1:8080/v1/events
  curl http://127.0.0.1:8080/v1/quotas/team-a
  curl -N http://127.0.0.1:8080/v1/stream?kinds=decisions
"""


def add_serve_parser(commands: Any) -> None:
    """``serve`` among the CLI's subcommands (``adapters/cli.py``)."""
    parser = commands.add_parser(
        "serve",
        help="engine + HTTP API, metrics and a web page over a ledger",
        description="Follow LEDGER, run the engine (not with --read-only) and serve the HTTP"
        " API of DESIGN §11: POST /v1/events (bearer token), GET /v1/state, /v1/quotas/NAME,"
        " /v1/tree, /v1/decisions, /v1/explain/pod/UID, POST /v1/admission, POST /v1/whatif,"
        " GET /v1/stream (server-sent events), /healthz, /readyz, /metrics, and the page at /."
        " Writes need the token of --token-file or QUOTALEDGER_TOKEN; without one they are"
        " refused (403). SIGTERM/SIGINT drain and exit within 2 s.",
        epilog=SERVE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "ledger",
        metavar="LEDGER",
        help="SQLite ledger file, sqlite:///PATH or kafka://HOST:PORT/TOPIC",
    )
    parser.add_argument(
        "--listen", default="127.0.0.1:8080", metavar="HOST:PORT", help="default 127.0.0.1:8080"
    )
    parser.add_argument("--token-file", metavar="F", help="file holding the bearer token")
    parser.add_argument(
        "--executor",
        choices=["simulate", "log", "kubernetes"],
        default="simulate",
        help="how evictions are carried out (default: simulate; kubernetes: the Eviction"
        " API, with --kubeconfig or --in-cluster)",
    )
    parser.add_argument(
        "--read-only",
        action="store_true",
        help="open the ledger read-only (a read-only medium or another user's file is fine),"
        " follow it and serve reads and metrics: no engine, no writes",
    )
    parser.add_argument("--instance", default=f"serve-{os.getpid()}", help="this engine's name")
    parser.add_argument(
        "--snapshots", metavar="PATH", help="local snapshot file of a Kafka ledger (DESIGN §10)"
    )
    add_cluster_arguments(parser)
    parser.set_defaults(handler=cmd_serve)


def serve_options(args: argparse.Namespace) -> ServeOptions:
    """The :class:`ServeOptions` of a parsed ``serve`` command line whose Kubernetes
    options :func:`check_arguments` accepted."""
    host, port = parse_listen(args.listen)
    return ServeOptions(
        host=host,
        port=port,
        token=read_token(args.token_file),
        executor=args.executor,
        read_only=args.read_only,
        instance=args.instance,
        cluster=ClusterOptions.from_args(args) if on_cluster(args) else None,
    )


def cmd_serve(args: argparse.Namespace) -> int:
    from .server import serve

    problem = check_arguments(args)
    if problem is not None:
        raise ServeError(problem)
    if args.read_only and on_cluster(args):
        raise ServeError(
            "--read-only serves reads without the engine; drop --kubeconfig/--in-cluster"
            " (every replica on a cluster serves reads)"
        )
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("aiokafka").setLevel(logging.WARNING)
    options = serve_options(args)
    run_server(
        serve(args.ledger, options, announce=print_urls, snapshots=args.snapshots), args.listen
    )
    return 0
