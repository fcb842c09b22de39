"""What a quota's configuration alone determines (DESIGN §5 "Request and used",
"Available"), computed once per configuration instead of at every recompute.

A :class:`Terms` belongs to one ``QuotaUpserted`` object;
:func:`quotaledger.projections.request.terms_for` rebuilds it when the node's
configuration object changes (configurations are immutable facts, so identity
is enough).
"""

from __future__ import annotations

from collections.abc import Mapping

from quotaledger.events.model import QuotaUpserted

from .resources import RL


class _ZeroEverywhere(dict[str, int]):
    """A limit list that lists every resource at 0 (allow_lent false)."""

    def __contains__(self, key: object) -> bool:
        return True

    def get(self, key: str, default: int | None = None) -> int:  # type: ignore[override]
        return 0

    def __getitem__(self, key: str) -> int:
        return 0


_ZERO_EVERYWHERE = _ZeroEverywhere()


def lending_limit(config: QuotaUpserted) -> Mapping[str, int] | None:
    """The effective lending limit: ``allow_lent false`` means 0 everywhere."""
    if not config.allow_lent:
        return _ZERO_EVERYWHERE
    return config.lending_limit


def kept_local(subtree: Mapping[str, int], limit: Mapping[str, int] | None) -> RL:
    """KEP-79 ``local = max(0, subtree − lending_limit)`` where a limit is set."""
    local: RL = {}
    if limit is not None:
        for key, value in subtree.items():
            if key in limit:
                kept = value - limit.get(key, 0)
                if kept > 0:
                    local[key] = kept
    return local


class Terms:
    """Constants of one configuration.

    * ``mask``: the keys a leaf's request keeps (its max; None keeps all, §8 rule 1);
    * ``reserved``: ``max(0, min − lending_limit)`` per resource — the floor of request;
    * ``caps``: per resource ``min(max, min + borrowing_limit)`` of those set —
      ``limited_request = min(request, caps)``;
    * ``lending``: the effective lending limit;
    * ``weights``: the configured shared weight per resource — ``shared_weight``,
      else ``max`` (§8 rule 2; a resource listed in neither takes the amount shared).
    """

    __slots__ = (
        "caps",
        "config",
        "lending",
        "mask",
        "reserved",
        "weights",
    )

    def __init__(self, config: QuotaUpserted) -> None:
        self.config = config
        self.mask: Mapping[str, int] | None = config.max
        self.lending = lending_limit(config)
        self.reserved = kept_local(config.min, self.lending)
        caps: RL = dict(config.max) if config.max is not None else {}
        if config.borrowing_limit is not None:
            for key, borrow in config.borrowing_limit.items():
                ceiling = config.min.get(key, 0) + borrow
                if key not in caps or ceiling < caps[key]:
                    caps[key] = ceiling
        self.caps = caps
        weights: RL = dict(config.max) if config.max is not None else {}
        if config.shared_weight is not None:
            weights.update(config.shared_weight)
        self.weights = weights
