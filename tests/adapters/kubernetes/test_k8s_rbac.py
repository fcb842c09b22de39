"""deploy/kubernetes/ grants exactly what the code uses (DESIGN §12): every API call quotaledger
makes against the stand-in API server is allowed by the shipped ClusterRole/Role, and every
granted (group, resource, verb) is used. Shadow mode (the shipped Deployments' own command
lines, ``single`` and ``ha``) needs base/rbac.yaml: read-only plus the Lease; evictions
(``--executor kubernetes``) add evict/rbac.yaml; each quota source adds sources/NAME/rbac.yaml."""

from __future__ import annotations

import asyncio
import signal
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from quotaledger.adapters.cli import build_parser
from quotaledger.adapters.kubernetes.cluster import run_on_cluster
from quotaledger.adapters.kubernetes.options import ClusterOptions
from quotaledger.adapters.kubernetes.watcher import WatchOptions
from quotaledger.events.codec import decode_event
from quotaledger.events.model import PreemptionFinished
from tests.adapters.kubernetes.test_k8s_replicas import seed
from tests.k8s_api_server import ApiCall
from tests.k8s_support import eventually, records, rig, running_watcher
from tests.paths import REPO

DEPLOY = REPO / "deploy" / "kubernetes"


def rules(*files: str) -> list[tuple[str | None, dict[str, Any]]]:
    """(namespace or None for a ClusterRole, rule) of every role in the files."""
    out: list[tuple[str | None, dict[str, Any]]] = []
    for name in files:
        for doc in yaml.safe_load_all((DEPLOY / name).read_text()):
            if doc["kind"] == "ClusterRole":
                out += [(None, rule) for rule in doc["rules"]]
            elif doc["kind"] == "Role":
                out += [(doc["metadata"]["namespace"], rule) for rule in doc["rules"]]
    return out


def allows(namespace: str | None, rule: dict[str, Any], call: ApiCall) -> bool:
    resource = f"{call.resource}/{call.subresource}" if call.subresource else call.resource
    if namespace is not None and call.namespace != namespace:
        return False
    names = rule.get("resourceNames")
    return (
        call.group in rule["apiGroups"]
        and resource in rule["resources"]
        and call.verb in rule["verbs"]
        and (not names or call.name in names)
    )


def unused(calls: list[ApiCall], granted: list[tuple[str | None, dict[str, Any]]]) -> list[str]:
    """Every granted (verb, group/resource) no call used."""
    missing = []
    for ns, rule in granted:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    used = any(
                        allows(ns, rule, c)
                        and c.group == group
                        and c.verb == verb
                        and resource
                        == (f"{c.resource}/{c.subresource}" if c.subresource else c.resource)
                        for c in calls
                    )
                    if not used:
                        missing.append(f"{verb} {group}/{resource} ({ns})")
    return missing


def check(calls: list[ApiCall], granted: list[tuple[str | None, dict[str, Any]]]) -> None:
    refused = sorted({c for c in calls if not any(allows(ns, r, c) for ns, r in granted)}, key=str)
    assert refused == [], f"calls the manifests do not allow: {refused}"
    missing = unused(calls, granted)
    assert missing == [], f"granted but never used: {missing}"


def collections(calls: list[ApiCall], verb: str) -> Counter[tuple[str, str, str | None]]:
    """How many ``verb`` calls each collection (group, resource, namespace) got."""
    return Counter((c.group, c.resource, c.namespace) for c in calls if c.verb == verb)


async def used_all(r: Any, granted: list[tuple[str | None, dict[str, Any]]]) -> None:
    """Wait until every grant has been used (the watches of collections listed last start
    a moment after their list); a grant the code never uses fails, naming it."""

    async def done() -> bool:
        return not unused(r.server.calls, granted)

    try:
        await eventually(done, what="every grant used")
    except AssertionError:
        check(r.server.calls, granted)
        raise


async def evict_relist_and_check(r: Any, task: asyncio.Task[Any], stop: asyncio.Event) -> None:
    """Let ``task`` (run or serve on the cluster) finish its evictions and go
    through a re-list, stop it, then check every API call it made against the
    shipped ClusterRole and Role (``check``: allowed, and every grant used)."""

    async def done() -> bool:
        return any(
            isinstance(decode_event(rec.payload), PreemptionFinished)
            for rec in await records(r.ledger)
        )

    async def relisted_and_watching() -> bool:
        # every collection listed again since the compaction, and watched from the
        # new list (the calls of the 410 path are checked too)
        after = r.server.calls[since:]
        lists, watches = collections(after, "list"), collections(after, "watch")
        return set(listed) <= set(lists) and set(listed) <= set(watches)

    granted = rules("base/rbac.yaml", "evict/rbac.yaml")
    try:
        await eventually(done, what="evictions done")
        await used_all(r, granted)
        listed = collections(r.server.calls, "list")
        since = len(r.server.calls)
        r.server.compact()  # the watches get 410 Gone: the watcher re-lists
        await eventually(relisted_and_watching, what="every collection re-listed and watched")
    finally:
        stop.set()
        await task
    verbs = {(c.verb, c.resource) for c in r.server.calls}
    assert {("create", "pods"), ("update", "leases"), ("get", "leases")} <= verbs
    check(r.server.calls, granted)


