"""The wording of ``audit``: findings rendered as text or JSON (DESIGN §7).

:mod:`quotaledger.engine.audit.decisions` decides (which decisions are justified, which
digests match) and records :class:`~quotaledger.engine.audit.findings.Problem`
codes with their numbers; this module says it in words. The explanations
(``why_*``) read the numbers of the state a decision was computed from.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from quotaledger.events.model import ClocksObserved, PodUpserted, PreemptionStarted
from quotaledger.events.quantity import format_amount
from quotaledger.events.times import rfc3339
from quotaledger.projections.clocks import owed, sampled
from quotaledger.projections.guard import delay_ms
from quotaledger.projections.plans import created_text
from quotaledger.projections.state import ProjectedState

from ..core import Timer
from ..render import amounts
from .findings import AuditReport, DigestCheck, Finding, Problem

# ----------------------------------------------------------------- words


def num(resource: str, amount: int) -> str:
    """An amount without its resource name: ``80Gi``, ``1.5``, ``500m``."""
    return format_amount(resource, amount).removesuffix(f" {resource}")


#: Names listed in a text line before "and N more".
FIRST_FEW = 5


def first_few(names: list[str]) -> str:
    """``a, b, c, d, e and 3,412 more (3,417 in all)`` for a long list; the whole short one."""
    if len(names) <= FIRST_FEW:
        return ", ".join(names)
    return (
        ", ".join(names[:FIRST_FEW])
        + f" and {len(names) - FIRST_FEW:,} more ({len(names):,} in all)"
    )


def clocks_words(event: ClocksObserved, head: str) -> tuple[str, str | None]:
    """The explanation of a clock sample, and a summary when that is long."""
    parts: list[str] = []
    short: list[str] = []
    for label, started, stopped in (
        ("owing", event.owing_started, event.owing_stopped),
        ("starving", event.starving_started, event.starving_stopped),
    ):
        if started:
            names = [f"{k} (since {rfc3339(v)})" for k, v in sorted(started.items())]
            parts.append(f"{label} from now: " + ", ".join(names))
            short.append(f"{label} from now: " + first_few(names))
        if stopped:
            parts.append(f"{label} no more: " + ", ".join(sorted(stopped)))
            short.append(f"{label} no more: " + first_few(sorted(stopped)))
    lead = f"{head} clocks sampled at basis #{event.basis}: "
    if not parts:
        # the engine's clock read past a deadline (DECISIONS 210)
        return lead + "no clock started or stopped", None
    if short == parts:
        return lead + "; ".join(parts), None
    return lead + "; ".join(parts), lead + "; ".join(short) + " (audit --json lists all)"


def rl(values: Mapping[str, int] | None) -> str:
    return amounts(dict(values) if values is not None else None, unlimited="unlimited")


def seconds(ms: int) -> str:
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms / 1000:g}s"


def sort_words(explain: Mapping[str, Any]) -> str:
    key = explain.get("sort_key") or {}
    created = key.get("created_at")
    parts = []
    if "originator" in key:
        parts.append("originator" if key["originator"] else "non-originator")
    if "common_ancestor_depth" in key:
        parts.append(f"common ancestor at depth {key['common_ancestor_depth']}")
    parts.append(f"priority {key.get('priority', 0)}")
    if "allow_preemption" in key:
        parts.append(
            "allows preemption" if key["allow_preemption"] else "does not allow preemption"
        )
    if isinstance(created, str) and created.endswith("+00:00"):
        created = created.removesuffix("+00:00") + "Z"
    parts.append(f"created {created}" if created else "no created_at (counts as oldest)")
    return ", ".join(parts)


def pod_words(pod: PodUpserted) -> str:
    created = created_text(pod)
    return sort_words(
        {
            "sort_key": {
                "originator": pod.originator,
                "priority": pod.priority,
                "allow_preemption": pod.allow_preemption,
                "created_at": created,
            }
        }
    )


def explain_words(explain: Mapping[str, Any]) -> str:
    """An eviction's ``explain`` in words: rule, rank and order, the numbers."""
    rule = str(explain.get("rule", "?"))
    words = [
        f"rule {rule}, rank {explain.get('rank')} in the order {RULE_ORDER.get(rule, '?')}"
        f" — {sort_words(explain)}"
    ]
    queue = explain.get("queue")
    leaf = explain.get("leaf")
    split = leaf is not None and leaf != queue
    own = f"{leaf} " if split else ""
    numbers = [f"{own}used {rl(explain.get('used'))}"]
    if "runtime" in explain:
        numbers.append(f"runtime {rl(explain.get('runtime'))}")
    if "guaranteed" in explain:
        numbers.append(f"{own}guaranteed {rl(explain.get('guaranteed'))}")
    if "max" in explain:
        numbers.append(
            f"{queue}'s max {rl(explain.get('max'))}" if split else f"max {rl(explain.get('max'))}"
        )
    if "owed" in explain:
        numbers.append(f"owed {rl(explain.get('owed'))}")
    words.append(", ".join(numbers))
    target = f"target {rl(explain.get('target'))}"
    if split:
        target = f"{leaf}'s share of {queue}'s {target}"
    if "for_pod" in explain:
        target += f" for starving pod {explain['for_pod']} in {explain.get('for_queue')}"
    words.append(target)
    return "; ".join(words)


