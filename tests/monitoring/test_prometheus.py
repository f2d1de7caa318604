"""Every dashboard query and every alert, proven on a real Prometheus scraping the real processes.

sparkgate runs on kubesim (sandbox.localsystem: the webhook under gunicorn over TLS, the allocator as a
process) beside `sparkgate certs sync --loop`, and Prometheus (Debian's package, `make tools`) scrapes all
three every two seconds over loopback, the webhook over HTTPS verified with its CA, the webhook's and the
allocator's targets labelled as the Prometheus Operator labels them (`operator_target`). A workload made to
bind the limits runs: Spark drivers on a cluster too small for them, one app held by a missing source
ConfigMap, a scale-down, an app that ends, a malformed admission request, a refused policy edit, a storm of
dropped watches. Then:

- every panel query of manifests/monitoring/sparkgate-dashboard.json, with its template variables
  substituted (all namespaces and apps, then one namespace and app), returns at least one number through
  /api/v1/query, and the variables' own queries return values;
- the series of an app that ended leave Prometheus (bounded cardinality, seen from the outside);
- every alert of manifests/monitoring/prometheusrule.yaml passes `promtool check rules`, evaluates without
  error, and fires (a copy with `for: 1s` is loaded): those the workload triggers, then the bypass alert
  once the webhook is stopped and a driver creates pods, then the no-leader alert once the allocator is
  stopped. Alerts that the scenario must not trigger are checked to be silent until then. The alerts on
  faults that this run does not cause (a contained exception, a task or a history write that keeps
  failing) are silent here throughout, and fire in promtool's unit test (fault_alerts.test.yaml).

Prometheus is an external process: the test polls its API with bounded deadlines. Every check of what it
holds is retried until it passes or its deadline (generous: a safety net) is over, since on a busy machine a
scrape can fail (up == 0) and leave the target's series stale for an interval; a check that an alert stays
silent is only taken from a moment when the allocator's last scrape succeeded.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from kubesim.errors import ApiError
from kubesim.scheduler import Extender
from kubesim.sparkdriver import SparkDriver
from sandbox.local_webhook import free_port
from sandbox.localsystem import LocalSystem
from sparkgate import contract

T = TypeVar("T")
PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")
MISSING = "Prometheus is not installed: `make tools` installs Debian's prometheus package (promtool included)"

POLICY = """
apiVersion: sparkgate.io/v1alpha1
kind: Policy
allocation: {batchSize: 4, batchDelaySeconds: 0.1, maxPendingPerApp: 3, maxPendingPerNamespace: 5, maxPendingCluster: 7}
caps: {batchSize: 10, maxPendingPerApp: 20}
profiles:
  - name: held
    match: {namespaces: [spark-held]}
    configMaps: [{source: absent-log4j, mountPath: /etc/log4j}]
  - name: refused
    match: {namespaces: [spark-refused]}
    template: {spec: {priorityClassName: no-such-class}}
  - name: spark
