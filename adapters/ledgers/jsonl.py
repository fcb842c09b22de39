"""JSONL event files: one event per line, the same JSON as a Kafka message value (DESIGN §3).

Line n becomes offset n (offset 0 is ``LedgerOpened``); a line's ``at`` becomes
its ts, a line without ``at`` takes the previous line's ts (the first: the
epoch), so a file replays the same on every machine. Blank lines are skipped
and take no offset.

A stream keeps going (DESIGN §4, §9): a line that does not decode, or is out of
bounds, becomes a ``FactRejected`` record at its own offset, keeping the raw
text, and the lines after it are read as usual. ``strict`` stops at the first
such line instead, naming ``FILE:LINE`` and the field (DECISIONS 31).

What is not a JSONL file at all is refused whole, before anything is read or
written (DECISIONS 32): a missing path, a directory, an unreadable file, or a
binary file (a NUL byte in its first 8 KiB, as git and grep decide). A UTF-8
byte order mark at the start is skipped. ``-`` is standard input.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import msgspec

from quotaledger.events.codec import EventError, decode_event, encode_event, peek_kind
from quotaledger.events.ledger import Record
from quotaledger.events.model import FactRejected, LedgerOpened
from quotaledger.events.times import epoch_ms

#: How much of the start of a file decides whether it is text (git's 8000, rounded).
SNIFF_BYTES = 8192
BOM = b"\xef\xbb\xbf"
#: The name that means standard input.
STDIN = "-"
#: File names a command reads as JSONL rather than as a SQLite ledger.
JSONL_SUFFIXES = (".jsonl", ".ndjson", ".json")

__all__ = [
    "JSONL_SUFFIXES",
    "STDIN",
    "JsonlError",
    "JsonlInput",
    "Line",
    "epoch_ms",
    "is_jsonl_path",
    "ledger_id_for",
    "open_jsonl",
    "read_lines",
    "records",
    "ts_of",
]


class JsonlError(ValueError):
    """A line that is not a valid event, in strict mode, or a file that is not JSONL."""

    def __init__(self, path: str, line: int, reason: str) -> None:
        super().__init__(f"{path}:{line}: {reason}" if line else f"{path}: {reason}")
        self.path = path
        self.line = line
        self.reason = reason


@dataclass(frozen=True, slots=True)
class Line:
    """One non-blank line: its physical number, ts and record payload (for a bad
    line, the ``FactRejected`` that replaces it, also kept as ``rejected``)."""

    number: int
    ts: int
    payload: bytes
    rejected: FactRejected | None = None

    def payload_at(self, offset: int) -> bytes:
        """The payload for a record at ``offset``: a FactRejected names its own
        record's offset (§8 rule 5), which only the appender knows when records
        are interleaved (``simulate`` appends decisions between the lines)."""
        if self.rejected is None or self.rejected.offset == offset:
            return self.payload
        return encode_event(msgspec.structs.replace(self.rejected, offset=offset))


def is_jsonl_path(path: Path) -> bool:
    """True when ``path`` names a JSONL file (by its suffix) or standard input (``-``)."""
    return str(path) == STDIN or path.suffix.lower() in JSONL_SUFFIXES


def ts_of(event: object, previous: int) -> int:
    """The ms timestamp of an event's ``at``, or ``previous`` when absent."""
    at = getattr(event, "at", None)
    if at is None:
        return previous
    return epoch_ms(at)


class JsonlInput:
    """An opened JSONL source: a file or standard input, checked to be text.

    Opening reads the first :data:`SNIFF_BYTES` (so a bad file fails before a
    command creates anything); :meth:`physical_lines` then yields every line
    once, the head included. Standard input is read once; :meth:`ledger_id`
    of stdin needs the whole content, so :func:`open_jsonl` buffers it when
    asked (``buffer_stdin``).
    """

    def __init__(self, name: str, handle: BinaryIO, head: bytes) -> None:
        self.name = name
        self._handle = handle
        self._head = head
        self._used = False

    @property
    def label(self) -> str:
        """The name in messages: the path, or ``<stdin>``."""
        return "<stdin>" if self.name == STDIN else self.name

    def physical_lines(self) -> Iterator[bytes]:
        """Every line of the source, with its newline, the BOM removed."""
        if self._used:
            raise RuntimeError(f"{self.name} was read already")
        self._used = True
        head = self._head.removeprefix(BOM)
        parts = head.split(b"\n")
        tail = parts.pop()  # what follows the head's last newline (maybe b"")
        for part in parts:
            yield part + b"\n"
        for line in self._handle:
            yield tail + line
            tail = b""
        if tail:
            yield tail

    def ledger_id(self) -> str:
        """A deterministic ledger id for the content: its hash (a file is read
        again; stdin must have been buffered)."""
        if self.name == STDIN:
            if not isinstance(self._handle, io.BytesIO):
                raise RuntimeError("stdin was not buffered")
            return "jsonl-" + hashlib.sha256(self._head + self._handle.getvalue()).hexdigest()[:16]
        return ledger_id_for(Path(self.name))

    def close(self) -> None:
        if self.name != STDIN:
            self._handle.close()

    def __enter__(self) -> JsonlInput:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def open_jsonl(name: str, *, buffer_stdin: bool = True) -> JsonlInput:
    """Open a JSONL file (or ``-``, standard input) and check it is text.

    Raises :class:`JsonlError` for a missing path, a directory, an unreadable
    file or a binary one (a NUL byte in the first 8 KiB), naming the file.
    """
    if name == STDIN:
        handle: BinaryIO = sys.stdin.buffer
        head = handle.read(SNIFF_BYTES)
        if buffer_stdin:
            handle = io.BytesIO(handle.read())
    else:
        path = Path(name)
        if path.is_dir():
            raise JsonlError(name, 0, "is a directory, not a JSONL file")
        try:
            handle = path.open("rb")
        except FileNotFoundError:
            raise JsonlError(name, 0, "no such file") from None
        except OSError as exc:
            raise JsonlError(name, 0, f"cannot read: {exc.strerror or exc}") from None
        try:
            head = handle.read(SNIFF_BYTES)
        except OSError as exc:
            handle.close()
            raise JsonlError(name, 0, f"cannot read: {exc.strerror or exc}") from None
    nul = head.find(b"\0")
    if nul >= 0:
        if name != STDIN:
            handle.close()
        line = head.count(b"\n", 0, nul) + 1
        raise JsonlError(
            "<stdin>" if name == STDIN else name,
            0,
            f"not a text file (a NUL byte at byte {nul}, line {line}); expected JSONL,"
            " one JSON event per line",
        )
    return JsonlInput(name, handle, head)