RULE_ORDER = {
    "quota-decrease": "non-originator first, lower priority, allow_preemption first, younger, uid",
    "reclaim": "owing quotas nearest the starving pod first (deeper common ancestor), lower"
    " priority, later start, uid; each owing quota gives at most what it owed",
    "overuse": "least important first (lower priority, later start, uid); the most important"
    " removed pods that still fit under runtime are added back",
}


# ----------------------------------------------------------------- explanations


def why_decrease(state: ProjectedState, event: PreemptionStarted, timer: Timer | None) -> str:
    node = state.quotas[event.queue]
    config = node.config
    cap = config.max or {}
    keys = sorted(set(event.target) | {k for k in cap if node.used.get(k, 0) > cap[k]})
    parts = []
    over = [k for k in keys if k in cap]
    if over:
        exceeded = "; ".join(
            f"used {k} {num(k, node.used.get(k, 0))} exceeded max {num(k, cap[k])}" for k in over
        )
        parts.append(exceeded)
    delay = delay_ms(config)
    if timer is not None:
        parts.append(
            f"since the change at {rfc3339(timer.deadline - delay)} + delay"
            f" {seconds(delay)} (due {rfc3339(timer.deadline)})"
        )
    guaranteed = rl(config.min) if config.min else "nothing"
    parts.append(f"guaranteed {guaranteed}")
    clamps = []
    for k, value in event.target.items():
        raw = node.used.get(k, 0) - cap.get(k, 0)
        if k in cap and value < raw:
            clamps.append(f"{k} {num(k, raw)} over max, but only {num(k, value)} above a min")
    if clamps:
        parts.append("limited by the guarantee: " + "; ".join(clamps))
    parts.append(f"target {rl(event.target)}")
    if config.is_parent:
        parts.append("split among the children by releasable usage (used above min)")
    return "; ".join(parts) + "."


def why_overuse(state: ProjectedState, event: PreemptionStarted, timer: Timer | None) -> str:
    node = state.quotas[event.queue]
    gap = owed(node)
    keys = sorted(gap) or sorted(event.target)
    cap = node.config.max
    held = ", ".join(
        f"{k} {num(k, min(node.used.get(k, 0), (cap or {}).get(k, node.used.get(k, 0))))}"
        for k in keys
    )
    parts = [
        f"held {held} (min of used and max) above its runtime"
        f" {', '.join(f'{k} {num(k, node.runtime.get(k, 0))}' for k in keys)}"
        f" (used {rl(node.used)}, max {rl(cap)}, guaranteed {rl(node.config.min)})"
    ]
    since = sampled(state).get(event.queue)
    after = round(state.settings.revoke_after_s * 1000)
    if since is not None and timer is not None:
        parts.append(
            f"owing continuously since {rfc3339(since)}, longer than revoke_after"
            f" {seconds(after)} (due {rfc3339(since + after)})"
        )
    parts.append(f"target used − runtime = {rl(event.target)}")
    return "; ".join(parts) + "."


