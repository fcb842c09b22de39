"""The shipped Grafana dashboard queries only metrics the collector exports (DESIGN §11)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from quotaledger.adapters.http.metrics import FoldStatistics, LedgerPosition, StateCollector
from quotaledger.projections import ProjectedState
from tests.paths import REPO

DEPLOY = REPO / "deploy"
DASHBOARD = DEPLOY / "grafana" / "quotaledger.json"

_KEYWORDS = {
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "and",
    "or",
    "unless",
    "bool",
    "offset",
    "inf",
    "nan",
}


def exported_names() -> set[str]:
    """Every series name the collector can write, from its families' types."""
    registry = CollectorRegistry(auto_describe=False)
    state = ProjectedState.empty()
    registry.register(
        StateCollector(lambda: state, FoldStatistics(), LedgerPosition(), lambda: 0, "t")
    )
    names = set()
    for family in registry.collect():
        if family.type == "counter":
            names.add(family.name + "_total")
        elif family.type == "histogram":
            names |= {family.name + suffix for suffix in ("_bucket", "_sum", "_count")}
        else:
            names.add(family.name)
    return names


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: identifiers left once strings,
    label matchers, ranges, grouping lists, function calls and keywords are removed."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", text)
    text = re.sub(r"[a-zA-Z_:][a-zA-Z0-9_:]*\s*\(", "(", text)  # function names
    tokens = re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", text)
    return {token for token in tokens if token.lower() not in _KEYWORDS and "$" not in token}


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for panel in dashboard["panels"]:
        out.extend(panel.get("panels", []))
        if panel["type"] != "row":
            out.append(panel)
    return out


def test_metric_names_parser() -> None:
    expr = (
        "histogram_quantile(0.99, sum by (le) (rate(quotaledger_fold_seconds_bucket[5m])))"
        ' / on(instance) quotaledger_leader_epoch{job="a,b"} - time()'
    )
    assert metric_names(expr) == {"quotaledger_fold_seconds_bucket", "quotaledger_leader_epoch"}


def test_every_panel_queries_exported_metrics_only() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exported = exported_names()
    used: set[str] = set()
    shown = panels(dashboard)
    assert len(shown) >= 10
    for panel in shown:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            names = metric_names(target["expr"])
            assert names, f"{panel['title']}: {target['expr']} names no metric"
            assert names <= exported, f"{panel['title']}: {sorted(names - exported)}"
            used |= names
    for variable in dashboard["templating"]["list"]:
        query = variable["query"]["query"]
        assert set(re.findall(r"quotaledger_[a-z_]+", query)) <= exported
    # the panels DESIGN §11 asks for, by the metrics they need
    for needed in (
        "quotaledger_quota_runtime",
        "quotaledger_quota_min",
        "quotaledger_quota_used",
        "quotaledger_preemptions_total",
        "quotaledger_evictions_total",
        "quotaledger_timer_deadline_seconds",
        "quotaledger_ledger_lag_records",
        "quotaledger_fold_seconds_bucket",
        "quotaledger_decision_latency_seconds_bucket",
    ):
        assert needed in used, needed


@pytest.mark.parametrize(
    "datasource",
    ["grafana/provisioning/datasources/prometheus.yml", "shadow/grafana-datasource.yml"],
)
def test_provisioning_points_at_the_dashboard_datasource(datasource: str) -> None:
    """The compose file's and the shadow dashboards' datasources (docs/QUICKSTART.md) both
    carry the uid the dashboard's panels query."""
    dashboard = json.loads(DASHBOARD.read_text())
    datasources = yaml.safe_load((DEPLOY / datasource).read_text())
    uids = {source["uid"] for source in datasources["datasources"]}
    for panel in panels(dashboard):
        assert panel["datasource"]["uid"] in uids
        for target in panel["targets"]:
            assert target["datasource"]["uid"] in uids
    providers = yaml.safe_load(
        (DEPLOY / "grafana" / "provisioning" / "dashboards" / "quotaledger.yml").read_text()
    )
    # outside Grafana's data volume (/var/lib/grafana), so the shipped file is what loads
    assert providers["providers"][0]["options"]["path"] == "/etc/grafana/dashboards"
