"""The docker-compose topology run natively (DESIGN §10, §11; DECISIONS 132).

A tansu Kafka-protocol broker stands in for the compose ``kafka`` service; the
``quotaledger`` and ``demo`` services run as real CLI processes with the commands
docker-compose.yml gives them (only the broker address and the listen port differ);
a Prometheus-format scrape of ``/metrics`` is parsed with prometheus-client's parser.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from quotaledger.adapters.cli import build_parser
from quotaledger.adapters.demo import _quota
from quotaledger.adapters.ledgers.url import open_ledger, parse_ledger_url
from quotaledger.events.codec import peek_kind

from .k8s_support import eventually
from .tansu import Tansu

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "topology-token-0123456789"


def compose_command(service: str, url: str) -> list[str]:
    """The service's command from docker-compose.yml with its kafka:// URL replaced."""
    document = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    command = [str(word) for word in document["services"][service]["command"]]
    assert any(word.startswith("kafka://") for word in command), service
    return [url if word.startswith("kafka://") else word for word in command]


def native(command: list[str], tmp_path: Path) -> list[str]:
    """Local ports and paths instead of the containers' ones."""
    out = []
    for word in command:
        if word.startswith("0.0.0.0:"):
            word = "127.0.0.1:0"
        elif word.startswith("/var/lib/quotaledger/"):
            word = str(tmp_path / Path(word).name)
        out.append(word)
    return out


@contextlib.asynccontextmanager
async def process(
    argv: list[str], log: Path, env: dict[str, str] | None = None
) -> AsyncIterator[asyncio.subprocess.Process]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "quotaledger.adapters.cli",
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=log.open("w"),
        env={**os.environ, **(env or {})},
    )
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                async with asyncio.timeout(20):
                    await proc.wait()
            except TimeoutError:
                proc.kill()
                await proc.wait()


def scrape(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Samples by name, parsed as Prometheus parses the exposition format."""
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return samples


def test_compose_commands_parse_with_their_kafka_urls() -> None:
    """The compose services' kafka:// URLs are real ledger URLs for the real parser."""
    parser = build_parser()
    for service, field in (("quotaledger", "ledger"), ("demo", "kafka")):
        command = compose_command(service, "kafka://kafka:9092/quotaledger")
        url = getattr(parser.parse_args(command), field)
        parsed = parse_ledger_url(url)
        assert parsed.scheme == "kafka" and parsed.topic == "quotaledger"
        assert parsed.bootstrap == ("kafka:9092",)


@pytest.mark.slow
async def test_compose_topology_natively(tansu: Tansu, topic: str, tmp_path: Path) -> None:
    url = tansu.url(topic)
    serve_argv = native(compose_command("quotaledger", url), tmp_path)
    demo_argv = native(compose_command("demo", url), tmp_path)
    env = {"QUOTALEDGER_TOKEN": TOKEN}
    async with (
        process(serve_argv, tmp_path / "serve.log", env) as serve,
        aiohttp.ClientSession() as session,
    ):
        assert serve.stdout is not None
        first = (await asyncio.wait_for(serve.stdout.readline(), 120)).decode()
        assert first.startswith("quotaledger serving http://"), (
            first + (tmp_path / "serve.log").read_text()
        )
        base = first.split()[-1].rstrip("/")

        async def get(path: str) -> tuple[int, Any]:
            async with session.get(base + path) as response:
                body = await response.read()
                kind = response.headers.get("Content-Type", "")
                return response.status, json.loads(body) if "json" in kind else body.decode()

        async def ready() -> bool:
            return (await get("/readyz"))[0] == 200

        await eventually(ready, what="serve ready on the Kafka ledger", limit_s=90)
        async with process(demo_argv, tmp_path / "demo.log"):

            async def tree_known() -> bool:
                status, state = await get("/v1/state")
                return status == 200 and "platform-api" in json.dumps(state)

            await eventually(tree_known, what="the demo producer's quotas in /v1/state", limit_s=90)
            # the stream sees a fact POSTed onto the Kafka topic through the API
            async with session.get(base + "/v1/stream") as stream:
                assert stream.status == 200
                # the demo's own decrease comes at 30 s with a 60 s delay; this one fires
                # after 1 s (a delay of 0 would disarm the timer, DESIGN §6.1)
                decrease = _quota(
                    "platform-api", "platform", 12, max={"cpu": 14}, preemption_delay_s=1
                )
                async with session.post(
                    base + "/v1/events",
                    data=json.dumps(decrease).encode() + b"\n",
                    headers={"Authorization": f"Bearer {TOKEN}"},
                ) as posted:
                    assert posted.status == 200, await posted.text()
                    answer = await posted.json()
                assert answer["appended"] == 1
                seen = b""
                async with asyncio.timeout(60):
                    while f"id: {answer['first_offset']}\n".encode() not in seen:
                        seen += await stream.content.readany()

            async def preempted() -> bool:
                status, text = await get("/metrics")
                assert status == 200
                samples = scrape(text)
                return sum(v for _, v in samples.get("quotaledger_preemptions_total", [])) > 0

            await eventually(preempted, what="a finished preemption in /metrics", limit_s=90)
            _, text = await get("/metrics")
            samples = scrape(text)
            quotas = {labels["quota"] for labels, _ in samples["quotaledger_quota_min"]}
            assert {"engineering", "platform-api", "ml-training"} <= quotas
            [(_, offset)] = samples["quotaledger_ledger_offset"]
            assert offset >= answer["first_offset"]
            _, ready_doc = await get("/readyz")
            assert ready_doc["leader"] is True and ready_doc["leader_epoch"] >= 1
    # the same facts are on the topic: the POSTed one and the engine's decisions
    ledger = await open_ledger(url, create=False)
    try:
        kinds = []
        async for batch in ledger.read(0):
            kinds += [peek_kind(record.payload) for record in batch]
            if batch[-1].offset >= offset:
                break
    finally:
        await ledger.close()
    assert kinds[0] == "LedgerOpened"
    assert {"LeaderElected", "QuotaUpserted", "PodUpserted", "PreemptionStarted"} <= set(kinds)


async def test_demo_on_kafka_serves_by_itself(tansu: Tansu, topic: str, tmp_path: Path) -> None:
    """``demo --kafka URL`` (with its own serve, no --speed: 1 on Kafka) feeds the topic and
    answers /readyz and /v1/tree; it ends by itself after --duration."""
    argv = ["demo", "--kafka", tansu.url(topic), "--listen", "127.0.0.1:0", "--duration", "6"]
    async with (
        process(argv, tmp_path / "demo.log") as demo,
        aiohttp.ClientSession() as session,
    ):
        assert demo.stdout is not None
        first = (await asyncio.wait_for(demo.stdout.readline(), 60)).decode()
        assert first.startswith("quotaledger demo serving http://"), (
            first + (tmp_path / "demo.log").read_text()
        )
        base = first.split()[3].rstrip("/")

        async def tree_ready() -> bool:
            async with session.get(base + "/readyz") as ready:
                if ready.status != 200:
                    return False
            async with session.get(base + "/v1/tree") as tree:
                return "platform-api" in await tree.text()

        await eventually(tree_ready, what="the demo's tree served from Kafka", limit_s=90)
        rest = (await demo.stdout.read()).decode()
        assert await demo.wait() == 0, (tmp_path / "demo.log").read_text()
    assert "demo finished: decisions in the ledger: LeaderElected 1" in rest
