"""What every ``quotaledger`` command shares (DESIGN §7, §9).

* Errors: :class:`UserError` is a user's mistake, printed as ``quotaledger:
  error: ...`` with exit status 2 and never a traceback.
* Shutdown (DESIGN §9): inside :func:`interruptible`, SIGTERM and SIGINT raise
  :class:`Interrupted` in whatever the main thread runs, so long work stops
  within milliseconds and every ``finally`` on the way out still runs.
* Progress (DESIGN §9): long work draws a bar on a terminal and logs a line
  every 10 s otherwise (:func:`progress_for`).
* Output: :func:`warn` and :func:`print_json`.
* Arguments: LEDGER and FILE.jsonl sources with ``--until``/``--strict``
  (:func:`add_source`, :func:`ledger_arg`, :func:`until_option`,
  :func:`check_end`), and types such as :func:`positive_int`.
* The collector settings of a long-lived process (:func:`tune_gc`), which the
  audit worker processes apply too.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TextIO, TypeAlias

import msgspec

from quotaledger.engine.fold_loop import Until, parse_until
from quotaledger.events.times import MAX_DELAY_S, rfc3339

from ..ledgers.jsonl import is_jsonl_path
from ..ledgers.url import is_kafka_url, parse_ledger_url

#: What ``add_subparsers`` returns: every command module's ``register`` adds its parsers to it.
Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


class UserError(Exception):
    """A mistake in what the user asked for; printed without a traceback."""


class Interrupted(KeyboardInterrupt):
    """SIGTERM or SIGINT arrived (DESIGN §9 shutdown). Raised from the signal
    handler in whatever the main thread runs, so a long fold stops within
    milliseconds. A KeyboardInterrupt, so asyncio re-raises it instead of
    logging it, and every ``finally`` on the way out runs: ledgers are closed,
    and SQLite keeps only whole transactions."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum
        self.detail = ""


def _raise_interrupted(signum: int, frame: object) -> None:
    raise Interrupted(signum)


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """SIGTERM and SIGINT raise :class:`Interrupted` while inside (main thread
    only; the previous handlers are restored on the way out)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    for signum in previous:
        signal.signal(signum, _raise_interrupted)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


PROGRESS_EVERY_ENV = "QUOTALEDGER_PROGRESS_EVERY_S"
#: DESIGN §9: long work logs its progress every 10 s when stderr is not a terminal.
PROGRESS_EVERY_S = 10.0


def progress_every_s() -> float:
    """The interval between logged progress lines: ``QUOTALEDGER_PROGRESS_EVERY_S``
    (seconds, > 0) or 10 s."""
    text = os.environ.get(PROGRESS_EVERY_ENV)
    if text is None or text.strip() == "":
        return PROGRESS_EVERY_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        raise UserError(f"{PROGRESS_EVERY_ENV}: {text!r} is not a positive number of seconds")
    return value


class Progress:
    """Progress of long work on stderr (DESIGN §9).

    ``mode`` "bar": a line redrawn in place at most twice a second (a
    terminal, or ``--progress``); "log": one timestamped line every
    ``every_s`` seconds (stderr is not a terminal: logs, CI, Kubernetes);
    "off": nothing (``--no-progress``). Work shorter than the interval shows
    nothing.
    """

    def __init__(
        self,
        label: str,
        total: int | None,
        stream: TextIO,
        mode: str,
        every_s: float = PROGRESS_EVERY_S,
    ) -> None:
        self.label, self.total, self.stream, self.mode = label, total, stream, mode
        self.every_s = 0.5 if mode == "bar" else every_s
        self.started = time.monotonic()
        self.shown_at = self.started
        self.drawn = False

    def __call__(self, done: int) -> None:
        if self.mode == "off":
            return
        now = time.monotonic()
        if now - self.shown_at < self.every_s:
            return
        self.shown_at = now
        rate = done / max(now - self.started, 1e-9)
        if self.mode == "log":
            of = f"/{self.total:,} ({100 * done / self.total:.1f}%)" if self.total else ""
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            self.stream.write(
                f"{stamp} quotaledger {self.label}: {done:,}{of} records,"
                f" {rate:,.0f} records/s, {now - self.started:.1f} s\n"
            )
        elif self.total:
            width = 30
            filled = min(width, int(width * done / self.total))
            bar = "#" * filled + "-" * (width - filled)
            self.stream.write(f"\r{self.label} [{bar}] {done:,}/{self.total:,} ({rate:,.0f}/s)")
        else:
            self.stream.write(f"\r{self.label} {done:,} records ({rate:,.0f}/s)")
        self.stream.flush()
        self.drawn = True

    def close(self) -> None:
        if self.drawn and self.mode == "bar":
            self.stream.write("\n")
            self.stream.flush()


def progress_for(label: str, total: int | None, args: argparse.Namespace | None) -> Progress:
    """A :class:`Progress` on stderr: ``--progress``/``--no-progress`` if given,
    else a bar on a terminal and logged lines otherwise."""
    choice = getattr(args, "progress", None)
    if choice is None:
        mode = "bar" if sys.stderr.isatty() else "log"
    else:
        mode = "bar" if choice else "off"
    return Progress(label, total, sys.stderr, mode, progress_every_s())


def progress_meter(label: str) -> Callable[[int], Progress]:
    """Progress of a pass over a known number of records, as :func:`progress_for`
    shows it (for :func:`quotaledger.adapters.ledgers.sources.with_record_source`)."""
    return lambda total: progress_for(label, total, None)


def writable_ledger(path: Path) -> Path:
    """A ledger a command will create or append to is a SQLite file: a JSONL
    name there (``ingest ledger.db events.jsonl``, arguments swapped) or ``-``
    is refused before anything is written (DECISIONS 37)."""
    if is_jsonl_path(path):
        raise UserError(
            f"{path}: a ledger is a SQLite file (e.g. ledger.db), not JSONL;"
            " did you swap the arguments?"
        )
    return path


def check_end(until: Until, state_offset: int, option: str = "--until") -> None:
    """An offset past the end of the ledger is an error naming the last offset
    (DECISIONS 36); a time past the end is the end."""
    if until.offset is not None and state_offset < until.offset:
        raise UserError(f"{option} {until.offset}: the ledger ends at offset {state_offset}")
    if until.ts is not None and state_offset < 0:
        # DECISIONS 266: no state before the first record (LedgerOpened), not offset -1.
        raise UserError(
            f"{option} {rfc3339(until.ts)}: before the ledger opened (its first record,"
            " offset 0, is later): no state then"
        )


def until_option(text: str | None, option: str = "--until") -> Until:
    """``--until``/``--at``: an offset or an RFC 3339 time; a bad one is a :class:`UserError`."""
    try:
        return parse_until(text, option)
    except ValueError as exc:
        raise UserError(str(exc)) from None


def warn(message: str) -> None:
    """One warning line on stderr (the command goes on)."""
    print(f"quotaledger: warning: {message}", file=sys.stderr, flush=True)


def ledger_arg(text: str) -> Path | str:
    """A LEDGER argument (DESIGN §10): a ``kafka://`` URL stays a URL, a path or
    ``sqlite:///PATH`` becomes the file's path."""
    if is_kafka_url(text):
        return text
    if text.lower().startswith("sqlite:"):
        return Path(parse_ledger_url(text).path)
    return Path(text)


