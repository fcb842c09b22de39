"""Producers independent of aiokafka (DESIGN §3, §10): confluent-kafka publishes the shipped
examples; ``replay kafka://...`` gives the same state hash as ``replay FILE.jsonl``."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from confluent_kafka import Producer  # type: ignore[import-untyped]

from tests.cli_process import cli
from tests.paths import REPO
from tests.tansu import Tansu

EXAMPLES = sorted((REPO / "examples").glob("*.jsonl"))


def publish(bootstrap: str, topic: str, path: Path) -> int:
    """Each line as one message. A line with `at` has its own time; a line without
    it is sent with record timestamp 1 ms (librdkafka reads 0 as "now"), which the
    ledger clamps up to the previous record's time: exactly what `replay FILE.jsonl`
    does with such a line."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "acks": "all",
            "enable.idempotence": False,
            "max.in.flight.requests.per.connection": 1,
        }
    )
    errors: list[str] = []

    def delivered(err: object, _msg: object) -> None:
        if err is not None:
            errors.append(str(err))

    count = 0
    for line in path.read_bytes().splitlines():
        if not line.strip():
            continue
        producer.produce(topic, line.strip(), partition=0, timestamp=1, on_delivery=delivered)
        count += 1
    assert producer.flush(30) == 0
    assert not errors, errors
    return count


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_confluent_published_example_replays_like_the_file(
    tansu: Tansu, topic: str, example: Path
) -> None:
    url = tansu.url(topic)
    # LedgerOpened at the epoch: a published history replays as the file does
    # (with init's wall clock, every older `at` would be clamped up to it).
    done = cli("init", url, "--at", "1970-01-01T00:00:00Z")
    assert done.returncode == 0, done.stderr
    count = publish(tansu.bootstrap, topic, example)
    from_kafka = cli("replay", url, "--json")
    assert from_kafka.returncode == 0, from_kafka.stderr
    from_file = cli("replay", str(example), "--json")
    kafka_state, file_state = json.loads(from_kafka.stdout), json.loads(from_file.stdout)
    assert kafka_state["offset"] == count
    assert kafka_state["hash"] == file_state["hash"]
    assert kafka_state["time"] == file_state["time"]
    # a file's decode errors name their line ("line 5: ..."); a Kafka record has none
    for item in file_state["rejected"]:
        item["reason"] = re.sub(r"^line \d+: ", "", item["reason"])
    assert kafka_state["rejected"] == file_state["rejected"]


def test_init_at_wall_clock_clamps_older_facts(tansu: Tansu, topic: str) -> None:
    """Without --at, LedgerOpened carries the wall clock: facts published later
    with an older `at` take that time (a ledger's time never goes back)."""
    url = tansu.url(topic)
    assert cli("init", url).returncode == 0
    publish(tansu.bootstrap, topic, EXAMPLES[0])
    state = json.loads(cli("replay", url, "--json").stdout)
    assert state["time"] > "2026-11"  # not the examples' 2026-01-01
