"""Executor ``kafka`` (DESIGN §10) end to end on tansu: commands on TOPIC.evictions, answers
from TOPIC.outcomes recorded as EvictionSucceeded/EvictionFailed."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import msgspec
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition  # type: ignore[import-untyped]
from aiokafka.admin import AIOKafkaAdminClient, NewTopic  # type: ignore[import-untyped]

from quotaledger.adapters.ledgers.kafka.executor import KafkaExecutor
from quotaledger.adapters.ledgers.kafka.ledger import KafkaLedger
from quotaledger.events.codec import decode_event
from quotaledger.events.model import EvictionFailed, EvictionSucceeded, PodUpserted
from quotaledger.projections.state import EvictionRun, ProjectedState
from tests.cli_process import cli
from tests.tansu import Tansu

EXAMPLE = Path(__file__).parent.parent / "examples" / "quota-decrease.jsonl"


async def make_topics(bootstrap: str, *names: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(n, 1, 1) for n in names])
    finally:
        await admin.close()


class Agent:
    """An external eviction agent: answers every command on TOPIC.evictions."""

    def __init__(self, bootstrap: str, topic: str, answer: dict[str, object]) -> None:
        self.bootstrap, self.topic, self.answer = bootstrap, topic, answer
        self.commands: list[dict[str, object]] = []

    async def run(self) -> None:
        consumer = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, group_id=None)
        producer = AIOKafkaProducer(bootstrap_servers=self.bootstrap, acks="all")
        await consumer.start()
        await producer.start()
        tp = TopicPartition(f"{self.topic}.evictions", 0)
        consumer.assign([tp])
        consumer.seek(tp, 0)
        try:
            while True:
                fetched = await consumer.getmany(tp, timeout_ms=200)
                for message in fetched.get(tp, []):
                    command = json.loads(message.value)
                    self.commands.append(command)
                    reply = {"eviction_id": command["eviction_id"], **self.answer}
                    await producer.send_and_wait(
                        f"{self.topic}.outcomes", json.dumps(reply).encode(), partition=0
                    )
        finally:
            await consumer.stop()
            await producer.stop()


async def ledger_events(bootstrap: str, topic: str) -> list[object]:
    ledger = await KafkaLedger.open(bootstrap, topic, create=False)
    try:
        out = []
        async for batch in ledger.read(0):
            out.extend(decode_event(r.payload) for r in batch)
        return out
    finally:
        await ledger.close()


async def test_run_with_kafka_executor_end_to_end(tansu: Tansu, topic: str) -> None:
    url = tansu.url(topic)
    assert cli("init", url, "--at", "1970-01-01T00:00:00Z").returncode == 0
    assert cli("ingest", str(EXAMPLE), url).returncode == 0
    await make_topics(tansu.bootstrap, f"{topic}.evictions", f"{topic}.outcomes")
    # an answer nobody asked for: logged and ignored
    producer = AIOKafkaProducer(bootstrap_servers=tansu.bootstrap)
    await producer.start()
    await producer.send_and_wait(
        f"{topic}.outcomes", b'{"eviction_id": "no-such-eviction", "ok": true}', partition=0
    )
    await producer.send_and_wait(f"{topic}.outcomes", b"not json", partition=0)
    await producer.stop()

    agent = Agent(tansu.bootstrap, topic, {"ok": True, "error": None})
    agent_task = asyncio.create_task(agent.run())
    engine = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "quotaledger.adapters.cli",
            "run",
            url,
            "--executor",
            "kafka",
            "--instance",
            "e1",
        ],
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    try:
        limit = time.monotonic() + 120  # a hang guard, not a speed requirement
        while True:
            events = await ledger_events(tansu.bootstrap, topic)
            kinds = [type(e).__name__ for e in events]
            if "PreemptionFinished" in kinds:
                break
            if time.monotonic() > limit:
                raise AssertionError(f"no PreemptionFinished; ledger: {kinds}")
            await asyncio.sleep(0.1)
        engine.send_signal(signal.SIGTERM)
        assert engine.wait(timeout=30) == 0
    finally:
        if engine.poll() is None:
            engine.kill()
            engine.wait()
        agent_task.cancel()
    stderr = engine.stderr.read() if engine.stderr else ""
    assert "unknown eviction 'no-such-eviction' ignored" in stderr, stderr
    assert "malformed outcome ignored" in stderr
    # basis 8: the engine's LeaderElected follows the example's 7 facts
    assert agent.commands == [
        {
            "eviction_id": "quota-decrease/analytics/8/spark-3",
            "preemption_id": "quota-decrease/analytics/8",
            "pod_uid": "spark-3",
            "namespace": "analytics",
            "name": "spark-exec-2",
            "queue": "analytics",
        }
    ]
    events = await ledger_events(tansu.bootstrap, topic)
    succeeded = [e for e in events if isinstance(e, EvictionSucceeded)]
    assert [e.eviction_id for e in succeeded] == ["quota-decrease/analytics/8/spark-3"]
    finished = [e for e in events if type(e).__name__ == "PreemptionFinished"]
    assert [getattr(e, "outcome", None) for e in finished] == ["complete"]
    assert cli("audit", url).returncode == 0


def _state_with_pod() -> ProjectedState:
    state = ProjectedState.empty()
    state.pods["p1"] = PodUpserted(uid="p1", name="web-0", namespace="shop")
    return state


def _run(eid: str) -> EvictionRun:
    return EvictionRun(
        eviction_id=eid, preemption_id="pre", pod_uid="p1", queue="shop", requested_offset=5
    )


async def test_failed_answer_and_timeout(tansu: Tansu, topic: str) -> None:
    agent = Agent(tansu.bootstrap, topic, {"ok": False, "error": "PodDisruptionBudget"})
    async with KafkaExecutor([tansu.bootstrap], topic, outcome_timeout_s=60) as executor:
        task = asyncio.create_task(agent.run())
        try:
            out = await executor.evict(_run("pre/p1"), _state_with_pod())
        finally:
            task.cancel()
    assert out == [EvictionFailed(eviction_id="pre/p1", error="PodDisruptionBudget")]
    # nobody answers: the eviction fails after the timeout
    async with KafkaExecutor([tansu.bootstrap], topic + "-x", outcome_timeout_s=0.5) as executor:
        out = await executor.evict(_run("pre/p2"), _state_with_pod())
    assert isinstance(out[0], EvictionFailed) and "no outcome" in out[0].error


async def test_answer_given_while_the_engine_was_down_is_used(tansu: Tansu, topic: str) -> None:
    """Outcomes are read from the topic's start: an answer published before the
    executor (re)started resolves the eviction as soon as it is driven again."""
    await make_topics(tansu.bootstrap, f"{topic}.evictions", f"{topic}.outcomes")
    producer = AIOKafkaProducer(bootstrap_servers=tansu.bootstrap)
    await producer.start()
    answer = msgspec.json.encode({"eviction_id": "pre/p1", "ok": True})
    await producer.send_and_wait(f"{topic}.outcomes", answer, partition=0)
    await producer.stop()
    state = _state_with_pod()
    run = _run("pre/p1")
    state.evictions[run.eviction_id] = run
    executor = KafkaExecutor([tansu.bootstrap], topic, outcome_timeout_s=30)
    executor.bind(lambda: state)
    async with executor:
        out = await executor.evict(run, state)
    assert out == [EvictionSucceeded(eviction_id="pre/p1")]
