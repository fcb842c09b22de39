"""The tree's shape as the full recompute walks it (:mod:`.arrays`; DECISIONS 156, 157).

Quotas in breadth-first levels, each parent's children contiguous and in name
order, with each level's configuration numbers as int64 columns: kept on the
state (``ProjectedState.tree_arrays``) while ``tree_version`` stays the same,
patched when a quota's numbers change, rebuilt when the shape does. A tree
the array path does not handle (a quota not reachable from a top, a child
under a quota that is not a parent) has no :class:`TreeArrays`.
"""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import numpy as np

from quotaledger.events.model import QuotaUpserted

from ..request import terms_for
from ..state import BUILTIN, ROOT, ProjectedState, QuotaNode
from .exact import INT64_SUMS


class Level:
    """The quotas of one breadth-first level, grouped by parent."""

    def __init__(self, nodes: list[QuotaNode]) -> None:
        self.nodes = nodes
        #: each node's row of the state's columns (stable while the shape is)
        self.rows = np.array([node.row for node in nodes], dtype=np.intp)
        # rows of each node's children in the next level
        self.child_start: list[int] = []
        self.child_end: list[int] = []
        self.starts = self.ends = np.zeros(0, dtype=np.intp)
        #: each node's parent's position in the level above (-1: none there)
        self.parent_at = np.full(len(nodes), -1, dtype=np.intp)

    def close(self) -> None:
        """The child ranges as arrays, once they are all known."""
        self.starts = np.array(self.child_start, dtype=np.intp)
        self.ends = np.array(self.child_end, dtype=np.intp)


class LevelTerms:
    """A level's configuration numbers per resource, as int64 columns (every
    configured amount is ≤ 2^62, DESIGN §9; caps are clipped there, which caps
    nothing more). Patched row by row when a quota's numbers change."""

    FIELDS = (
        "min",
        "masked",
        "reserved",
        "cap",
        "has_cap",
        "lend",
        "has_lend",
        "weight",
        "has_weight",
    )

    def __init__(self, nodes: list[QuotaNode], keys: list[str]) -> None:
        self.configs = [node.config for node in nodes]
        self.is_parent = np.array([node.is_parent for node in nodes], dtype=bool)
        #: for a resource no configuration names: a quota with a max masks it
        #: out of its pods' request, an allow_lent false quota keeps it all local
        self.has_max = np.array([node.config.max is not None for node in nodes], dtype=bool)
        self.no_lent = np.array([not node.config.allow_lent for node in nodes], dtype=bool)
        self.keys = keys
        every = [terms_for(node) for node in nodes]
        #: rows whose cap (max, or min + borrowing_limit) is above 2^62: a
        #: request (a sum of pods) may exceed that too, so a clipped cap would
        #: decide; such a tree takes the exact row path (``recompute_arrays``)
        self.clipped: set[int] = {
            row
            for row, terms in enumerate(every)
            if any(cap > INT64_SUMS for cap in terms.caps.values())
        }
        self.columns: dict[str, dict[str, Any]] = {}
        for key in keys:
            caps = [terms.caps.get(key) for terms in every]
            lends = [terms.lending is not None and key in terms.lending for terms in every]
            weights = [terms.weights.get(key) for terms in every]
            int64 = {
                "min": [terms.config.min.get(key, 0) for terms in every],
                "reserved": [terms.reserved.get(key, 0) for terms in every],
                "cap": [0 if cap is None else min(cap, INT64_SUMS) for cap in caps],
                "lend": [
                    terms.lending.get(key, 0) if lend and terms.lending is not None else 0
                    for terms, lend in zip(every, lends, strict=True)
                ],
                "weight": [0 if weight is None else weight for weight in weights],
            }
            flags = {
                "masked": [terms.mask is not None and key not in terms.mask for terms in every],
                "has_cap": [cap is not None for cap in caps],
                "has_lend": lends,
                "has_weight": [weight is not None for weight in weights],
            }
            columns = {name: np.array(values, dtype=np.int64) for name, values in int64.items()}
            columns.update({name: np.array(values, dtype=bool) for name, values in flags.items()})
            self.columns[key] = columns

    def _values(self, node: QuotaNode) -> dict[str, tuple[Any, ...]]:
        """Per resource, one row's values in :attr:`FIELDS` order."""
        terms = terms_for(node)
        mask, lending, config_min = terms.mask, terms.lending, node.config.min
        out: dict[str, tuple[Any, ...]] = {}
        for key in self.keys:
            cap = terms.caps.get(key)
            has_lend = lending is not None and key in lending
            weight = terms.weights.get(key)
            out[key] = (
                config_min.get(key, 0),
                mask is not None and key not in mask,
                terms.reserved.get(key, 0),
                0 if cap is None else min(cap, INT64_SUMS),
                cap is not None,
                lending.get(key, 0) if has_lend and lending is not None else 0,
                has_lend,
                0 if weight is None else weight,
                weight is not None,
            )
        return out

    def patch(self, rows: list[int], nodes: list[QuotaNode]) -> None:
        """Bring these rows up to date with their quotas' configurations (one
        assignment per column for all of them; rows distinct)."""
        for row, node in zip(rows, nodes, strict=True):
            self.configs[row] = node.config
            if any(cap > INT64_SUMS for cap in terms_for(node).caps.values()):
                self.clipped.add(row)
            else:
                self.clipped.discard(row)
        at = np.array(rows, dtype=np.intp)
        self.has_max[at] = [node.config.max is not None for node in nodes]
        self.no_lent[at] = [not node.config.allow_lent for node in nodes]
        every = [self._values(node) for node in nodes]
        for key in self.keys:
            columns = self.columns[key]
            per_row = [values[key] for values in every]
            for index, name in enumerate(self.FIELDS):
                columns[name][at] = [values[index] for values in per_row]


