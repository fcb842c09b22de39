"""The rules a decision is checked against, each on one state (DESIGN §7 audit;
DECISIONS 13, 210, 211).

The auditor (:mod:`.decisions`) picks the state (a decision's basis, or the
fold just before its record) and keeps what spans records (the plan a
preemption was re-derived with, the pods it requested since); the checks here
read that one state and the decision and return what is wrong, as
:class:`~.findings.Problem` codes:

* what triggers a preemption: the clocks a ``ClocksObserved`` starts and stops
  (:func:`clock_problems`; the owing clock + ``revoke_after_s`` and a starving
  pod's clock + ``reclaim_after_s`` are the overuse and reclaim deadlines) and
  the timer a ``PreemptionStarted`` answers, with the engine's own list of armed
  timers (:func:`quotaledger.engine.core.timers`): on its basis
  (:func:`due_timer`, :func:`why_no_timer`) and where it lands
  (:func:`landing_problems`: still armed and due, the id never started before;
  what the projection's guard requires, so a problem there on an accepted
  decision is one the guard should have refused);
* what it does: the plan the engine computes for the timer (:func:`plan_for`)
  and each ``EvictionRequested`` against the plan's victims (:func:`check_victim`).

Pure functions of a state and the decision; no I/O.
"""

from __future__ import annotations

from collections.abc import Container

from quotaledger.events.ledger import Record
from quotaledger.events.model import ClocksObserved, EvictionRequested, PreemptionStarted
from quotaledger.projections import Projection
from quotaledger.projections.clocks import free_capacity, is_owing, is_starving
from quotaledger.projections.plans import Plan, Victim, comparable_explain, decrease_target
from quotaledger.projections.state import ProjectedState

from ..core import EngineCore, Timer, timers
from .findings import Problem


def clock_problems(state: ProjectedState, event: ClocksObserved) -> list[Problem]:
    """Every clock the sample starts must owe (starve) in ``state``, its basis
    (settled), and every clock it stops must not (DECISIONS 13): the clocks that
    justify revoke and reclaim deadlines."""
    problems: list[Problem] = []
    basis = event.basis
    free = free_capacity(state)

    def owes(name: str) -> bool:
        node = state.quotas.get(name)
        return node is not None and is_owing(node)

    def starves(uid: str) -> bool:
        return uid in state.pending_pods and is_starving(state, uid, free)

    for name in sorted(event.owing_started):
        if not owes(name):
            problems.append(Problem("did-not-owe", {"name": name, "basis": basis}))
    for name in event.owing_stopped:
        if owes(name):
            problems.append(Problem("still-owed", {"name": name, "basis": basis}))
    for uid in sorted(event.starving_started):
        if not starves(uid):
            problems.append(Problem("not-starving", {"uid": uid, "basis": basis}))
    for uid in event.starving_stopped:
        if starves(uid):
            problems.append(Problem("still-starving", {"uid": uid, "basis": basis}))
    return problems


def armed_for(state: ProjectedState, event: PreemptionStarted) -> list[Timer]:
    """The timers armed in ``state`` that the decision may answer: its cause and
    queue (and, for reclaim, its pod), in the engine's order."""
    return [
        timer
        for timer in timers(state)
        if timer.cause == event.cause
        and timer.queue == event.queue
        and (event.cause != "reclaim" or timer.pod_uid == (event.pod_uid or ""))
    ]


def why_no_timer(state: ProjectedState, event: PreemptionStarted) -> Problem:
    """``no-timer``, with the reason no timer of the decision's cause is armed."""
    settings = state.settings
    queue = event.queue
    reason = "not-armed"
    if event.cause == "quota-decrease":
        if not settings.quota_preemption_enabled:
            reason = "quota-preemption-disabled"
    elif event.cause == "overuse":
        if not settings.revoke_enabled:
            reason = "revoke-disabled"
        elif queue in state.owing_held:
            reason = "owing-held"
        else:
            reason = "not-owing"
    elif event.cause == "reclaim" and not settings.reclaim_enabled:
        reason = "reclaim-disabled"
    return Problem(
        "no-timer",
        {"reason": reason, "queue": queue, "cause": event.cause, "basis": event.basis},
    )


