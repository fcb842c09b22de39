"""``audit --jobs N`` from the ledger's snapshots (DESIGN §9; DECISIONS 160-162): a
segment starts from a snapshot the segment before it must reproduce, and the
report is the one-process report whatever the jobs, snapshots and tampering."""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quotaledger.adapters.cli import main
from quotaledger.adapters.ledgers.sqlite.ledger import SqliteLedger
from quotaledger.engine.audit import AuditReport, audit, report_json, report_text
from quotaledger.engine.audit import decisions as decisions_module
from quotaledger.engine.audit.digests import chain_pass
from quotaledger.engine.audit.parallel import (
    audit_segment,
    audit_span,
    merge_segments,
    merge_spans,
    with_chain,
)
from quotaledger.engine.audit.plan import Cut, plan_cuts
from quotaledger.events.digest import DigestChain
from quotaledger.events.ledger import Record, Snapshot
from quotaledger.events.model import LedgerOpened, NodeUpserted
from quotaledger.projections import Projection, state_hash
from quotaledger.projections import guard as guard_module
from quotaledger.projections.snapshot import dump
from tests.engine.test_guard_triggers import T0, Ledger, Writer, owing_race
from tests.paths import REPO

REPO = REPO
EXAMPLES = ("quota-decrease.jsonl", "overuse.jsonl", "reclaim.jsonl")


# ---------------------------------------------------------------- ledgers and snapshots


@functools.cache
def simulated_records(example: str) -> tuple[Record, ...]:
    """The records ``quotaledger simulate`` writes for an example (decisions included)."""
    import tempfile

    with tempfile.TemporaryDirectory() as directory:
        out = Path(directory) / "sim.db"
        assert main(["simulate", str(REPO / "examples" / example), "--out", str(out)]) == 0
        with sqlite3.connect(out) as conn:
            conn.text_factory = bytes
            return tuple(
                Record(int(o), int(t), bytes(p))
                for o, t, p in conn.execute("SELECT offset, ts, payload FROM records ORDER BY 1")
            )


def snapshots_at(records: Sequence[Record], offsets: Sequence[int]) -> dict[int, Snapshot]:
    """Snapshots as the engine stores them (blob, digest, state hash, checksum)."""
    wanted = set(offsets)
    projection, chain = Projection(), DigestChain()
    out: dict[int, Snapshot] = {}
    for record in records:
        projection.apply_record(record)
        chain.update(record)
        if record.offset in wanted:
            state = projection.settled()
            blob = dump(state)
            out[record.offset] = Snapshot(
                offset=record.offset,
                blob=blob,
                digest=chain.hex,
                state_hash=state_hash(state),
                checksum=Snapshot.checksum_of(blob),
            )
    return out


def forged(snapshot: Snapshot, how: str) -> Snapshot:
    """A snapshot changed the way a careless cache or a forger would."""
    body = json.loads(snapshot.blob)
    if how == "digest":
        return Snapshot(
            offset=snapshot.offset,
            blob=snapshot.blob,
            digest="ab" * 32,
            state_hash=snapshot.state_hash,
            checksum=snapshot.checksum,
        )
    if how == "pod" and body["state"]["pods"]:
        first = sorted(body["state"]["pods"])[0]
        pod = body["state"]["pods"][first]
        pod["requests"] = {**pod["requests"], "cpu": 123_000}
    elif how == "time":  # outside the state hash: only the blob tells
        body["state"]["ts"] += 1
    else:
        body["state"]["settings"]["revoke_after_s"] = 7
    blob = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    from quotaledger.projections.snapshot import load

    # the forger also rewrites the state hash and checksum to match the blob
    return Snapshot(
        offset=snapshot.offset,
        blob=blob,
        digest=snapshot.digest,
        state_hash=state_hash(load(blob)) if how != "time" else snapshot.state_hash,
        checksum=Snapshot.checksum_of(blob),
    )


