"""The dashboard and the alert rules as files: importable into any Grafana with a Prometheus data source,
using only metrics that exist (and every one of them), each alert with its runbook entry, and both shipped
by the prometheus-operator component exactly as they are in manifests/monitoring/. Whether the queries return
data is test_prometheus.py's job."""

from __future__ import annotations

import json
import re
from itertools import combinations
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
OPERATIONS = REPO / "docs" / "operations.md"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
HISTOGRAM_SERIES = ("_bucket", "_sum", "_count")
# Where every alert's runbook_url points: docs/operations.md from the repository's root. The project
# publishes its docs at no canonical URL (none in README.md or pyproject.toml), so the base is the path, and
# docs/metrics.md ("Alerts") tells the admin to put their own in front. With a published URL, it goes here.
RUNBOOK_BASE = "docs/operations.md"
# Grafana's units of a value per second: for rate() panels, and only for them (an increase() over the
# interval or the range is a count, a gauge a number).
PER_SECOND_UNITS = {"ops", "reqps", "rps", "wps", "cps", "pps"}


def metric_names(expr: str) -> set[str]:
    return set(re.findall(r"\b(sparkgate_[a-z_]+)\b", expr))


def known_series(families: list[Any]) -> dict[str, str]:
    """Series name -> family name, histograms by their three series."""
    series = {}
    for family in families:
        if family.type == "histogram":
            series.update({family.name + suffix: family.name for suffix in HISTOGRAM_SERIES})
        else:
            series[family.name] = family.name
    return series


def test_the_dashboard_is_importable_with_a_datasource_variable(dashboard: dict[str, Any]) -> None:
    assert dashboard["uid"] == "sparkgate" and dashboard["title"] and "__inputs" not in dashboard
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert (
        variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    )
    for name in ("namespace", "app"):
        assert variables[name]["type"] == "query" and variables[name]["datasource"] == DATASOURCE
        assert variables[name]["includeAll"] and variables[name]["allValue"] == ".*"
    assert variables["top"]["type"] == "custom"
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["targets"] and panel.get("description"), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE and target["expr"].strip(), panel["title"]
        assert len({t["refId"] for t in panel["targets"]}) == len(panel["targets"]), panel["title"]