class TreeArrays:
    """The tree's shape as :func:`recompute_arrays` walks it, and each level's
    configuration columns: kept on the state (``ProjectedState.tree_arrays``)
    while ``tree_version`` stays the same, patched when a quota's numbers
    change (its configuration object is another), rebuilt when the shape does."""

    def __init__(self, version: int, levels: list[Level], keys: list[str]) -> None:
        self.version = version
        self.levels = levels
        self.keys = keys
        self.terms = [LevelTerms(level.nodes, keys) for level in levels]
        #: quota name -> (level, position in it)
        self.where = {
            node.name: (depth, row)
            for depth, level in enumerate(levels)
            for row, node in enumerate(level.nodes)
        }


def _config_keys(state: ProjectedState) -> list[str]:
    keys: set[str] = set()
    for node in state.quotas.values():
        config = node.config
        keys.update(config.min)
        for limits in (
            config.max,
            config.shared_weight,
            config.lending_limit,
            config.borrowing_limit,
        ):
            if limits is not None:
                keys.update(limits)
    return sorted(keys)


def _config_names(config: QuotaUpserted) -> set[str]:
    """Every resource a configuration names."""
    named = set(config.min)
    for limits in (config.max, config.shared_weight, config.lending_limit, config.borrowing_limit):
        if limits is not None:
            named.update(limits)
    return named


def tree_arrays(state: ProjectedState) -> TreeArrays | None:
    """The state's :class:`TreeArrays`, brought up to date (None: a shape this path declines)."""
    cached = state.tree_arrays
    if isinstance(cached, TreeArrays) and cached.version == state.tree_version:
        # only a numbers-only edit (quota_tree.put_quota) gives a quota another
        # configuration without changing the shape
        keys = set(cached.keys)
        fresh = True
        patches: dict[int, tuple[list[int], list[QuotaNode]]] = {}
        for name in sorted(state.reconfigured):
            place = cached.where.get(name)
            if place is None:
                continue
            depth, row = place
            node = cached.levels[depth].nodes[row]
            if node.config is not cached.terms[depth].configs[row]:
                if not _config_names(node.config) <= keys:
                    fresh = False  # a new resource: rebuild
                    break
                rows, nodes = patches.setdefault(depth, ([], []))
                rows.append(row)
                nodes.append(node)
        state.reconfigured.clear()
        if fresh:
            for depth, (rows, nodes) in patches.items():
                cached.terms[depth].patch(rows, nodes)
            return cached
    levels = _levels(state)
    if levels is None:
        state.tree_arrays = None
        return None
    built = TreeArrays(state.tree_version, levels, _config_keys(state))
    state.tree_arrays = built
    state.reconfigured.clear()
    return built


def _levels(state: ProjectedState) -> list[Level] | None:
    quotas = state.quotas
    tops = sorted(
        name for name, node in quotas.items() if node.parent == ROOT or node.parent not in quotas
    )
    levels: list[Level] = []
    current = [quotas[name] for name in tops]
    seen = len(current)
    while current:
        level = Level(current)
        following: list[QuotaNode] = []
        for node in current:
            level.child_start.append(len(following))
            children = state.children_of.get(node.name)
            if children:
                if not node.is_parent:
                    return None
                following.extend(quotas[child] for child in sorted(children) if child in quotas)
            level.child_end.append(len(following))
        level.close()
        levels.append(level)
        seen += len(following)
        current = following
    if seen != len(quotas):
        return None
    for above, level in pairwise(levels):
        level.parent_at = np.repeat(np.arange(len(above.nodes)), above.ends - above.starts)
    levels[0].parent_at = np.array(
        [0 if node.parent == ROOT and node.name not in BUILTIN else -1 for node in levels[0].nodes],
        dtype=np.intp,
    )
    return levels
