"""Decisions re-derived on their basis (DESIGN §7 audit; DECISIONS 13, 210): the state a
``ClocksObserved`` or ``PreemptionStarted`` names as its ``basis``, given by the lagging fold
(:mod:`.lagging`), checked with the rules of :mod:`.checks` and explained in
:mod:`.report`'s words.

* ``ClocksObserved`` — every clock it starts owes (starves) at the basis, every clock it
  stops does not: the clocks that justify revoke and reclaim deadlines;
* ``PreemptionStarted`` — a timer of its cause was armed for the queue and due at the
  decision's ts, the queue was free, and the plan the reconcilers' pure functions compute
  there (:mod:`quotaledger.projections.plans`) has the recorded target; the plan is handed
  back for the evictions and the finish that follow (:mod:`.decisions` keeps it).

Pure apart from the records the lagging fold reads: no clock, no writes.
"""

from __future__ import annotations

from quotaledger.events.ledger import Record
from quotaledger.events.model import ClocksObserved, PreemptionStarted
from quotaledger.projections.plans import Plan
from quotaledger.projections.settle import settle

from .checks import clock_problems, due_timer, plan_for
from .findings import Finding, Problem
from .lagging import LaggingFold
from .report import clocks_words, rl, why_decrease, why_overuse, why_reclaim


def clocks_finding(
    record: Record, event: ClocksObserved, head: str, lagging: LaggingFold
) -> Finding:
    """Every clock started must owe (starve) at the basis, every stopped one not
    (DECISIONS 13): the clocks that justify revoke and reclaim deadlines."""
    finding = Finding(record.offset, record.ts, "ClocksObserved")
    finding.explanation, finding.summary = clocks_words(event, head)
    basis = event.basis
    if not 0 <= basis < record.offset:
        finding.problems.append(
            Problem("basis-not-before", {"basis": basis, "offset": record.offset, "what": "one"})
        )
        return finding
    state = lagging.at(basis)
    settle(state)
    finding.problems += clock_problems(state, event)
    return finding


def started_finding(
    record: Record, event: PreemptionStarted, head: str, lagging: LaggingFold
) -> tuple[Finding, Plan | None]:
    """A preemption re-derived on its basis: a timer of its cause armed for the queue and
    due at its ts, the queue free, the plan's target the recorded one; with the plan the
    rule gives there (None: no plan, the problem said)."""
    finding = Finding(
        record.offset,
        record.ts,
        "PreemptionStarted",
        queue=event.queue,
        preemption_id=event.preemption_id,
        pod_uid=event.pod_uid,
    )
    basis = event.basis
    recorded = f"target {rl(event.target)}, basis #{basis}"
    if not 0 <= basis < record.offset:
        finding.explanation = f"{head} {event.cause} preemption on {event.queue}: {recorded}."
        finding.problems.append(
            Problem(
                "basis-not-before",
                {"basis": basis, "offset": record.offset, "what": "decision"},
            )
        )
        return finding, None
    state = lagging.at(basis)
    if event.queue not in state.quotas:
        finding.explanation = f"{head} {event.cause} preemption on {event.queue}: {recorded}."
        finding.problems.append(Problem("unknown-quota", {"queue": event.queue, "basis": basis}))
        return finding, None
    timer, problem = due_timer(state, event, record.ts)
    if problem is not None:
        finding.problems.append(problem)
    holder = state.occupied.get(event.queue)
    if holder is not None:
        finding.problems.append(
            Problem("occupied", {"queue": event.queue, "holder": holder, "basis": basis})
        )
    plan = plan_for(state, event, timer)
    if event.cause == "quota-decrease":
        why = why_decrease(state, event, timer)
    elif event.cause == "overuse":
        why = why_overuse(state, event, timer)
    elif event.cause == "reclaim":
        why = why_reclaim(state, event, timer)
    else:
        why = f"{recorded}."
    finding.explanation = (
        f"{head} {event.cause} preemption {event.preemption_id} on {event.queue}"
        f" (from the facts through #{basis}): {why}"
    )
    if plan is None:
        if event.cause == "overuse":
            finding.problems.append(Problem("nothing-owed", {"queue": event.queue, "basis": basis}))
        else:
            finding.problems.append(Problem("empty-target", {"basis": basis}))
    elif plan.target != event.target:
        finding.problems.append(
            Problem("target-differs", {"recorded": dict(event.target), "derived": plan.target})
        )
    if plan is not None:
        if plan.victims:
            names = ", ".join(v.pod_uid for v in plan.victims)
            finding.explanation += f" The rule picks {len(plan.victims)} victim(s): {names}."
        else:
            finding.explanation += f" No victim is possible: {plan.reason}."
    return finding, plan
