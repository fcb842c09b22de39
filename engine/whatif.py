"""What-if: fork the state at a point of a ledger, apply hypothetical facts, and
simulate what the reconcilers would evict (DESIGN §7 ``whatif``).

Nothing is written anywhere: the forked state is a copy (snapshot ``dump`` and
``load``) run by a :class:`~quotaledger.engine.simulate.Simulation` on a
virtual clock from the fork time to fork time + horizon, with the simulate
executor (every eviction succeeds at once). The same fork is also run *without*
the changes, so each eviction says whether it would happen anyway.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from quotaledger.events.codec import decode_event, to_builtins
from quotaledger.events.model import (
    EvictionRequested,
    PreemptionFinished,
    PreemptionStarted,
    is_fact,
    kind_of,
)
from quotaledger.events.times import MAX_DELAY_S, rfc3339
from quotaledger.projections import ProjectedState, Projection, state_json
from quotaledger.projections.snapshot import dump, load

from .render import amounts
from .simulate import Simulation

#: Default horizon: one hour.
DEFAULT_HORIZON_MS = 3_600_000

#: The longest horizon: ten years, the bound of every delay (DESIGN §9), so
#: fork time + horizon is always a valid time.
MAX_HORIZON_MS = MAX_DELAY_S * 1000

_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")


def parse_duration(text: str, option: str = "duration") -> int:
    """``90s``, ``30m``, ``2h``, ``1d``, ``1h30m``, ``500ms``, or bare seconds -> ms.

    Exact (no float): a negative duration, or one above :data:`MAX_HORIZON_MS`
    (ten years), is a ValueError naming ``option``.
    """
    spec = text.strip().lower()
    if spec.startswith("-"):
        raise ValueError(f"{option} {text}: must not be negative")
    total = Fraction(0)
    if re.fullmatch(r"\d+(?:\.\d+)?", spec, flags=re.ASCII):
        total = Fraction(spec) * 1000
    else:
        pos = 0
        for match in _PART.finditer(spec):
            if match.start() != pos:
                break
            total += Fraction(match[1]) * _UNITS_MS[match[2]]
            pos = match.end()
        if not spec or pos != len(spec):
            raise ValueError(
                f"{option} {text!r}: expected a number with a unit (ms, s, m, h, d),"
                " e.g. 90s, 30m, 2h, 1d, 1h30m"
            )
    if total > MAX_HORIZON_MS:
        raise ValueError(f"{option} {text}: at most 3650d (ten years)")
    return round(total)


class ChangeError(ValueError):
    """A hypothetical change that is not a fact."""


@dataclass(slots=True)
class Run:
    """One forked simulation and what it evicted."""

    simulation: Simulation
    evictions: list[dict[str, Any]] = field(default_factory=list)
    preemptions: list[dict[str, Any]] = field(default_factory=list)


def _fork(blob: bytes, ledger_id: str) -> Simulation:
    simulation = Simulation(ledger_id=ledger_id, projection=Projection(load(blob)))
    # The fork speaks as the newest leader of the state it forks: a ledger a live
    # engine wrote holds a LeaderElected epoch, and epoch-0 proposals would be fenced.
    simulation.core.epoch = simulation.projection.state.leader_epoch
    return simulation


def _collect(simulation: Simulation) -> Run:
    run = Run(simulation)
    started: dict[str, dict[str, Any]] = {}
    for record, event in simulation.decisions:
        at = rfc3339(record.ts)
        if isinstance(event, PreemptionStarted):
            item: dict[str, Any] = {
                "preemption_id": event.preemption_id,
                "queue": event.queue,
                "cause": event.cause,
                "target": dict(event.target),
                "at": at,
                "offset": record.offset,
                "outcome": None,
                "claimed": None,
                "finished_at": None,
                "reason": None,
            }
            started[event.preemption_id] = item
            run.preemptions.append(item)
        elif isinstance(event, EvictionRequested):
            cause = started.get(event.preemption_id, {}).get("cause")
            run.evictions.append(
                {
                    "queue": event.queue,
                    "pod_uid": event.pod_uid,
                    "at": at,
                    "cause": cause if cause is not None else event.explain.get("rule"),
                    "preemption_id": event.preemption_id,
                    "offset": record.offset,
                    "explain": dict(event.explain),
                }
            )
        elif isinstance(event, PreemptionFinished) and event.preemption_id in started:
            started[event.preemption_id].update(
                outcome=event.outcome,
                claimed=dict(event.claimed),
                finished_at=at,
                reason=event.reason,
            )
    return run


def whatif(
    state: ProjectedState,
    changes: Iterable[tuple[int, bytes]],
    *,
    at: int | None = None,
    horizon_ms: int = DEFAULT_HORIZON_MS,
) -> dict[str, Any]:
    """Fork ``state`` (left untouched) at ``at`` (default: its ts), apply the
    ``(ts, payload)`` facts of ``changes`` — each at ``max(ts, at)`` — run the
    reconcilers until ``at + horizon_ms``, and report what they evicted.

    Raises :class:`ChangeError` for a change that is not a fact.
    """
    fork_ts = state.ts if at is None else max(at, state.ts)
    end = fork_ts + horizon_ms
    lines: list[tuple[int, bytes]] = []
    for number, (ts, payload) in enumerate(changes, start=1):
        event = decode_event(payload)
        if not is_fact(event):
            raise ChangeError(
                f"change {number}: {kind_of(event)} is a decision; a what-if applies facts only"
            )
        lines.append((max(ts, fork_ts), payload))
    blob = dump(state)
    ledger_id = state.ledger_id or "whatif"
    changed = _fork(blob, ledger_id)
    baseline = _fork(blob, ledger_id)
    # Start both clocks at the fork time: timers due before it fire there.
    changed.run(lines, until=end)
    baseline.run([], until=end)
    result = _collect(changed)
    anyway = {item["pod_uid"] for item in _collect(baseline).evictions}
    for item in result.evictions:
        item["without_change"] = item["pod_uid"] in anyway
    final = changed.projection.state
    rejected = [
        {"offset": r.offset, "kind": r.kind, "reason": r.reason}
        for r in final.rejected
        if r.offset > state.offset
    ]
    pending = [
        {
            "queue": timer.queue,
            "cause": timer.cause,
            "deadline": rfc3339(timer.deadline),
            **({"pod_uid": timer.pod_uid} if timer.pod_uid else {}),
        }
        for timer in changed.core.pending()
        if timer.deadline > end
    ]
    notes = []
    if final.decrease_deadlines and not final.settings.quota_preemption_enabled:
        queues = ", ".join(sorted(final.decrease_deadlines))
        notes.append(
            f"quota-decrease timers are armed ({queues}) but quota_preemption_enabled is false:"
            " they never fire (§8 rule 19)"
        )
    return {
        "at": rfc3339(fork_ts),
        "offset": state.offset,
        "horizon_s": horizon_ms // 1000 if horizon_ms % 1000 == 0 else horizon_ms / 1000,
        "until": rfc3339(end),
        "changes": len(lines),
        "evictions": result.evictions,
        "preemptions": result.preemptions,
        "pending": pending,
        "notes": notes,
        "rejected": rejected,
        "decisions": [
            {**to_builtins(event), "offset": record.offset, "at": rfc3339(record.ts)}
            for record, event in changed.decisions
        ],
        "state": state_json(final),
    }


def _duration_words(ms: int) -> str:
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


def whatif_text(result: dict[str, Any]) -> str:
    """The evictions per queue and pod, in words."""
    horizon = _duration_words(round(result["horizon_s"] * 1000))
    lines = [
        f"what if: forked after offset {result['offset']} at {result['at']},"
        f" {result['changes']} change(s), horizon {horizon} (until {result['until']})"
    ]
    for item in result["rejected"]:
        lines.append(f"  change refused at #{item['offset']} ({item['kind']}): {item['reason']}")
    evictions = result["evictions"]
    by_queue: dict[str, list[dict[str, Any]]] = {}
    for item in evictions:
        by_queue.setdefault(item["queue"], []).append(item)
    for queue in sorted(by_queue):
        lines.append(f"{queue}: {len(by_queue[queue])} eviction(s)")
        for item in by_queue[queue]:
            anyway = "  (also without the change)" if item["without_change"] else ""
            explain = item.get("explain", {})
            lines.append(
                f"  {item['pod_uid']}  at {item['at']}  {item['cause']}"
                f" rank {explain.get('rank')}  preemption {item['preemption_id']}{anyway}"
            )
    for item in result["preemptions"]:
        outcome = item["outcome"] or "still running"
        claimed = f" claimed {amounts(item['claimed'])}" if item["claimed"] else ""
        reason = f" ({item['reason']})" if item["reason"] else ""
        lines.append(
            f"preemption {item['preemption_id']} at {item['at']}: {item['cause']} on"
            f" {item['queue']} target {amounts(item['target'])} -> {outcome}{claimed}{reason}"
        )
    for item in result["pending"]:
        who = f" for pod {item['pod_uid']}" if item.get("pod_uid") else ""
        lines.append(
            f"still armed after the horizon: {item['cause']} on {item['queue']}{who},"
            f" due {item['deadline']}"
        )
    lines.extend(f"note: {note}" for note in result["notes"])
    caused = sum(1 for item in evictions if not item["without_change"])
    lines.append(
        f"{len(evictions)} eviction(s) in {len(by_queue)} queue(s) within the horizon;"
        f" {caused} caused by the change"
    )
    return "\n".join(lines)
