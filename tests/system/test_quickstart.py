"""docs/QUICKSTART.md, run as written: shadow mode beside Kueue, Koordinator, Volcano and
YuniKorn, from a workstation and in the cluster (DECISIONS 269).

Each fenced block marked ``quickstart=PATH`` is read from the file and its lines are run
with bash, in a scratch directory holding the repository's ``deploy/`` and this test's
virtualenv as ``.venv``, against the stand-in Kubernetes API server loaded with the
scheduler's sample objects (tests/data/import/, with their source and licence), some nodes
and a pod. The only substitutions: ``$HOME/.kube/config`` is the stand-in's kubeconfig,
and port 8080 is a free port. Lines that need what the stand-in cannot give are checked
against the files they use instead: the ``pip install`` (tests/system/test_packaging.py installs
the package the same way), ``docker build``/``kind load`` (the Dockerfile and the image
the Deployment runs), ``kubectl port-forward`` (the Service it reaches, the port Prometheus
scrapes) and ``docker compose`` (the shadow dashboards' files). In the cluster path, what
the kubelet would run — the Deployment ``kubectl apply -k`` stored — is run with the
stand-in's kubeconfig instead of the service account.

Checked: the resulting tree is the tree ``quotaledger import`` makes of the same objects,
the pod is in its quota, ``/metrics`` (what Grafana reads) has every quota, nothing was
evicted, and every API call quotaledger made is allowed by the rights QUICKSTART states
(read-only plus the Lease)."""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from quotaledger.adapters.cli import main as cli_main
from tests.adapters.kubernetes.test_k8s_rbac import allows, rules
from tests.k8s_api_server import ApiServer
from tests.k8s_support import IMPORT_DATA, eventually, load_source_samples, node, pod
from tests.paths import REPO

REPO = REPO
QUICKSTART = REPO / "docs" / "QUICKSTART.md"
KUBECTL = shutil.which("kubectl")
VENV = Path(sys.executable).parent.parent

#: The scheduler's own sample objects (tests/data/import/*/SOURCE.md name their origin).
SAMPLES = {
    "kueue": ["kueue/cohort-borrowing-limit.yaml", "kueue/cohort-shared-quota.yaml"],
    "koordinator": [
        "koordinator/multi-tree-quota.yaml",
        "koordinator/networktopology-quota.yaml",
        "koordinator/proposal-multi-hierarchy.yaml",
    ],
    "volcano": ["volcano/capacity-deserved.yaml", "volcano/hierarchical-jobs-queues.yaml"],
    "yunikorn": ["yunikorn/resource-limits-configmap.yaml"],
}
#: A pod of each scheduler, placed in a queue the way that scheduler's pods name it.
POD_IN = {
    "kueue": ("team-a-cq", {"labels": {"quotaledger.io/quota": "team-a-cq"}}),
    "koordinator": (
        "quota-example",
        {"labels": {"quota.scheduling.koordinator.sh/name": "quota-example"}},
    ),
    "volcano": ("queue1", {"annotations": {"scheduling.volcano.sh/queue-name": "queue1"}}),
    "yunikorn": ("tenants.group-a", {"labels": {"queue": "root.tenants.group-a"}}),
}
CONFIG_FIELDS = ("parent", "is_parent", "min", "max", "lending_limit", "borrowing_limit")


def blocks() -> dict[str, list[str]]:
    """The ``quickstart=PATH`` code blocks of QUICKSTART.md: their command lines."""
    found = re.findall(r"^```bash quickstart=(\w+)\n(.*?)^```", QUICKSTART.read_text(), re.M | re.S)
    return {
        name: [line for line in body.splitlines() if line.strip() and not line.startswith("#")]
        for name, body in found
    }


def commands(line: str) -> int:
    return len([part for part in re.split(r"&&|\|\||;|\|", line) if part.strip()])


def test_each_path_is_at_most_five_commands() -> None:
    paths = blocks()
    assert set(paths) == {"workstation", "cluster"}
    for name, lines in paths.items():
        assert sum(commands(line) for line in lines) <= 5, name
        assert any("--executor log" in line or "sources/" in line for line in lines)
    text = QUICKSTART.read_text()
    assert "export QUOTA_SOURCE=kueue   # or koordinator, volcano, yunikorn" in text


def test_the_stated_rights_are_the_shipped_rules() -> None:
    """Every rule of base/rbac.yaml and sources/*/rbac.yaml is a row of the table, and
    none grants more than reading, except the Lease."""
    text = QUICKSTART.read_text()
    files = ["base/rbac.yaml", *(f"sources/{s}/rbac.yaml" for s in SAMPLES)]
    for namespace, rule in rules(*files):
        row = next(
            (
                line
                for line in text.splitlines()
                if line.startswith("|")
                and all(f"`{r}`" in line for r in rule["resources"])
                and all(f"`{n}`" in line for n in rule.get("resourceNames", []))
                and (namespace is None or f"`{namespace}`" in line or "Lease" in line)
            ),
            None,
        )
        assert row is not None, (namespace, rule)
        for verb in rule["verbs"]:
            assert verb in row, (verb, row)
        if "leases" not in rule["resources"]:
            assert set(rule["verbs"]) <= {"list", "watch"}, rule


