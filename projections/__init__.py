"""quotaledger.projections: pure, deterministic folds (DESIGN §5).

No I/O, no clock, no randomness: the same records in the same order give the
same state, byte for byte.

``rfc3339`` lives in :mod:`quotaledger.events.times`; it is re-exported here for
the callers that still import it from ``projections`` (the auditor's modules).
"""

from quotaledger.events.times import rfc3339

from .derive import recompute_all, settle
from .fold import OutOfOrder, Projection
from .state import ProjectedState, Settings
from .state_digest import state_hash
from .view import state_json

__all__ = [
    "OutOfOrder",
    "ProjectedState",
    "Projection",
    "Settings",
    "recompute_all",
    "rfc3339",
    "settle",
    "state_hash",
    "state_json",
]
