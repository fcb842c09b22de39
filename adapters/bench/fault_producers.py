"""The outside producers of a ``quotaledger bench faults`` trial (DECISIONS 220, 222):
``quotaledger ingest`` runs of a few facts each at random times early in the workload, and
on Kafka a plain confluent-kafka producer (acks=all). Each fact is a ``NamespaceWeighted``
with an id of its own (some with weight 0, which the fold refuses and keeps raw); which
were acknowledged is kept for the fact-lost and fact-twice checks.
"""

from __future__ import annotations

import asyncio
import json
import random
import threading
import time
from typing import Any

from .fault_processes import tail
from .fault_records import decode_json
from .fault_trial_state import TrialState


async def ingest_producer(trial: TrialState, index: int) -> None:
    """``quotaledger ingest`` runs of a few facts each, at random times."""
    rng = random.Random(trial.rng.random())
    runs = rng.randint(1, trial.options.ingest_runs)
    # early in the window: an ingest into a long Kafka ledger reads it (slow on s3)
    times = sorted(rng.uniform(0.0, trial.options.workload_s * 0.6) for _ in range(runs))
    start = time.monotonic()
    for run, at_s in enumerate(times):
        await asyncio.sleep(max(0.0, at_s - (time.monotonic() - start)))
        lines = []
        ids = []
        for n in range(rng.randint(3, 25)):
            fact_id = f"f{trial.seed}x{index}x{run}x{n}"
            ids.append(fact_id)
            weight = 0 if rng.random() < 0.05 else rng.randint(1, 9)  # 0: refused, kept raw
            lines.append(
                json.dumps({"kind": "NamespaceWeighted", "namespace": fact_id, "weight": weight})
            )
        source = trial.dir / f"ingest-{index}-{run}.jsonl"
        source.write_text("\n".join(lines) + "\n")
        err = trial.dir / f"ingest-{index}-{run}.err"
        trial.tool_errs.append(err)
        url = trial.engine_url(rng.choice(["stop", "fill"]))
        with err.open("wb") as stderr:
            proc = await asyncio.create_subprocess_exec(
                *trial.options.tool_command,
                "ingest",
                str(source),
                url,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=stderr,
            )
            try:
                code = await proc.wait()
            finally:
                if proc.returncode is None:  # cancelled: nothing outlives the trial
                    proc.kill()
                    await proc.wait()
        for fact_id in ids:
            trial.produced.acked[fact_id] = code == 0
        trial.result.stats["facts ingested"] += len(ids)
        if code == 2 and "cannot connect" in tail(err, 2):
            # a clear refusal at start (the broker restarting): nothing appended
            trial.result.stats["ingest runs refused at connect"] += 1
        elif code != 0:
            trial.exited("ingest", code, tail(err))


async def kafka_producer(trial: TrialState) -> None:
    """A plain confluent-kafka producer (acks=all), one fact every few tens of ms."""
    import confluent_kafka

    rng = random.Random(trial.rng.random())
    producer = confluent_kafka.Producer(
        {
            "bootstrap.servers": trial.bootstrap,
            "acks": "all",
            "enable.idempotence": False,
            "linger.ms": 0,
            "message.timeout.ms": 120_000,
            "log_level": 0,
        }
    )
    acked = trial.produced.acked
    lock = threading.Lock()

    def delivered(error: Any, message: Any) -> None:
        fact = decode_json(message.value() or b"") or {}
        with lock:
            acked[str(fact.get("namespace"))] = error is None

    stop_at = time.monotonic() + trial.options.workload_s - 0.3
    n = 0
    while time.monotonic() < stop_at:
        fact_id = f"f{trial.seed}xkx{n}"
        n += 1
        weight = 0 if rng.random() < 0.03 else rng.randint(1, 9)
        value = json.dumps({"kind": "NamespaceWeighted", "namespace": fact_id, "weight": weight})
        acked.setdefault(fact_id, False)
        producer.produce(trial.topic, value.encode(), partition=0, on_delivery=delivered)
        producer.poll(0)
        await asyncio.sleep(rng.uniform(0.02, 0.15))
    left = len(producer)
    flush_until = time.monotonic() + 150
    while left and time.monotonic() < flush_until:  # in short steps: cancellable
        left = await asyncio.to_thread(producer.flush, 1.0)
    trial.result.stats["facts produced"] += n
    if left:
        trial.violate("fact-lost", f"the confluent-kafka producer could not deliver {left} facts")
