"""deploy/kubernetes/: the two supported deployments, `single` and `ha` (DESIGN §12;
DECISIONS 261), checked as kubectl reads them.

* ``kubectl apply -f deploy/kubernetes/`` reads the directory's ``.yaml``/``.yml``/``.json``
  files in name order, not its subdirectories; it must create the Namespace and the CRD
  before anything that needs them, and must not read the kustomization.
* ``kubectl apply -k deploy/kubernetes/`` (single) and ``-k deploy/kubernetes/ha/`` render
  with kustomize. With ``kubectl`` installed, its own kustomize renders them and both are
  applied to the stand-in API server, which refuses an object whose namespace does not
  exist as the real one does. Without it, :func:`render_subset` implements the one
  kustomize feature the files use (``resources``: files, and directories holding a
  kustomization) and refuses any other, so the checks still run; where both exist they
  must give the same objects.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from quotaledger.adapters.cli import build_parser
from quotaledger.adapters.ledgers.url import parse_ledger_url

from .k8s_api_server import ApiServer

DEPLOY = Path(__file__).resolve().parents[1] / "deploy" / "kubernetes"
KUBECTL = shutil.which("kubectl")
#: kustomize's file names for a kustomization, in the order it looks for them.
KUSTOMIZATION_NAMES = ("kustomization.yaml", "kustomization.yml", "Kustomization")
#: What ``kubectl apply -f DIR`` reads (cli-runtime's FileExtensions).
APPLY_EXTENSIONS = (".json", ".yaml", ".yml")

Doc = dict[str, Any]


def key(doc: Doc) -> tuple[str, str, str]:
    meta = doc.get("metadata") or {}
    return (str(doc.get("kind")), str(meta.get("namespace", "")), str(meta.get("name")))


def load_docs(path: Path) -> list[Doc]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def apply_f_files(directory: Path) -> list[Path]:
    """The files ``kubectl apply -f DIRECTORY`` reads, in its order (no -R)."""
    return sorted(
        (p for p in directory.iterdir() if p.is_file() and p.suffix in APPLY_EXTENSIONS),
        key=lambda p: p.name,
    )


def kustomization(directory: Path) -> Doc:
    for name in KUSTOMIZATION_NAMES:
        if (directory / name).is_file():
            doc = yaml.safe_load((directory / name).read_text())
            assert isinstance(doc, dict)
            return doc
    raise AssertionError(f"{directory}: no kustomization")


def render_subset(directory: Path) -> list[Doc]:
    """kustomize for what deploy/kubernetes/ uses: ``resources`` (files, and directories
    with a kustomization), with kustomize's load restrictions (a file must be inside the
    kustomization's directory) and no duplicate object, then ``patches`` given inline as
    JSON 6902 operations on a ``target`` (RFC 6902: test, add, replace, remove); any other
    field or form is refused."""
    doc = kustomization(directory)
    used = set(doc) - {"apiVersion", "kind", "resources", "patches"}
    assert not used, f"{directory}: kustomize fields this test does not implement: {used}"
    assert doc.get("kind") == "Kustomization"
    out: list[Doc] = []
    for entry in doc.get("resources", []):
        target = (directory / entry).resolve()
        if target.is_dir():
            out += render_subset(target)
        else:
            assert ".." not in Path(entry).parts, f"{directory}: file {entry} outside it"
            out += load_docs(target)
    keys = [key(d) for d in out]
    assert len(keys) == len(set(keys)), f"{directory}: an object twice"
    for patch in doc.get("patches", []):
        assert set(patch) == {"target", "patch"}, f"{directory}: unsupported patch {patch}"
        selector = patch["target"]
        assert set(selector) <= {"group", "version", "kind", "name", "namespace"}
        matched = [d for d in out if _selected(d, selector)]
        assert matched, f"{directory}: a patch whose target matches nothing"
        for target_doc in matched:
            for operation in yaml.safe_load(patch["patch"]):
                _apply_operation(target_doc, operation)
    return out


def _selected(doc: Doc, selector: dict[str, str]) -> bool:
    group, _, version = doc["apiVersion"].rpartition("/")
    have = {
        "group": group,
        "version": version,
        "kind": doc["kind"],
        "name": doc["metadata"]["name"],
        "namespace": doc["metadata"].get("namespace", ""),
    }
    return all(have[field] == value for field, value in selector.items())


def _apply_operation(doc: Doc, operation: dict[str, Any]) -> None:
    """One RFC 6902 operation (test, add, replace, remove) on ``doc``, in place."""
    op, path = operation["op"], operation["path"]
    assert op in ("test", "add", "replace", "remove"), f"unsupported operation {op}"
    tokens = [t.replace("~1", "/").replace("~0", "~") for t in path.split("/")[1:]]
    parent: Any = doc
    for token in tokens[:-1]:
        parent = parent[int(token)] if isinstance(parent, list) else parent[token]
    last = tokens[-1]
    if isinstance(parent, list):
        index = len(parent) if last == "-" else int(last)
        if op == "test":
            assert parent[index] == operation["value"], f"test failed at {path}"
        elif op == "add":
            parent.insert(index, operation["value"])
        elif op == "replace":
            parent[index] = operation["value"]
        else:
            del parent[index]
        return
    if op == "test":
        assert parent[last] == operation["value"], f"test failed at {path}"
    elif op == "remove":
        del parent[last]
    else:
        assert op == "add" or last in parent, f"replace of a missing {path}"
        parent[last] = operation["value"]


def render(directory: Path) -> list[Doc]:
    """``kubectl kustomize DIRECTORY`` when kubectl is installed, else the subset."""
    if KUBECTL is None:
        return render_subset(directory)
    done = subprocess.run(
        [KUBECTL, "kustomize", str(directory)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def by_key(docs: list[Doc]) -> dict[tuple[str, str, str], Doc]:
    return {key(d): d for d in docs}


# ------------------------------------------------------------------ apply -f, apply -k


def test_apply_f_creates_the_namespace_and_the_crd_before_what_needs_them() -> None:
    files = apply_f_files(DEPLOY)
    assert files, "kubectl apply -f deploy/kubernetes/ would read nothing"
    assert not any(p.name.startswith("kustomization") for p in files)
    created: set[str] = set()
    crds_first = True
    for path in files:
        for doc in load_docs(path):
            namespace = (doc.get("metadata") or {}).get("namespace")
            if namespace is not None:
                assert namespace in created, f"{path.name}: namespace {namespace} not yet created"
            if doc["kind"] == "Namespace":
                created.add(doc["metadata"]["name"])
            crds_first &= doc["kind"] in ("Namespace", "CustomResourceDefinition")
            if doc["kind"] == "CustomResourceDefinition":
                assert crds_first, f"{path.name}: the CRD after other objects"
    kinds = [load_docs(p)[0]["kind"] for p in files]
    assert kinds[:2] == ["Namespace", "CustomResourceDefinition"]


def test_apply_f_and_apply_k_give_the_same_objects() -> None:
    from_files = by_key([doc for path in apply_f_files(DEPLOY) for doc in load_docs(path)])
    from_kustomize = by_key(render(DEPLOY))
    assert from_files == from_kustomize


SOURCES = ["koordinator", "kueue", "volcano", "yunikorn"]
VARIANTS = ["single", "ha", *(f"sources/{source}" for source in SOURCES)]


def variant_dir(variant: str) -> Path:
    return DEPLOY if variant == "single" else DEPLOY / variant


@pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")
@pytest.mark.parametrize("variant", VARIANTS)
def test_kubectl_kustomize_and_the_subset_agree(variant: str) -> None:
    assert by_key(render(variant_dir(variant))) == by_key(render_subset(variant_dir(variant)))


@pytest.mark.parametrize("source", SOURCES)
def test_a_source_overlay_is_single_reading_that_scheduler_with_its_rights(source: str) -> None:
    """``kubectl apply -k deploy/kubernetes/sources/NAME/`` (docs/QUICKSTART.md): the single
    deployment with ``--quota-source NAME`` and the source's extra read-only rules."""
    single = by_key(render(DEPLOY))
    docs = render(DEPLOY / "sources" / source)
    overlay = by_key(docs)
    extra = {k: v for k, v in overlay.items() if k not in single}
    assert extra == by_key(load_docs(DEPLOY / "sources" / source / "rbac.yaml"))
    args = build_parser().parse_args(container_args(deployment(docs)))
    assert args.quota_source == source
    assert container_args(deployment(docs)).count(f"--quota-source={source}") == 1
    changed = deployment(docs)
    changed["spec"]["template"]["spec"]["containers"][0]["args"] = container_args(
        deployment(list(single.values()))
    )
    assert changed == deployment(list(single.values()))
    for rule_doc in extra.values():
        for rule in rule_doc.get("rules", []):
            assert set(rule["verbs"]) <= {"get", "list", "watch"}, rule


@pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")
@pytest.mark.parametrize(
    "how",
    [
        ["-f", "deploy/kubernetes/"],
        ["-k", "deploy/kubernetes/"],
        ["-k", "deploy/kubernetes/ha/"],
        ["-k", "deploy/kubernetes/sources/kueue/"],
    ],
)
async def test_kubectl_apply_on_an_empty_cluster(tmp_path: Path, how: list[str]) -> None:
    """The real kubectl against the stand-in API server, which (like the real one)
    refuses a namespaced object before its Namespace exists: one try, every object."""
    server = ApiServer()
    server.require_namespaces = True
    await server.start()
    try:
        kubeconfig = server.kubeconfig(tmp_path / "kubeconfig")
        flag, path = how
        done = await asyncio.to_thread(
            subprocess.run,
            [KUBECTL, "--kubeconfig", str(kubeconfig), "apply", flag, path],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=DEPLOY.parents[1],
            env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
        )
        assert done.returncode == 0, done.stdout + done.stderr
        expected = (
            [doc for p in apply_f_files(DEPLOY) for doc in load_docs(p)]
            if flag == "-f"
            else render(DEPLOY / path.removeprefix("deploy/kubernetes/"))
        )
        for doc in expected:
            kind, namespace, name = key(doc)
            group = doc["apiVersion"].rpartition("/")[0]
            plural = next(k.plural for k in server.kinds() if k.kind == kind)
            assert server.get(plural, name, namespace, group=group) is not None, key(doc)
        assert len(expected) == done.stdout.count(" created")
    finally:
        await server.stop()


