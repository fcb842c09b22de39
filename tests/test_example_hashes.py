"""The shipped examples fold to the same state as before the performance round
(issue #11 "Done when": every acceptance behaviour of DESIGN §5 unchanged).

The state hash covers the persisted fields; the digest of the whole state JSON
also covers every derived number (request, runtime, available, ...), so a
change in how those are computed or stored shows here first.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from quotaledger.adapters.cli import main

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"

#: example -> (state hash, sha256 of the ``replay --json`` output), recorded
#: before issue #11's changes.
RECORDED = {
    "koordinator.jsonl": (
        "48971ea713f59aa389c56601d294dfcc12870db8792aeadd87b8c83fac4330ea",
        "bbf042b5cc02e796c7311b5cb4eb264abad952c66f593160a3f434e894adecab",
    ),
    "overuse.jsonl": (
        "5b4bdfbb7ff3034aa8677ef1376ab372e617f1216299b7779e41a903455b01c5",
        "070f988bcdcba14f86d463edc7a9bbe81ed72066ab31f9c3ec37560bae9ce896",
    ),
    "quota-decrease.jsonl": (
        "21db1d9f3fb7951d990e9af3ed4074fd050f2df95708756932d65e576e54d353",
        "1c5ad09423b82acd9859003bef4fa23428819f1fef103bfd715ddaf1647d6170",
    ),
    "reclaim.jsonl": (
        "6125393596d1dd5b906d0579d51db4ad241440cd15198fed799a7e6d9caff8c1",
        "2c59a3599d10e5cf06a1b209335197b9f7f493d4c92ce424f00a76afee34c690",
    ),
}


def test_every_shipped_example_is_recorded() -> None:
    assert sorted(path.name for path in EXAMPLES.glob("*.jsonl")) == sorted(RECORDED)


@pytest.mark.parametrize("example", sorted(RECORDED))
def test_example_state_is_unchanged(example: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["replay", str(EXAMPLES / example), "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    state_hash, document_digest = RECORDED[example]
    assert json.loads(out)["hash"] == state_hash
    assert hashlib.sha256(out.encode()).hexdigest() == document_digest
