"""Ledger URLs: which backend a LEDGER argument names, and opening it (DESIGN §3, §10).

* a path, or ``sqlite:///PATH``: the SQLite ledger in that file;
* ``kafka://HOST:PORT[,HOST:PORT...]/TOPIC[?option=value&...]``: the Kafka
  ledger in that topic's only partition. The options are the TLS/SASL settings
  handed to aiokafka (:data:`KAFKA_OPTIONS`), ``gaps=stop|fill`` (what a
  reader does at a skip in the partition's offsets it cannot read, DECISIONS 78,
  200) and ``gap_patience_s=SECONDS`` (how long it waits for such offsets
  before it stops or fills, DECISIONS 200; default 60); any other
  parameter is refused with a clear error rather than silently ignored.

Every command that takes a LEDGER calls :func:`open_ledger`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from quotaledger.events.ledger import Ledger, LedgerError
from quotaledger.events.times import wall_clock_ms

__all__ = [
    "KAFKA_OPTIONS",
    "LedgerUrl",
    "LedgerUrlError",
    "is_kafka_url",
    "open_ledger",
    "parse_ledger_url",
]


class LedgerUrlError(LedgerError):
    """A LEDGER argument that names no ledger we can open."""


#: Query parameters of a ``kafka://`` URL: name -> allowed values (None: any).
#: ``ssl_cafile``/``ssl_certfile``/``ssl_keyfile``/``ssl_password`` build the
#: aiokafka ``ssl_context``; the others are aiokafka client arguments as named.
KAFKA_OPTIONS: dict[str, frozenset[str] | None] = {
    "security_protocol": frozenset({"PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"}),
    "sasl_mechanism": frozenset({"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "GSSAPI"}),
    "sasl_plain_username": None,
    "sasl_plain_password": None,
    "sasl_kerberos_service_name": None,
    "sasl_kerberos_domain_name": None,
    "ssl_cafile": None,
    "ssl_certfile": None,
    "ssl_keyfile": None,
    "ssl_password": None,
    "client_id": None,
}
_SSL_KEYS = ("ssl_cafile", "ssl_certfile", "ssl_keyfile", "ssl_password")


@dataclass(frozen=True, slots=True)
class LedgerUrl:
    """A parsed LEDGER: ``scheme`` is ``sqlite`` (``path``) or ``kafka``."""

    scheme: str
    path: str = ""
    bootstrap: tuple[str, ...] = ()
    topic: str = ""
    options: dict[str, str] = field(default_factory=dict)
    gaps: str = "stop"
    #: ``gap_patience_s`` when the URL gives it (else the ledger's default).
    gap_patience_s: float | None = None

    def client_options(self) -> dict[str, Any]:
        """Keyword arguments for aiokafka clients (TLS context built from the files)."""
        out: dict[str, Any] = {k: v for k, v in self.options.items() if k not in _SSL_KEYS}
        if any(key in self.options for key in _SSL_KEYS):
            from aiokafka.helpers import create_ssl_context  # type: ignore[import-untyped]

            try:
                out["ssl_context"] = create_ssl_context(
                    cafile=self.options.get("ssl_cafile"),
                    certfile=self.options.get("ssl_certfile"),
                    keyfile=self.options.get("ssl_keyfile"),
                    password=self.options.get("ssl_password"),
                )
            except (OSError, ValueError) as exc:
                raise LedgerUrlError(f"kafka TLS options: {exc}") from None
        return out

    def __str__(self) -> str:
        if self.scheme == "sqlite":
            return self.path
        return f"kafka://{','.join(self.bootstrap)}/{self.topic}"


def is_kafka_url(text: str) -> bool:
    """True when ``text`` names a Kafka ledger."""
    return text.lower().startswith("kafka://")


def parse_ledger_url(text: str) -> LedgerUrl:
    """Parse a LEDGER argument; :class:`LedgerUrlError` names what is wrong."""
    lowered = text.lower()
    if lowered.startswith("sqlite://"):
        rest = text[len("sqlite://") :]
        if not rest.startswith("/"):
            raise LedgerUrlError(f"{text}: a SQLite URL is sqlite:///PATH (three slashes)")
        path = unquote(rest)
        if path.startswith("//"):
            path = path[1:]
        return LedgerUrl(scheme="sqlite", path=path)
    if is_kafka_url(text):
        return _parse_kafka(text)
    scheme = re.match(r"([A-Za-z][A-Za-z0-9+.-]*)://", text)
    if scheme is not None:
        raise LedgerUrlError(
            f"{text}: unknown ledger scheme {scheme.group(1)!r} (use a path, sqlite:///PATH"
            " or kafka://HOST:PORT/TOPIC)"
        )
    return LedgerUrl(scheme="sqlite", path=text)


def _parse_kafka(text: str) -> LedgerUrl:
    parts = urlsplit(text)
    hosts = tuple(h for h in parts.netloc.split(",") if h)
    if not hosts:
        raise LedgerUrlError(f"{text}: no broker: use kafka://HOST:PORT[,HOST:PORT...]/TOPIC")
    for host in hosts:
        name, sep, port = host.rpartition(":")
        if not sep or not name or not port.isdigit() or not 0 < int(port) < 65536:
            raise LedgerUrlError(f"{text}: broker {host!r} is not HOST:PORT")
    topic = unquote(parts.path.lstrip("/"))
    if not topic or "/" in topic:
        raise LedgerUrlError(f"{text}: the path must be exactly one topic name: /TOPIC")
    if len(topic) > 200 or not all(c.isalnum() or c in "._-" for c in topic):
        raise LedgerUrlError(
            f"{text}: topic {topic!r}: Kafka topic names use letters, digits, '.', '_', '-'"
            " (at most 200, leaving room for the .evictions/.outcomes topics)"
        )
    if parts.fragment:
        raise LedgerUrlError(f"{text}: a ledger URL has no #fragment")
    options: dict[str, str] = {}
    gaps = "stop"
    patience: float | None = None
    for key, value in parse_qsl(parts.query, keep_blank_values=True, strict_parsing=False):
        if key == "gaps":
            if value not in ("stop", "fill"):
                raise LedgerUrlError(f"{text}: gaps={value!r} is not one of fill, stop")
            gaps = value
            continue
        if key == "gap_patience_s":
            try:
                patience = float(value)
            except ValueError:
                patience = -1.0
            if not 0 <= patience <= 86_400:
                raise LedgerUrlError(
                    f"{text}: gap_patience_s={value!r} is not a number of seconds in 0..86400"
                )
            continue
        if key not in KAFKA_OPTIONS:
            known = ", ".join(sorted([*KAFKA_OPTIONS, "gap_patience_s", "gaps"]))
            raise LedgerUrlError(f"{text}: unknown Kafka option {key!r} (known: {known})")
        allowed = KAFKA_OPTIONS[key]
        if allowed is not None and value not in allowed:
            raise LedgerUrlError(
                f"{text}: {key}={value!r} is not one of {', '.join(sorted(allowed))}"
            )
        if key in options:
            raise LedgerUrlError(f"{text}: option {key!r} given twice")
        options[key] = value
    return LedgerUrl(
        scheme="kafka",
        bootstrap=hosts,
        topic=topic,
        options=options,
        gaps=gaps,
        gap_patience_s=patience,
    )


async def open_ledger(
    url: str,
    *,
    create: bool,
    snapshots: str | None = None,
    opened_at_ms: int | None = None,
    clock_ms: Callable[[], int] | None = None,
    read_only: bool = False,
) -> Ledger:
    """Open the ledger ``url`` names (creating it when ``create``).

    ``read_only`` opens the ledger without writing to it, so a ledger on a
    read-only medium can be read (DESIGN §9): a SQLite file through query-only
    connections; a Kafka topic without creating it or a producer, and its
    ``snapshots`` file query-only (not at all when missing). Either handle
    refuses ``append`` and ``save_snapshot`` with a :class:`LedgerError` saying
    it is read-only.

    ``snapshots`` is the local snapshot file of a Kafka ledger (§10); a SQLite
    ledger keeps its snapshots in its own file and refuses the option.
    ``opened_at_ms`` stamps the ``LedgerOpened`` of a ledger created here
    (default: the wall clock); ``clock_ms`` is the clock for appends without ts.
    """
    parsed = parse_ledger_url(url)
    if parsed.scheme == "sqlite":
        from .sqlite.ledger import SqliteLedger

        if snapshots is not None:
            raise LedgerUrlError(
                f"{url}: --snapshots is for Kafka ledgers; a SQLite ledger keeps its"
                " snapshots in its own file"
            )
        if not create and not os.path.exists(parsed.path):
            raise LedgerUrlError(f"{parsed.path}: no such file")
        if read_only:
            return await SqliteLedger.open(parsed.path, read_only=True)
        clock = clock_ms or wall_clock_ms
        if opened_at_ms is not None:
            # Record 0 takes the first clock reading of open(); later appends the clock.
            first = [True]

            def opening_clock() -> int:
                if first[0]:
                    first[0] = False
                    return opened_at_ms
                return clock()

            return await SqliteLedger.open(parsed.path, create=create, clock_ms=opening_clock)
        return await SqliteLedger.open(parsed.path, create=create, clock_ms=clock)
    from .kafka.ledger import KafkaLedger

    kwargs: dict[str, Any] = {}
    if clock_ms is not None:
        kwargs["clock_ms"] = clock_ms
    if parsed.gap_patience_s is not None:
        kwargs["gap_patience_s"] = parsed.gap_patience_s
    return await KafkaLedger.open(
        parsed.bootstrap,
        parsed.topic,
        create=create,
        client_options=parsed.client_options(),
        snapshots=snapshots,
        opened_at_ms=opened_at_ms,
        gaps=parsed.gaps,
        read_only=read_only,
        **kwargs,
    )
