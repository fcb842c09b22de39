"""A decision is accepted only where it is justified at its own offset (DECISIONS 211).

Two writers (``EngineCore`` + ``Projection`` each, no election: both decide,
the ledger guards) share one in-memory ledger. Each decides from its own view,
which may lag the ledger: its proposals land after records it never saw,
possibly after the other writer already answered the same trigger. The
projection must refuse a ``PreemptionStarted`` whose timer no longer holds
where it lands (quota-decrease: the queue's deadline armed and passed;
overuse: the queue's owing clock running, not held, ``since + revoke_after``
passed; reclaim: the pod's starving clock likewise; all: the id never started
before), so one trigger is never run twice. ``audit`` checks the same where the
decision lands (from the engine's list of armed timers, not the guard's code)
and agrees with the projection on every decision.

The trigger check here is this file's own, written against the projected
state's clocks and deadlines.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quotaledger.adapters.cli import main
from quotaledger.adapters.ledgers.sqlite.ledger import SqliteLedger
from quotaledger.engine.audit import audit, report_text
from quotaledger.engine.core import EngineCore, Timer
from quotaledger.engine.executors import SimulateExecutor
from quotaledger.engine.live import LiveEngine
from quotaledger.events.codec import decode_event, encode_event
from quotaledger.events.ledger import Append, Record
from quotaledger.events.model import (
    Event,
    EvictionSucceeded,
    LedgerOpened,
    NodeUpserted,
    PodRemoved,
    PodUpserted,
    PreemptionStarted,
    QuotaUpserted,
    SettingsChanged,
)
from quotaledger.events.times import rfc3339
from quotaledger.projections import Projection, guard
from quotaledger.projections.plans import decrease_target
from quotaledger.projections.state import ProjectedState
from tests.engine.test_engine_guard import Engines, _wait_for, read_records
from tests.engine_worker import SlowLink
from tests.scenarios import engine_facts

T0 = 1_767_225_600_000

# ------------------------------------------------------------------ the harness


@dataclass
class Ledger:
    """One ledger in memory: records in order, ts clamped up (DESIGN §3)."""

    records: list[Record] = field(default_factory=list)

    def append(self, ts: int, events: Sequence[Event]) -> None:
        for event in events:
            if self.records:
                ts = max(ts, self.records[-1].ts)
            self.records.append(Record(len(self.records), ts, encode_event(event)))

    def source(self, start: int) -> Iterator[Record]:
        return iter(self.records[start:])


@dataclass
class Writer:
    """An engine: its own fold of the ledger, possibly behind it."""

    name: str
    ledger: Ledger
    projection: Projection = field(default_factory=Projection)
    core: EngineCore = field(init=False)
    #: a proposal decided but not appended yet (a slow link: it lands later)
    outbox: list[tuple[Timer, list[Event]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.core = EngineCore(self.projection, instance=self.name)

    def catch_up(self, through: int) -> None:
        records = self.ledger.records
        for record in records[self.projection.state.offset + 1 : through + 1]:
            self.projection.apply_record(record)

    def append(self, now: int, events: Sequence[Event]) -> None:
        """Append and read back (the live engine's ``append_applied``)."""
        self.ledger.append(now, events)
        self.catch_up(len(self.ledger.records) - 1)
        self.core.sealed_through = self.projection.state.offset

    def round(self, now: int, slow: bool = False) -> int:
        """One reconciler round at ``now`` on the view it has (live ``step``);
        the number of records appended. A proposal decided while ``slow`` lands
        only at the writer's next round (the live engine waits for its append
        meanwhile, so that round does nothing else)."""
        before = len(self.ledger.records)
        core = self.core
        if self.outbox:
            for timer, events in self.outbox:
                self.append(now, events)
                core.reopen_if_refused(timer, events, now=now)
            self.outbox.clear()
            return len(self.ledger.records) - before
        observed = core.observe(now)
        if observed is not None:
            self.append(now, [observed])
        finished = core.finished()
        if finished:
            self.append(now, finished)
        for eviction in core.outstanding(mine_only=True):
            self.append(
                now,
                [EvictionSucceeded(eviction_id=eviction.eviction_id), PodRemoved(eviction.pod_uid)],
            )
        core.revisit()
        for timer in core.due(now):
            events = core.propose(timer)
            if events and slow:
                self.outbox.append((timer, events))
                return len(self.ledger.records) - before
            if events:
                self.append(now, events)
                core.reopen_if_refused(timer, events, now=now)
        disarm = core.disarm_at()
        if disarm is not None and now >= disarm:
            self.append(now, [core.disarm_record(now)])
        return len(self.ledger.records) - before


@dataclass(frozen=True)
class Turn:
    """A writer decides after catching up to ``lag`` records before the tail."""

    writer: int
    lag: int
    advance_ms: int
    slow: bool = False


def race(facts: Sequence[tuple[int, Event]], turns: Sequence[Sequence[Turn]]) -> Ledger:
    """Facts in order; before each, the turns drawn for it; then both writers
    run on, fully caught up, until nothing is left to do."""
    ledger = Ledger()
    ledger.append(facts[0][0], [LedgerOpened(ledger_id="two-writers")])
    writers = [Writer("A", ledger), Writer("B", ledger)]
    now = facts[0][0]
    for (ts, fact), before in zip(facts, turns, strict=True):
        for turn in before:
            now = min(max(now, ledger.records[-1].ts) + turn.advance_ms, max(ts, now))
            writer = writers[turn.writer]
            writer.catch_up(max(writer.projection.state.offset, len(ledger.records) - 1 - turn.lag))
            writer.round(now, turn.slow)
        ledger.append(ts, [fact])
        now = max(now, ts)
    quiet = 0
    for _ in range(120):  # drain: a second per step, both writers current
        now = max(now, ledger.records[-1].ts) + 1000
        moved = 0
        for writer in writers:
            writer.catch_up(len(ledger.records) - 1)
            moved += writer.round(now)
        pending = any(w.core.next_deadline() is not None for w in writers)
        quiet = quiet + 1 if not moved and not pending else 0
        if quiet >= 2:
            break
    return ledger


# ------------------------------------------------------------------ the checks


def trigger_holds(state: ProjectedState, event: PreemptionStarted, ts: int) -> bool:
    """The timer ``event`` answers is armed and due at ``ts`` (DESIGN §6 rules 1-3,
    §8 rules 19, 29, 31): this file's reading of the state, not the guard's."""
    settings_ = state.settings
    if event.cause == "quota-decrease":
        deadline = state.decrease_deadlines.get(event.queue)
        if not settings_.quota_preemption_enabled or deadline is None or deadline > ts:
            return False
        # §8 rule 21: at the first record after a passed deadline, an empty target
        # on a free queue disarms it (DECISIONS 14), this very record included
        first_after = deadline < ts and ts > state.ts and event.queue not in state.occupied
        return not (first_after and not decrease_target(state, event.queue))
    if event.cause == "overuse":
        since = state.owing_since.get(event.queue)
        return (
            settings_.revoke_enabled
            and event.queue not in state.owing_held
            and since is not None
            and since + round(settings_.revoke_after_s * 1000) <= ts
        )
    uid = event.pod_uid
    if uid is None or state.pod_quota.get(uid) != event.queue:
        return False
    since = state.starving_since.get(uid)
    return (
        settings_.reclaim_enabled
        and uid not in state.starving_held
        and since is not None
        and since + round(settings_.reclaim_after_s * 1000) <= ts
    )


TRIGGER_REASONS = ("deadline", "clock", "disabled", "reclaim names", "not an active pod")


@dataclass
class Verdicts:
    accepted: int = 0
    refused_trigger: int = 0  # refused because the timer no longer held


def check(ledger: Ledger) -> Verdicts:
    """Every accepted ``PreemptionStarted`` had its trigger where it landed and a
    fresh id; audit agrees with the projection on every decision."""
    projection = Projection()
    started: set[str] = set()
    accepted_at: dict[int, bool] = {}
    verdicts = Verdicts()
    for record in ledger.records:
        event = decode_event(record.payload)
        holds = (
            trigger_holds(projection.state, event, record.ts)
            if isinstance(event, PreemptionStarted)
            else None
        )
        ok = projection.apply_record(record) is not None
        if not isinstance(event, PreemptionStarted):
            continue
        accepted_at[record.offset] = ok
        where = f"#{record.offset} {event.preemption_id}"
        if ok:
            assert holds, f"{where}: accepted, but its trigger did not hold there"
            assert event.preemption_id not in started, f"{where}: accepted twice"
            started.add(event.preemption_id)
            verdicts.accepted += 1
        else:
            reason = projection.state.rejected[-1].reason
            if not holds:
                verdicts.refused_trigger += 1
            elif "occupied" not in reason and "already used" not in reason:
                raise AssertionError(f"{where}: refused although its trigger held: {reason}")
    report = audit(ledger.source)
    assert report.flagged == 0, [
        (f.offset, f.kind, [p.code for p in f.problems]) for f in report.findings if f.flagged
    ]
    for finding in report.findings:
        if finding.kind != "PreemptionStarted":
            continue
        landing = {p.code for p in finding.problems} & {"trigger-gone", "id-reused"}
        # audit flags at the landing exactly the decisions the projection refused there
        if accepted_at[finding.offset]:
            assert finding.refused is None and not landing
        else:
            assert finding.refused is not None
            if any(word in finding.refused for word in TRIGGER_REASONS):
                assert "trigger-gone" in landing, (finding.offset, finding.refused)
    return verdicts


# ------------------------------------------------------------------ one race, by hand

NODE = NodeUpserted(name="n", allocatable={"cpu": 10})


def owing_race() -> list[tuple[int, Event]]:
    """``a`` borrows 8 cpu that ``b`` (min 8) is entitled to: ``a`` owes 6."""
    facts: list[Event] = [
        SettingsChanged(revoke_enabled=True, revoke_after_s=1.0, reclaim_enabled=False),
        NODE,
        QuotaUpserted(name="a", min={"cpu": 2}, max={"cpu": 10}),
        QuotaUpserted(name="b", min={"cpu": 8}, max={"cpu": 10}),
        *(
            PodUpserted(
                uid=f"a{i}",
                name=f"a{i}",
                namespace="a",
                quota="a",
                requests={"cpu": 2},
                phase="Running",
                node="n",
                priority=i,
            )
            for i in range(4)
        ),
        PodUpserted(
            uid="b0", name="b0", namespace="b", quota="b", requests={"cpu": 8}, phase="Pending"
        ),
    ]
    return [(T0, fact) for fact in facts]


def test_a_revoke_decided_from_a_stale_view_is_refused_once_answered() -> None:
    """B decides on a view one record behind A's; A's revoke lands, runs and
    finishes (holding ``a``'s clock, §8 rule 29). B's revoke of the same
    trigger, with another basis and so another id, lands on a free queue: the
    guard refuses it, since ``a``'s clock no longer runs. (Before: accepted,
    the same trigger run twice, with victims chosen on B's stale state.)"""
    ledger = Ledger()
    ledger.append(T0, [LedgerOpened(ledger_id="stale")])
    ledger.append(T0, [fact for _, fact in owing_race()])
    a, b = Writer("A", ledger), Writer("B", ledger)
    a.catch_up(len(ledger.records) - 1)
    a.append(T0, [a.core.observe(T0)])  # type: ignore[list-item]
    ledger.append(T0 + 500, [NodeUpserted(name="spare", allocatable={})])
    now = T0 + 1000
    b.catch_up(len(ledger.records) - 1)
    a_timers, b_timers = a.core.due(now), b.core.due(now)
    assert [t.cause for t in a_timers] == ["overuse"] and a_timers == b_timers
    proposal_b = b.core.propose(b_timers[0])  # computed now, lands later
    a.append(now, a.core.propose(a_timers[0]))
    a.round(now)  # drives A's evictions
    a.round(now)  # finishes A's preemption
    state = a.projection.state
    assert not state.preemptions and state.owing_held == {"a"}
    started_b = proposal_b[0]
    assert isinstance(started_b, PreemptionStarted)
    assert started_b.preemption_id not in state.finished_preemptions
    b.append(now + 10, proposal_b)
    assert started_b.preemption_id not in b.projection.state.preemptions
    refusal = next(r for r in b.projection.state.rejected if r.kind == "PreemptionStarted")
    assert refusal.reason == "queue: 'a' overuse clock is held after its last revoke"
    verdicts = check(ledger)
    assert verdicts.accepted == 1 and verdicts.refused_trigger == 1
    report = audit(ledger.source)
    [finding] = [f for f in report.findings if f.preemption_id == started_b.preemption_id][:1]
    assert finding.refused == refusal.reason and not report.failed
    assert [p.code for p in finding.problems] == ["trigger-gone"]


def test_audit_flags_an_accepted_decision_whose_trigger_was_gone(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With a guard that does not look at triggers (as before DECISIONS 211),
    the stale revoke is accepted: audit flags it where it lands and fails
    (``quotaledger audit`` exits 1). With the guard, the same ledger has it
    refused, and the audit passes (exit 0) explaining the refusal."""
    ledger = Ledger()
    ledger.append(T0, [LedgerOpened(ledger_id="stale")])
    ledger.append(T0, [fact for _, fact in owing_race()])
    a, b = Writer("A", ledger), Writer("B", ledger)
    monkeypatch.setattr(guard, "trigger_gone", lambda state, event, ts: None)
    a.catch_up(len(ledger.records) - 1)
    a.append(T0, [a.core.observe(T0)])  # type: ignore[list-item]
    ledger.append(T0 + 500, [NodeUpserted(name="spare", allocatable={})])
    now = T0 + 1000
    b.catch_up(len(ledger.records) - 1)
    proposal_b = b.core.propose(b.core.due(now)[0])
    a.append(now, a.core.propose(a.core.due(now)[0]))
    a.round(now)
    a.round(now)
    b.append(now + 10, proposal_b)
    report = audit(ledger.source)
    [finding] = [
        f
        for f in report.findings
        if f.kind == "PreemptionStarted" and f.preemption_id == proposal_b[0].preemption_id  # type: ignore[union-attr]
    ]
    assert finding.refused is None and finding.flagged and report.failed
    [problem] = finding.problems
    assert problem.code == "trigger-gone" and problem.data["reason"] == "owing-held"
    assert "where it lands" in report_text(report)
    exported = tmp_path / "stale.jsonl"
    exported.write_text(
        "".join(
            msgspec.json.encode({**msgspec.json.decode(r.payload), "at": rfc3339(r.ts)}).decode()
            + "\n"
            for r in ledger.records[1:]
        )
    )
    assert main(["audit", str(exported)]) == 1
    assert "where it lands" in capsys.readouterr().out
    monkeypatch.undo()
    assert main(["audit", str(exported)]) == 0
    assert "overuse clock is held after its last revoke" in capsys.readouterr().out


def test_an_overuse_outcome_judged_before_the_last_removal_is_not_flagged() -> None:
    """B reads A's revoke up to the last eviction's success but not yet the pod's
    removal (same batch): ``a`` still counts that pod, so B judges the revoke
    ``best-effort``; just before B's record it would be ``complete``. The
    ledger records no basis for a finish: audit accepts an outcome some state
    between the last outcome and the finish gives (DECISIONS 212)."""
    ledger = Ledger()
    ledger.append(T0, [LedgerOpened(ledger_id="judged")])
    ledger.append(T0, [fact for _, fact in owing_race()])
    a, b = Writer("A", ledger), Writer("B", ledger)
    a.catch_up(len(ledger.records) - 1)
    a.append(T0, [a.core.observe(T0)])  # type: ignore[list-item]
    now = T0 + 1000
    [timer] = a.core.due(now)
    a.append(now, a.core.propose(timer))
    a.round(now)  # each eviction: EvictionSucceeded, then its pod's PodRemoved
    assert isinstance(decode_event(ledger.records[-1].payload), PodRemoved)
    b.catch_up(len(ledger.records) - 2)
    [judged] = b.core.finished()
    [then] = EngineCore(a.projection).finished()
    assert (judged.outcome, then.outcome) == ("best-effort", "complete")
    b.append(now, [judged])
    report = audit(ledger.source)
    assert report.flagged == 0 and not report.failed
    [finding] = [f for f in report.findings if f.kind == "PreemptionFinished"]
    assert finding.refused is None and finding.problems == []


def test_the_guard_refuses_each_trigger_that_does_not_hold() -> None:
    """Each cause's trigger, one condition at a time, on one state."""
    projection = Projection()
    projection.apply(0, T0, LedgerOpened(ledger_id="triggers"))
    for offset, (ts, fact) in enumerate(owing_race(), start=1):
        assert projection.apply(offset, ts, fact)
    state = projection.state

    def refused(event: PreemptionStarted, ts: int) -> str | None:
        return guard.trigger_gone(state, event, ts)

    def started(cause: str, queue: str = "a", pod_uid: str | None = None) -> PreemptionStarted:
        return PreemptionStarted(
            preemption_id="x",
            queue=queue,
            cause=cause,
            target={},
            basis=0,
            pod_uid=pod_uid,  # type: ignore[arg-type]
        )

    overuse = started("overuse")
    assert refused(overuse, T0 + 10_000) == "queue: 'a' has no running overuse clock"
    state.owing_since["a"] = T0
    assert (
        refused(overuse, T0 + 999)
        == "queue: 'a' overuse deadline 1767225601000 is after 1767225600999"
    )
    assert refused(overuse, T0 + 1000) is None
    state.owing_held.add("a")
    assert "held" in (refused(overuse, T0 + 1000) or "")
    state.owing_held.clear()
    state.settings.revoke_enabled = False
    assert "disabled" in (refused(overuse, T0 + 1000) or "")

    state.settings.reclaim_enabled = True
    state.settings.reclaim_after_s = 2.0
    reclaim = started("reclaim", "b", "b0")
    assert refused(reclaim, T0 + 5000) == "pod_uid: 'b0' has no running starvation clock"
    state.starving_since["b0"] = T0
    assert refused(reclaim, T0 + 1999) is not None and refused(reclaim, T0 + 2000) is None
    assert refused(started("reclaim", "a", "b0"), T0 + 2000) == (
        "pod_uid: 'b0' is not an active pod of 'a'"
    )
    assert (
        refused(started("reclaim", "b"), T0 + 2000) == "pod_uid: a reclaim names its starving pod"
    )
    state.starving_held.add("b0")
    assert "held" in (refused(reclaim, T0 + 2000) or "")

    decrease = started("quota-decrease")
    assert "disabled" in (refused(decrease, T0) or "")
    state.settings.quota_preemption_enabled = True
    assert refused(decrease, T0) == "queue: 'a' has no armed quota-decrease deadline"
    state.decrease_deadlines["a"] = T0 + 5
    assert refused(decrease, T0 + 4) == "queue: 'a' deadline 1767225600005 is after 1767225600004"
    assert refused(decrease, T0 + 5) is None


# ------------------------------------------------------------------ random interleavings


@st.composite
def races(draw: st.DrawFn) -> tuple[list[tuple[int, Event]], list[list[Turn]]]:
    facts = draw(engine_facts())
    turn = st.builds(
        Turn,
        writer=st.integers(0, 1),
        lag=st.sampled_from([0, 0, 1, 2, 4, 8, 16]),
        advance_ms=st.sampled_from([0, 0, 100, 500, 1000, 2500]),
        slow=st.booleans(),
    )
    turns = [draw(st.lists(turn, max_size=6)) for _ in facts]
    return facts, turns


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(races())
def test_two_writers_never_run_a_trigger_whose_time_is_gone(
    race_: tuple[list[tuple[int, Event]], list[list[Turn]]],
) -> None:
    """Random interleavings of two writers' proposals, each from a view that may
    lag: no accepted ``PreemptionStarted`` whose trigger did not hold where it
    landed, no id started twice, and audit's verdicts equal the projection's
    (it flags no accepted decision; it finds the trigger gone exactly where the
    projection refused for that)."""
    facts, turns = race_
    check(race(facts, turns))


# ------------------------------------------------------------------ two live engines


class SlowDecisions(SlowLink):
    """A link on which a batch starting with a ``PreemptionStarted`` takes up to
    ``decision_ms`` (a pause while proposing); every other append up to 20 ms."""

    decision_ms = 500.0

    async def append(self, batch: Sequence[Append]) -> list[int]:
        if batch and b'"kind":"PreemptionStarted"' in batch[0].payload:
            await asyncio.sleep(self.rng.uniform(0, self.decision_ms) / 1000)
        return await super().append(batch)


async def test_two_live_engines_without_election_never_run_a_trigger_twice(
    tmp_path: Path,
) -> None:
    """Two live engines, election off (both decide, the ledger guards), on one
    SQLite ledger each, 6 ledgers at once; a proposal of theirs takes up to 0.5 s
    to land (other appends up to 20 ms), so one engine's revoke often lands after
    the other's has run and finished. Twice per ledger a leaf starts to owe: each revoke trigger
    runs once, and the ledgers pass the checks above (audit included)."""
    rng = random.Random(15)
    paths = [tmp_path / f"owing{i}.db" for i in range(6)]
    facts = [fact for _, fact in owing_race()]
    facts[0] = SettingsChanged(revoke_enabled=True, revoke_after_s=0.2, reclaim_enabled=False)
    regrown = [
        PodUpserted(
            uid=f"c{i}",
            name=f"c{i}",
            namespace="a",
            quota="a",
            requests={"cpu": 2},
            phase="Running",
            node="n",
            priority=i,
        )
        for i in range(3)
    ]
    ledgers = [await SqliteLedger.open(path, poll_interval=0.01) for path in paths]
    # A reads the tail every 5 ms, B every 80 ms: their views differ when they decide
    links = [
        await SqliteLedger.open(path, poll_interval=poll)
        for path in paths
        for poll in (0.005, 0.08)
    ]
    engines = [
        LiveEngine(
            SlowDecisions(link, random.Random(rng.random()), 0, 20),  # type: ignore[arg-type]
            SimulateExecutor(),
            instance="AB"[i % 2],
            election=False,
            idle_poll_s=0.02,
            observe_every_ms=50,
        )
        for i, link in enumerate(links)
    ]

    # a ledger's noise pauses once both its engines have run the revokes: with
    # noise every 5-25 ms and B reading every 80 ms, the two offsets would seldom
    # be equal at the same instant on all six ledgers at once
    hushed = [asyncio.Event() for _ in paths]

    def settled(path_index: int, revokes: int) -> bool:
        pair = engines[2 * path_index : 2 * path_index + 2]
        done = all(
            sum(1 for f in e.state.finished_preemptions if f.startswith("overuse/")) >= revokes
            and not e.state.preemptions
            for e in pair
        )
        if done:
            hushed[path_index].set()
        return done and all(e.state.offset == pair[0].state.offset for e in pair)

    async def producer(index: int, stop: asyncio.Event) -> None:
        """Facts that change no number, every 5-25 ms: the engines' views differ."""
        noise = Append(encode_event(NodeUpserted(name="spare", allocatable={})))
        while not stop.is_set():
            if not hushed[index].is_set():
                await ledgers[index].append([noise])
            await asyncio.sleep(rng.uniform(0.005, 0.025))

    quiet = asyncio.Event()
    try:
        for ledger in ledgers:
            await ledger.append([Append(encode_event(f)) for f in facts])
        async with Engines() as running, asyncio.TaskGroup() as producers:
            for index in range(len(ledgers)):
                producers.create_task(producer(index, quiet))
            for engine in engines:
                running.start(engine)
            await _wait_for(lambda: all(settled(i, 1) for i in range(len(paths))), timeout=60)
            for ledger, hush in zip(ledgers, hushed, strict=True):
                hush.clear()
                await ledger.append([Append(encode_event(f)) for f in regrown])
            await _wait_for(lambda: all(settled(i, 2) for i in range(len(paths))), timeout=60)
            quiet.set()
    finally:
        quiet.set()
        for ledger in [*ledgers, *links]:
            await ledger.close()
    reasons: Counter[str] = Counter()
    for path in paths:
        shared = Ledger(read_records(path))
        verdicts = check(shared)
        assert verdicts.accepted == 2, (path.name, verdicts)
        projection = Projection()
        for record in shared.records:
            projection.apply_record(record)
        for rejection in projection.state.rejected:
            if rejection.kind == "PreemptionStarted":
                reasons[rejection.reason.split("'")[-1].strip()] += 1
    print(f"\n{len(paths)} ledgers: second revokes refused: {dict(reasons)}")
    # not trivial: some second revoke landed on a free queue after the first had run
    assert (
        reasons["overuse clock is held after its last revoke"]
        + reasons["has no running overuse clock"]
        > 0
    ), reasons