def ledger_id_for(path: Path) -> str:
    """A deterministic ledger id for a file: its content hash."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return "jsonl-" + digest.hexdigest()[:16]


def _opened(source: JsonlInput | Path) -> JsonlInput:
    return source if isinstance(source, JsonlInput) else open_jsonl(str(source))


def read_lines(
    source: JsonlInput | Path,
    *,
    strict: bool = False,
    first_offset: int = 1,
    from_line: int = 1,
    export: bool = False,
    skip_invalid: bool | None = None,
) -> Iterator[Line]:
    """Validated lines with their ts.

    A bad line becomes a ``FactRejected`` carrying the raw text, the reason
    and the offset its record will have (``first_offset``: the offset of the
    first line's record); its ts is the previous line's. ``strict`` raises
    :class:`JsonlError` at the first bad line instead. Physical lines before
    ``from_line`` are skipped (a resumed ``ingest``); numbering stays physical.
    With ``export``, a first line that is a ``LedgerOpened`` (a ledger's export)
    is offset ``first_offset - 1``, and every line after it one less.
    ``skip_invalid`` is the old spelling (``skip_invalid=False`` is ``strict``).
    """
    if skip_invalid is not None:
        strict = not skip_invalid
    source = _opened(source)
    ts = 0
    number = 0
    for physical, raw in enumerate(source.physical_lines(), start=1):
        if physical < from_line:
            continue
        text = raw.strip()
        if not text:
            continue
        number += 1
        if export and number == 1 and peek_kind(text) == "LedgerOpened":
            first_offset -= 1
        try:
            event = decode_event(text)
        except EventError as exc:
            if strict:
                raise JsonlError(source.label, physical, exc.reason) from None
            rejected = FactRejected(
                offset=first_offset + number - 1,
                reason=f"line {physical}: {exc.reason}",
                rejected_kind=exc.kind,
                raw=text.decode("utf-8", "replace"),
            )
            yield Line(physical, ts, encode_event(rejected), rejected)
            continue
        new_ts = ts_of(event, ts)
        ts = max(ts, new_ts)
        yield Line(physical, new_ts, text)


def records(
    source: JsonlInput | Path,
    *,
    strict: bool = False,
    export: bool = False,
    skip_invalid: bool | None = None,
) -> Iterator[Record]:
    """The source as ledger records: ``LedgerOpened`` then one record per line.

    Line n is offset n after a ``LedgerOpened`` of the file's own ledger id at
    offset 0, ts 0 (``replay``). With ``export`` (``audit``, ``whatif``), a file
    whose first line is a ``LedgerOpened`` is a ledger's export: that line is
    offset 0 and line n offset n - 1, so the decisions' ``basis`` offsets keep
    their meaning. ts is clamped to be non-decreasing, as a ledger does (DESIGN §3).
    """
    if skip_invalid is not None:
        strict = not skip_invalid
    source = _opened(source)
    opened = LedgerOpened(ledger_id=source.ledger_id())
    head = Record(offset=0, ts=0, payload=msgspec.json.encode(opened))
    lines = read_lines(source, strict=strict, export=export)
    if export:
        first = next(lines, None)
        if first is not None and peek_kind(first.payload) == "LedgerOpened":
            head = Record(offset=0, ts=first.ts, payload=first.payload)
        elif first is not None:
            lines = itertools.chain([first], lines)
    yield head
    last = head.ts
    for offset, line in enumerate(lines, start=1):
        last = max(last, line.ts)
        yield Record(offset=offset, ts=last, payload=line.payload)