def test_panels_have_unique_ids_and_do_not_overlap(dashboard: dict[str, Any]) -> None:
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    assert len({p["title"] for p in panels}) == len(panels)
    boxes = []
    for panel in panels:
        g = panel["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, panel["title"]
        boxes.append((panel["title"], g["x"], g["y"], g["x"] + g["w"], g["y"] + g["h"]))
    for (a, ax0, ay0, ax1, ay1), (b, bx0, by0, bx1, by1) in combinations(boxes, 2):
        assert ax1 <= bx0 or bx1 <= ax0 or ay1 <= by0 or by1 <= ay0, f"{a} overlaps {b}"


def test_the_dashboard_asks_for_what_the_admin_needs(panel_queries: list[Any]) -> None:
    by_panel: dict[str, str] = {}
    for q in panel_queries:
        by_panel[q.panel] = by_panel.get(q.panel, "") + q.expr
    wanted = {
        "Admissions per second": "rate(sparkgate_webhook_requests_total",
        "Admission latency": "histogram_quantile(0.99, sum by (le, endpoint) (rate(sparkgate_webhook_request",
        "Admission outcomes": "sparkgate_webhook_requests_total",
        "Policy reloads": "sparkgate_webhook_policy_reloads_total",
        "Executors by state, per namespace": "sparkgate_allocator_executors",
        "Executors by state, top $top apps": "topk($top,",
        "Gate wait": "histogram_quantile(0.9, sum by (le) (rate(sparkgate_allocator_gate_wait_seconds_bucket",
        "Release to bind": "histogram_quantile(0.5, sum by (le) (rate(sparkgate_allocator_release_to_bind",
        "Releases per second": "rate(sparkgate_allocator_releases_total",
        "Limit hits by scope": "sum by (scope) (rate(sparkgate_allocator_limit_hits_total",
        "Deletions by reason": "sparkgate_allocator_deletions_total",
        "Bypassed pods": "sparkgate_allocator_bypassed_pods",
        "Leadership": "sparkgate_allocator_leader",
        "Watch restarts": "sparkgate_allocator_watch_restarts_total",
        "API errors": 'sparkgate_allocator_api_requests_total{code!~"2.."}',
        "Certificate expiry": "sparkgate_webhook_certificate_expiry_timestamp_seconds",
        "Allocator memory": "process_resident_memory_bytes",
        "Allocator open files": "process_open_fds",
    }
    for panel, fragment in wanted.items():
        assert fragment in by_panel.get(panel, ""), f"{panel}: {fragment}"


def test_every_query_uses_known_metrics_and_every_metric_is_shown(
    panel_queries: list[Any],
    alert_rules: list[dict[str, Any]],
    families: list[Any],
    dashboard: dict[str, Any],
) -> None:
    series = known_series(families)
    exprs = [q.expr for q in panel_queries] + [r["expr"] for r in alert_rules]
    exprs += [v["query"]["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    used = set()
    for expr in exprs:
        unknown = metric_names(expr) - series.keys()
        assert not unknown, f"unknown metrics {unknown} in {expr}"
        used |= {series[name] for name in metric_names(expr)}
    assert {f.name for f in families} - used == set(), "metrics no panel shows"


def test_units_say_per_second_exactly_for_rates(dashboard: dict[str, Any]) -> None:
    """A panel of rate() is a value per second (ops, reqps), except the rate of a counter of seconds, which
    is a fraction (CPU seconds a second: percentunit); one of increase() counts or gauges is not (short); a
    panel of histogram quantiles is seconds."""
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            continue
        unit = panel["fieldConfig"]["defaults"]["unit"]
        exprs = [target["expr"] for target in panel["targets"]]
        if any("histogram_quantile(" in e for e in exprs):
            assert unit == "s", panel["title"]
        elif all(re.search(r"\brate\([a-z_]+_seconds_total\[", e) for e in exprs):
            assert unit == "percentunit", f"{panel['title']}: seconds a second shown as {unit}"
        elif all("rate(" in e and "increase(" not in e for e in exprs):
            assert unit in PER_SECOND_UNITS, f"{panel['title']}: a rate shown as {unit}"
        else:
            assert unit not in PER_SECOND_UNITS, f"{panel['title']}: counts or gauges shown as {unit}"


def test_rate_windows_come_from_grafana(panel_queries: list[Any]) -> None:
    """Panel windows follow the scrape interval and the time range ($__rate_interval, $__range)."""
    for q in panel_queries:
        for window in re.findall(r"\[([^\]]+)\]", q.expr):
            assert window in ("$__rate_interval", "$__range"), f"{q.panel}: [{window}]"


def runbook_section() -> str:
    text = OPERATIONS.read_text()
    return text[text.index("\n## Alert runbook") :]


def anchor(heading: str) -> str:
    """GitHub's anchor for a Markdown heading."""
    return re.sub(r"[^a-z0-9 _-]", "", heading.strip().lower()).replace(" ", "-")


def test_every_alert_is_complete_and_has_its_runbook_entry(alert_rules: list[dict[str, Any]]) -> None:
    section = runbook_section()
    headings = {anchor(h): h for h in re.findall(r"^### (.+)$", section, re.MULTILINE)}
    names = [r["alert"] for r in alert_rules]
    assert len(names) == len(set(names))
    for rule in alert_rules:
        name = rule["alert"]
        assert re.fullmatch(r"Sparkgate[A-Za-z]+", name)
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], name
        # runbook_url: the annotation Alertmanager, Grafana and kube-prometheus's alerts use.
        assert "runbook" not in rule["annotations"], name
        base, _, fragment = rule["annotations"]["runbook_url"].partition("#")
        assert base == RUNBOOK_BASE and fragment == anchor(name), name
        assert headings.get(fragment) == name, f"no runbook entry '### {name}' in docs/operations.md"
    assert set(headings.values()) == set(names), "runbook entries without an alert"
    required = {
        "SparkgateWebhookErrors",
        "SparkgateWebhookBypassed",
        "SparkgateNoAllocatorLeader",
        "SparkgateExecutorsHeld",
        "SparkgateWatchRestartStorm",
        "SparkgateCertificateExpiresSoon",
    }
    assert required <= set(names)


def seconds(duration: str) -> float:
    """A Prometheus duration of one unit (`7m`, `90s`, `1h`) in seconds."""
    match = re.fullmatch(r"(\d+)(s|m|h)", duration)
    assert match, duration
    return int(match[1]) * {"s": 1, "m": 60, "h": 3600}[match[2]]


def test_the_profile_alert_waits_for_a_second_probe(alert_rules: list[dict[str, Any]]) -> None:
    """The probe's verdict changes only when it runs: a refusal of a moment (a namespace at its quota)
    holds the series at 0 for a whole interval. The alert waits longer than one interval plus a scrape and
    an evaluation, so the next probe decides, and pages before a third one."""
    from allocator.probe import DEFAULT_INTERVAL
    from sparkgate.cli import build_parser

    interval = build_parser(["allocator"]).parse_args(["allocator"]).probe_interval
    assert interval == DEFAULT_INTERVAL
    rule = next(r for r in alert_rules if r["alert"] == "SparkgateProfileRefused")
    assert interval + 60 < seconds(rule["for"]) < 2 * interval
    for doc in (OPERATIONS, REPO / "docs" / "metrics.md"):  # the runbook and the table say how long
        assert f"{int(seconds(rule['for']) // 60)} minutes" in doc.read_text(), doc.name


def test_the_alerts_tell_the_processes_apart_by_container(
    alert_rules: list[dict[str, Any]],
    families: list[Any],
    component: dict[tuple[str, str], dict[str, Any]],
) -> None:
    """Both ServiceMonitors scrape the one Service without a jobLabel, so under the Prometheus Operator
    the webhook's and the allocator's series have the same `job`: an alert over both processes groups by
    the operator's `container` (and `pod`), and names them so, never by `job`."""
    monitors = [o for (kind, _), o in component.items() if kind == "ServiceMonitor"]
    service = component[("Service", "sparkgate-metrics")]
    containers = {
        c["name"]: {p["name"] for p in c.get("ports") or []}
        for c in component[("Deployment", "sparkgate")]["spec"]["template"]["spec"]["containers"]
    }
    scraped = []
    for monitor in monitors:
        assert "jobLabel" not in monitor["spec"], monitor["metadata"]["name"]
        assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
        for endpoint in monitor["spec"]["endpoints"]:
            port = next(p for p in service["spec"]["ports"] if p["name"] == endpoint["port"])
            scraped += [name for name, ports in containers.items() if port["targetPort"] in ports]
    assert sorted(scraped) == ["allocator", "webhook"], "one port scraped per container"
    # The operator's target labels, not sparkgate's (a metric label of the same name would be renamed).
    assert not {"container", "pod"} & {label for f in families for label in f.labels}
    for rule in alert_rules:
        annotations = " ".join(str(v) for v in rule["annotations"].values())
        assert "$labels.job" not in annotations, rule["alert"]
        if "sparkgate_webhook_" in rule["expr"] and "sparkgate_allocator_" in rule["expr"]:
            groupings = re.findall(r"\bby \(([^)]*)\)", rule["expr"])
            assert groupings, rule["alert"]
            for grouping in groupings:
                labels = {label.strip() for label in grouping.split(",")}
                assert {"container", "pod"} <= labels and "job" not in labels, rule["alert"]
            assert "$labels.container" in rule["annotations"]["summary"], rule["alert"]


def test_the_certificate_alert_warns_14_days_ahead(alert_rules: list[dict[str, Any]]) -> None:
    rule = next(r for r in alert_rules if r["alert"] == "SparkgateCertificateExpiresSoon")
    assert rule["expr"].rstrip().endswith("- time() < 14 * 86400")


@pytest.fixture(scope="module")
def component(kustomize_module: ModuleType) -> dict[tuple[str, str], dict[str, Any]]:
    objects: dict[tuple[str, str], dict[str, Any]] = kustomize_module.by_kind(
        kustomize_module.install(["prometheus-operator"])
    )
    return objects


@pytest.fixture(scope="module")
def kustomize_module() -> ModuleType:
    import importlib.util

    path = REPO / "tests" / "manifests" / "kustomize.py"
    spec = importlib.util.spec_from_file_location("sparkgate_monitoring_kustomize", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_component_ships_the_dashboard_and_the_rules_as_they_are(
    component: dict[tuple[str, str], dict[str, Any]],
    dashboard: dict[str, Any],
    prometheus_rule: dict[str, Any],
) -> None:
    config_map = component[("ConfigMap", "sparkgate-dashboard")]
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["namespace"] == "sparkgate-system"
    assert json.loads(config_map["data"]["sparkgate-dashboard.json"]) == dashboard
    rule = component[("PrometheusRule", "sparkgate")]
    assert rule["metadata"]["namespace"] == "sparkgate-system"
    assert rule["spec"] == prometheus_rule["spec"]


def test_the_base_install_needs_no_prometheus_operator(kustomize_module: ModuleType) -> None:
    """Without the operator's CRDs, `kubectl apply -k manifests/` must not meet a PrometheusRule."""
    kinds = {o["kind"] for o in kustomize_module.build(REPO / "manifests")}
    assert not kinds & {"PrometheusRule", "ServiceMonitor"}