async def test_run_on_a_cluster_uses_exactly_the_shipped_rbac(tmp_path: Path) -> None:
    async with rig(tmp_path) as r:
        await seed(r)
        r.server.calls.clear()
        args = build_parser().parse_args(
            [
                "run", str(r.ledger_path), "--kubeconfig", str(r.kubeconfig), "--instance", "rbac",
                "--executor", "kubernetes", "--lease-duration", "1", "--renew-deadline", "0.6",
                "--retry-period", "0.2", "--watch-timeout", "1",
            ]
        )  # fmt: skip
        stop = asyncio.Event()
        options = ClusterOptions.from_args(args, snapshot_every=args.snapshot_every)
        task = asyncio.create_task(run_on_cluster(options, r.ledger, stop))

        await evict_relist_and_check(r, task, stop)


@pytest.mark.parametrize("source", ["koordinator", "kueue", "volcano", "yunikorn"])
async def test_quota_sources_need_only_their_extra_rules(tmp_path: Path, source: str) -> None:
    async with rig(tmp_path) as r:
        options = WatchOptions(quota_source=source, watch_timeout_s=1)
        async with running_watcher(r, options) as watcher:
            await eventually(lambda: _watching(watcher))

            async def resumed() -> bool:
                # each watch timed out (1 s) and was resumed from its version
                watches = collections(r.server.calls, "watch")
                return all(n >= 2 for n in watches.values()) and set(watches) >= set(
                    collections(r.server.calls, "list")
                )

            await eventually(resumed, what="every watch resumed")
        base = [
            (ns, rule)
            for ns, rule in rules("base/rbac.yaml")
            if "leases" not in rule["resources"] and "quotas" not in rule["resources"]
        ]
        check(r.server.calls, base + rules(f"sources/{source}/rbac.yaml"))


async def _watching(watcher: Any) -> bool:
    return all(reflector.resource_version for reflector in watcher.reflectors.values())


def test_the_quota_crd_holds_the_quota_upserted_fields() -> None:
    docs = [doc for doc in yaml.safe_load_all((DEPLOY / "base" / "quota-crd.yaml").read_text())]
    crd = docs[0]
    assert crd["kind"] == "CustomResourceDefinition"
    assert crd["metadata"]["name"] == "quotas.quotaledger.io"
    assert crd["spec"]["scope"] == "Cluster" and crd["spec"]["names"]["kind"] == "Quota"
    version = crd["spec"]["versions"][0]
    assert version["name"] == "v1alpha1"
    fields = set(version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"])
    from quotaledger.events.model import QuotaUpserted

    assert fields == set(QuotaUpserted.__struct_fields__) - {"name", "at"}


@pytest.mark.parametrize("variant", ["single", "ha"])
async def test_shadow_mode_deployments_use_exactly_the_read_only_rbac(
    tmp_path: Path, variant: str, request: pytest.FixtureRequest
) -> None:
    """The shipped Deployment's own command line (``serve ... --in-cluster --executor=log``),
    run against the stand-in with only the kubeconfig, the addresses and the data paths
    substituted, calls exactly what base/rbac.yaml grants: read-only plus the Lease."""
    from tests.system.test_k8s_manifests import container_args, deployment, render, resolve

    docs = render(DEPLOY if variant == "single" else DEPLOY / variant)
    dep = deployment(docs)
    async with rig(tmp_path) as r:
        replace = {"$(POD_NAME)": "shadow", "0.0.0.0:8080": "127.0.0.1:0", "/data/": f"{tmp_path}/"}
        if variant == "ha":
            tansu = request.getfixturevalue("tansu")
            topic = request.getfixturevalue("topic")
            replace["$(LEDGER_URL)"] = tansu.url(topic)
        argv: list[str] = []
        for arg in container_args(dep):
            if arg == "--in-cluster":
                argv += ["--kubeconfig", str(r.kubeconfig)]
                continue
            for old, new in replace.items():
                arg = arg.replace(old, new)
            argv.append(resolve(docs, dep, arg) if "$(" in arg else arg)
        assert "$(" not in " ".join(argv)
        r.server.calls.clear()
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "quotaledger.adapters.cli", *argv,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        granted = rules("base/rbac.yaml")
        try:
            await used_all(r, granted)
        finally:
            process.send_signal(signal.SIGTERM)
            assert process.stderr is not None
            err = (await asyncio.wait_for(process.stderr.read(), 60)).decode()
            code = await process.wait()
        assert code == 0, err
        check(r.server.calls, granted)
        assert not any(c.subresource == "eviction" for c in r.server.calls)
