"""docker-compose.yml and Dockerfile, checked without a container runtime (DESIGN §11)."""

from __future__ import annotations

import importlib
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from quotaledger.adapters.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent


def compose() -> dict[str, Any]:
    document = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert isinstance(document, dict)
    return document


def quotaledger_services(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: s for name, s in document["services"].items() if s.get("build") == "."}


def test_services_are_the_ones_design_names() -> None:
    services = compose()["services"]
    assert set(services) == {"kafka", "quotaledger", "demo", "prometheus", "grafana"}
    kafka = services["kafka"]["environment"]
    assert "controller" in kafka["KAFKA_PROCESS_ROLES"]  # KRaft, no ZooKeeper
    assert kafka["KAFKA_CONTROLLER_QUORUM_VOTERS"].startswith("1@kafka:")


def test_every_quotaledger_command_parses_with_the_cli() -> None:
    document = compose()
    kafka_listener = document["services"]["kafka"]["environment"]["KAFKA_ADVERTISED_LISTENERS"]
    broker = kafka_listener.split("//", 1)[1]
    parser = build_parser()
    commands = {}
    for name, service in quotaledger_services(document).items():
        args = parser.parse_args(service["command"])
        assert args.handler is not None, name
        commands[name] = args
    assert set(commands) == {"quotaledger", "demo"}
    serve = commands["quotaledger"]
    assert serve.handler.__name__ == "cmd_serve"
    demo = commands["demo"]
    assert demo.handler.__name__ == "cmd_demo" and demo.serve is False and demo.speed == 1
    try:  # the Kafka backend's URL parser, once it is part of the package
        urls = importlib.import_module("quotaledger.adapters.ledgers.url")
    except ModuleNotFoundError:
        urls = None
    for url in (serve.ledger, demo.kafka):
        match = re.fullmatch(r"kafka://([^/]+)/([A-Za-z0-9._-]+)", url)
        assert match is not None, url
        assert match.group(1) == broker
        if urls is not None:
            assert urls.parse_ledger_url(url).scheme == "kafka"
    assert serve.ledger == demo.kafka  # one ledger
    # the Kafka ledger's snapshot file lives on the service's volume
    mounts = document["services"]["quotaledger"]["volumes"]
    assert any(serve.snapshots.startswith(m.split(":")[1] + "/") for m in mounts)


def test_ports_and_scrape_target_agree() -> None:
    document = compose()
    services = document["services"]
    listen = build_parser().parse_args(services["quotaledger"]["command"]).listen
    port = listen.rsplit(":", 1)[1]
    assert f"{port}:{port}" in services["quotaledger"]["ports"]
    prometheus = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    job = prometheus["scrape_configs"][0]
    assert job["metrics_path"] == "/metrics"
    assert job["static_configs"][0]["targets"] == [f"quotaledger:{port}"]
    mounts = services["prometheus"]["volumes"]
    assert "./deploy/prometheus/prometheus.yml:/etc/prometheus/prometheus.yml:ro" in mounts
    datasources = yaml.safe_load(
        (ROOT / "deploy/grafana/provisioning/datasources/prometheus.yml").read_text()
    )
    assert datasources["datasources"][0]["url"] == "http://prometheus:9090"
    assert "9090:9090" in services["prometheus"]["ports"]
    grafana = services["grafana"]["volumes"]
    assert "./deploy/grafana/provisioning:/etc/grafana/provisioning:ro" in grafana
    providers = yaml.safe_load(
        (ROOT / "deploy/grafana/provisioning/dashboards/quotaledger.yml").read_text()
    )
    path = providers["providers"][0]["options"]["path"]
    assert f"./deploy/grafana/quotaledger.json:{path}/quotaledger.json:ro" in grafana
    assert "3000:3000" in services["grafana"]["ports"]


def test_dockerfile_installs_the_package_as_readme_does() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    readme = (ROOT / "README.md").read_text()
    assert re.search(r"pip install -q \.(\s|$)", readme)
    assert re.search(r"RUN pip install --no-cache-dir \.(\s|$)", dockerfile, re.M)
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    folders = set(pyproject["tool"]["setuptools"]["package-dir"].values())
    copied = set(re.findall(r"^COPY (\S+) \1$", dockerfile, re.M))
    assert folders <= copied
    assert re.search(r"^COPY pyproject.toml README.md ./$", dockerfile, re.M)
    assert 'ENTRYPOINT ["quotaledger"]' in dockerfile
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".venv" in ignored and "*.db" in ignored


#: Where each image keeps its data, by the image's own configuration: (how it is set,
#: the variable or flag, the image's default). apache/kafka: `log.dirs` through
#: KAFKA_LOG_DIRS, else its server.properties' /tmp/kraft-combined-logs; prom/prometheus:
#: --storage.tsdb.path, relative `data/` under its working directory /prometheus when a
#: `command:` replaces the image's own; grafana/grafana: GF_PATHS_DATA.
DATA_DIRECTORIES = {
    "apache/kafka": ("env", "KAFKA_LOG_DIRS", "/tmp/kraft-combined-logs"),
    "prom/prometheus": ("flag", "--storage.tsdb.path", "/prometheus/data"),
    "grafana/grafana": ("env", "GF_PATHS_DATA", "/var/lib/grafana"),
}
#: Services that keep nothing: the demo producer writes to Kafka only.
STATELESS = {"demo"}


def data_directory(service: dict[str, Any]) -> str:
    """The directory the service's image writes its data to, as configured."""
    if service.get("build") == ".":  # quotaledger serve: its snapshot file's directory
        args = build_parser().parse_args(service["command"])
        return str(Path(args.snapshots).parent)
    image = service["image"].rsplit(":", 1)[0]
    how, name, default = DATA_DIRECTORIES[image]
    if how == "env":
        value = service.get("environment", {}).get(name, default)
        return str(value).split(",")[0]
    for arg in service.get("command", []):
        if arg.startswith(f"{name}="):
            return str(arg.split("=", 1)[1])
    return default


@pytest.mark.parametrize("path", ["docker-compose.yml", "deploy/shadow/docker-compose.yml"])
def test_every_stateful_service_keeps_its_data_on_a_named_volume(path: str) -> None:
    """The ledger is the system of record: Kafka's log (and every other service's data)
    must be on a named volume, which `docker compose down && up` keeps."""
    document = yaml.safe_load((ROOT / path).read_text())
    declared = set(document.get("volumes") or {})
    for name, service in document["services"].items():
        if name in STATELESS:
            continue
        directory = data_directory(service)
        named = {}
        for mount in service.get("volumes", []):
            source, target = mount.split(":")[:2]
            if not source.startswith((".", "/")):
                named[target.rstrip("/")] = source
        on = [t for t in named if directory == t or directory.startswith(t + "/")]
        assert on, f"{name}: its data directory {directory} is on no named volume ({named})"
        assert named[on[0]] in declared, name
    if "kafka" in document["services"]:
        kafka = document["services"]["kafka"]["environment"]
        assert kafka.get("CLUSTER_ID"), "a recreated broker must reuse the formatted log"