def tampered(records: Sequence[Record], offset: int) -> list[Record]:
    """The records with the one at ``offset`` changed (still valid JSON when it was)."""
    out = list(records)
    record = out[offset]
    payload = record.payload.replace(b'"cpu"', b'"cpu "', 1)
    if payload == record.payload:
        payload = record.payload[:-1] + b',"x":1}'
    out[offset] = Record(record.offset, record.ts, payload)
    return out


def one_process(records: Sequence[Record], digests: dict[int, bytes] | None = None) -> AuditReport:
    return audit(lambda start: records[start:], digests=digests)


def in_spans(
    records: Sequence[Record],
    snapshots: dict[int, Snapshot],
    stops: Sequence[int | Cut],
    digests: dict[int, bytes] | None = None,
) -> tuple[AuditReport, list[str]]:
    """What ``audit --jobs`` does, each span run here in turn instead of in a
    process; a stop given as an offset is a cut at its snapshot itself."""

    def source(start: int) -> Sequence[Record]:
        return records[start:]

    last = records[-1].offset
    cuts = [stop if isinstance(stop, Cut) else Cut(stop, stop) for stop in stops]
    results = [
        audit_span(source, snapshots.get, start, cuts, last, digests=digests)
        for start in [None, *cuts]
    ]
    warnings: list[str] = []
    report, clean, problems = merge_spans(results, last, warnings.append)
    if not clean:
        report = with_chain(report, chain_pass(source, digests), problems)
    return report, warnings


def same(a: AuditReport, b: AuditReport) -> None:
    assert report_json(a) == report_json(b)
    assert report_text(a) == report_text(b)


# ---------------------------------------------------------------- in one process


@pytest.mark.parametrize("example", EXAMPLES)
def test_spans_from_good_snapshots_give_the_one_process_report(example: str) -> None:
    records = simulated_records(example)
    last = records[-1].offset
    for stops in ([last // 2], [last // 4, last // 2, 3 * last // 4], list(range(1, last))):
        report, warnings = in_spans(records, snapshots_at(records, stops), stops)
        assert warnings == []
        same(report, one_process(records))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    example=st.sampled_from(EXAMPLES),
    cuts=st.lists(st.floats(0.0, 0.999), min_size=1, max_size=4),
    record_cut=st.none() | st.floats(0.0, 0.999),
    forge=st.none()
    | st.tuples(st.integers(0, 3), st.sampled_from(["pod", "time", "settings", "digest"])),
)
def test_spans_equal_one_process_whatever_the_snapshots_and_tampering(
    example: str,
    cuts: list[float],
    record_cut: float | None,
    forge: tuple[int, str] | None,
) -> None:
    """Property: any snapshots, a changed record anywhere, a forged snapshot: the
    report is the one-process report, and a forged snapshot is named."""
    records = list(simulated_records(example))
    last = records[-1].offset
    stops = sorted({int(cut * last) for cut in cuts})
    snapshots = snapshots_at(records, stops)  # taken before any record was changed
    if record_cut is not None:
        records = tampered(records, 1 + int(record_cut * last))
    bad: int | None = None
    if forge is not None:
        bad = stops[forge[0] % len(stops)]
        snapshots[bad] = forged(snapshots[bad], forge[1])
    report, warnings = in_spans(records, snapshots, stops)
    same(report, one_process(records))
    if bad is not None:
        # a changed blob, time or digest is never taken for the records' state
        assert any(f"snapshot at offset {bad} " in w for w in warnings)


def fed_one_by_one(records: Sequence[Record], digests: dict[int, bytes] | None) -> AuditReport:
    """The audit with every record given to :meth:`Auditor.feed` on its own."""
    auditor = decisions_module.Auditor(
        lambda start: [r for r in records if r.offset >= start], digests=digests
    )
    for record in records:
        auditor.feed(record)
        if auditor.stopped:
            break
    return auditor.finish()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    example=st.sampled_from(EXAMPLES),
    stops=st.lists(st.floats(0.0, 0.999), max_size=5),
    record_cut=st.none() | st.floats(0.0, 0.999),
    removed=st.none() | st.floats(0.0, 0.999),
    given_at=st.none() | st.floats(0.0, 0.999),
)
def test_feeding_in_runs_equals_feeding_one_by_one(
    example: str,
    stops: list[float],
    record_cut: float | None,
    removed: float | None,
    given_at: float | None,
) -> None:
    """DECISIONS 371: ``Auditor.feed_until`` (the usual record folded in its own
    loop) stopping anywhere gives the report of ``feed`` record by record,
    whatever record is changed or removed and with a ``--digest`` value left."""
    records = list(simulated_records(example))
    last = records[-1].offset
    digests: dict[int, bytes] | None = None
    if given_at is not None:
        chain = DigestChain()
        for record in records[: int(given_at * last) + 1]:
            chain.update(record)
        digests = {chain.through: chain.digest}
    if record_cut is not None:
        records = tampered(records, 1 + int(record_cut * last))
    if removed is not None:
        del records[1 + int(removed * last)]
    expected = fed_one_by_one(records, digests)
    auditor = decisions_module.Auditor(
        lambda start: [r for r in records if r.offset >= start], digests=digests
    )
    remaining = iter(records)
    for stop in [*sorted(int(cut * last) for cut in stops), last + 1]:
        auditor.feed_until(remaining, stop)
    same(auditor.finish(), expected)


