"""``import``: other schedulers' quota objects as quotaledger facts (DESIGN §13).

The command itself lives with the importers (:mod:`quotaledger.adapters.importers.command`);
this module registers it among the CLI's commands.
"""

from __future__ import annotations

from ..importers.command import add_parser
from .common import Commands


def register(commands: Commands) -> None:
    """``import``."""
    add_parser(commands)
