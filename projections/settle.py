"""Bring derived numbers up to date, incrementally (DESIGN §5).

A change marks quotas dirty (their pods or configuration changed) and parents
for *refill* (their children's runtime inputs changed). :func:`settle`:

1. recomputes request/used/KEP sums bottom-up along the dirty paths only;
2. recomputes the cluster total (§5, §8 rule 16) when nodes or the builtin
   quotas' usage changed;
3. water-fills runtime top-down under the parents whose inputs changed, and
   under every child parent whose own runtime changed as a result.

Every number is read from and written to the quotas' rows of the state's
columns (:mod:`.columns`): per parent segment, in Python over the
rows, no per-quota dict. The result is identical to a full recomputation
(:func:`recompute_all`).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from typing import Any

from .columns import QuotaColumns
from .pods import flush_sums
from .recompute.totals import cluster_total, root_children, root_sums
from .request import Change, apply_changes, recompute_node, terms_for
from .resources import RL
from .runtime import GroupFill, distribute
from .state import BUILTIN, ROOT, ProjectedState, QuotaNode

_TOP_DOWN = ("runtime", "effective_min")

#: A settle of a tree of at least ``BULK_MIN_QUOTAS`` quotas with at least one
#: in ``BULK_FRACTION`` of them dirty recomputes everything on arrays instead of
#: along the dirty paths (DECISIONS 193): the same numbers, in a few ms.
BULK_MIN_QUOTAS = 1024
BULK_FRACTION = 8


def tree_cache(state: ProjectedState) -> dict[str, Any]:
    """``state.sorted_children``, emptied when the tree's shape changed: quota
    name -> its children in name order; ``ROOT`` -> the top quotas (see
    :func:`top_quotas`); ``""`` -> the version and quotas they were listed
    from, and the parents' fills (see :func:`_groups`)."""
    cache = state.sorted_children
    stamp = cache.get("")
    if stamp is None or stamp[0] != state.tree_version or stamp[1] is not state.quotas:
        cache.clear()
        cache[""] = (state.tree_version, state.quotas, {})
    return cache


def top_quotas(state: ProjectedState) -> list[QuotaNode]:
    """The quotas at the top of a tree (root's children and the quotas whose
    parent does not exist), system and default aside; kept while the tree's
    shape is (§8 rule 31's free capacity subtracts their used)."""
    cache = tree_cache(state)
    out: list[QuotaNode] | None = cache.get(ROOT)
    if out is None:
        quotas = state.quotas
        out = cache[ROOT] = [
            quotas[name]
            for parent, names in state.children_of.items()
            if parent == ROOT or parent not in quotas
            for name in names
            if name not in BUILTIN
        ]
    return out


class ChangedQuotas:
    """The quotas whose numbers or configuration changed since a reader last
    looked: what ``state.touched`` is for the clock sample, for another reader
    (``clocks.owing_quotas``, kept in ``state.owing_index``). The settle adds to
    it whatever it adds to ``touched``; ``everything`` after a full recompute."""

    __slots__ = ("changed", "everything", "members", "quotas")

    def __init__(self, quotas: object) -> None:
        self.quotas = quotas
        self.members: set[str] = set()
        self.changed: set[str] = set()
        self.everything = True


def _changed(state: ProjectedState, names: Iterable[str]) -> None:
    index = state.owing_index
    if isinstance(index, ChangedQuotas) and not index.everything:
        index.changed.update(names)


def _children(state: ProjectedState, name: str) -> list[QuotaNode]:
    """A quota's children in name order (kept while the tree's shape is)."""
    cache = tree_cache(state)
    out = cache.get(name)
    if out is None:
        quotas = state.quotas
        out = [quotas[child] for child in sorted(state.children(name))]
        for child in out:
            if child.store is not state.columns:
                state.attach(child)
        cache[name] = out
    return out


