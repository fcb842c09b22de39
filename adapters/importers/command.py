"""``quotaledger import`` (DESIGN §13, IMPORT.md §1): files in, JSONL facts out.

Exit 0 with the facts on stdout (or ``--out``) and warnings on stderr; exit 2 with
nothing written for unreadable input (missing file, directory, broken YAML), a
parent cycle, or documents of several schedulers without ``--from``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from . import PEERS, MixedPeers, choose_peer, translate, unpack_lists
from .common import SourceDocument, name_or_unknown

DESCRIPTION = """\
Translate another scheduler's quota configuration into quotaledger facts (JSONL):
at most one SettingsChanged, then NamespaceWeighted, then one QuotaUpserted per
quota, parents before children, siblings by name. Reads multi-document YAML or
JSON (kind: List is unpacked); the scheduler is detected per document unless
--from is given. Configuration without an equivalent is named on stderr as
`warning: <key>: <subject>: <text>`, never dropped silently. Give every file of
one tree in one run: parent sums are computed over everything given.

exit status: 0 when facts were written (warnings or not); 2 with nothing written
for unreadable input, a parent cycle, or files of several schedulers without --from."""

EPILOG = """\
examples:
  quotaledger import elasticquotas.yaml > quotas.jsonl          # Koordinator
  quotaledger import cohorts.yaml clusterqueues.yaml --out q.jsonl   # Kueue
  kubectl get queues.scheduling.volcano.sh -o yaml | quotaledger import -
  kubectl -n yunikorn get configmap yunikorn-configs -o yaml | quotaledger import --from yunikorn -
  quotaledger import queues.yaml --out q.jsonl && quotaledger replay q.jsonl
"""


def add_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register the ``import`` subcommand."""
    parser = commands.add_parser(
        "import",
        help="translate Koordinator/Kueue/Volcano/YuniKorn quota configuration into facts",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("files", nargs="+", metavar="FILE", help="YAML or JSON file; - is stdin")
    parser.add_argument(
        "--from", dest="peer", choices=sorted(PEERS), help="the scheduler (default: detected)"
    )
    parser.add_argument("--out", metavar="FILE.jsonl", help="write the facts here, not stdout")
    parser.set_defaults(handler=run)


def _error(message: str) -> int:
    print(f"quotaledger: error: {message}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    from .documents import UnreadableInput, read_documents  # PyYAML only for this command

    documents: list[SourceDocument] = []
    try:
        for name in args.files:
            documents.extend(read_documents(name))
    except UnreadableInput as exc:
        return _error(str(exc))
    peer = args.peer
    if peer is None:
        try:
            peer = choose_peer(documents)
        except MixedPeers as exc:
            return _error(f"{exc}; choose one with --from")
    if peer is None:
        for document in unpack_lists(documents):
            body = document.body
            if isinstance(body, dict):
                subject = f"{body.get('kind')}/{name_or_unknown(body)}"
                print(
                    f"warning: skipped-kind: {subject}: {document.origin}: not a Koordinator,"
                    " Kueue, Volcano or YuniKorn object",
                    file=sys.stderr,
                )
            elif body is not None:
                print(f"warning: invalid: {document.origin}: not a map; ignored", file=sys.stderr)
        result_lines: list[str] = []
        fatal: list[str] = []
        warnings: list[str] = []
    else:
        try:
            result = translate(peer, documents)
        except RecursionError:
            return _error("the input nests too deeply (a self-referencing YAML alias?)")
        fatal = [item.line() for item in result.rejected if item.key in ("cycle", "unreadable")]
        warnings = [item.line() for item in result.warnings + result.rejected]
        result_lines = [json.dumps(fact, ensure_ascii=False) for fact in result.facts]
    if fatal:
        for line in fatal:
            print(f"quotaledger: error: {line.removeprefix('warning: ')}", file=sys.stderr)
        return 2
    for line in warnings:
        print(line, file=sys.stderr)
    text = "".join(line + "\n" for line in result_lines)
    if args.out:
        try:
            _write_atomically(Path(args.out), text)
        except OSError as exc:
            return _error(f"{args.out}: cannot write: {exc.strerror}")
    else:
        sys.stdout.write(text)
        sys.stdout.flush()
    return 0


def _write_atomically(path: Path, text: str) -> None:
    """Write the whole output or nothing (a rename within the target's folder)."""
    handle, temporary = tempfile.mkstemp(dir=path.parent or Path("."), prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