def print_json(document: Any) -> None:
    """``document`` as indented JSON on stdout (``--json``)."""
    sys.stdout.buffer.write(msgspec.json.format(msgspec.json.encode(document), indent=2))
    sys.stdout.buffer.write(b"\n")
    sys.stdout.flush()


SNAPSHOTS_HELP = "local SQLite file holding a Kafka ledger's snapshots (keyed by ledger_id)"
LEDGER_HELP = "a SQLite ledger (PATH or sqlite:///PATH) or kafka://HOST:PORT[,...]/TOPIC"


STRICT_HELP = (
    "stop at the first bad line with FILE:LINE and the field, exit 2 (default: keep the bad"
    " line as a FactRejected record, listed in state.rejected, and go on)"
)


def add_strict(parser: argparse.ArgumentParser) -> None:
    """``--strict``, and ``--skip-invalid``: the old name of today's default, a hidden no-op."""
    parser.add_argument("--strict", action="store_true", help=STRICT_HELP)
    parser.add_argument("--skip-invalid", action="store_true", help=argparse.SUPPRESS)


def positive_int(text: str) -> int:
    """An argument type: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def positive_seconds(text: str) -> float:
    """An argument type: seconds, more than 0 and at most the longest delay (DESIGN §9 bounds)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not 0 < value <= MAX_DELAY_S:
        raise argparse.ArgumentTypeError(
            f"must be more than 0 and at most {MAX_DELAY_S}, got {text}"
        )
    return value


def add_source(parser: argparse.ArgumentParser) -> None:
    """The source of a fold (``replay``, ``tree``): LEDGER or FILE.jsonl, ``--snapshots``,
    ``--until``, ``--strict``, ``--no-snapshot`` and ``--progress``."""
    parser.add_argument("source", help=f"{LEDGER_HELP}, or FILE.jsonl of events (- reads stdin)")
    parser.add_argument("--snapshots", metavar="PATH", help=SNAPSHOTS_HELP)
    parser.add_argument(
        "--until",
        metavar="OFFSET|TIME",
        help="stop after this offset (inclusive; beyond the end is an error) or RFC 3339 time",
    )
    add_strict(parser)
    parser.add_argument(
        "--no-snapshot", action="store_true", help="fold from offset 0, ignoring snapshots"
    )
    parser.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress on stderr (default: when stderr is a terminal)",
    )


#: Young-generation size before CPython's collector runs (default 700). The
#: engine keeps 10^5-10^6 long-lived objects and creates little cyclic garbage
#: (refcounting frees the rest), so frequent young collections only re-scan
#: the same survivors: measured 12 % of the fold (docs/PERFORMANCE.md).
GC_THRESHOLDS = (50_000, 20, 20)


def tune_gc() -> None:
    """Process-wide collector settings for a long-lived engine (see GC_THRESHOLDS)."""
    gc.set_threshold(*GC_THRESHOLDS)