def why_reclaim(state: ProjectedState, event: PreemptionStarted, timer: Timer | None) -> str:
    uid = event.pod_uid or "?"
    pod = state.pods.get(uid)
    parts = [f"pod {uid} in {event.queue} is starving"]
    if pod is not None:
        node = state.quotas[event.queue]
        parts[0] += (
            f": pending, requests {rl(pod.requests)}, which fits {event.queue}'s runtime"
            f" {rl(node.runtime)} (used {rl(node.used)}) but not the cluster's free"
            " capacity"
        )
    after = round(state.settings.reclaim_after_s * 1000)
    if timer is not None:
        parts.append(
            f"starving continuously since {rfc3339(timer.deadline - after)}, longer than"
            f" reclaim_after {seconds(after)} (due {rfc3339(timer.deadline)})"
        )
    parts.append(f"target request − free = {rl(event.target)}")
    parts.append("taken from owing quotas, nearest in the tree first")
    return "; ".join(parts) + "."


# ----------------------------------------------------------------- problems


def _at(data: Mapping[str, Any]) -> str:
    return f"at basis #{data['basis']}"


def _no_timer(d: Mapping[str, Any]) -> str:
    reason, queue, at = d["reason"], d["queue"], _at(d)
    if reason == "quota-preemption-disabled":
        return f"quota_preemption_enabled was false {at} (§8 rule 19)"
    if reason == "revoke-disabled":
        return f"revoke_enabled was false {at}"
    if reason == "owing-held":
        return (
            f"{queue}'s overuse clock was held after its last revoke {at}"
            " (§8 rule 29: it restarts with the next fact)"
        )
    if reason == "not-owing":
        return f"{queue} was not owing {at}"
    if reason == "reclaim-disabled":
        return f"reclaim_enabled was false {at}"
    return f"no {d['cause']} timer was armed for {queue} {at}"


def _trigger_gone(d: Mapping[str, Any]) -> str:
    """Where a ``PreemptionStarted`` lands, its timer no longer holds (DECISIONS 211)."""
    reason, queue, cause = d["reason"], d["queue"], d["cause"]
    where = f"where it lands (#{d['offset']})"
    if reason == "early":
        return (
            f"{where} {queue}'s {cause} deadline is {rfc3339(d['deadline'])},"
            f" after the decision's ts {rfc3339(d['ts'])}"
        )
    if reason == "empty-target":
        return (
            f"{where} {queue}'s passed deadline had an empty target, so this first record"
            " after it disarms it (§8 rule 21)"
        )
    why = _no_timer({**d, "basis": d["offset"]}).replace(f"at basis #{d['offset']}", where)
    return why + ": the trigger was answered or gone before this decision"


def _changed(d: Mapping[str, Any]) -> str:
    first, last = d["first"], d["last"]
    if first == last:
        where = f"record {first} was changed"
    else:
        where = f"at least one of records {first}..{last} was changed"
    text = (
        f"the records 0..{d['through']} digest to {d['actual']}, not {d['recorded']}:"
        f" {where} after this digest was taken"
    )
    if d.get("consistent_after") is not None:
        text += (
            f" (records {d['consistent_after'] + 1}..{d['through']} match the digest recorded"
            f" for {d['consistent_after']}: the change is the one reported there)"
        )
    return text