# ------------------------------------------------------------------ the two deployments


def deployment(docs: list[Doc]) -> Doc:
    found = [d for d in docs if d["kind"] == "Deployment"]
    assert len(found) == 1
    return found[0]


def container_args(doc: Doc) -> list[str]:
    args = doc["spec"]["template"]["spec"]["containers"][0]["args"]
    assert all(isinstance(a, str) for a in args)
    return list(args)


def resolve(docs: list[Doc], doc: Doc, arg: str) -> str:
    """``$(VAR)`` in a container argument, as the kubelet expands it (env from a literal
    or a ConfigMap key; the pod name stays symbolic)."""
    container = doc["spec"]["template"]["spec"]["containers"][0]
    for env in container.get("env", []):
        token = f"$({env['name']})"
        if token not in arg:
            continue
        ref = (env.get("valueFrom") or {}).get("configMapKeyRef")
        if "value" in env:
            arg = arg.replace(token, env["value"])
        elif ref is not None:
            namespace = doc["metadata"]["namespace"]
            config = by_key(docs)[("ConfigMap", namespace, ref["name"])]
            arg = arg.replace(token, config["data"][ref["key"]])
    return arg


def test_single_is_one_replica_on_sqlite_on_a_read_write_once_volume() -> None:
    docs = render(DEPLOY)
    dep = deployment(docs)
    spec = dep["spec"]
    assert spec["replicas"] == 1 and spec["strategy"] == {"type": "Recreate"}
    args = build_parser().parse_args(container_args(dep))
    assert args.handler.__name__ == "cmd_serve"
    assert parse_ledger_url(args.ledger).scheme == "sqlite"
    mounts = {
        m["name"]: m["mountPath"] for m in spec["template"]["spec"]["containers"][0]["volumeMounts"]
    }
    volumes = {v["name"]: v for v in spec["template"]["spec"]["volumes"]}
    mount = next(name for name, path in mounts.items() if args.ledger.startswith(path + "/"))
    claim = volumes[mount]["persistentVolumeClaim"]["claimName"]
    pvc = by_key(docs)[("PersistentVolumeClaim", dep["metadata"]["namespace"], claim)]
    assert pvc["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert args.snapshots is None  # a SQLite ledger keeps its snapshots in its file


def test_ha_is_two_or_more_replicas_on_kafka_without_a_shared_volume() -> None:
    docs = render(DEPLOY / "ha")
    dep = deployment(docs)
    spec = dep["spec"]
    assert spec["replicas"] >= 2
    assert spec["strategy"]["type"] == "RollingUpdate"
    raw = container_args(dep)
    args = build_parser().parse_args([resolve(docs, dep, a) for a in raw])
    assert parse_ledger_url(args.ledger).scheme == "kafka"
    assert not [d for d in docs if d["kind"] == "PersistentVolumeClaim"]
    volumes = spec["template"]["spec"]["volumes"]
    assert all(set(v) == {"name", "emptyDir"} for v in volumes), volumes
    mounts = [m["mountPath"] for m in spec["template"]["spec"]["containers"][0]["volumeMounts"]]
    assert args.snapshots is not None and any(args.snapshots.startswith(m + "/") for m in mounts)
    pdb = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    assert pdb and pdb[0]["spec"]["selector"] == spec["selector"]


@pytest.mark.parametrize("variant", ["single", "ha"])
def test_both_deployments_are_shadow_mode_on_the_cluster_with_probes(variant: str) -> None:
    docs = render(DEPLOY if variant == "single" else DEPLOY / variant)
    dep = deployment(docs)
    pod_spec = dep["spec"]["template"]["spec"]
    assert pod_spec["serviceAccountName"] == "quotaledger"
    container = pod_spec["containers"][0]
    assert container["image"] == "quotaledger:0.1.0"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    args = build_parser().parse_args([resolve(docs, dep, a) for a in container_args(dep)])
    assert args.in_cluster and args.executor == "log"
    assert args.listen.endswith(f":{container['ports'][0]['containerPort']}")
    service = by_key(docs)[("Service", "quotaledger", "quotaledger")]
    assert service["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]
    lease_role = by_key(docs)[("Role", "quotaledger", "quotaledger")]
    assert any("leases" in rule["resources"] for rule in lease_role["rules"])
    kinds = {d["kind"] for d in docs}
    assert {"Namespace", "CustomResourceDefinition", "ClusterRole", "ConfigMap"} <= kinds


def test_the_two_deployments_differ_only_where_they_must() -> None:
    single = deployment(render(DEPLOY))
    ha = deployment(render(DEPLOY / "ha"))
    for doc in (single, ha):
        doc["spec"].pop("replicas")
        doc["spec"].pop("strategy")
        pod_spec = doc["spec"]["template"]["spec"]
        pod_spec.pop("volumes")
        pod_spec.pop("topologySpreadConstraints", None)
        container = pod_spec["containers"][0]
        container["args"] = [a for a in container["args"][2:] if not a.startswith("--snapshots")]
        container["env"] = [e for e in container["env"] if e["name"] != "LEDGER_URL"]
    assert single == ha