def due_timer(
    state: ProjectedState, event: PreemptionStarted, ts: int
) -> tuple[Timer | None, Problem | None]:
    """The armed timer that justifies the decision on its basis ``state`` (None when
    there is none) and the problem with it, if any (``no-timer``; ``early``: its
    deadline is after the decision's ``ts``)."""
    matching = armed_for(state, event)
    if not matching:
        return None, why_no_timer(state, event)
    timer = matching[0]
    if timer.deadline > ts:
        return timer, Problem("early", {"ts": ts, "deadline": timer.deadline})
    return timer, None


def landing_problems(
    state: ProjectedState, record: Record, event: PreemptionStarted, started: Container[str]
) -> list[Problem]:
    """What is wrong where the decision lands (``state``: the fold just before its
    ``record``): its id among the ids ``started`` before (``id-reused``), or the
    timer it answers gone (``trigger-gone``: not armed, not yet due, or a
    quota-decrease deadline the fold disarms at this very record, DECISIONS 211)."""
    problems: list[Problem] = []
    where = {"offset": record.offset, "cause": event.cause, "queue": event.queue}
    if event.preemption_id in started:
        problems.append(Problem("id-reused", {**where, "id": event.preemption_id}))
    if event.queue not in state.quotas:
        return problems  # the basis check names the unknown quota
    matching = armed_for(state, event)
    if not matching:
        reason = why_no_timer(state, event).data["reason"]
        problems.append(Problem("trigger-gone", {**where, "reason": reason}))
    elif matching[0].deadline > record.ts:
        data = {**where, "reason": "early", "deadline": matching[0].deadline}
        problems.append(Problem("trigger-gone", {**data, "ts": record.ts}))
    elif (
        event.cause == "quota-decrease"
        and matching[0].deadline < record.ts
        and record.ts > state.ts
        and event.queue not in state.occupied
        and not decrease_target(state, event.queue)
    ):
        # §8 rule 21 (DECISIONS 14): this record is the first after the
        # deadline and the target is empty: the fold disarms it right here
        problems.append(Problem("trigger-gone", {**where, "reason": "empty-target"}))
    return problems


def plan_for(state: ProjectedState, event: PreemptionStarted, timer: Timer | None) -> Plan | None:
    """The plan the engine computes for ``timer`` on the basis ``state`` (with no
    timer armed, for one of the decision's cause, queue and pod)."""
    if timer is None:
        timer = Timer(
            deadline=0,
            cause_rank=0,
            depth_rank=0,
            queue=event.queue,
            pod_uid=event.pod_uid or "",
            cause=event.cause,
        )
    return EngineCore(Projection(state)).plan(timer)


def check_victim(
    event: EvictionRequested, victims: list[Victim], index: int
) -> tuple[Victim | None, list[Problem]]:
    """The ``index``-th eviction a preemption requested against its plan's
    ``victims``: the victim it is (None: not one, or not the one the rule picks
    there) and what differs (the pod, its order, its queue, its explain)."""
    problems: list[Problem] = []
    order = [v.pod_uid for v in victims]
    pod = event.pod_uid
    if index >= len(victims):
        if pod not in order:
            problems.append(Problem("not-a-victim", {"pod": pod, "order": order}))
        else:
            problems.append(Problem("requested-twice", {"pod": pod}))
        return None, problems
    victim = victims[index]
    if victim.pod_uid != pod:
        chosen = next((v for v in victims if v.pod_uid == pod), None)
        data = {"pod": pod, "index": index, "victim": victim.pod_uid, "order": order}
        if chosen is None:
            data["victim_explain"] = dict(victim.explain)
            problems.append(Problem("not-chosen", data))
            return None, problems
        problems.append(Problem("out-of-order", data))
        return chosen, problems
    if victim.queue != event.queue:
        problems.append(
            Problem("queue-differs", {"recorded": event.queue, "pod": pod, "queue": victim.queue})
        )
    recorded, derived = comparable_explain(event.explain), comparable_explain(victim.explain)
    if event.explain and recorded != derived:
        differing = sorted(
            key for key in set(recorded) | set(derived) if recorded.get(key) != derived.get(key)
        )
        problems.append(Problem("explain-differs", {"keys": differing}))
    return victim, problems
