"""``serve``'s HTTP API over real loopback sockets (DESIGN §11)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest
from hypothesis import given
from hypothesis import strategies as st

from quotaledger.adapters.http.requests import MAX_EVENTS_BYTES
from quotaledger.engine.fold_loop import Until, fold
from quotaledger.events.codec import encode_event
from quotaledger.events.ledger import Append
from quotaledger.events.model import NodeRemoved
from quotaledger.projections import Projection, state_json

from .serve_support import TOKEN, caught_up, facts_after, ingest, ingest_now, running, simulate

NODE = {"kind": "NodeUpserted", "name": "extra", "allocatable": {"cpu": "4"}}


def ndjson(*docs: object) -> bytes:
    return b"".join(json.dumps(doc).encode() + b"\n" for doc in docs)


async def replay_json(path: Path, offset: int) -> dict[str, object]:
    from quotaledger.adapters.ledgers.sqlite.ledger import SqliteLedger

    ledger = await SqliteLedger.open(str(path), create=False)
    try:
        projection = Projection()
        fold(projection, ledger.iter_batches(0), Until(offset=offset))
        return state_json(projection.state)
    finally:
        await ledger.close()


async def test_writes_need_the_token(tmp_path: Path) -> None:
    path = await ingest("koordinator.jsonl", tmp_path / "l.db")
    async with running(path) as run:
        before = await run.ledger.last_offset()
        url = f"{run.base}/v1/events"
        async with run.session.post(url, data=ndjson(NODE)) as response:
            assert response.status == 401
            assert (await response.json())["error"]["field"] == "Authorization"
        bad = {"Authorization": "Bearer " + TOKEN[:-1] + "x"}
        async with run.session.post(url, data=ndjson(NODE), headers=bad) as response:
            assert response.status == 401
        assert await facts_after(run, before) == []
        async with run.session.post(url, data=ndjson(NODE, NODE), headers=run.auth) as response:
            assert response.status == 200
            body = await response.json()
        # (the engine may append its own records at any time: offsets are checked by
        # what they hold, not by arithmetic on an earlier tail)
        first = body["first_offset"]
        assert body == {"appended": 2, "first_offset": first, "last_offset": first + 1}
        facts = await facts_after(run, before)
        assert [offset for offset, _ in facts] == [first, first + 1]
        assert all(b'"extra"' in payload for _, payload in facts)


async def test_no_token_configured_refuses_every_write(tmp_path: Path) -> None:
    path = await ingest("koordinator.jsonl", tmp_path / "l.db")
    async with running(path, token=None) as run:
        before = await run.ledger.last_offset()
        for headers in ({}, {"Authorization": "Bearer "}, {"Authorization": "Bearer x"}):
            async with run.session.post(
                f"{run.base}/v1/events", data=ndjson(NODE), headers=headers
            ) as response:
                assert response.status == 403
                error = (await response.json())["error"]
                assert error["status"] == 403 and "no token" in error["message"]
        assert await facts_after(run, before) == []


async def test_all_lines_or_none(tmp_path: Path) -> None:
    path = await ingest("koordinator.jsonl", tmp_path / "l.db")
    async with running(path) as run:
        before = await run.ledger.last_offset()
        body = (
            ndjson(NODE)
            + b"{not json\n"
            + ndjson({"kind": "PodUpserted", "uid": "p"})
            + ndjson({"kind": "QuotaUpserted", "name": "q", "min": {"cpu": "-1"}})
        )
        async with run.session.post(
            f"{run.base}/v1/events", data=body, headers=run.auth
        ) as response:
            assert response.status == 400
            error = (await response.json())["error"]
        assert [line["line"] for line in error["lines"]] == [2, 3, 4]
        assert "`name`" in error["lines"][1]["reason"]
        assert "min.cpu" in error["lines"][2]["reason"]
        decision = {"kind": "EvictionSucceeded", "eviction_id": "e"}
        async with run.session.post(
            f"{run.base}/v1/events", data=ndjson(NODE, decision), headers=run.auth
        ) as response:
            assert response.status == 403
            assert (await response.json())["error"]["lines"][0]["line"] == 2
        assert await facts_after(run, before) == []


async def test_body_over_16_mib_is_413(tmp_path: Path) -> None:
    path = await ingest("koordinator.jsonl", tmp_path / "l.db")
    async with running(path) as run:
        before = await run.ledger.last_offset()
        line = ndjson(NODE)
        body = line * (MAX_EVENTS_BYTES // len(line) + 1)
        assert len(body) > MAX_EVENTS_BYTES
        async with run.session.post(
            f"{run.base}/v1/events", data=body, headers=run.auth
        ) as response:
            assert response.status == 413
            assert (await response.json())["error"]["status"] == 413
        assert await facts_after(run, before) == []  # nothing of the refused body
        count = MAX_EVENTS_BYTES // len(line)
        exact = line * count
        async with run.session.post(
            f"{run.base}/v1/events", data=exact, headers=run.auth
        ) as response:
            assert response.status == 200
            answer = await response.json()
        # all of it, as one contiguous batch (the engine may append its own
        # records, e.g. a LedgerDigest, before or after it)
        first = answer["first_offset"]
        assert answer["appended"] == count
        assert answer["last_offset"] == first + count - 1
        facts = await facts_after(run, before)
        assert [offset for offset, _ in facts] == list(range(first, first + count))


async def test_state_matches_a_replay_and_at_reads_the_past(tmp_path: Path) -> None:
    path = await ingest("koordinator.jsonl", tmp_path / "l.db")
    async with running(path) as run:
        async with run.session.post(
            f"{run.base}/v1/events", data=ndjson(NODE), headers=run.auth
        ) as response:
            last = (await response.json())["last_offset"]
        await caught_up(run, last)
        async with run.session.get(f"{run.base}/v1/state") as response:
            state = await response.json()
        assert state["offset"] >= last
        assert state == await replay_json(path, state["offset"])
        assert state["cluster"]["allocatable"]["cpu"] == 132_000
        async with run.session.get(f"{run.base}/v1/state?at=5") as response:
            past = await response.json()
        assert past["offset"] == 5 and past == await replay_json(path, 5)
        async with run.session.get(f"{run.base}/v1/state?at=yesterday") as response:
            assert response.status == 400
            assert (await response.json())["error"]["field"] == "at"


async def test_quota_tree_admission(tmp_path: Path) -> None:
    path = await ingest("koordinator.jsonl", tmp_path / "l.db")
    async with running(path) as run:
        async with run.session.get(f"{run.base}/v1/state") as response:
            state = await response.json()
        async with run.session.get(f"{run.base}/v1/quotas/team-a") as response:
            quota = await response.json()
        assert quota["runtime"] == state["quotas"]["team-a"]["runtime"]
        assert quota["name"] == "team-a"
        async with run.session.get(f"{run.base}/v1/quotas/nobody") as response:
            assert response.status == 404
            assert (await response.json())["error"]["field"] == "name"
        async with run.session.get(f"{run.base}/v1/tree") as response:
            tree = await response.json()
        names = {child["name"] for child in tree["root"]["children"]}
        assert {"research", "default", "system"} <= names
        available = state["quotas"]["team-a"]["available"]["nvidia.com/gpu"]
        for amount, fits in ((available, True), (available + 1, False)):
            async with run.session.post(
                f"{run.base}/v1/admission",
                json={"quota": "team-a", "requests": {"nvidia.com/gpu": amount, "cpu": "1"}},
            ) as response:
                answer = await response.json()
            assert answer["fits"] is fits
            gpu = answer["per_resource"]["nvidia.com/gpu"]
            assert gpu == {
                "request": amount,
                "available": available,
                "max": state["quotas"]["team-a"]["max"].get("nvidia.com/gpu"),
                "fits": fits,
            }
            assert answer["per_resource"]["cpu"]["request"] == 1000
        async with run.session.post(
            f"{run.base}/v1/admission", json={"quota": "team-a", "requests": {"cpu": "lots"}}
        ) as response:
            assert response.status == 400
            assert (await response.json())["error"]["field"] == "requests.cpu"
        async with run.session.post(
            f"{run.base}/v1/admission", json={"quota": "ghost", "requests": {}}
        ) as response:
            assert response.status == 404


async def test_decisions_explain_whatif(tmp_path: Path) -> None:
    path = await simulate("quota-decrease.jsonl", tmp_path / "l.db")
    async with running(path) as run:
        seen: list[dict[str, object]] = []
        since = 0
        for _ in range(20):
            async with run.session.get(
                f"{run.base}/v1/decisions?since={since}&limit=2"
            ) as response:
                page = await response.json()
            assert len(page["decisions"]) <= 2
            seen.extend(page["decisions"])
            if not page["decisions"]:
                break
            since = page["next"]
        kinds = [d["kind"] for d in seen]
        assert "PreemptionStarted" in kinds and "PreemptionFinished" in kinds
        assert [d["offset"] for d in seen] == sorted({d["offset"] for d in seen})
        async with run.session.get(f"{run.base}/v1/decisions?limit=0") as response:
            assert response.status == 400
        async with run.session.get(f"{run.base}/v1/explain/pod/spark-3") as response:
            explained = await response.json()
        assert explained["pod"] == "spark-3"
        assert any(d["kind"] == "EvictionRequested" for d in explained["decisions"])
        assert "spark-3" in explained["text"]
        async with run.session.get(f"{run.base}/v1/explain/pod/nobody") as response:
            assert response.status == 404
        change = {
            "kind": "QuotaUpserted",
            "name": "analytics",
            "min": {"memory": "20Gi"},
            "max": {"memory": "21Gi"},
            "preemption_delay_s": 60,
        }
        async with run.session.post(
            f"{run.base}/v1/whatif?horizon=10m", data=ndjson(change)
        ) as response:
            result = await response.json()
        assert [e["pod_uid"] for e in result["evictions"]] == ["spark-2"]
        async with run.session.post(
            f"{run.base}/v1/whatif?horizon=soon", data=ndjson(change)
        ) as response:
            assert response.status == 400
        bad = ndjson(change) + b'{"kind": "QuotaUpserted"\n'
        async with run.session.post(f"{run.base}/v1/whatif", data=bad) as response:
            assert response.status == 400
            error = (await response.json())["error"]
        assert error["field"] == "body" and [p["line"] for p in error["lines"]] == [2]


async def test_stream_sends_each_folded_record(tmp_path: Path) -> None:
    path = await ingest("koordinator.jsonl", tmp_path / "l.db")
    async with running(path) as run:
        timeout = aiohttp.ClientTimeout(total=30)
        async with run.session.get(f"{run.base}/v1/stream", timeout=timeout) as stream:
            assert stream.headers["Content-Type"].startswith("text/event-stream")
            await stream.content.readline()  # retry
            async with run.session.post(
                f"{run.base}/v1/events", data=ndjson(NODE, NODE), headers=run.auth
            ) as response:
                first = (await response.json())["first_offset"]
            events = []
            while len(events) < 2:
                line = (await stream.content.readline()).decode()
                if line.startswith("data: "):
                    event = json.loads(line[6:])
                    if event["offset"] >= first:
                        events.append(event)
        assert [e["offset"] for e in events] == [first, first + 1]
        assert events[0]["kind"] == "NodeUpserted" and events[0]["event"]["name"] == "extra"


async def test_readyz_and_read_only(tmp_path: Path) -> None:
    path = await ingest("koordinator.jsonl", tmp_path / "l.db")
    async with running(path, read_only=True) as run:
        async with run.session.get(f"{run.base}/healthz") as response:
            assert response.status == 200
        async with run.session.get(f"{run.base}/readyz") as response:
            ready = await response.json()
        assert ready["ready"] and ready["offset"] == ready["tail"] == 17
        # the read-only server writes nothing (no LeaderElected) and refuses writes
        assert await run.ledger.last_offset() == 17
        async with run.session.post(
            f"{run.base}/v1/events", data=ndjson(NODE), headers=run.auth
        ) as response:
            assert response.status == 403
        async with run.session.get(f"{run.base}/nothing-here") as response:
            assert response.status == 404
            assert (await response.json())["error"]["status"] == 404


async def test_readyz_is_503_while_behind(tmp_path: Path) -> None:
    path = await ingest("koordinator.jsonl", tmp_path / "l.db")
    async with running(path, read_only=True) as run:
        async with _held(run):
            from quotaledger.events.codec import encode_event
            from quotaledger.events.ledger import Append
            from quotaledger.events.model import NodeRemoved

            await run.ledger.append([Append(payload=encode_event(NodeRemoved(name="x")))])
            async with run.session.get(f"{run.base}/readyz") as response:
                assert response.status == 503
                assert (await response.json())["ready"] is False
        await caught_up(run, 18)
        async with run.session.get(f"{run.base}/readyz") as response:
            assert response.status == 200


class _held:
    """Hold the fold gate: the follower cannot fold while inside."""

    def __init__(self, run: object) -> None:
        self.gate = run.server.ledger.gate  # type: ignore[attr-defined]

    async def __aenter__(self) -> asyncio.Lock:
        await self.gate.acquire()
        return self.gate  # type: ignore[no-any-return]

    async def __aexit__(self, *exc: object) -> None:
        self.gate.release()


def test_sigterm_drains_with_an_open_stream(tmp_path: Path) -> None:
    path = ingest_now("koordinator.jsonl", tmp_path / "l.db")
    env = {**os.environ, "QUOTALEDGER_TOKEN": TOKEN}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "quotaledger.adapters.cli",
            "serve",
            str(path),
            "--listen",
            "127.0.0.1:0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline().decode()
        base = first.split()[-1].rstrip("/")

        async def open_stream() -> None:
            async with aiohttp.ClientSession() as session:
                await asyncio.sleep(0)
                async with session.get(f"{base}/v1/stream") as stream:
                    await stream.content.readline()
                    proc.send_signal(signal.SIGTERM)
                    # the server ends the stream itself
                    while await stream.content.readline():
                        pass

        asyncio.run(asyncio.wait_for(open_stream(), 30))
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert b"Traceback" not in proc.stderr.read()  # type: ignore[union-attr]


async def test_quota_reads_wait_for_a_fold_but_not_for_a_reader_thread(tmp_path: Path) -> None:
    import threading

    path = await ingest("koordinator.jsonl", tmp_path / "l.db")
    async with running(path) as run:
        url = f"{run.base}/v1/quotas/team-a"
        release = threading.Event()
        reader = asyncio.create_task(
            run.server.read_settled(lambda state: release.wait(30) and state.offset)
        )
        while not run.server._thread_readers:
            await asyncio.sleep(0.01)
        async with run.session.get(url) as response:  # beside the reader thread
            assert response.status == 200
        release.set()
        assert await reader == run.server.state.offset
        async with _held(run) as gate:  # as while a batch is folded
            pending = asyncio.create_task(run.session.get(url))
            # the request has reached the gate and queues on it (asyncio.Lock keeps
            # its waiters in ``_waiters``): a sync point, not a while of wall time
            async with asyncio.timeout(30):
                while not getattr(gate, "_waiters", None) and not pending.done():
                    await asyncio.sleep(0.01)
            assert not pending.done()
        response = await asyncio.wait_for(pending, 30)
        assert response.status == 200
        response.release()


_LINES = {
    "fact": b'{"kind": "NodeRemoved", "name": "n"}',
    "timed": b'{"kind": "NodeRemoved", "name": "n", "at": "2026-01-01T00:00:01Z"}',
    "malformed": b'{"kind": "NodeRemoved"',
    "invalid": b'{"kind": "PodUpserted", "uid": "p"}',
    "decision": b'{"kind": "EvictionSucceeded", "eviction_id": "e"}',
    "blank": b"   ",
}


@given(st.lists(st.sampled_from(sorted(_LINES)), max_size=30))
def test_parse_facts_names_every_bad_line(kinds: list[str]) -> None:
    from quotaledger.adapters.http.requests import parse_facts

    body = b"\n".join(_LINES[kind] for kind in kinds)
    appends, problems, decisions = parse_facts(body)
    numbered = list(enumerate(kinds, start=1))
    assert [p["line"] for p in problems] == [
        n for n, kind in numbered if kind in ("malformed", "invalid")
    ]
    assert [d["line"] for d in decisions] == [n for n, kind in numbered if kind == "decision"]
    good = [kind for kind in kinds if kind in ("fact", "timed")]
    assert len(appends) == len(good)
    assert [a.ts is not None for a in appends] == [kind == "timed" for kind in good]


@given(st.lists(st.sampled_from(sorted(_LINES)), max_size=30))
def test_parse_changes_reads_the_lines_as_parse_facts_does(kinds: list[str]) -> None:
    """What-if changes and appended facts come from one line reader: the same bad
    lines by number; every event line is a change (decisions too), ``at`` or 0."""
    from quotaledger.adapters.http.requests import parse_changes, parse_facts

    body = b"\n".join(_LINES[kind] for kind in kinds)
    changes, problems = parse_changes(body)
    assert problems == parse_facts(body)[1]
    events = [kind for kind in kinds if kind in ("fact", "timed", "decision")]
    assert [line for _, line in changes] == [_LINES[kind] for kind in events]
    assert [at != 0 for at, _ in changes] == [kind == "timed" for kind in events]


async def _ids(stream: aiohttp.ClientResponse, count: int) -> list[int]:
    ids: list[int] = []
    while len(ids) < count:
        line = (await stream.content.readline()).decode()
        if line.startswith("id: "):
            ids.append(int(line[4:]))
    return ids


async def test_stream_resumes_from_last_event_id_without_gap_or_repeat(tmp_path: Path) -> None:
    path = await ingest("koordinator.jsonl", tmp_path / "l.db")
    # read-only: no engine writes in between, so the offsets are exactly ours
    async with running(path, read_only=True) as run:

        async def append(count: int) -> int:
            event = encode_event(NodeRemoved(name="gone"))
            offsets = await run.ledger.append([Append(payload=event)] * count)
            return offsets[-1]

        tail = run.server.state.offset
        timeout = aiohttp.ClientTimeout(total=30)
        async with run.session.get(f"{run.base}/v1/stream?since=0", timeout=timeout) as stream:
            assert await _ids(stream, tail + 1) == list(range(tail + 1))
            last = await append(3)
            assert await _ids(stream, 3) == [last - 2, last - 1, last]
        await caught_up(run, last)
        headers = {"Last-Event-ID": str(last - 2)}
        async with run.session.get(
            f"{run.base}/v1/stream", headers=headers, timeout=timeout
        ) as stream:
            assert await _ids(stream, 2) == [last - 1, last]
            newest = await append(1)
            assert await _ids(stream, 1) == [newest]
        async with run.session.get(f"{run.base}/v1/stream?since=x") as response:
            assert response.status == 400


def test_serve_refuses_bad_arguments_without_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from quotaledger.adapters.cli import main

    ledger = str(tmp_path / "l.db")
    for args, needle in (
        (["--listen", "nope"], "--listen 'nope'"),
        (["--token-file", str(tmp_path / "missing")], "--token-file"),
    ):
        assert main(["serve", ledger, *args]) == 2
        err = capsys.readouterr().err
        assert err.startswith("quotaledger: error: ") and needle in err
        assert "Traceback" not in err
    empty = tmp_path / "empty-token"
    empty.write_text("\n")
    assert main(["serve", ledger, "--token-file", str(empty)]) == 2
    assert "is empty" in capsys.readouterr().err


async def test_record_source_reads_any_ledger_as_the_sqlite_reader_does(tmp_path: Path) -> None:
    """``/v1/explain`` audits through one record source: a SQLite ledger read batch by
    batch, any other ledger (here the gated wrapper over the same file) read once:
    the same records from every offset, so the same audit."""
    from quotaledger.adapters.http.gate import GatedLedger
    from quotaledger.adapters.ledgers.sources import ledger_record_source as record_source
    from quotaledger.adapters.ledgers.sqlite.ledger import SqliteLedger
    from quotaledger.engine.audit import audit, report_json

    path = await simulate("quota-decrease.jsonl", tmp_path / "l.db")
    ledger = await SqliteLedger.open(str(path), read_only=True)
    try:
        tail = await ledger.last_offset()
        direct = await record_source(ledger)
        other = await record_source(GatedLedger(ledger, lambda: Projection().state))
        for start in (0, 1, tail // 2, tail, tail + 1):
            assert list(direct(start)) == list(other(start)), start
        assert len(list(direct(0))) == tail + 1
        report = audit(direct)
        assert report.records == tail + 1 and report.findings
        assert report_json(audit(other)) == report_json(report)
    finally:
        await ledger.close()
