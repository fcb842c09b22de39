"""Where ``audit --jobs N`` cuts a ledger that has snapshots (DESIGN §9; DECISIONS 340).

A cut is a snapshot and an offset at or after it: the span before the cut
audits every record through the offset, checking the snapshot on its way
(:func:`.parallel._reproduces`); the span after it loads the snapshot, folds
the records from there to the offset without auditing them, and audits from
the next record on (:func:`.parallel.audit_span`). So a cut may fall between
two snapshots: an engine keeps few of them (it thins the old ones), and a cut
only at a snapshot can leave the spans far from even.

:func:`plan_cuts` puts the cuts where the longest span is shortest, by a
model of what each costs, in records audited:

* every record costs the same (with the kept state hash, a ``LedgerDigest``
  costs what changed since the one before, not the state's size: DECISIONS
  230; measured on the bench ledger, 23-25 µs of CPU per record before and
  after its first snapshot alike);
* a record only folded (between a cut's snapshot and its offset) costs
  :data:`FOLD_SHARE` of that, and one audited after a snapshot
  :data:`RESTORED_SHARE` of it;
* a span that starts from a snapshot first pays :data:`START_RECORDS`
  (its process's start) and one record per :data:`LOAD_BYTES` of the
  snapshot (reading and loading it, the state hash from nothing), and the
  span that checks a snapshot one record per :data:`VERIFY_BYTES` (its state
  hash, encoding the state and comparing it with the blob).

The span at offset 0 is the parent process's own (it starts no process).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

#: What folding a record costs, against auditing it (decode and fold, and the digest
#: chain; without the settle and state hash of each ``LedgerDigest`` and the decisions).
FOLD_SHARE = 0.47
#: A worker process's start (a fork: DECISIONS 343), in records audited.
START_RECORDS = 2_000
#: Bytes of a snapshot per record audited that loading it costs.
LOAD_BYTES = 500
#: Bytes of a snapshot per record audited that checking it costs.
VERIFY_BYTES = 2_500
#: What a record audited by a span that started from a snapshot costs, against
#: one audited by the span at offset 0 (measured 4-8 % more on the bench ledger;
#: the state decoded in one piece is the likely cause, not established).
RESTORED_SHARE = 1.05


@dataclass(frozen=True, slots=True, order=True)
class Cut:
    """A boundary between two spans: the snapshot at ``snapshot`` and the offset
    ``offset`` (≥ ``snapshot``) through which the span before audits and the
    span after folds onto that snapshot."""

    snapshot: int
    offset: int


def _start(size: int) -> float:
    """What a span starting from a snapshot of ``size`` bytes pays first."""
    return START_RECORDS + size / LOAD_BYTES


def _cuts_within(
    budget: float, last: int, usable: Sequence[tuple[int, int]], jobs: int
) -> list[Cut] | None:
    """Cuts such that no span costs more than ``budget`` (greedy: each span as
    long as it may be, the next starting from the snapshot that leaves the
    least work after it), or None when ``jobs`` spans cannot. The work of
    records ``a+1..b`` is ``b - a``, every record audited weighing one."""
    cuts: list[Cut] = []
    previous, cost = -1, 0.0  # the last offset before the span, its own fixed cost
    end = last
    sizes = dict(usable)
    for span in range(jobs):
        share = 1.0 if span == 0 else RESTORED_SHARE
        if cost + share * (end - previous) <= budget:
            return cuts
        if span == jobs - 1:
            return None
        best: tuple[float, Cut] | None = None
        for snapshot, size in usable:
            if snapshot <= previous:
                continue
            room = budget - cost - size / VERIFY_BYTES
            offset = min(int(previous + 1 + room / share) - 1, end - 1)
            if offset < snapshot:
                continue
            then = _start(size) + FOLD_SHARE * (offset - snapshot)
            left = then + RESTORED_SHARE * (end - offset)
            if best is None or left < best[0]:
                best = (left, Cut(snapshot, offset))
        if best is None:
            return None
        cut = best[1]
        size = sizes[cut.snapshot]
        cost = _start(size) + FOLD_SHARE * (cut.offset - cut.snapshot)
        cuts.append(cut)
        previous = cut.offset
    return None


def plan_cuts(snapshots: Sequence[tuple[int, int]], last_offset: int, jobs: int) -> list[Cut]:
    """The cuts for ``jobs`` processes among the ``(offset, size)`` of the ledger's
    snapshots that make the longest span (by the module's model) shortest;
    none without a usable snapshot (one at the last offset is of no use: a span
    starts after its cut). When the model finds no cut worth its fixed costs (a
    small ledger), the ledger is still cut at the snapshots nearest to an even
    split of the work (:func:`even_cuts`)."""
    usable = sorted({(o, size) for o, size in snapshots if 0 <= o < last_offset})
    if jobs < 2 or not usable:
        return []
    low, high = 0.0, float(last_offset + 1)
    best: list[Cut] = []
    for _ in range(60):
        middle = (low + high) / 2
        cuts = _cuts_within(middle, last_offset, usable, jobs)
        if cuts is None:
            low = middle
        else:
            high, best = middle, cuts
        if high - low <= high * 1e-6:
            break
    return best or even_cuts(last_offset, usable, jobs)


def even_cuts(last_offset: int, usable: Sequence[tuple[int, int]], jobs: int) -> list[Cut]:
    """For each even split k/jobs of the records, the snapshot nearest to it
    (ties: the earlier), each a cut at the snapshot itself."""
    total = last_offset + 1
    stops = {
        min(usable, key=lambda item: (abs(item[0] + 1 - total * k / jobs), item[0]))[0]
        for k in range(1, jobs)
    }
    return [Cut(stop, stop) for stop in sorted(stops)]
