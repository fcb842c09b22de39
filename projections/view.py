"""The state JSON of DESIGN §7 (and the state hash it carries, :mod:`.state_digest`)."""

from __future__ import annotations

from typing import Any

from .available import NumberReader, reported_available
from .derive import settle
from .fair_share import fair_shares, namespace_usage
from .resources import RL, sparse
from .state import DEFAULT, SYSTEM, NamespaceUsage, ProjectedState, QuotaNode
from .state_digest import state_hash


def rfc3339(ts_ms: int) -> str:
    """A ledger ts as RFC 3339 UTC; milliseconds only when not whole seconds.

    Exact integer arithmetic on the proleptic Gregorian calendar, for any
    integer: decoding bounds every time to 1970 .. 9000 (§9), but whatever ts a
    state holds (a deadline, a ledger written by something else), rendering it
    must not fail. A year outside 0000 .. 9999 is written with its sign and all
    its digits (the extended form of ISO 8601), so it is still unambiguous.
    """
    days, ms = divmod(ts_ms, 86_400_000)
    seconds, milli = divmod(ms, 1000)
    minutes, second = divmod(seconds, 60)
    hour, minute = divmod(minutes, 60)
    year, month, day = _civil(days)
    sign = "" if 0 <= year <= 9999 else ("+" if year > 0 else "-")
    text = f"{sign}{abs(year):04d}" if not sign else f"{sign}{abs(year):06d}"
    text += f"-{month:02d}-{day:02d}T{hour:02d}:{minute:02d}:{second:02d}"
    return text + (f".{milli:03d}Z" if milli else "Z")


def _civil(days: int) -> tuple[int, int, int]:
    """Year, month and day of ``days`` since 1970-01-01 (proleptic Gregorian;
    the civil-from-days algorithm over 400-year eras of 146,097 days)."""
    days += 719_468  # days from 0000-03-01 to 1970-01-01
    era, day_of_era = divmod(days, 146_097)
    year_of_era = (
        day_of_era - day_of_era // 1460 + day_of_era // 36_524 - day_of_era // 146_096
    ) // 365
    day_of_year = day_of_era - (365 * year_of_era + year_of_era // 4 - year_of_era // 100)
    shifted_month = (5 * day_of_year + 2) // 153  # March = 0
    day = day_of_year - (153 * shifted_month + 2) // 5 + 1
    month = shifted_month + 3 if shifted_month < 10 else shifted_month - 9
    year = year_of_era + era * 400 + (1 if month <= 2 else 0)
    return year, month, day


def _config_rl(amounts: RL | None) -> RL | None:
    return None if amounts is None else {key: amounts[key] for key in sorted(amounts)}


def quota_view(state: ProjectedState, name: str, memo: dict[str, RL]) -> dict[str, Any]:
    """One quota as in ``state.quotas[name]`` (call after ``settle``)."""
    node = state.quotas[name]
    return _quota_view(state, name, memo, getattr, namespace_usage(state, node))


def _quota_view(
    state: ProjectedState,
    name: str,
    memo: dict[str, RL],
    numbers: NumberReader,
    usage_by_ns: dict[str, NamespaceUsage],
) -> dict[str, Any]:
    """:func:`quota_view` with the quota's numbers read through ``numbers``
    (sparse dicts in key order already, as ``QuotaNode`` builds them) and
    its namespaces' usage given."""
    node = state.quotas[name]
    config = node.config
    runtime = numbers(node, "runtime")
    shares = fair_shares(node, usage_by_ns, state.namespace_weights, runtime)
    namespaces = {
        ns: {
            "weight": state.namespace_weights.get(ns, 1),
            "request": sparse(usage.request),
            "used": sparse(usage.used),
            "fair_share": shares[ns],
        }
        for ns, usage in usage_by_ns.items()
    }
    return {
        "parent": config.parent,
        "is_parent": config.is_parent,
        "orphan": not node.connected,
        "min": _config_rl(config.min),
        "max": _config_rl(config.max),
        "effective_min": numbers(node, "effective_min"),
        "shared_weight": _config_rl(config.shared_weight),
        "allow_lent": config.allow_lent,
        "lending_limit": _config_rl(config.lending_limit),
        "borrowing_limit": _config_rl(config.borrowing_limit),
        "request": numbers(node, "request"),
        "limited_request": numbers(node, "limited_request"),
        "used": numbers(node, "used"),
        "runtime": runtime,
        "available": sparse(reported_available(state, name, memo, numbers)),
        "pods": sorted(node.pods),
        "children": sorted(state.children(name)),
        "namespaces": namespaces,
    }


class _SettledNumbers:
    """Every quota's numbers read at once, field by field, as the sparse
    dicts ``QuotaNode`` builds one at a time (the state must stay unchanged
    while this is used: it is for one reading of a settled state)."""

    def __init__(self, state: ProjectedState) -> None:
        self.store = state.columns
        self.fields: dict[str, list[RL]] = {}

    def __call__(self, node: QuotaNode, field: str) -> RL:
        if node.store is not self.store:
            return {}
        rows = self.fields.get(field)
        if rows is None:
            rows = self.fields[field] = self.store.read_rows(field)
        return rows[node.row]


def _body(state: ProjectedState) -> dict[str, Any]:
    settle(state)
    memo: dict[str, RL] = {}
    numbers = _SettledNumbers(state)
    return {
        "cluster": cluster_view(state),
        "quotas": {
            name: _quota_view(
                state, name, memo, numbers, namespace_usage(state, state.quotas[name])
            )
            for name in sorted(state.quotas)
        },
        "preemptions": preemptions_view(state),
    }


def cluster_view(state: ProjectedState) -> dict[str, RL]:
    """The state JSON's ``cluster`` (DESIGN §7; call after ``settle``)."""
    return {
        "allocatable": sparse(state.allocatable),
        "system_used": sparse(state.quotas[SYSTEM].used),
        "default_used": sparse(state.quotas[DEFAULT].used),
        "total": sparse(state.cluster_total),
    }


def preemptions_view(state: ProjectedState) -> dict[str, dict[str, Any]]:
    """The state JSON's ``preemptions``: each queue with a deadline or a
    running preemption (DESIGN §7)."""
    queues = sorted(set(state.decrease_deadlines) | set(state.occupied))
    return {
        queue: {
            "deadline": (
                rfc3339(state.decrease_deadlines[queue])
                if queue in state.decrease_deadlines
                else None
            ),
            "running": state.occupied.get(queue),
        }
        for queue in queues
    }


def state_json(state: ProjectedState) -> dict[str, Any]:
    """The whole state JSON of DESIGN §7."""
    body = _body(state)
    return {
        "offset": state.offset,
        "time": rfc3339(state.ts),
        "hash": state_hash(state),
        **body,
        "rejected": [
            {"offset": item.offset, "kind": item.kind, "reason": item.reason}
            for item in state.rejected
        ],
    }
