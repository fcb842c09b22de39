"""quotaledger.projections: pure, deterministic folds (DESIGN §5).

No I/O, no clock, no randomness: the same records in the same order give the
same state, byte for byte.
"""

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
    "settle",
    "state_hash",
    "state_json",
]
