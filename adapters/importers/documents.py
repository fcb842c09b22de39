"""Reading configuration files for ``quotaledger import`` (the I/O side of IMPORT.md §1)."""

from __future__ import annotations

import sys
from pathlib import Path

from .common import SourceDocument
from .yaml_text import UnreadableInput, parse_text

__all__ = ["UnreadableInput", "read_documents"]


def read_documents(name: str) -> list[SourceDocument]:
    """The documents of one file (``-`` is standard input)."""
    if name == "-":
        return parse_text(sys.stdin.read(), "<stdin>")
    path = Path(name)
    try:
        if path.is_dir():
            raise UnreadableInput(f"{name}: is a directory")
        content = path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise UnreadableInput(f"{name}: no such file") from None
    except UnicodeDecodeError as exc:
        raise UnreadableInput(
            f"{name}: not UTF-8 text ({exc.reason} at byte {exc.start})"
        ) from None
    except OSError as exc:
        raise UnreadableInput(f"{name}: cannot read: {exc.strerror}") from None
    return parse_text(content, name)