PROBLEM_WORDS: dict[str, Callable[[Mapping[str, Any]], str]] = {
    "basis-not-before": lambda d: (
        f"basis #{d['basis']} is not a record before this {d['what']} (#{d['offset']})"
    ),
    "did-not-owe": lambda d: f"{d['name']} did not owe {_at(d)}",
    "still-owed": lambda d: f"{d['name']} still owed {_at(d)}",
    "not-starving": lambda d: f"pod {d['uid']} was not starving {_at(d)}",
    "still-starving": lambda d: f"pod {d['uid']} was still starving {_at(d)}",
    "unknown-quota": lambda d: f"quota {d['queue']!r} did not exist {_at(d)}",
    "no-timer": _no_timer,
    "trigger-gone": _trigger_gone,
    "id-reused": lambda d: f"preemption id {d['id']} was already started before #{d['offset']}",
    "early": lambda d: f"fired at {rfc3339(d['ts'])}, before its deadline {rfc3339(d['deadline'])}",
    "occupied": lambda d: (
        f"{d['queue']} was occupied by preemption {d['holder']} {_at(d)}"
        " (§8 rule 34: a timer waits for the running preemption)"
    ),
    "nothing-owed": lambda d: f"{d['queue']} did not owe anything {_at(d)}: nothing to revoke",
    "empty-target": lambda d: (
        f"the facts through #{d['basis']} give an empty target: nothing to preempt"
        " (§8 rule 21 records nothing)"
    ),
    "target-differs": lambda d: (
        f"recorded target {rl(d['recorded'])} differs from the re-derived {rl(d['derived'])}"
    ),
    "not-a-victim": lambda d: (
        f"the rule chooses {len(d['order'])} victim(s) ({', '.join(d['order']) or 'none'});"
        f" this eviction of {d['pod']} is not one of them"
    ),
    "requested-twice": lambda d: f"{d['pod']} was requested more than once",
    "not-chosen": lambda d: (
        f"names {d['pod']}, which the rule does not choose; victim #{d['index'] + 1} is"
        f" {d['victim']} (rank {d['victim_explain'].get('rank')}:"
        f" {sort_words(d['victim_explain'])}); the rule's victims: {', '.join(d['order'])}"
    ),
    "out-of-order": lambda d: (
        f"{d['pod']} is requested out of order: victim #{d['index'] + 1} is {d['victim']};"
        f" the rule's order: {', '.join(d['order'])}"
    ),
    "queue-differs": lambda d: f"records queue {d['recorded']}, but {d['pod']} is in {d['queue']}",
    "explain-differs": lambda d: (
        "recorded explain differs from the re-derived numbers in: " + ", ".join(d["keys"])
    ),
    "finished-early": lambda d: (
        "finished while the eviction of " + ", ".join(d["waiting"]) + " had no outcome yet"
    ),
    "never-requested": lambda d: (
        "the rule's victim(s) " + ", ".join(d["missing"]) + " were never requested"
    ),
    "outcome-differs": lambda d: (
        f"outcome {d['recorded']} does not follow from the evictions' outcomes:"
        f" §8 rule 26 gives {d['derived']}"
    ),
    "claimed-differs": lambda d: (
        f"claimed {rl(d['recorded'])}, but the successful evictions release {rl(d['derived'])}"
    ),
    "digest-mismatch": _changed,
    "state-hash-mismatch": lambda d: (
        f"the state after record {d['through']} hashes to {d['actual']}, not {d['recorded']}"
    ),
    "through-not-before": lambda d: (
        f"through #{d['through']} is not a record before this one (#{d['offset']})"
    ),
    "beyond-end": lambda d: (
        f"the ledger ends at offset {d['last']}, so record {d['through']} is missing:"
        " records were removed"
    ),
    "gap": lambda d: (
        f"record {d['expected']} is missing: the next record read is {d['found']} (records"
        " were removed or the file is damaged); nothing after it was audited"
    ),
}


