"""Codecs: JSON, the wire and ledger form of events (snapshots: ``projections.snapshot``).

A ledger record's payload is the JSON of one event, exactly as it arrived for
facts (a producer's Kafka message value, a JSONL line) and as the engine wrote
it for decisions. Facts are canonicalised when decoded, never re-encoded, so
``4`` cpu cannot be read back as 4000 cpu.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Union, get_args

import msgspec

from .model import Event, InputRL, PodUpserted
from .quantity import canonical_list
from .times import bounded_time

_JSON_DECODER = msgspec.json.Decoder(Event)
_JSON_ENCODER = msgspec.json.Encoder()


class _WirePod(PodUpserted, tag="PodUpserted", gc=False):
    """``PodUpserted`` as first decoded on the fast path: ``requests`` kept as
    the exact bytes of its JSON value (a :class:`msgspec.Raw`), every other
    field decoded and validated as :class:`PodUpserted` does. Same fields, same
    layout: once ``requests`` is canonical the object becomes a plain
    ``PodUpserted`` (``__class__`` assignment)."""

    requests: msgspec.Raw = msgspec.Raw(b"{}")  # type: ignore[assignment]


_WIRE_KINDS = (*(kind for kind in get_args(Event) if kind is not PodUpserted), _WirePod)
_WIRE_DECODER: msgspec.json.Decoder[Any] = msgspec.json.Decoder(Union[_WIRE_KINDS])
#: Kinds whose amounts ``canonicalize`` puts in canonical units after decoding.
_CANONICALISED = frozenset(kind for kind in _WIRE_KINDS if hasattr(kind, "canonicalize"))
_REQUESTS_DECODER = msgspec.json.Decoder(InputRL)


@lru_cache(maxsize=65536)
def _canonical_requests(raw: bytes) -> dict[str, int]:
    """The canonical list of one exact ``requests`` JSON text (memoised: a
    workload repeats a few hundred). Raises on anything invalid; the caller
    then takes the full path, which reports the error (DECISIONS 120)."""
    return canonical_list("requests", _REQUESTS_DECODER.decode(raw))  # type: ignore[arg-type]


class _KindOnly(msgspec.Struct):
    """Reads only ``kind``; other fields are skipped unvalidated, so a payload
    refused for, say, an out-of-range number still reports its kind."""

    kind: Any = None


_KIND_ONLY = msgspec.json.Decoder(_KindOnly)


class EventError(ValueError):
    """Input that is not a valid event; the message names the offending field."""

    def __init__(self, reason: str, kind: str | None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.kind = kind


def peek_kind(payload: bytes | str) -> str | None:
    """The ``kind`` string of a JSON object, or None when there is none to read."""
    try:
        kind = _KIND_ONLY.decode(payload).kind
    except (msgspec.DecodeError, TypeError, ValueError):  # ValueError: invalid UTF-8
        return None
    return kind if isinstance(kind, str) else None


def decode_event(payload: bytes | str) -> Event:
    """Decode one event (DESIGN §4), or raise :class:`EventError` naming the field.

    Bounds (§9) are applied here, so a fact the projection cannot hold never
    reaches it: times within 1970 .. 9000 and made UTC when they carry no
    offset, delays ≤ ten years, amounts ≤ 2^62 (see ``times`` and ``quantity``).

    An ASCII payload first takes the fast path (DECISIONS 120): the
    pod's ``requests`` is canonicalised once per distinct JSON text. Whenever
    anything is off there (invalid input included) the full path decides, with
    its own error: the result is the full path's either way.
    """
    if payload.__class__ is bytes and payload.isascii():
        try:
            event: Any = _WIRE_DECODER.decode(payload)
            kind = event.__class__
            if kind is _WirePod:
                requests = _canonical_requests(bytes(event.requests))
            elif kind in _CANONICALISED:
                event.canonicalize()
        except (msgspec.DecodeError, ValueError, TypeError):  # ValidationError is a DecodeError
            pass
        else:
            at = event.at
            if at is None or (at.tzinfo is not None and 1970 < at.year < 9000):
                if kind is not _WirePod:
                    decoded: Event = event
                    return decoded
                created = event.created_at
                if created is None or (created.tzinfo is not None and 1970 < created.year < 9000):
                    event.requests = requests
                    event.__class__ = PodUpserted
                    return event  # type: ignore[no-any-return]
    return _decode_full(payload)


def _decode_full(payload: bytes | str) -> Event:
    """Decode, bound and canonicalise, raising :class:`EventError` naming the field."""
    try:
        if isinstance(payload, bytes) and not payload.isascii():
            # JSON text is UTF-8 (RFC 8259); msgspec checks the strings it keeps
            # but skips unknown fields unchecked.
            payload.decode("utf-8")
        event: Event = _JSON_DECODER.decode(payload)
        at = event.at
        if at is not None and (at.tzinfo is None or not 1970 < at.year < 9000):
            event.at = bounded_time("at", at)
        canonicalize = getattr(event, "canonicalize", None)
        if canonicalize is not None:
            canonicalize()
        return event
    except msgspec.ValidationError as exc:
        raise EventError(str(exc), peek_kind(payload)) from None
    except msgspec.DecodeError as exc:
        raise EventError(f"malformed JSON: {exc}", None) from None
    except UnicodeDecodeError as exc:
        reason = f"malformed JSON: invalid UTF-8 at byte {exc.start}"
        raise EventError(reason, peek_kind(payload)) from None
    except ValueError as exc:
        raise EventError(str(exc), peek_kind(payload)) from None


def encode_event(event: Event) -> bytes:
    """The JSON of an engine-written event (decisions, removals)."""
    return _JSON_ENCODER.encode(event)


def to_builtins(event: Event) -> dict[str, Any]:
    """The event as plain JSON-able data, ``kind`` included."""
    out = msgspec.to_builtins(event)
    assert isinstance(out, dict)
    return out