# ------------------------------------------------------------------ the paths, run


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def existing_cluster(server: ApiServer, source: str) -> tuple[str, str]:
    """The cluster a platform team has: nodes, namespaces, the scheduler's objects, a pod
    in one of its queues. Returns (the pod's uid, its quota)."""
    for name in ("node-a", "node-b"):
        server.put("nodes", node(name, cpu="32", memory="128Gi", zone="z1"))
    namespaces = ["team", "kube-system", "default"] + (["yunikorn"] if source == "yunikorn" else [])
    for name in namespaces:
        server.put("namespaces", {"metadata": {"name": name}})
    assert load_source_samples(server, source, [IMPORT_DATA / f for f in SAMPLES[source]])
    quota, keys = POD_IN[source]
    obj = pod("worker-0", uid="uid-worker-0", namespace="team", node="node-a", phase="Running")
    obj["metadata"].update(keys)
    server.put("pods", obj)
    return "uid-worker-0", quota


def imported_tree(source: str, tmp_path: Path) -> dict[str, dict[str, Any]]:
    """The quotas ``quotaledger import`` makes of the same sample files (config fields)."""
    facts, state = tmp_path / "imported.jsonl", tmp_path / "imported.json"
    files = [str(IMPORT_DATA / f) for f in SAMPLES[source]]
    assert cli_main(["import", *files, "--from", source, "--out", str(facts)]) == 0
    done = subprocess.run(
        [sys.executable, "-m", "quotaledger.adapters.cli", "replay", str(facts), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    state.write_text(done.stdout)
    quotas = json.loads(done.stdout)["quotas"]
    return {
        name: {field: quotas[name][field] for field in CONFIG_FIELDS}
        for name in quotas
        if name not in ("system", "default")
    }


def scratch(tmp_path: Path, kubeconfig: Path) -> tuple[Path, dict[str, str]]:
    """A working directory as a clone has it, and the environment of the user's shell."""
    work = tmp_path / "work"
    work.mkdir()
    shutil.copytree(REPO / "deploy", work / "deploy", symlinks=True)
    shutil.copy(REPO / "Dockerfile", work / "Dockerfile")
    (work / ".venv").symlink_to(VENV)
    home = tmp_path / "home"
    (home / ".kube").mkdir(parents=True)
    shutil.copy(kubeconfig, home / ".kube" / "config")
    env = {
        "HOME": str(home),
        "PATH": f"{VENV / 'bin'}:/usr/bin:/bin",
        "LANG": "C.UTF-8",
    }
    return work, env


def check_not_run(line: str, work: Path) -> bool:
    """The lines the stand-in cannot serve: checked against their files (module doc).
    True when ``line`` was such a line."""
    words = shlex.split(line.split("#")[0].rstrip(" &"))
    if line.startswith("python3 -m venv .venv && .venv/bin/pip install -q ."):
        readme = (REPO / "README.md").read_text()
        assert ".venv/bin/pip install -q ." in readme  # the README's own install line
        return True
    if words[:2] == ["docker", "build"]:
        tag = words[words.index("-t") + 1]
        assert (work / "Dockerfile").is_file() and words[4] == "."  # the clone's Dockerfile
        deployment = next(
            d
            for d in yaml.safe_load_all(
                (work / "deploy/kubernetes/single/quotaledger.yaml").read_text()
            )
            if d["kind"] == "Deployment"
        )
        assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == tag
        assert f"kind load docker-image {tag}" in line
        return True
    if words[:2] == ["docker", "compose"]:
        compose = work / words[words.index("-f") + 1]
        document = yaml.safe_load(compose.read_text())
        prometheus = yaml.safe_load((compose.parent / "prometheus.yml").read_text())
        assert prometheus["scrape_configs"][0]["static_configs"][0]["targets"] == ["127.0.0.1:8080"]
        assert set(document["services"]) == {"prometheus", "grafana"}
        assert words[-2:] == ["up", "-d"]
        return True
    if "port-forward" in words:
        local, _, remote = words[-1].partition(":")
        assert local == "8080" and words[words.index("port-forward") + 1] == "svc/quotaledger"
        service = yaml.safe_load((work / "deploy/kubernetes/base/service.yaml").read_text())
        assert int(remote) in [p["port"] for p in service["spec"]["ports"]]
        return True
    return False


async def run_line(line: str, work: Path, env: dict[str, str]) -> asyncio.subprocess.Process | None:
    """A command line with bash: waited for, or started in the background (``&``)."""
    if line.rstrip().endswith("&"):
        return await asyncio.create_subprocess_exec(
            "bash", "-c", "exec " + line.rstrip()[:-1], cwd=work, env=env,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
    done = await asyncio.to_thread(
        subprocess.run, ["bash", "-c", line], cwd=work, env=env, capture_output=True, text=True,
        timeout=180,
    )  # fmt: skip
    assert done.returncode == 0, f"{line}\n{done.stdout}{done.stderr}"
    return None


def kubelet_command(server: ApiServer, home: Path, port: int, data: Path) -> list[str]:
    """What the kubelet would start for the Deployment kubectl stored: its container's
    args, with the stand-in's kubeconfig in place of the service account."""
    deployment = server.get("deployments", "quotaledger", "quotaledger", group="apps")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["image"] == "quotaledger:0.1.0"
    argv = []
    for arg in container["args"]:
        if arg == "--in-cluster":
            argv += ["--kubeconfig", str(home / ".kube" / "config")]
            continue
        arg = arg.replace("$(POD_NAME)", "quotaledger-7d4b9-x2x9q")
        arg = arg.replace("0.0.0.0:8080", f"127.0.0.1:{port}").replace("/data/", f"{data}/")
        argv.append(arg)
    return [str(VENV / "bin" / "quotaledger"), *argv]


@pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")
@pytest.mark.parametrize("path", ["workstation", "cluster"])
@pytest.mark.parametrize("source", sorted(SAMPLES))
async def test_quickstart_path(tmp_path: Path, path: str, source: str) -> None:
    expected = imported_tree(source, tmp_path)
    server = ApiServer()
    server.require_namespaces = True  # as the real one: the Lease needs its namespace
    await server.start()
    processes: list[asyncio.subprocess.Process] = []
    try:
        uid, quota = existing_cluster(server, source)
        work, env = scratch(tmp_path, server.kubeconfig(tmp_path / "kubeconfig", namespace=""))
        env["QUOTA_SOURCE"] = source
        port = free_port()
        started_at = 0
        for line in blocks()[path]:
            if check_not_run(line, work):
                continue
            if "quotaledger serve" in line:
                started_at = len(server.calls)
            line = line.replace("127.0.0.1:8080", f"127.0.0.1:{port}")
            process = await run_line(line, work, env)
            if process is not None:
                processes.append(process)
        if path == "cluster":
            started_at = len(server.calls)
            data = tmp_path / "data"
            data.mkdir()
            processes.append(
                await asyncio.create_subprocess_exec(
                    *kubelet_command(server, Path(env["HOME"]), port, data),
                    cwd=work,
                    env=env,
                    stdout=asyncio.subprocess.DEVNULL,
                    stderr=asyncio.subprocess.PIPE,
                )
            )
        assert len(processes) == 1
        state, metrics = await served(port, expected, processes[0])
        tree = {
            name: {field: state["quotas"][name][field] for field in CONFIG_FIELDS}
            for name in expected
        }
        assert tree == expected
        assert uid in state["quotas"][quota]["pods"]
        for name in expected:
            assert f'quota="{name}"' in metrics, name
        assert not any(c.subresource == "eviction" for c in server.calls)
        granted = rules("base/rbac.yaml", f"sources/{source}/rbac.yaml")
        ours = server.calls[started_at:]
        refused = sorted(
            {c for c in ours if not any(allows(ns, r, c) for ns, r in granted)}, key=str
        )
        assert refused == [], refused
        assert any(c.resource == "leases" and c.verb == "create" for c in ours)
    finally:
        for process in processes:
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
        for process in processes:
            assert process.stderr is not None
            err = (await asyncio.wait_for(process.stderr.read(), 60)).decode()
            code = await process.wait()
            assert code == 0, err
            assert "Traceback" not in err, err
        await server.stop()


async def served(
    port: int, expected: dict[str, Any], process: asyncio.subprocess.Process
) -> tuple[dict[str, Any], str]:
    """The state and the metrics once the served tree holds every expected quota."""
    base = f"http://127.0.0.1:{port}"
    found: dict[str, Any] = {}
    async with aiohttp.ClientSession() as session:

        async def complete() -> bool:
            if process.returncode is not None:
                raise AssertionError(f"quotaledger ended with {process.returncode}")
            try:
                async with session.get(f"{base}/v1/state") as response:
                    if response.status != 200:
                        return False
                    found.update(await response.json())
            except aiohttp.ClientConnectionError:
                return False
            quotas = found.get("quotas", {})
            return set(expected) <= set(quotas) and all(
                quotas[name]["min"] == expected[name]["min"] for name in expected
            )

        await eventually(complete, limit_s=90, what="the served tree")
        async with session.get(f"{base}/metrics") as response:
            assert response.status == 200
            metrics = await response.text()
    return found, metrics
