"""What the monitoring tests share: the metric families of the real registries, the dashboard's queries and
the alert rules, read from manifests/monitoring/."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.metrics import MetricWrapperBase

REPO = Path(__file__).resolve().parents[2]
MONITORING = REPO / "manifests" / "monitoring"
DASHBOARD = MONITORING / "sparkgate-dashboard.json"
RULES = MONITORING / "prometheusrule.yaml"


@dataclass(frozen=True)
class Family:
    name: str  # as exposed: counters with their `_total`
    type: str  # counter, gauge, histogram
    labels: tuple[str, ...]
    component: str  # webhook, allocator, certs


def _families(component: str, wrappers: list[MetricWrapperBase], registry: CollectorRegistry) -> list[Family]:
    # Names and types from the registry (what /metrics exposes); label names from the metric objects, since
    # a labelled family has no sample, hence no label, until a child exists. `_labelnames` is the client's
    # own record of them.
    labels = {m._name: tuple(m._labelnames) for m in wrappers}
    found = []
    for family in registry.collect():
        if not family.name.startswith(f"sparkgate_{component}_"):
            continue
        assert family.name in labels, (
            f"{family.name} is registered but not an attribute of its metrics object"
        )
        name = family.name + "_total" if family.type == "counter" else family.name
        found.append(Family(name, family.type, labels[family.name], component))
    assert len(found) == len(wrappers), f"{component}: metric objects missing from the registry"
    return found


def metric_families() -> list[Family]:
    """Every metric family sparkgate exposes, from the registries the processes serve."""
    from allocator.metrics import AllocatorMetrics
    from certs.sync import CertsMetrics
    from webhook import metrics as webhook_metrics

    def wrappers(obj: Any) -> list[MetricWrapperBase]:
        return [v for v in vars(obj).values() if isinstance(v, MetricWrapperBase)]

    from allocator.status import GAUGES

    allocator = AllocatorMetrics()
    certs_registry = CollectorRegistry()
    certs = CertsMetrics(certs_registry)
    return (
        _families("webhook", wrappers(webhook_metrics), REGISTRY)
        + _families("allocator", wrappers(allocator), allocator.registry)
        # The gauges of what the allocator tracks, written at each scrape (allocator/status.py AppsCollector).
        + [Family(g.name, "gauge", g.labels, "allocator") for g in GAUGES]
        + _families("certs", wrappers(certs), certs_registry)
    )


@pytest.fixture(scope="session")
def families() -> list[Family]:
    return metric_families()


@dataclass(frozen=True)
class PanelQuery:
    panel: str
    ref: str
    expr: str


@pytest.fixture(scope="session")
def dashboard() -> dict[str, Any]:
    document: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return document


@pytest.fixture(scope="session")
def panel_queries(dashboard: dict[str, Any]) -> list[PanelQuery]:
    queries = [
        PanelQuery(panel["title"], target["refId"], target["expr"])
        for panel in dashboard["panels"]
        for target in panel.get("targets") or []
    ]
    assert queries
    return queries


@pytest.fixture(scope="session")
def prometheus_rule() -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(RULES.read_text())
    return document


@pytest.fixture(scope="session")
def alert_rules(prometheus_rule: dict[str, Any]) -> list[dict[str, Any]]:
    rules = [rule for group in prometheus_rule["spec"]["groups"] for rule in group["rules"]]
    assert rules and all("alert" in rule for rule in rules)
    return rules
