"""``replay`` and ``tree``: fold a ledger or a JSONL file and print the state (DESIGN §7).

Fold only, no reconcilers. A JSONL file is streamed through the digest chain;
a SQLite or Kafka ledger is opened read only (DESIGN §9: a ledger on a
read-only medium can be replayed) and restored from a verified snapshot unless
``--no-snapshot``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from quotaledger.engine.fold_loop import Until, fold
from quotaledger.engine.render import tree_lines, tree_text
from quotaledger.engine.restore import ChainedFold, Restored, restore
from quotaledger.events.ledger import Record
from quotaledger.projections import Projection, state_json

from ..ledgers.jsonl import is_jsonl_path, open_jsonl, records
from ..ledgers.url import is_kafka_url, open_ledger
from .common import (
    Commands,
    UserError,
    add_source,
    check_end,
    ledger_arg,
    print_json,
    progress_for,
    until_option,
    warn,
)


def _batched(items: Iterable[Record], size: int = 5000) -> Iterator[list[Record]]:
    batch: list[Record] = []
    for item in items:
        batch.append(item)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


async def fold_ledger(path: Path | str, until: Until, args: argparse.Namespace) -> Restored:
    """Fold a SQLite or Kafka ledger up to ``until``, read only, from a verified
    snapshot unless ``--no-snapshot`` (DESIGN §9), with progress."""
    ledger = await open_ledger(
        str(path), create=False, read_only=True, snapshots=getattr(args, "snapshots", None)
    )
    try:
        # A Kafka ledger finds its tail only by reading it: no total there.
        total = None if is_kafka_url(str(path)) else await ledger.last_offset() + 1
        progress = progress_for(getattr(args, "command", None) or "replay", total, args)
        restored = await restore(
            ledger, until=until, use_snapshot=not args.no_snapshot, warn=warn, progress=progress
        )
        progress.close()
        return restored
    finally:
        await ledger.close()


def fold_path(path: Path | str, args: argparse.Namespace) -> Restored:
    """Fold a JSONL file (``-``: stdin), a SQLite ledger or a Kafka ledger up to
    ``--until``, with the digest chain (DESIGN §9, §10)."""
    until = until_option(args.until)
    if isinstance(path, str):
        restored = asyncio.run(fold_ledger(path, until, args))
    elif is_jsonl_path(path):
        with open_jsonl(str(path)) as source:
            chained = ChainedFold(Projection(), on_mismatch=warn)
            progress = progress_for(getattr(args, "command", None) or "replay", None, args)
            stream: Iterable[Record] = records(source, strict=args.strict)
            if until.offset is not None:
                # Do not even read (and fail on) lines past the stop offset.
                stream = itertools.islice(stream, until.offset + 1)
            fold(chained, _batched(stream), until, progress)
            progress.close()
            restored = Restored(chained)
    elif not path.exists():
        raise UserError(f"{path}: no such file")
    else:
        restored = asyncio.run(fold_ledger(path, until, args))
    check_end(until, restored.projection.state.offset)
    return restored


def cmd_replay(args: argparse.Namespace) -> int:
    restored = fold_path(ledger_arg(args.source), args)
    document = state_json(restored.projection.state)
    if args.json:
        # DESIGN §9: the digest of the last record folded, next to the state hash.
        with_digest: dict[str, Any] = {}
        for key, value in document.items():
            with_digest[key] = value
            if key == "hash":
                with_digest["digest"] = restored.digest
        print_json(with_digest)
    else:
        print(tree_text(document))
    return 0


def cmd_tree(args: argparse.Namespace) -> int:
    """The indented tree alone (DECISIONS 263); ``replay`` adds the header and footer."""
    restored = fold_path(ledger_arg(args.source), args)
    print("\n".join(tree_lines(state_json(restored.projection.state))))
    return 0


def register(commands: Commands) -> None:
    """``replay`` and ``tree``."""
    raw = argparse.RawDescriptionHelpFormatter

    replay = commands.add_parser(
        "replay",
        help="fold a ledger or JSONL file and print the state",
        description="Fold only (no reconcilers) and print the state: the tree, or --json."
        " A bad JSONL line is kept as a FactRejected record (listed in state.rejected) and"
        " the replay goes on; --strict stops at it instead (exit 2).",
        epilog="examples:\n  quotaledger replay examples/koordinator.jsonl --json\n"
        "  quotaledger replay ledger.db --until 1500\n"
        "  quotaledger replay events.jsonl --strict\n"
        "  gunzip -c events.jsonl.gz | quotaledger replay - --json\n",
        formatter_class=raw,
    )
    add_source(replay)
    replay.add_argument(
        "--json",
        action="store_true",
        help="print the state JSON (DESIGN §7) with `digest`, the digest chain's d(offset)"
        " (DESIGN §9)",
    )
    replay.set_defaults(handler=cmd_replay)

    tree = commands.add_parser(
        "tree",
        help="show the quota tree alone, in human units",
        description="The quota tree alone: root and every quota indented under its parent"
        " with min/max/request/used/runtime (cpu in cores, memory in bytes with binary"
        " units), then any orphans. `replay` prints the same tree with a header (offset,"
        " time, hash, cluster totals) and a footer (running preemptions, rejected records).",
        epilog="examples:\n  quotaledger tree examples/koordinator.jsonl\n"
        "  quotaledger tree ledger.db --until 2026-01-01T00:00:00Z\n",
        formatter_class=raw,
    )
    add_source(tree)
    tree.set_defaults(handler=cmd_tree)