def settle(state: ProjectedState) -> None:
    """Make every derived number consistent with the facts folded so far.

    Along the dirty paths; or, when many quotas are dirty (a ``LedgerDigest``'s
    hash, a replay's end), by the full recompute on arrays, which gives the
    same numbers and marks every quota touched (the clocks re-check what did
    not change to the same result, ``clocks.sampled``)."""
    if not state.dirty and not state.refill and not state.total_dirty:
        return
    quotas = state.quotas
    if len(quotas) >= BULK_MIN_QUOTAS and len(state.dirty) * BULK_FRACTION >= len(quotas):
        recompute_all(state)
        return
    _settle_paths(state)


def _settle_paths(state: ProjectedState) -> None:
    """:func:`settle` along the dirty paths (steps 1-3 of the module docstring)."""
    quotas = state.quotas
    columns = state.columns
    path: set[str] = set()
    dirty = state.dirty
    for name in dirty:
        current = name
        while current in quotas and current not in path:
            path.add(current)
            node = quotas[current]
            if node.store is not columns:
                state.attach(node)
            current = node.config.parent
    state.dirty = set()
    state.touched |= path
    _changed(state, path)
    root_changed = False
    # parents to water-fill again for some resources only: those whose
    # children's limited requests moved (as the water-fill sees them) or whose
    # amount to share moved; ``state.refill`` holds those to fill whole
    moves = _Moves()
    partial = moves.partial
    # how each parent's children moved, per resource (request.apply_changes)
    moved_under: dict[str, dict[str, Change]] = {}
    for name in sorted(path, key=lambda q: (-quotas[q].depth, q)):
        node = quotas[name]
        if not node.connected:
            state.columns.clear(_TOP_DOWN, node.row)
        outcome = None
        if name not in dirty:
            # an ancestor on the path only: its own inputs are as they were
            below = moved_under.pop(name, None)
            if below is None:
                continue
            outcome = apply_changes(state, node, below)
        if outcome is None:
            if node.sum_log or node.sums_stale:
                flush_sums(state, node)
            children = _children(state, name) if node.config.is_parent else []
            outcome = recompute_node(state, node, children)
        changed, moved, changes = outcome
        if changed:
            parent = node.config.parent
            if parent == ROOT:
                root_changed = True
                if name in BUILTIN:
                    state.total_dirty = True
                elif moved:
                    partial.setdefault(ROOT, set()).update(moved)
            elif parent in quotas:
                if moved:
                    partial.setdefault(parent, set()).update(moved)
                wants = moves.wants.setdefault(parent, {})
                for key, change in changes.items():
                    if change[0]:
                        wants.setdefault(key, []).append((node, change[0]))
                into = moved_under.get(parent)
                if into is None:
                    moved_under[parent] = changes
                else:
                    for key, change in changes.items():
                        sums = into.get(key)
                        if sums is None:
                            into[key] = change
                        else:
                            for i in range(4):
                                sums[i] += change[i]
    if state.total_dirty:
        total = cluster_total(state)
        before = state.cluster_total
        if total != before:
            partial.setdefault(ROOT, set()).update(
                key for key in total.keys() | before.keys() if total.get(key) != before.get(key)
            )
            state.cluster_total = total
            root_changed = True
        state.total_dirty = False
    if root_changed or ROOT in state.refill:
        root_sums(state)
    _refill(state, moves)


class _Moves:
    """What one settle changed that its top-down fill reads (DECISIONS 250).

    ``partial``: parents to fill again for some resources only; ``wants``:
    per parent and resource, the children whose limited request changed and
    by how much; ``amounts``: per parent and resource, its runtime before this
    settle changed it."""

    __slots__ = ("amounts", "partial", "wants")

    def __init__(self) -> None:
        self.partial: dict[str, set[str]] = {}
        self.wants: dict[str, dict[str, list[tuple[QuotaNode, int]]]] = {}
        self.amounts: dict[str, dict[str, int]] = {}