def problem_text(problem: Problem) -> str:
    words = PROBLEM_WORDS.get(problem.code)
    if words is None:
        return f"{problem.code}: {problem.data}"
    return words(problem.data)


def problem_json(problem: Problem) -> dict[str, Any]:
    return {"code": problem.code, **problem.data}


# ----------------------------------------------------------------- findings


def finding_json(finding: Finding) -> dict[str, Any]:
    return {
        "offset": finding.offset,
        "at": rfc3339(finding.ts),
        "kind": finding.kind,
        "queue": finding.queue,
        "preemption_id": finding.preemption_id,
        "pod_uid": finding.pod_uid,
        "explanation": finding.explanation,
        "justified": finding.justified,
        "refused": finding.refused,
        "problems": [problem_text(p) for p in finding.problems],
        "problem_data": [problem_json(p) for p in finding.problems],
    }


def finding_text(finding: Finding) -> str:
    if finding.refused is not None:
        lines = ["REFUSED " + finding.explanation]
        lines.append(f"  refused by the projection: {finding.refused}")
    else:
        text = finding.summary or finding.explanation
        lines = [("FLAGGED " if finding.problems else "") + text]
    lines.extend(f"  ! {problem_text(problem)}" for problem in finding.problems)
    return "\n".join(lines)


def _source(check: DigestCheck) -> str:
    if check.offset is None:
        return "given with --digest"
    return f"LedgerDigest #{check.offset}"


def digest_json(check: DigestCheck) -> dict[str, Any]:
    return {
        "offset": check.offset,
        "through": check.through,
        "recorded": check.recorded,
        "actual": check.actual,
        "verified": check.verified,
        "problems": [problem_text(p) for p in check.problems],
        "problem_data": [problem_json(p) for p in check.problems],
    }


def digest_text(check: DigestCheck) -> str:
    if check.verified:
        return f"digest of records 0..{check.through} verified ({_source(check)})"
    lines = [f"TAMPERED digest of records 0..{check.through} ({_source(check)})"]
    lines.extend(f"  ! {problem_text(problem)}" for problem in check.problems)
    return "\n".join(lines)


def report_json(report: AuditReport) -> dict[str, Any]:
    return {
        "decisions": [finding_json(finding) for finding in report.findings],
        "flagged": report.flagged,
        "refused": report.refused,
        "records": report.records,
        "unfinished": list(report.unfinished),
        "digests": [digest_json(check) for check in report.digests],
        "damage": [problem_text(p) for p in report.damage],
        "tampered": report.tampered,
        "covered_through": report.covered_through,
        "last_offset": report.last_offset,
        "digest": report.digest,
    }


def report_text(report: AuditReport) -> str:
    parts = [finding_text(finding) for finding in report.findings]
    for preemption_id in report.unfinished:
        parts.append(f"preemption {preemption_id} is still running at the end of the ledger")
    parts.extend(digest_text(check) for check in report.digests)
    parts.extend(f"TAMPERED {problem_text(p)}" for p in report.damage)
    covered = report.covered_through
    if covered < report.last_offset:
        parts.append(
            f"records {covered + 1}..{report.last_offset} are covered by no matching digest"
            " (a LedgerDigest record or --digest): a change to them cannot be detected"
        )
    if report.last_offset >= 0:
        parts.append(
            f"digest of records 0..{report.last_offset}: {report.digest} (keep it elsewhere;"
            f" `audit --digest {report.last_offset}:HEX` checks the ledger against it later)"
        )
    summary = (
        f"{len(report.findings)} decision(s) audited over {report.records} record(s);"
        f" {report.flagged} flagged"
    )
    if report.refused:
        summary += f", {report.refused} refused by the guard (not flagged)"
    if report.tampered:
        summary += f"; {report.tampered} digest mismatch(es): the records were changed"
    parts.append(summary)
    return "\n".join(parts)
