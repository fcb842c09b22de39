"""quotaledger.events: the event vocabulary, codecs, quantities and the Ledger interface."""

from .codec import EventError, decode_event, encode_event, peek_kind
from .ledger import Append, Ledger, LedgerError, LedgerGap, LedgerMismatch, Record, Snapshot
from .model import *  # noqa: F403
from .model import __all__ as _model_all
from .quantity import QuantityError, canonical_amount, canonical_list, format_amount

__all__ = [
    *_model_all,
    "Append",
    "EventError",
    "Ledger",
    "LedgerError",
    "LedgerGap",
    "LedgerMismatch",
    "QuantityError",
    "Record",
    "Snapshot",
    "canonical_amount",
    "canonical_list",
    "decode_event",
    "encode_event",
    "format_amount",
    "peek_kind",
]