def _refill(state: ProjectedState, moves: _Moves | None = None) -> None:
    """Water-fill, top-down, every parent in ``state.refill`` (all resources)
    and in ``moves.partial`` (the resources named), then every child parent
    whose runtime moved as a result, for the resources that moved. A parent's
    runtime is an input of its children's fill only for the same resource,
    so the resources left out keep numbers equal to a fill's; a group that
    every limited request fits in, before and after, is settled without a
    fill (:func:`_fits`; DECISIONS 250)."""
    quotas = state.quotas
    whole = state.refill
    moves = _Moves() if moves is None else moves
    partial = moves.partial
    heap = [
        (0 if name == ROOT else quotas[name].depth, name)
        for name in whole | partial.keys()
        if name == ROOT or (name in quotas and quotas[name].connected)
    ]
    state.refill = set()
    heapq.heapify(heap)
    done: set[str] = set()
    min_scaling = state.settings.min_scaling
    groups = _groups(state)
    for name in whole:
        groups.pop(name, None)
    touched = state.touched
    index = state.owing_index
    track = index.changed if isinstance(index, ChangedQuotas) and not index.everything else None
    by_key = state.columns.columns
    amounts_before = moves.amounts
    while heap:
        _, name = heapq.heappop(heap)
        if name in done:
            continue
        done.add(name)
        total: RL | int
        fill = groups.get(name)
        if fill is not None and fill.store is not state.columns:
            fill = None
        if name == ROOT:
            total = state.cluster_total
            if fill is None:
                fill = groups[name] = GroupFill(state.columns, root_children(state))
        else:
            node = quotas[name]
            if not node.config.is_parent:
                continue
            total = row = node.row
            if fill is None:
                fill = groups[name] = GroupFill(state.columns, _children(state, name))
        children = fill.children
        if not children:
            continue
        changed: list[tuple[QuotaNode, dict[str, int]]] = []
        keys: set[str] | None = None
        if name not in whole:
            keys = partial[name]
            if name != ROOT:
                # a parent short of what its children ask is filled (the
                # first test of ``_fits``, taken here without the call)
                keys = {
                    key
                    for key in keys
                    if by_key[key].runtime[row] < by_key[key].request[row]
                    or not _fits(state, moves, node, fill, key, changed)
                }
        if keys is None or keys:
            moved = distribute(state, total, children, min_scaling, keys, fill)
            for child, before in zip(children, moved, strict=True):
                if before:
                    changed.append((child, before))
        for child, before in changed:
            child_name = child.config.name
            touched.add(child_name)
            if track is not None:
                track.add(child_name)
            if child.config.is_parent:
                partial.setdefault(child_name, set()).update(before)
                amounts = amounts_before.get(child_name)
                if amounts is None:
                    amounts_before[child_name] = dict(before)
                else:
                    for key, value in before.items():
                        amounts.setdefault(key, value)
                heapq.heappush(heap, (child.depth, child_name))


def _groups(state: ProjectedState) -> dict[str, GroupFill]:
    """The parents' :class:`~.runtime.GroupFill`, kept with the tree's shape;
    a parent filled whole (its children's configurations may have changed)
    loses its own (``_refill``)."""
    groups: dict[str, GroupFill] = tree_cache(state)[""][2]
    return groups


