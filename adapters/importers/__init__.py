"""Other schedulers' quota configuration → quotaledger facts (DESIGN §13, IMPORT.md).

The translation is pure: :func:`translate` takes parsed objects (plain dicts, as
a YAML file or a Kubernetes list/watch gives them) and returns the facts in
order plus warnings and rejections, so ``quotaledger import`` and the live quota
sources of DESIGN §12 share one code path. Reading files is
:mod:`quotaledger.adapters.importers.documents`.

For a live source: keep the current objects of the peer's kinds, call
``translate(peer, [SourceDocument(origin, obj) ...])`` after each change, decode each
fact with :func:`quotaledger.events.codec.decode_event`, append the ones that differ
from the last appended for that name, and a ``QuotaRemoved`` for every name that is no
longer emitted. The result does not depend on the order of the objects; an unusable
object is in ``rejected`` (never an exception), and ``Translation.cycle`` lists quotas
left out because their parents form a cycle.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from . import koordinator, kueue, volcano, yunikorn
from .common import ImportWarning, SourceDocument, Translation, Warnings, type_name

PEERS: dict[str, Callable[[Sequence[SourceDocument]], Translation]] = {
    "koordinator": koordinator.translate,
    "kueue": kueue.translate,
    "volcano": volcano.translate,
    "yunikorn": yunikorn.translate,
}


def detect(body: Any) -> str | None:
    """The peer a document belongs to, by the API group of ``apiVersion``; a top-level
    ``partitions`` key or a ConfigMap holding ``queues.yaml`` is YuniKorn (IMPORT.md §1)."""
    if not isinstance(body, dict):
        return None
    if yunikorn.is_yunikorn(body):
        return "yunikorn"
    if koordinator.is_koordinator(body):
        return "koordinator"
    if kueue.is_kueue(body):
        return "kueue"
    if volcano.is_volcano(body):
        return "volcano"
    return None


class MixedPeers(ValueError):
    """Documents of more than one peer in one run without ``--from``."""


def choose_peer(documents: Sequence[SourceDocument]) -> str | None:
    """The one peer of the documents, None when no document belongs to any, or
    :class:`MixedPeers` naming the first document of each peer."""
    first: dict[str, str] = {}
    for document in unpack_lists(documents):
        peer = detect(document.body)
        if peer is not None and peer not in first:
            first[peer] = document.origin
    if len(first) > 1:
        found = ", ".join(f"{peer} ({origin})" for peer, origin in sorted(first.items()))
        raise MixedPeers(f"documents of several schedulers: {found}; one run imports one")
    return next(iter(first), None)


def translate(peer: str, documents: Sequence[SourceDocument]) -> Translation:
    """Translate the documents as ``peer`` objects (IMPORT.md §2-§5).

    ``List`` objects are unpacked; empty documents are skipped; a document that is not
    a map is rejected (key ``invalid``), like any object that cannot be used.
    """
    rejected: list[ImportWarning] = []
    usable: list[SourceDocument] = []
    for document in unpack_lists(documents):
        if document.body is None:
            continue
        if not isinstance(document.body, dict):
            rejected.append(
                ImportWarning(
                    "invalid",
                    document.origin,
                    f"expected a map (an object), got {type_name(document.body)}; not imported",
                )
            )
            continue
        usable.append(document)
    result = PEERS[peer](usable)
    result.rejected[:0] = rejected
    return result


def unpack_lists(documents: Sequence[SourceDocument]) -> list[SourceDocument]:
    """``kind: List`` documents replaced by their items (IMPORT.md §1)."""
    out: list[SourceDocument] = []
    for document in documents:
        body = document.body
        if isinstance(body, dict) and body.get("kind") == "List" and "items" in body:
            items = body["items"]
            if not isinstance(items, list):
                out.append(SourceDocument(document.origin, ["items of a List must be a list"]))
                continue
            out.extend(
                SourceDocument(f"{document.origin} items[{index}]", item)
                for index, item in enumerate(items)
            )
        else:
            out.append(document)
    return out


__all__ = [
    "PEERS",
    "ImportWarning",
    "MixedPeers",
    "SourceDocument",
    "Translation",
    "Warnings",
    "choose_peer",
    "detect",
    "translate",
    "unpack_lists",
]
