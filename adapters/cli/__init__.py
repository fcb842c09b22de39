"""The ``quotaledger`` command line (DESIGN §7); the console script is :func:`main`."""

from .main import build_parser, main

__all__ = ["build_parser", "main"]