def _fits(
    state: ProjectedState,
    moves: _Moves,
    node: QuotaNode,
    fill: GroupFill,
    key: str,
    changed: list[tuple[QuotaNode, dict[str, int]]],
) -> bool:
    """Settle one parent's children for one resource without a fill, when
    every limited request fitted in the amount shared before this settle and
    still does: then every child's runtime is its limited request, whatever
    the effective mins (§5 Runtime steps 2-3: with every borrower weighted,
    the pool covers every borrower's way to its cap), so only the children
    whose limited request changed move, and the effective mins only when
    they are scaled to an amount that changed. False when that does not hold
    (the caller fills). The parent's configuration and children are as at the last fill
    (it is not filled whole), so its request, a sum of its children's
    limited requests when no reserve floors it, is what they ask now."""
    name = node.config.name
    terms = terms_for(node)
    if key in terms.reserved:
        return False
    columns = state.columns.columns[key]
    row = node.row
    amount = columns.runtime[row]
    amounts = moves.amounts.get(name)
    amount_before = amount if amounts is None else amounts.get(key, amount)
    if amount <= 0 or amount_before <= 0:
        return False
    asked = columns.request[row]
    wants = moves.wants.get(name)
    changes = () if wants is None else wants.get(key, ())
    asked_before = asked
    for _, delta in changes:
        asked_before -= delta
    if amount < asked or amount_before < asked_before:
        return False
    facts = fill.facts.get(key)
    if facts is None:
        facts = fill.key_facts(key)
    mins, min_sum, _, weighted = facts
    if not weighted:
        return False
    if (
        amount != amount_before
        and state.settings.min_scaling
        and (amount < min_sum or amount_before < min_sum)
    ):
        # the effective mins are scaled to the amount (§5 Runtime step 1)
        effective = columns.effective_min
        for child_row, value in zip(fill.rows, mins, strict=True):
            if amount < min_sum:
                value = amount * value // min_sum
            if effective[child_row] != value:
                effective[child_row] = value
    limited, runtime = columns.limited_request, columns.runtime
    for child, _ in changes:
        child_row = child.row
        want = limited[child_row]
        before = runtime[child_row]
        if before != want:
            runtime[child_row] = want
            changed.append((child, {key: before}))
    return True


def recompute_all(state: ProjectedState) -> None:
    """Recompute everything from the pod sums (snapshot restore, benchmarks), on
    arrays (:mod:`.recompute.arrays`); on a tree that path declines, with
    :func:`recompute_all_rows`. Both give the same numbers."""
    from .recompute.arrays import recompute_arrays  # numpy: loaded on the first full recompute

    # the fill below does not go through ``_refill``, which drops the facts of
    # groups whose children's configurations changed: drop them all
    _groups(state).clear()
    index = state.owing_index
    if isinstance(index, ChangedQuotas):
        index.everything = True
    attach_all(state)
    if not recompute_arrays(state):
        recompute_all_rows(state)


def attach_all(state: ProjectedState) -> None:
    """Give every quota its row, in name order (a restored state's quotas come
    without); rows of quotas the state no longer holds are dropped."""
    columns = state.columns
    quotas = state.quotas
    # the fold adds quotas to the same dict with their rows (quota_tree.put_quota);
    # a restore installs another dict of quotas without
    if quotas is columns.verified and columns.live == len(quotas):
        return
    if columns.live == len(quotas) and all(node.store is columns for node in quotas.values()):
        columns.verified = quotas
        return
    # start afresh: the sums were charged into rows some of which are stale
    pending = [node for node in quotas.values() if node.store is not columns]
    if columns.live + len(pending) != len(quotas):
        state.columns = columns = QuotaColumns()
        state.tree_arrays = None
        for name in sorted(quotas):
            node = quotas[name]
            node.store = None
            state.attach(node)
            node.sum_log.clear()
            node.sums_stale = True
        state.dirty.update(quotas)
    else:
        for node in sorted(pending, key=lambda item: item.config.name):
            state.attach(node)
            node.sum_log.clear()
            node.sums_stale = True
            state.dirty.add(node.config.name)
    columns.verified = quotas


def recompute_all_rows(state: ProjectedState) -> None:
    """Recompute everything from the pod sums, quota by quota along the paths of ``settle``.

    Every quota is recomputed bottom-up and every parent (root included)
    re-filled, which assigns each derived number of each connected quota; an
    orphan's runtime and effective min are cleared by ``settle``, and
    system/default never get one (DECISIONS 6). So nothing needs resetting first.
    """
    attach_all(state)
    state.dirty.update(state.quotas)
    state.refill.update(state.quotas)
    state.cluster_total = {}
    state.total_dirty = True
    state.refill.add(ROOT)
    _settle_paths(state)