"""
REFUSED_POLICY = "apiVersion: sparkgate.io/v1alpha1\nkind: Policy\nallocation: {batchSize: -1}\n"
WATCH_DROPS = 14  # restarts of each configmap watch: the storm alert wants more than 10 in 5 minutes


def eventually(check: Callable[[], T], timeout: float, what: str, interval: float = 0.25) -> T:
    """Poll an external process (Prometheus, the allocator's /metrics) until `check` returns something
    truthy; fail with `what` and the last result after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {result!r}")
        time.sleep(interval)


def settles(problems: Callable[[], list[str]], timeout: float, what: str) -> None:
    """Poll until `problems` finds none; fail with `what` and the last problems found after `timeout` s."""
    last: list[str] = []

    def none() -> bool:
        last[:] = problems()
        return not last

    try:
        eventually(none, timeout, what, interval=0.5)
    except AssertionError:
        raise AssertionError(f"timed out after {timeout}s waiting for {what}:\n" + "\n".join(last)) from None


class Prometheus:
    """`prometheus` on a free loopback port with a generated config, its data in a temporary directory."""

    def __init__(self, workdir: Path, scrape: list[dict[str, Any]], rules: Path) -> None:
        assert PROMETHEUS is not None, MISSING
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = {
            # A scrape may take up to its whole interval: a slow answer on a busy machine is still a sample.
            "global": {"scrape_interval": "2s", "scrape_timeout": "2s", "evaluation_interval": "1s"},
            "rule_files": [str(rules)],
            "scrape_configs": scrape,
        }
        self.config = workdir / "prometheus.yml"
        self.config.write_text(yaml.safe_dump(config))
        self.log = workdir / "prometheus.log"
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                [
                    PROMETHEUS,
                    f"--config.file={self.config}",
                    f"--storage.tsdb.path={workdir / 'data'}",
                    f"--web.listen-address=127.0.0.1:{self.port}",
                    "--log.level=warn",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.started = time.time()
        eventually(self._ready, 30, f"Prometheus to be ready (log: {self.log})")

    def _ready(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"prometheus exited with {self.process.returncode}: {self.log.read_text()}")
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as r:
                return r.status == 200
        except OSError:
            return False

    def api(self, path: str, **params: str | list[str]) -> Any:
        query = urllib.parse.urlencode(params, doseq=True)
        try:
            with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=10) as r:
                body = json.loads(r.read())
        except urllib.error.HTTPError as e:
            body = json.loads(e.read())
        if body.get("status") != "success":
            raise AssertionError(f"{path} {params}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.api("query", query=expr)
        assert data["resultType"] == "vector", (expr, data["resultType"])
        result: list[dict[str, Any]] = data["result"]
        return result

    def alerts(self, state: str = "firing") -> list[dict[str, Any]]:
        return [a for a in self.api("alerts")["alerts"] if a["state"] == state]

    def firing(self, name: str) -> list[dict[str, str]]:
        return [a["labels"] for a in self.alerts() if a["labels"]["alertname"] == name]

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


# What a `kubectl replace` of the certificate loop's webhook configuration leaves: no caBundle. It selects
# no pod, so the running webhook's admissions are untouched.
DRIFTED_CONFIGURATION = {
    "metadata": {"name": "not-the-test-webhook"},
    "webhooks": [
        {
            "name": "drift.sparkgate.io",
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "clientConfig": {
                "service": {"namespace": contract.INSTALL_NAMESPACE, "name": contract.WEBHOOK_SERVICE},
            },
            "objectSelector": {"matchLabels": {"selected-by": "nothing"}},
            "rules": [
                {"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}
            ],
        }
    ],
}


def _exists(cluster: Any, resource: str, namespace: str, name: str) -> bool:
    try:
        cluster.store.get(resource, namespace, name)
    except ApiError:
        return False
    return True


class CertsSync:
    """`sparkgate certs sync --loop --metrics-port`, the process that reports the Secret's certificates,
    against kubesim. It names a webhook configuration that does not exist, so that it leaves the caBundle
    of the running webhook alone (injecting its own CA there would make every admission fail open)."""

    def __init__(self, system: LocalSystem, workdir: Path) -> None:
        self.port = free_port()
        self.log = workdir / "certs.log"
        args = [
            sys.executable, "-m", "sparkgate.cli", "certs", "sync", "--loop", "--interval", "1",
            "--kubeconfig", str(system.cluster.kubeconfig("admin")), "--namespace", contract.INSTALL_NAMESPACE,
            "--webhook-configuration", "not-the-test-webhook", "--identity", "certs-1",
            "--metrics-port", str(self.port),
        ]  # fmt: skip
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


def test_rules_pass_promtool(prometheus_rule: dict[str, Any], tmp_path: Path) -> None:
    assert PROMTOOL is not None, MISSING
    rules = tmp_path / "rules.yml"
    rules.write_text(yaml.safe_dump(prometheus_rule["spec"]))
    check = subprocess.run([PROMTOOL, "check", "rules", str(rules)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"SUCCESS: {sum(len(g['rules']) for g in prometheus_rule['spec']['groups'])} rules" in check.stdout


def test_copy_with_short_for(prometheus_rule: dict[str, Any], tmp_path: Path) -> None:
    """The copy the live test loads differs from the shipped rules only in `for`."""
    assert PROMTOOL is not None, MISSING
    rules = short_for_copy(prometheus_rule, tmp_path / "rules.yml")
    check = subprocess.run([PROMTOOL, "check", "rules", str(rules)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    copy = yaml.safe_load(rules.read_text())
    original = prometheus_rule["spec"]
    for group, copied in zip(original["groups"], copy["groups"], strict=True):
        for rule, twin in zip(group["rules"], copied["rules"], strict=True):
            assert {k: v for k, v in twin.items() if k != "for"} == {
                k: v for k, v in rule.items() if k != "for"
            }


FAULT_ALERTS_TEST = Path(__file__).with_name("fault_alerts.test.yaml")


def fault_alerts() -> set[str]:
    """The alerts that promtool's unit test (FAULT_ALERTS_TEST) makes fire, rather than the live run."""
    document = yaml.safe_load(FAULT_ALERTS_TEST.read_text())
    return {
        case["alertname"]
        for test in document["tests"]
        for case in test["alert_rule_test"]
        if case["exp_alerts"]
    }


def test_fault_alerts_fire_in_promtools_unit_test(prometheus_rule: dict[str, Any], tmp_path: Path) -> None:
    """The alerts on faults the live run does not cause (a contained exception, a task or a history write
    that keeps failing) fire, name their cause and clear, on series shaped as the allocator exports them
    (`promtool test rules`, Prometheus's own rule evaluation)."""
    assert PROMTOOL is not None, MISSING
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(prometheus_rule["spec"]))
    test = tmp_path / FAULT_ALERTS_TEST.name
    test.write_text(FAULT_ALERTS_TEST.read_text())
    run = subprocess.run([PROMTOOL, "test", "rules", str(test)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    names = {r["alert"] for g in prometheus_rule["spec"]["groups"] for r in g["rules"]}
    faults = {
        "SparkgateAllocatorErrors",
        "SparkgateAllocatorTaskFailing",
        "SparkgateDeletionHistoryNotSaved",
        "SparkgateProvisioningRequestsFailing",
    }
    assert fault_alerts() == faults and faults <= names


def short_for_copy(prometheus_rule: dict[str, Any], path: Path) -> Path:
    spec = json.loads(json.dumps(prometheus_rule["spec"]))
    for group in spec["groups"]:
        for rule in group["rules"]:
            rule["for"] = "1s"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


@dataclass
class Run:
    system: LocalSystem
    prometheus: Prometheus
    drivers: dict[str, SparkDriver]
    ended_app: str
    notes: list[str] = field(default_factory=list)

    def window(self) -> str:
        """A range that covers the whole run, for $__rate_interval and $__range: every rate sees all of it."""
        return f"{int(time.time() - self.prometheus.started) + 5}s"


POD = "sparkgate-7d4b9c-x2k8q"


SERVICE_MONITORS = (
    Path(__file__).resolve().parents[2]
    / "manifests"
    / "components"
    / "prometheus-operator"
    / "servicemonitor.yaml"
)


def operator_target(container: str, port: str, target: str) -> dict[str, Any]:
    """The scrape of one container as the Prometheus Operator makes it from components/prometheus-operator:
    both ServiceMonitors scrape the Service sparkgate-metrics without a jobLabel, so both containers have
    the same `job`, and `container` and `pod` tell them apart (a target label overrides the job_name); every
    target also gets `namespace` and `endpoint` (the port's name), which sparkgate's own series have too:
    the ServiceMonitor endpoint's honorLabels decides which wins (Prometheus's honor_labels)."""
    [endpoint] = [
        e
        for monitor in yaml.safe_load_all(SERVICE_MONITORS.read_text())
        for e in monitor["spec"]["endpoints"]
        if e["port"] == port
    ]
    labels = {
        "job": "sparkgate-metrics",
        "container": container,
        "pod": POD,
        "namespace": "sparkgate-system",
        "endpoint": port,
    }
    return {
        "honor_labels": bool(endpoint.get("honorLabels", False)),
        "static_configs": [{"targets": [target], "labels": labels}],
    }


def _metric_value(text: str, prefix: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(prefix))


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, prometheus_rule: dict[str, Any]) -> Iterator[Run]:
    assert PROMETHEUS is not None and PROMTOOL is not None, MISSING
    workdir = tmp_path_factory.mktemp("prometheus")
    policy = workdir / "policy.yaml"
    policy.write_text(POLICY)
    system = LocalSystem(
        policy,
        workdir / "system",
        namespaces=("spark", "spark-b", "spark-held", "spark-refused"),
        allocator_tick=0.2,
        nodes=2,
        node_cpu="4",  # 7 executors of 1 CPU beside the drivers: far fewer than the apps ask for
        node_memory="64Gi",
        bookmark_interval=0.5,
        gate_protection="webhook",  # the admission panels show both of the webhook's endpoints
    )
    resources: list[Any] = []
    try:
        system.start()
        resources.append(system)
        assert system.webhook is not None and system.allocator is not None
        certs = CertsSync(system, workdir)
        resources.append(certs)
        ca = workdir / "webhook-ca.pem"
        ca.write_bytes(system.webhook.ca_pem)
        scrape = [
            {
                "job_name": "sparkgate-allocator",
                **operator_target("allocator", "allocator-http", f"127.0.0.1:{system.allocator.port}"),
            },
            {
                "job_name": "sparkgate-webhook",
                "scheme": "https",
                "tls_config": {"ca_file": str(ca)},
                **operator_target("webhook", "webhook-https", f"127.0.0.1:{system.webhook.port}"),
            },
            {"job_name": "sparkgate-certs", "static_configs": [{"targets": [f"127.0.0.1:{certs.port}"]}]},
        ]
        prometheus = Prometheus(workdir, scrape, short_for_copy(prometheus_rule, workdir / "rules.yml"))
        resources.append(prometheus)
        cluster = system.cluster
        # kube-scheduler calls sparkgate's extender for every pod (the extender panels).
        cluster.scheduler.add_profile(
            "default-scheduler", [Extender(f"{system.allocator.url}/scheduler", weight=5, ignorable=True)]
        )
        drivers = {
            name: cluster.spark_driver(namespace, name, executors=n, batch_size=10, batch_delay=0.2, cpu="1")
            for namespace, name, n in (
                ("spark", "etl", 10),
                ("spark", "adhoc", 8),
                ("spark-b", "report", 8),
                ("spark-held", "held", 3),
            )
        }
        # The cluster fills up: 7 executors run, the rest are gated or unschedulable in flight.
        cluster.wait_for(
            lambda: sum(d.running() for d in drivers.values()) >= 6, timeout=60, what="the cluster full"
        )
        # A release-to-bind histogram series appears at its first observation, and rate() cannot see the
        # step from no series to its first value: once Prometheus has the series, a new node lets the
        # unschedulable pods in flight bind, observed by series it already has.
        eventually(
            lambda: prometheus.query('sparkgate_allocator_release_to_bind_seconds_count{namespace="spark"}'),
            60,
            "Prometheus to scrape the first binds",
        )
        cluster.add_node("node-3", cpu="8", memory="64Gi")
        # The drivers' admissions can all come before Prometheus's first scrape of the webhook, and the
        # allocator's gate removals make none: the latency panels' rate() would see no increase. Once
        # Prometheus has the webhook's latency series, two admission requests that are not AdmissionReviews
        # (outcome bad_request; their latency observed too) are an increase it sees.
        eventually(
            lambda: prometheus.query('sparkgate_webhook_request_duration_seconds_count{endpoint="mutate"}'),
            60,
            "Prometheus to scrape the webhook's admissions",
        )
        context = ssl.create_default_context(cadata=system.webhook.ca_pem.decode())
        for _ in range(2):
            request = urllib.request.Request(
                f"{system.webhook.url}/mutate", data=b"not a review", method="POST"
            )
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(request, context=context, timeout=5)
            assert refused.value.code == 400
        # A policy edit that does not load: both processes refuse it and keep the policy in force.
        refused_policy = policy.with_suffix(".new")
        refused_policy.write_text(REFUSED_POLICY)
        os.replace(refused_policy, policy)
        # A re-apply blanks a caBundle (the configuration the certificate loop keeps, which selects no pod):
        # the loop's next cycle repairs it and counts the repair (SparkgateCaBundleDrift).
        cluster.wait_for(
            lambda: _exists(cluster, "secrets", contract.INSTALL_NAMESPACE, contract.CERT_SECRET),
            timeout=60,
            what="the certificate loop to create the Secret",
        )
        cluster.store.create("mutatingwebhookconfigurations", DRIFTED_CONFIGURATION)
        # A storm of dropped watches (the allocator's two configmap watches; kubesim ends their streams).
        allocator = system.allocator

        def restarts() -> float:
            text = allocator.get("/metrics")[1]
            return min(
                _metric_value(
                    text, f'sparkgate_allocator_watch_restarts_total{{cause="timeout",watch="{w}"}}'
                )
                for w in ("copies", "sources")
            )

        # Each watch restarts once, and Prometheus records the counters (a labelled counter appears at its
        # first increment, unseen by increase()), then the storm: a dozen restarts each within seconds.
        # A watch that is reconnecting when its stream is dropped is not dropped: drop again until both
        # have restarted. Each stream is cut once it has been open a second, as a proxy with a short timeout
        # would: a watch cut sooner is "very short" and re-opened only after a growing backoff.
        def first_restarts_scraped() -> bool:
            if restarts() < 1:
                cluster.faults.drop_watches("configmaps", min_age=1.0)
                return False
            series = prometheus.query(
                'sparkgate_allocator_watch_restarts_total{cause="timeout",watch=~"copies|sources"}'
            )
            return {s["metric"]["watch"] for s in series} == {"copies", "sources"}

        eventually(first_restarts_scraped, 60, "Prometheus to scrape both watches' first restart")
        deadline = time.monotonic() + 60
        while restarts() < WATCH_DROPS:
            assert time.monotonic() < deadline, "the allocator did not restart its watches"
            if cluster.faults.drop_watches("configmaps", min_age=1.0) == 0:
                time.sleep(0.02)  # the allocator is reconnecting, or its streams are younger than 1 s
        # A scale-down (pending and gated pods deleted) and an app that ends (its driver pod deleted).
        drivers["etl"].scale_to(3)
        adhoc = drivers["adhoc"]
        eventually(
            lambda: f'app="{adhoc.app_id}"' in allocator.get("/metrics")[1], 30, "adhoc's series in /metrics"
        )
        eventually(
            lambda: prometheus.query(f'sparkgate_allocator_executors{{app="{adhoc.app_id}"}}'),
            60,
            "Prometheus to scrape the adhoc app's series",
        )
        adhoc.stop()
        adhoc.delete_driver_pod()
        eventually(
            lambda: adhoc.app_id not in allocator.get("/metrics")[1], 60, "adhoc's series to leave /metrics"
        )
        yield Run(system, prometheus, drivers, adhoc.app_id)
    finally:
        for resource in reversed(resources):
            resource.stop()


def substitute(expr: str, window: str, namespace: str = ".*", app: str = ".*", top: str = "10") -> str:
    for name, value in (
        ("$__rate_interval", window),
        ("$__range", window),
        ("$namespace", namespace),
        ("$app", app),
        ("$top", top),
    ):
        expr = expr.replace(name, value)
    assert "$" not in expr, f"an unknown template variable in {expr}"
    return expr


def numbers(result: list[dict[str, Any]]) -> list[float]:
    return [float(sample["value"][1]) for sample in result if not math.isnan(float(sample["value"][1]))]


def test_every_panel_query_returns_data(run: Run, panel_queries: list[Any]) -> None:
    prometheus = run.prometheus
    etl = run.drivers["etl"]
    for variables in ({}, {"namespace": "spark", "app": etl.app_id}):

        def empty(variables: dict[str, str] = variables) -> list[str]:
            window = run.window()
            return [
                f"{q.panel} [{q.ref}]: {substitute(q.expr, window, **variables)}"
                for q in panel_queries
                if not numbers(prometheus.query(substitute(q.expr, window, **variables)))
            ]

        # Until every query has a number (scrapes are asynchronous); the failure lists the empty ones.
        settles(empty, 60, "every panel query to return data")

    def unfiltered() -> list[str]:
        window = run.window()
        problems = []
        # The variables filter: one namespace's executors are only that namespace's.
        per_namespace = next(q.expr for q in panel_queries if q.panel == "Executors by state, per namespace")
        by_namespace = prometheus.query(substitute(per_namespace, window, namespace="spark-b"))
        if {s["metric"]["namespace"] for s in by_namespace} != {"spark-b"}:
            problems.append(f"executors of namespace spark-b: {by_namespace}")
        top = next(q.expr for q in panel_queries if q.panel.startswith("Executors by state, top"))
        top_one = {s["metric"]["app"] for s in prometheus.query(substitute(top, window, top="1"))}
        if len(top_one) != 1:
            problems.append(f"top 1 apps: {top_one}")
        top_ten = {s["metric"]["app"] for s in prometheus.query(substitute(top, window))}
        if len(top_ten) < 3:
            problems.append(f"top 10 apps: {top_ten}")
        # The limits bound, in more than one scope, and the workload's events are all there.
        hits = prometheus.query(f"sum by (scope) (increase(sparkgate_allocator_limit_hits_total[{window}]))")
        if len({s["metric"]["scope"] for s in hits if float(s["value"][1]) > 0}) < 2:
            problems.append(f"limit hits: {hits}")
        reasons = prometheus.query("sum by (reason) (sparkgate_allocator_deletions_total)")
        if len({s["metric"]["reason"] for s in reasons}) < 2:
            problems.append(f"deletion reasons: {reasons}")
        outcomes = prometheus.query("sum by (outcome) (sparkgate_webhook_requests_total)")
        if not {"mutated", "allowed", "bad_request"} <= {s["metric"]["outcome"] for s in outcomes}:
            problems.append(f"webhook outcomes: {outcomes}")
        return problems

    settles(unfiltered, 60, "the filters and the workload's figures")


def test_template_variable_queries_return_values(run: Run, dashboard: dict[str, Any]) -> None:
    """Grafana resolves `label_values(metric{selector}, label)` through /api/v1/label/<label>/values."""
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert (
        variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    )
    live = {d.app_id for name, d in run.drivers.items() if name != "adhoc"}
    for name, expected in (("namespace", {"spark", "spark-b", "spark-held"}), ("app", live)):
        query = variables[name]["query"]["query"]
        selector, _, label = query.removeprefix("label_values(").removesuffix(")").rpartition(", ")
        assert label == name
        selector = substitute(selector, "1m")

        def values(selector: str = selector, label: str = label) -> set[str]:
            start = str(time.time() - 5)  # the values of the live series, as Grafana's range of "now"
            return set(run.prometheus.api(f"label/{label}/values", **{"match[]": selector, "start": start}))

        eventually(lambda expected=expected, values=values: expected <= values(), 60, f"${name}'s values")


def test_an_ended_apps_series_leave_prometheus(run: Run) -> None:
    prometheus = run.prometheus
    selector = f'sparkgate_allocator_executors{{app="{run.ended_app}"}}'
    assert prometheus.query(f"max_over_time({selector}[{run.window()}])"), "the app's series were scraped"

    def left() -> bool:
        # From a scrape that has the live apps' series (a failed one would make every series stale).
        live = {s["metric"]["app"] for s in prometheus.query("sparkgate_allocator_executors")}
        return run.ended_app not in live and run.drivers["etl"].app_id in live

    eventually(left, 60, "the ended app's series to go stale while the live apps' stay")


def test_every_alert_fires_in_its_scenario(run: Run, alert_rules: list[dict[str, Any]]) -> None:
    prometheus, system = run.prometheus, run.system
    names = {rule["alert"] for rule in alert_rules}
    held = run.drivers["held"].app_id
    # The alerts the workload triggers, each naming what caused it and nothing else: the labels that name
    # the cause, of every firing instance, sorted.
    causes: dict[str, tuple[Callable[[dict[str, str]], Any], list[Any]]] = {
        "SparkgateExecutorsHeld": (lambda a: (a["namespace"], a["app"]), [("spark-held", held)]),
        "SparkgateWebhookErrors": (lambda a: (a["endpoint"], a["outcome"]), [("mutate", "bad_request")]),
        "SparkgateWatchRestartStorm": (lambda a: a["watch"], ["copies", "sources"]),
        # The certificate the local webhook serves lives a day; the Secret's live 90 days and 3 years.
        "SparkgateCertificateExpiresSoon": (lambda a: a["certificate"], ["webhook-serving"]),
        # Both containers refuse it: told apart by `container` (their `job` is the same; the rule drops it).
        "SparkgatePolicyRejected": (
            lambda a: (a["container"], a["pod"], a.get("job")),
            [("allocator", POD, None), ("webhook", POD, None)],
        ),
        # The blanked caBundle, repaired by the certificate loop.
        "SparkgateCaBundleDrift": (lambda a: a["job"], ["sparkgate-certs"]),
        # The leader's policy probe: the profile naming a PriorityClass that does not exist, where it applies.
        "SparkgateProfileRefused": (lambda a: a["profile"], ["refused"]),
    }
    later = {"SparkgateWebhookBypassed", "SparkgateNoAllocatorLeader"}
    # Faults this run does not cause, made to fire by promtool's unit test: silent here all along.
    faults = fault_alerts()
    assert causes.keys() | later | faults == names, "every alert has a scenario here or in promtool's test"

    def workload_alerts() -> list[str]:
        firing = prometheus.alerts()
        problems = []
        for name, (cause, wanted) in causes.items():
            got = sorted(cause(a["labels"]) for a in firing if a["labels"]["alertname"] == name)
            if got != wanted:
                problems.append(f"{name}: {got!r} firing, expected {wanted!r}")
        return problems

    settles(workload_alerts, 60, "the workload's alerts to fire, each naming its cause")

    def silent(quiet: set[str]) -> Callable[[], list[str]]:
        """Alerts neither firing nor pending, seen while the allocator is scraped: a failed scrape makes
        its series stale, and no series at all is what the no-leader alert is about."""

        def problems() -> list[str]:
            if not prometheus.query('up{container="allocator"} == 1'):
                return ["the allocator's last scrape failed"]
            active = {a["labels"]["alertname"] for a in prometheus.alerts() + prometheus.alerts("pending")}
            return [f"{name} is active" for name in sorted(quiet & active)]

        return problems

    settles(silent(later | faults), 60, "the alerts of the scenarios to come and of faults to be silent")

    # The webhook goes away: an executor pod is admitted without sparkgate (failurePolicy Ignore).
    assert system.webhook is not None and system.allocator is not None
    system.webhook.stop()
    system.cluster.spark_driver("spark-b", "bypass", executors=2, batch_size=2, batch_delay=0.2)
    eventually(
        lambda: [a["namespace"] for a in prometheus.firing("SparkgateWebhookBypassed")] == ["spark-b"],
        60,
        "the bypass alert, for spark-b alone",
    )
    settles(
        silent({"SparkgateNoAllocatorLeader"} | faults), 60, "the no-leader and fault alerts to be silent"
    )

    # The allocator goes away: nobody leads.
    system.allocator.stop()
    eventually(lambda: prometheus.firing("SparkgateNoAllocatorLeader"), 60, "the no-leader alert")

    # Every rule evaluated without error all along.
    rules = [r for g in prometheus.api("rules")["groups"] for r in g["rules"]]
    assert {r["name"] for r in rules} == names
    assert all(r["health"] == "ok" for r in rules), [(r["name"], r.get("lastError")) for r in rules]
