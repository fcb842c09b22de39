"""Generated bad lines and bad files against replay, simulate and ingest
(DESIGN §4, §9; DECISIONS 31-34).

Each example is a JSONL file of good facts with bad lines mixed in (wrong
types, negative and out-of-range numbers, out-of-range times, huge amounts,
unknown kinds, broken UTF-8, truncated JSON, misplaced BOMs, NULs, very long
lines, non-objects), sometimes with a BOM at the start or a binary head. The
properties, for every example:

- no traceback, ever; exit 0, or 2 for ``--strict`` with a bad line and for a
  binary file (a NUL byte in its first 8 KiB: refused whole, DECISIONS 32);
- every bad line is a FactRejected at its own offset, with its raw text;
- every good line is still folded: the state hash equals that of the file with
  only its good lines (a FactRejected never changes the hash), and so do the
  quotas and cluster of ``simulate``;
- a ledger built by ``ingest`` replays to the same hash as ``replay`` of the file.

The property test ends by checking what it threw itself: at least 2,000 bad
lines and files (:data:`ENOUGH_BAD_INPUT`), whether it runs alone or with the
others; the whole file takes well under a minute on an idle 2-core machine.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from quotaledger.adapters.cli import main
from quotaledger.events.codec import EventError, decode_event

EXE = Path(sys.executable).parent / "quotaledger"
EXAMPLES = 160
#: Bad lines plus binary files one run of the property must throw at the CLI.
ENOUGH_BAD_INPUT = 2_000
#: Revoke and reclaim off: simulate then decides nothing, so its state can be
#: compared with the good-only file's whatever offsets the bad lines take.
HEAD = {"kind": "SettingsChanged", "revoke_enabled": False, "reclaim_enabled": False}

NAMES = st.sampled_from(["a", "b", "c", "team-x", "default"])
SMALL = st.integers(min_value=0, max_value=64)
GOOD_AT = st.one_of(
    st.none(),
    st.datetimes(min_value=datetime(2025, 1, 1), max_value=datetime(2027, 1, 1)).map(
        lambda moment: moment.isoformat()  # naive: UTC
    ),
    st.sampled_from(["2026-01-01T00:00:00Z", "2026-06-01T12:00:00+09:00"]),
)


def _with_at(doc: dict[str, Any], at: str | None) -> dict[str, Any]:
    return doc if at is None else {**doc, "at": at}


@st.composite
def good_line(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["node", "quota", "pod", "pod", "pod", "removed", "weight"]))
    at = draw(GOOD_AT)
    if kind == "node":
        doc: dict[str, Any] = {
            "kind": "NodeUpserted",
            "name": draw(st.sampled_from(["n1", "n2"])),
            "allocatable": {"cpu": draw(SMALL), "memory": f"{draw(SMALL)}Gi"},
        }
    elif kind == "quota":
        doc = {
            "kind": "QuotaUpserted",
            "name": draw(NAMES),
            "min": {"cpu": draw(st.integers(0, 4))},
            "max": draw(st.one_of(st.none(), st.builds(lambda c: {"cpu": c}, SMALL))),
            "preemption_delay_s": draw(st.sampled_from([0, 1.5, 60, 315_360_000])),
        }
    elif kind == "pod":
        doc = {
            "kind": "PodUpserted",
            "uid": draw(st.sampled_from(["p1", "p2", "p3", "p4"])),
            "name": "pod",
            "namespace": draw(NAMES),
            "requests": {"cpu": draw(st.sampled_from(["100m", "1", "2", 3]))},
            "phase": draw(st.sampled_from(["Pending", "Running"])),
            "node": draw(st.sampled_from([None, "n1"])),
            "priority": draw(st.integers(-(2**31), 2**31 - 1)),
            "created_at": draw(GOOD_AT),
        }
    elif kind == "removed":
        doc = {"kind": "PodRemoved", "uid": draw(st.sampled_from(["p1", "p2", "p9"]))}
    else:
        doc = {
            "kind": "NamespaceWeighted",
            "namespace": draw(NAMES),
            "weight": draw(st.integers(1, 9)),
        }
    return json.dumps(_with_at(doc, at)).encode()


POD = {"kind": "PodUpserted", "uid": "px", "name": "px", "namespace": "a"}
BAD_DOCS: list[dict[str, Any]] = [
    {"kind": "PodExploded"},
    {"kind": 7},
    {"name": "no-kind"},
    {"kind": "NodeUpserted"},
    {"kind": "NodeUpserted", "name": 5},
    {"kind": "NodeUpserted", "name": "n", "labels": None},
    {"kind": "NodeUpserted", "name": "n", "unschedulable": "yes"},
    {**POD, "requests": {"cpu": -1}},
    {**POD, "requests": {"cpu": "-1"}},
    {**POD, "requests": {"cpu": "lots"}},
    {**POD, "requests": {"cpu": True}},
    {**POD, "requests": {"memory": "20Ei"}},
    {**POD, "requests": {"cpu": 2**80}},
    {**POD, "requests": {"cpu": 1e300}},
    {**POD, "requests": {"cpu": "4611686018427388"}},
    {**POD, "priority": 2**31},
    {**POD, "priority": "high"},
    {**POD, "phase": "Exploded"},
    {**POD, "created_at": "1969-12-31T23:59:59Z"},
    {**POD, "created_at": "9000-01-01T00:00:01Z"},
    {**POD, "created_at": "9999-12-31T23:59:59"},
    {**POD, "created_at": "yesterday"},
    {"kind": "PodRemoved", "uid": "p1", "at": "1960-01-01T00:00:00"},
    {"kind": "PodRemoved", "uid": "p1", "at": "9500-01-01T00:00:00Z"},
    {"kind": "PodRemoved", "uid": "p1", "at": 12},
    {"kind": "QuotaUpserted", "name": "q", "preemption_delay_s": -1},
    {"kind": "QuotaUpserted", "name": "q", "preemption_delay_s": 1e308},
    {"kind": "QuotaUpserted", "name": "q", "preemption_delay_s": 315_360_000.5},
    {"kind": "QuotaUpserted", "name": "q", "preemption_delay_s": "60"},
    {"kind": "QuotaUpserted", "name": "q", "max": {"cpu": "1e31"}},
    {"kind": "NamespaceWeighted", "namespace": "a", "weight": 0},
    {"kind": "NamespaceWeighted", "namespace": "a", "weight": 2**63},
    {"kind": "NamespaceWeighted", "namespace": "a", "weight": 1.5},
    {"kind": "SettingsChanged", "revoke_after_s": 1e12},
    {"kind": "SettingsChanged", "reclaim_after_s": -0.5},
    {"kind": "SettingsChanged", "preemption_miss_percent": 101},
    {"kind": "SettingsChanged", "min_scaling": None},
]


@st.composite
def bad_line(draw: st.DrawFn) -> bytes:
    """A non-blank line that must not decode."""
    # A NUL in the first 8 KiB makes the whole file binary (refused whole):
    # rare enough that most examples exercise the line-by-line path.
    how = draw(
        st.sampled_from(
            [
                *["doc"] * 12,
                *["truncated", "utf8", "bom", "not-object"] * 3,
                "long",
                "long",
                "garbage",
                "garbage",
                "nul",
            ]
        )
    )
    if how == "doc":
        return json.dumps(draw(st.sampled_from(BAD_DOCS))).encode()
    if how == "truncated":
        whole = draw(good_line())
        return whole[: draw(st.integers(1, len(whole) - 1))]
    if how == "utf8":
        whole = draw(good_line())
        cut = draw(st.integers(1, len(whole) - 1))
        return (
            whole[:cut] + draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80"])) + whole[cut:]
        )
    if how == "nul":
        whole = draw(good_line())
        cut = draw(st.integers(0, len(whole)))
        return whole[:cut] + b"\x00" + whole[cut:]
    if how == "bom":
        return b"\xef\xbb\xbf" + draw(good_line())  # only the file's first BOM is skipped
    if how == "long":
        pad = "x" * draw(st.integers(10_000, 120_000))
        return json.dumps({"kind": "NoSuchKind", "pad": pad}).encode()
    if how == "not-object":
        return draw(st.sampled_from([b"[1, 2]", b'"PodUpserted"', b"42", b"null", b"true", b"{}"]))
    text = draw(st.binary(min_size=1, max_size=40))
    for byte in (b"\n", b"\r", b"\x00"):
        text = text.replace(byte, b"")
    return text.strip() or b"\x01"


@dataclass
class Example:
    lines: list[tuple[bytes, bool]]  # (bytes, is_good), physical order, blanks excluded
    bom: bool
    crlf: bool
    final_newline: bool

    def data(self, *, only_good: bool = False) -> bytes:
        eol = b"\r\n" if self.crlf else b"\n"
        kept = [raw for raw, good in self.lines if good or not only_good]
        body = eol.join(kept) + (eol if self.final_newline or only_good else b"")
        return (b"\xef\xbb\xbf" if self.bom else b"") + body

    @property
    def binary(self) -> bool:
        return b"\x00" in self.data()[:8192]

    def bad_offsets(self) -> list[int]:
        return [offset for offset, (_, good) in enumerate(self.lines, start=1) if not good]


@st.composite
def example(draw: st.DrawFn) -> Example:
    head = [(json.dumps(HEAD).encode(), True)]
    body = draw(
        st.lists(
            st.one_of(
                good_line().map(lambda b: (b, True)),
                bad_line().map(lambda b: (b, False)),
                bad_line().map(lambda b: (b, False)),
            ),
            min_size=16,
            max_size=48,
        )
    )
    return Example(
        lines=head + body,
        bom=draw(st.booleans()),
        crlf=draw(st.booleans()),
        final_newline=draw(st.booleans()),
    )


def cli(capsysbinary: pytest.CaptureFixture[bytes], *argv: str) -> tuple[int, bytes, str]:
    code = main(list(argv))
    out, err = capsysbinary.readouterr()
    text = err.decode("utf-8", "replace")
    assert "Traceback" not in text
    return code, out, text


def test_bad_input_never_stops_a_stream(
    tmp_path_factory: pytest.TempPathFactory, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    """The property below over :data:`EXAMPLES` examples, then its own count of
    what it threw: a run that tested too little bad input fails here."""
    thrown: Counter[str] = Counter()
    bad_input_never_stops_a_stream(
        tmp_path_factory=tmp_path_factory, capsysbinary=capsysbinary, thrown=thrown
    )
    print(dict(thrown))
    assert thrown["bad_lines"] + thrown["binary_files"] >= ENOUGH_BAD_INPUT, thrown


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.large_base_example,
    ],
)
@given(item=example())
def bad_input_never_stops_a_stream(
    item: Example,
    tmp_path_factory: pytest.TempPathFactory,
    capsysbinary: pytest.CaptureFixture[bytes],
    thrown: Counter[str],
) -> None:
    root = tmp_path_factory.mktemp("fuzz")
    path = root / "events.jsonl"
    path.write_bytes(item.data())
    thrown["examples"] += 1
    for raw, good in item.lines:
        if not good:
            thrown["bad_lines"] += 1
            with pytest.raises(EventError):  # the generator's own claim
                decode_event(raw.strip())
    if item.binary:
        thrown["binary_files"] += 1
        for argv in (
            ["replay", str(path)],
            ["simulate", str(path)],
            ["ingest", str(path), str(root / "x.db")],
        ):
            code, out, err = cli(capsysbinary, *argv)
            assert code == 2
            assert err.startswith("quotaledger: error: ") and "not a text file" in err
        assert not (root / "x.db").exists()
        return

    good_path = root / "good.jsonl"
    good_path.write_bytes(item.data(only_good=True))
    code, out, err = cli(capsysbinary, "replay", str(path), "--json")
    assert code == 0, err
    state = json.loads(out)
    code, out, err = cli(capsysbinary, "replay", str(good_path), "--json")
    assert code == 0, err
    good_state = json.loads(out)
    assert state["hash"] == good_state["hash"]
    assert state["offset"] == len(item.lines)
    rejected = [r for r in state["rejected"] if r["reason"].startswith("line ")]
    assert [r["offset"] for r in rejected] == item.bad_offsets()

    # --strict stops at the first bad line, naming its physical line.
    code, out, err = cli(capsysbinary, "replay", str(path), "--json", "--strict")
    if item.bad_offsets():
        assert code == 2
        first = item.bad_offsets()[0]  # blank lines never occur: offset = line number
        assert err.startswith(f"quotaledger: error: {path}:{first}: ")
        assert out == b""
    else:
        assert code == 0

    # simulate: same quotas and cluster as the good-only file; rejections at their offsets.
    code, out, err = cli(capsysbinary, "simulate", str(path), "--json")
    assert code == 0, err
    simulated = json.loads(out)["state"]
    code, out, err = cli(capsysbinary, "simulate", str(good_path), "--json")
    assert code == 0, err
    good_simulated = json.loads(out)["state"]
    assert simulated["quotas"] == good_simulated["quotas"]
    assert simulated["cluster"] == good_simulated["cluster"]
    assert len([r for r in simulated["rejected"] if r["reason"].startswith("line ")]) == len(
        item.bad_offsets()
    )

    # ingest: the ledger replays to the file's hash, each bad line kept raw.
    ledger = root / "ledger.db"
    code, out, err = cli(capsysbinary, "ingest", str(path), str(ledger))
    assert code == 0, err
    code, out, err = cli(capsysbinary, "replay", str(ledger), "--json")
    assert code == 0, err
    from_ledger = json.loads(out)
    assert from_ledger["hash"] == state["hash"]
    assert from_ledger["rejected"] == state["rejected"]


SUBPROCESS_CASES = [
    b'{"kind": "PodExploded"}\n{"kind":"NodeUpserted","name":"n","allocatable":{"cpu":4}}\n',
    b"\xef\xbb\xbf"
    + b'{"kind":"NodeUpserted","name":"n","allocatable":{"memory":"20Ei"}}\r\n\xff\xfe\n',
    b'{"kind":"QuotaUpserted","name":"q","preemption_delay_s":1e308}\n'
    b'{"kind": "PodRemoved", "uid": ',
    b"\x00\x01\x02garbage" * 100,
]


@pytest.mark.parametrize(
    "data", SUBPROCESS_CASES, ids=["kind", "bom-huge-utf8", "poison-truncated", "binary"]
)
def test_console_script_never_prints_a_traceback(data: bytes, tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.write_bytes(data)
    binary = b"\x00" in data[:8192]
    for argv in (
        ["replay", str(path), "--json"],
        ["simulate", str(path)],
        ["ingest", str(path), "l.db"],
    ):
        done = subprocess.run([str(EXE), *argv], cwd=tmp_path, capture_output=True, timeout=120)
        assert b"Traceback" not in done.stderr
        assert done.returncode == (2 if binary else 0), done.stderr
        if binary:
            assert done.stderr.startswith(b"quotaledger: error: ")
    assert (tmp_path / "l.db").exists() != binary