@pytest.mark.parametrize("example", EXAMPLES)
def test_a_changed_record_in_each_segment(example: str) -> None:
    records = simulated_records(example)
    last = records[-1].offset
    stops = [last // 3, 2 * last // 3]
    snapshots = snapshots_at(records, stops)
    for offset in (stops[0] // 2 + 1, (stops[0] + stops[1]) // 2, (stops[1] + last) // 2 + 1):
        changed = tampered(records, offset)
        report, warnings = in_spans(changed, snapshots, stops)
        single = one_process(changed)
        same(report, single)
        if offset <= stops[1]:  # the chain at the next snapshot differs: it is not used
            assert warnings and "stores digest" in warnings[0]


def test_given_digests_are_checked_across_segments() -> None:
    records = simulated_records("overuse.jsonl")
    last = records[-1].offset
    stops = [last // 3, 2 * last // 3]
    snapshots = snapshots_at(records, stops)
    chain = DigestChain()
    kept: dict[int, bytes] = {}
    for record in records:
        chain.update(record)
        if record.offset in (2, stops[0], stops[1] + 1, last):
            kept[record.offset] = chain.digest
    good = in_spans(records, snapshots, stops, kept)[0]
    same(good, one_process(records, kept))
    assert len(good.digests) == 4 and good.tampered == 0
    wrong = {**kept, stops[1] + 1: bytes(32), last + 3: bytes(32)}
    same(in_spans(records, snapshots, stops, wrong)[0], one_process(records, wrong))


def test_a_forged_snapshot_is_named_and_the_segment_audited_again() -> None:
    records = simulated_records("quota-decrease.jsonl")
    last = records[-1].offset
    stops = [last // 3, 2 * last // 3]
    snapshots = snapshots_at(records, stops)
    snapshots[stops[0]] = forged(snapshots[stops[0]], "pod")
    report, warnings = in_spans(records, snapshots, stops)
    same(report, one_process(records))
    assert len(warnings) == 1
    assert f"snapshot at offset {stops[0]} does not hold the state the records give" in warnings[0]
    assert "state hash" in warnings[0]
    # a time changed in the blob only (outside the state hash) is caught by the blob
    snapshots = snapshots_at(records, stops)
    snapshots[stops[1]] = forged(snapshots[stops[1]], "time")
    report, warnings = in_spans(records, snapshots, stops)
    same(report, one_process(records))
    assert len(warnings) == 1 and "leaves out" in warnings[0]


def test_plan_cuts_balances_the_spans_between_snapshots() -> None:
    """DECISIONS 340: a cut may fall after its snapshot, where the span before
    (auditing) and the span after (loading the snapshot, folding to the cut,
    auditing on) cost the same by the model; a small ledger is cut at the
    snapshots nearest to an even split of the records."""
    same_size = [(10, 1), (45, 1), (52, 1), (100, 1)]
    assert plan_cuts([], 100, 2) == []
    assert plan_cuts(same_size, 100, 2) == [Cut(52, 52)]  # records 0..52 are 53 of 101
    assert plan_cuts(same_size, 100, 1) == []
    assert plan_cuts([(5, 1), (30, 1), (60, 1), (99, 1)], 99, 4) == [Cut(30, 30), Cut(60, 60)]
    assert plan_cuts([(-1, 1), (200, 1)], 100, 2) == []
    # the bench ledger's snapshots (the engine thinned the old ones)
    bench = [
        (200019, 39461005),
        (400039, 38686687),
        (700069, 38572387),
        (950094, 38572852),
        (1050104, 38569369),
        (1100109, 38568414),
    ]
    [cut] = plan_cuts(bench, 1111111, 2)
    assert cut.snapshot == 400039 and 640_000 < cut.offset < 670_000
    cuts = plan_cuts(bench, 1111111, 3)
    assert len(cuts) == 2 and cuts[0].offset < cuts[1].snapshot <= cuts[1].offset
    # with a snapshot near the balance, the cut is at most a few hundred records after it
    [cut] = plan_cuts([*bench, (600000, 38_600_000)], 1111111, 2)
    assert cut.snapshot == 600000 and cut.offset - cut.snapshot < 1000


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    example=st.sampled_from(EXAMPLES),
    cuts=st.lists(st.tuples(st.floats(0.0, 0.999), st.floats(0.0, 0.5)), min_size=1, max_size=3),
    record_cut=st.none() | st.floats(0.0, 0.999),
    forge=st.none() | st.tuples(st.integers(0, 2), st.sampled_from(["pod", "time", "digest"])),
)
def test_cuts_after_their_snapshots_equal_one_process(
    example: str,
    cuts: list[tuple[float, float]],
    record_cut: float | None,
    forge: tuple[int, str] | None,
) -> None:
    """Property (DECISIONS 340): spans that fold from their snapshot to a cut
    after it give the one-process report, whatever record is changed and
    whatever snapshot is forged; a forged snapshot is named."""
    records = list(simulated_records(example))
    last = records[-1].offset
    plan: list[Cut] = []
    for at, fold in sorted(cuts):
        snapshot = max(int(at * last), plan[-1].offset + 1 if plan else 0)
        offset = min(snapshot + int(fold * last), last - 1)
        if snapshot <= offset:
            plan.append(Cut(snapshot, offset))
    if not plan:
        return
    snapshots = snapshots_at(records, [cut.snapshot for cut in plan])
    if record_cut is not None:
        records = tampered(records, 1 + int(record_cut * last))
    bad: int | None = None
    if forge is not None:
        bad = plan[forge[0] % len(plan)].snapshot
        snapshots[bad] = forged(snapshots[bad], forge[1])
    report, warnings = in_spans(records, snapshots, plan)
    same(report, one_process(records))
    if bad is not None:
        assert any(f"snapshot at offset {bad} " in w for w in warnings)


# ------------------------------------------- what the single pass carries across records


def _judged_then_reused() -> list[Record]:
    """A revoke whose outcome B judged before the last pod's removal (DECISIONS
    212: the window from its last eviction's outcome to its finish), then a
    ``PreemptionStarted`` reusing the finished preemption's id (``id-reused``
    where it lands, DECISIONS 211): both judged on what records before them
    did, which a segment starting between them must be given."""
    ledger = Ledger()
    ledger.append(T0, [LedgerOpened(ledger_id="carried")])
    ledger.append(T0, [fact for _, fact in owing_race()])
    a, b = Writer("A", ledger), Writer("B", ledger)
    a.catch_up(len(ledger.records) - 1)
    a.append(T0, [a.core.observe(T0)])  # type: ignore[list-item]
    now = T0 + 1000
    [timer] = a.core.due(now)
    started = a.core.propose(timer)
    a.append(now, started)
    a.round(now)  # each eviction: EvictionSucceeded, then its pod's PodRemoved
    b.catch_up(len(ledger.records) - 2)
    [judged] = b.core.finished()
    b.append(now, [judged])
    ledger.append(now + 5000, [NodeUpserted(name="spare", allocatable={})])
    ledger.append(now + 5000, [started[0]])  # the same id again
    return ledger.records


def in_segments(records: Sequence[Record], cuts: Sequence[int]) -> AuditReport:
    """What ``audit --jobs`` does without snapshots: each segment folds the
    records before it, the digest chain in one pass of its own."""

    def source(start: int) -> Sequence[Record]:
        return records[start:]

    bounds = [0, *cuts, records[-1].offset + 1]
    results = [audit_segment(source, s, e - 1) for s, e in itertools.pairwise(bounds)]
    return merge_segments(chain_pass(source, None), results)


@pytest.mark.parametrize("kept", [None, 0])
def test_segments_and_spans_judge_what_straddles_their_start_as_one_pass(
    monkeypatch: pytest.MonkeyPatch, kept: int | None
) -> None:
    """Cut anywhere, from a fold of the records before or from a snapshot: an
    overuse outcome judged on a state before the cut and an id started before
    it are judged as one process judges them. ``kept`` 0: the guard remembers
    no finished id (the bound of DECISIONS 62 reached), so a snapshot's state
    no longer names the id and the records before it are asked."""
    if kept is not None:
        monkeypatch.setattr(guard_module, "FINISHED_KEPT", kept)
        monkeypatch.setattr(decisions_module, "FINISHED_KEPT", kept)
    records = _judged_then_reused()
    single = one_process(records)
    codes = {p.code for f in single.findings for p in f.problems}
    assert "id-reused" in codes and "outcome-differs" not in codes
    last = records[-1].offset
    for cut in range(1, last + 1):
        same(in_segments(records, [cut]), single)
        if cut < last:
            report, warnings = in_spans(records, snapshots_at(records, [cut - 1]), [cut - 1])
            assert warnings == []
            same(report, single)


# ---------------------------------------------------------------- through the CLI


async def _save(path: Path, snapshots: dict[int, Snapshot]) -> None:
    ledger = await SqliteLedger.open(str(path))
    try:
        for snapshot in snapshots.values():
            await ledger.save_snapshot(snapshot)
    finally:
        await ledger.close()


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _ledger_with_snapshots(tmp_path: Path, example: str, stops: list[int]) -> Path:
    path = tmp_path / "ledger.db"
    assert main(["simulate", str(REPO / "examples" / example), "--out", str(path)]) == 0
    asyncio.run(_save(path, snapshots_at(simulated_records(example), stops)))
    return path


@pytest.mark.parametrize("example", ["overuse.jsonl", "quota-decrease.jsonl"])
def test_cli_jobs_from_snapshots_print_what_one_process_prints(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, example: str
) -> None:
    last = simulated_records(example)[-1].offset
    stops = [last // 4, last // 2, 3 * last // 4]
    path = _ledger_with_snapshots(tmp_path, example, stops)
    outputs: dict[str, Any] = {}
    for jobs in ("1", "2", "4"):
        for form in ((), ("--json",)):
            code, out, err = _cli(capsys, "audit", str(path), "--jobs", jobs, *form)
            assert "warning" not in err, err
            outputs.setdefault(" ".join(form), set()).add((code, out))
    assert all(len(seen) == 1 for seen in outputs.values())
    # a forged snapshot: named on stderr, stdout unchanged
    with sqlite3.connect(path) as conn:
        blob = conn.execute("SELECT blob FROM snapshots WHERE offset = ?", (stops[1],)).fetchone()
        changed = json.loads(blob[0])
        changed["state"]["ts"] += 5
        conn.execute(
            "UPDATE snapshots SET blob = ? WHERE offset = ?",
            (json.dumps(changed, sort_keys=True).encode(), stops[1]),
        )
    for form in ((), ("--json",)):
        code, out, err = _cli(capsys, "audit", str(path), "--jobs", "2", *form)
        assert (code, out) in outputs[" ".join(form)]
    code, out, err = _cli(capsys, "audit", str(path), "--jobs", "4")
    assert (code, out) in outputs[""]
    assert f"snapshot at offset {stops[1]} does not hold the state" in err
    assert "checksum" in err


def test_cli_jobs_on_a_ledger_an_engine_checkpointed(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The bench's ledger shape: an engine's snapshots, each followed by its
    LedgerDigest, and LedgerDigests in between (their state hashes are checked
    per segment, the first one of a segment against its snapshot's)."""
    from quotaledger.adapters.bench.fold_measurements import measure_sqlite
    from quotaledger.adapters.bench.workload import generate

    work = generate(quotas=60, pods=600, nodes=8, events=4000, seed=3)
    path = str(tmp_path / "bench.db")
    *_, checkpoints = measure_sqlite(work.records, path, snapshot_every=1000, digest_every=300)
    assert checkpoints is not None and checkpoints.snapshots >= 4
    with sqlite3.connect(path) as conn:
        offsets = [row[0] for row in conn.execute("SELECT offset FROM snapshots ORDER BY 1")]
        kinds = {
            offset: payload
            for offset, payload in conn.execute("SELECT offset, payload FROM records")
        }
    assert all("LedgerDigest" in kinds[offset + 1] for offset in offsets)
    outputs = set()
    for jobs in ("1", "2", "3"):
        code, out, err = _cli(capsys, "audit", path, "--json", "--jobs", jobs)
        assert code == 0 and "warning" not in err, err
        outputs.add(out)
    assert len(outputs) == 1
    document = json.loads(outputs.pop())
    assert len(document["digests"]) == checkpoints.digests
    assert all(check["verified"] for check in document["digests"])
    # a forged state hash in a LedgerDigest right after a segment's snapshot
    first = offsets[len(offsets) // 2] + 1
    event = json.loads(kinds[first])
    with sqlite3.connect(path) as conn:
        conn.execute(
            "UPDATE records SET payload = ? WHERE offset = ?",
            (json.dumps({**event, "state_hash": "0" * 64}), first),
        )
    results = {_cli(capsys, "audit", path, "--json", "--jobs", jobs)[:2] for jobs in "123"}
    assert len(results) == 1
    code, out = results.pop()
    assert code == 1
    codes = [p["code"] for c in json.loads(out)["digests"] for p in c["problem_data"]]
    assert "state-hash-mismatch" in codes


def test_an_unreadable_snapshot_row_is_audited_past(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A damaged row of the snapshot table (a blob that is no blob) is named in a
    warning and audited past; it never fails the audit (snapshots are a cache)."""
    example = "overuse.jsonl"
    last = simulated_records(example)[-1].offset
    stops = [last // 2]
    path = _ledger_with_snapshots(tmp_path, example, stops)
    expected = _cli(capsys, "audit", str(path), "--json")[:2]
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE snapshots SET blob = 5 WHERE offset = ?", (stops[0],))
    code, out, err = _cli(capsys, "audit", str(path), "--json", "--jobs", "2")
    assert (code, out) == expected
    assert f"snapshot at offset {stops[0]} does not hold the state" in err
    assert "cannot be read" in err and "Traceback" not in err
