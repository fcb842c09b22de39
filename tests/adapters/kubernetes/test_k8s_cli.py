"""`run` on a cluster from the command line: user errors exit 2 with a clear message; SIGTERM
stops a leading replica promptly and releases the Lease (DESIGN §9, §12)."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

import pytest

from quotaledger.adapters.cli import main
from quotaledger.adapters.kubernetes.watcher import (
    ClusterWatcher,
    LedgerSink,
    NotLeader,
    WatchOptions,
)
from quotaledger.events.codec import decode_event
from quotaledger.events.model import LeaderElected
from tests.k8s_support import eventually, pod, records, rig


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--executor", "kubernetes"], "--executor kubernetes needs --kubeconfig"),
        (["--kubeconfig", "KC", "--renew-deadline", "20"], "--renew-deadline"),
        (["--kubeconfig", "KC", "--settings-configmap", "justaname"], "--settings-configmap"),
        (["--kubeconfig", "missing.yaml"], "missing.yaml: no such file"),
    ],
)
def test_user_errors_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    kubeconfig = tmp_path / "kc"
    kubeconfig.write_text("{}")
    extra = [
        str(kubeconfig) if x == "KC" else str(tmp_path / x) if x == "missing.yaml" else x
        for x in extra
    ]
    code = main(["run", str(tmp_path / "l.db"), "--stop-after", "5", *extra])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("quotaledger: error:") and message in err
    assert "Traceback" not in err


async def test_sigterm_stops_the_leader_and_releases_the_lease(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "quotaledger.adapters.cli", "run", str(r.ledger_path),
            "--kubeconfig", str(r.kubeconfig), "--instance", "solo", "--executor", "log",
            stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:

            async def leading() -> bool:
                return any(
                    isinstance(decode_event(rec.payload), LeaderElected)
                    for rec in await records(r.ledger)
                )

            await eventually(leading, what="the replica leading")
            r.server.put("pods", pod("p", uid="u"))
            await eventually(lambda: _has(r, b'"uid":"u"'), what="the pod fact")
        finally:
            process.send_signal(signal.SIGTERM)
            assert process.stderr is not None
            err = (await asyncio.wait_for(process.stderr.read(), 30)).decode()  # a hang guard
            code = await process.wait()
        assert code == 0, err
        lease = r.server.get("leases", "quotaledger", "quotaledger", group="coordination.k8s.io")
        assert lease["spec"]["holderIdentity"] is None  # released for a successor


async def _has(r: object, needle: bytes) -> bool:
    return any(needle in rec.payload for rec in await records(r.ledger))  # type: ignore[attr-defined]


async def test_watcher_stops_with_not_leader_when_the_sink_refuses(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        r.server.put("pods", pod("p", uid="u"))
        watcher = ClusterWatcher(
            r.cluster.core, r.cluster.custom, LedgerSink(r.ledger, lambda: False), WatchOptions()
        )
        with pytest.raises(NotLeader):
            await asyncio.wait_for(watcher.run(), 10)
        assert len(await records(r.ledger)) == 1  # only LedgerOpened


def test_option_sources_match_the_adapter() -> None:
    from quotaledger.adapters.kubernetes import options, sources

    assert options.SOURCES == sources.SOURCES
