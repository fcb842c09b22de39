"""``simulate`` writes the same ledger and prints the same output as the code
that recorded ``tests/data/simulate_identical.json`` (DESIGN §7 ``simulate``).

Speed work on the engine core, the clocks and the settle (timers kept in a
heap, clocks' inputs kept incrementally, settles of what changed) must not
move a single byte: the same facts give the same records — decisions, clock
observations, their offsets and times — and the same state. Pinned per input:

* the digest chain (events/digest.py) of the simulated ledger, every record
  from ``LedgerOpened`` on, which is what ``simulate --out`` writes;
* the sha256 of ``simulate --json``'s document with ``state.hash`` blanked
  (the state hash function is not this test's subject; the rest of the state
  JSON, every derived number included, is).

The inputs are the shipped examples (through the CLI, with both executors), a
deterministic generated corpus (tests/simulate_corpus.py) and a small
``bench decide`` day-long scenario. Regenerate the data only for a change
that is meant to alter decisions, and say so in DECISIONS:
``python -m tests.test_simulate_identical --write``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest

from quotaledger.adapters.cli import main
from quotaledger.adapters.ledgers.sqlite.ledger import SqliteLedger
from quotaledger.engine.simulate import Simulation
from quotaledger.events.digest import DigestChain
from quotaledger.events.ledger import Record

from .simulate_corpus import case

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
DATA = Path(__file__).resolve().parent / "data" / "simulate_identical.json"

#: Corpus seeds pinned (0 .. CORPUS-1) and the bench scenario's arguments.
CORPUS = 300
BENCH = {"quotas": 300, "pods": 3000, "nodes": 30, "events": 3000, "seed": 1}


def ledger_digest(records: list[Record]) -> str:
    chain = DigestChain()
    for record in records:
        chain.update(record)
    return chain.hex


def document_digest(document: dict[str, Any]) -> str:
    """sha256 of the JSON ``simulate --json`` prints, ``state.hash`` blanked."""
    document["state"]["hash"] = ""
    return hashlib.sha256(msgspec.json.format(msgspec.json.encode(document), indent=2)).hexdigest()


def simulated(lines: list[tuple[int, bytes]], **kw: Any) -> str:
    """``ledger digest:document digest`` of one run of ``lines``."""
    until = kw.pop("until", None)
    simulation = Simulation(**kw)
    simulation.run(lines, until=until)
    return f"{ledger_digest(simulation.records)}:{document_digest(simulation.result())}"


def corpus_digest(seed: int) -> str:
    item = case(seed)
    return simulated(
        item["lines"], ledger_id=f"corpus-{seed}", executor=item["executor"], until=item["until"]
    )


def bench_digest() -> str:
    from quotaledger.adapters.bench_decide import simulate_lines
    from quotaledger.adapters.workload import generate

    work = generate(BENCH["quotas"], BENCH["pods"], BENCH["nodes"], BENCH["events"], BENCH["seed"])
    return simulated(simulate_lines(work), ledger_id=f"bench-{BENCH['seed']}")


def example_digest(example: str, executor: str, tmp: Path) -> str:
    """Through the CLI: the ``--out`` ledger's digest chain and the ``--json`` document."""
    out = tmp / f"{example}.{executor}.db"
    stdout = sys.stdout
    capture = _Capture()
    sys.stdout = capture  # type: ignore[assignment]
    try:
        code = main(
            [
                "simulate",
                str(EXAMPLES / example),
                "--json",
                "--executor",
                executor,
                "--out",
                str(out),
            ]
        )
    finally:
        sys.stdout = stdout
    assert code == 0
    document = json.loads(capture.buffer.getvalue())

    async def read() -> list[Record]:
        ledger = await SqliteLedger.open(str(out), create=False)
        try:
            return [record for batch in ledger.iter_batches(0) for record in batch]
        finally:
            await ledger.close()

    return f"{ledger_digest(asyncio.run(read()))}:{document_digest(document)}"


class _Capture:
    """A stdout whose ``buffer`` keeps the bytes the CLI writes."""

    def __init__(self) -> None:
        import io

        self.buffer = io.BytesIO()

    def write(self, text: str) -> int:
        self.buffer.write(text.encode())
        return len(text)

    def flush(self) -> None:
        pass


def recorded() -> dict[str, Any]:
    return dict(json.loads(DATA.read_text()))


# ------------------------------------------------------------------ the tests


def test_the_recorded_data_covers_every_example_and_the_corpus() -> None:
    data = recorded()
    assert sorted(data["examples"]) == sorted(
        f"{path.name}:{executor}"
        for path in EXAMPLES.glob("*.jsonl")
        for executor in ("simulate", "log")
    )
    assert sorted(map(int, data["corpus"])) == list(range(CORPUS))
    assert data["bench"]["args"] == BENCH


@pytest.mark.parametrize(
    "example",
    sorted(
        f"{path.name}:{executor}"
        for path in EXAMPLES.glob("*.jsonl")
        for executor in ("simulate", "log")
    ),
)
def test_examples_simulate_to_the_recorded_bytes(example: str, tmp_path: Path) -> None:
    name, executor = example.split(":")
    assert example_digest(name, executor, tmp_path) == recorded()["examples"][example]


@pytest.mark.parametrize("chunk", range(6))
def test_corpus_simulates_to_the_recorded_bytes(chunk: int) -> None:
    expected = recorded()["corpus"]
    differ = [
        seed for seed in range(chunk, CORPUS, 6) if corpus_digest(seed) != expected[str(seed)]
    ]
    assert differ == [], f"corpus seeds whose simulated ledger or output changed: {differ}"


def test_bench_scenario_simulates_to_the_recorded_bytes() -> None:
    assert bench_digest() == recorded()["bench"]["digest"]


def test_output_does_not_depend_on_the_hash_seed() -> None:
    """Set iteration order never reaches the output: two interpreters with
    different ``PYTHONHASHSEED`` agree on a slice of the corpus."""
    script = (
        "from tests.test_simulate_identical import corpus_digest;"
        "print(','.join(corpus_digest(s) for s in range(0, 300, 2)))"
    )
    outputs = set()
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run(
            [sys.executable, "-c", script],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
        )
        outputs.add(done.stdout)
    assert len(outputs) == 1


def write() -> None:
    """Record the data from the code as it is (see the module docstring)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        examples = {
            f"{path.name}:{executor}": example_digest(path.name, executor, Path(tmp))
            for path in sorted(EXAMPLES.glob("*.jsonl"))
            for executor in ("simulate", "log")
        }
    data = {
        "examples": examples,
        "bench": {"args": BENCH, "digest": bench_digest()},
        "corpus": {str(seed): corpus_digest(seed) for seed in range(CORPUS)},
    }
    DATA.write_text(json.dumps(data, indent=1) + "\n")


if __name__ == "__main__":
    if sys.argv[1:] == ["--write"]:
        write()
    else:
        raise SystemExit("usage: python -m tests.test_simulate_identical --write")
