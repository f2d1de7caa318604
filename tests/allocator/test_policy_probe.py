"""The allocator's policy probe (allocator/probe.py) on kubesim: the leader exports each profile's result
(one series per profile), records a Warning Event naming a refused profile's namespaces on the policy
ConfigMap when its refusals change (not at every run), probes again when the policy changes or its
interval has passed, keeps each run within its dry-run bound while rotating through the namespaces, and a
follower exports nothing. End to end, a Spark driver whose executors get a PriorityClass, a runtime class
and a service account from the profile runs all of them, and an installed profile naming a missing class
shows in the allocator's metric.

kubesim's Priority plugin answers as plugin/pkg/admission/priority/admission.go does (`no PriorityClass
with name NAME was found`); a dry run (`dryRun=All`) stores nothing.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from allocator.metrics import AllocatorMetrics
from allocator.probe import REASON, PolicyProbe
from kubesim.cluster import Cluster
from sandbox.localsystem import LocalSystem
from sparkgate import contract
from sparkgate.kube import Kube
from sparkgate.leader import LeaderTask
from sparkgate.policy_file import PolicySource
from sparkgate.probe import Verdict, probe

REPO = Path(__file__).resolve().parents[2]
METRIC = "sparkgate_allocator_policy_probe_admitted"
POLICY = """
apiVersion: sparkgate.io/v1alpha1
kind: Policy
allocation: {{batchSize: 5, batchDelaySeconds: 0.1, maxPendingPerApp: 20}}
profiles:
  - name: spark
    match: {{namespaces: [spark]}}
    template:
      spec:
        priorityClassName: {klass}
        runtimeClassName: gvisor
        serviceAccountName: spark-exec
    overrides: [spec.serviceAccountName]
{extra}"""
BROKEN = """  - name: broken
    match: {namespaces: [spark-b]}
    template:
      spec:
        priorityClassName: no-such-class
"""


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def prepare(cluster: Cluster, namespaces: tuple[str, ...] = ("spark", "spark-b")) -> None:
    """What the profiles name, created by the admin beside the policy."""
    for namespace in namespaces:
        cluster.add_namespace(namespace)
    cluster.add_priority_class("spark-batch", 1000)
    cluster.add_runtime_class("gvisor", "runsc", overhead={"cpu": "100m", "memory": "64Mi"})
    cluster.add_service_account("spark", "spark-exec")


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    with Cluster(nodes=1) as c:
        prepare(c)
        c.store.create(
            "configmaps",
            {"metadata": {"name": contract.POLICY_CONFIGMAP}, "data": {"policy.yaml": "..."}},
            namespace=contract.INSTALL_NAMESPACE,
        )
        yield c


def sample(metrics: AllocatorMetrics, profile: str) -> float | None:
    value: float | None = metrics.registry.get_sample_value(METRIC, {"profile": profile})
    return value


def refused_events(cluster: Cluster) -> list[dict[str, Any]]:
    events, _, _ = cluster.store.list_objects("events", namespace=contract.INSTALL_NAMESPACE)
    return [e for e in events if e["reason"] == REASON]


def dry_runs(cluster: Cluster, since: int) -> int:
    return sum(1 for e in cluster.requests.entries()[since:] if e.resource == "pods" and "dryRun" in e.query)


class Leader:
    """A PolicyProbe as the leader runs it, on a policy file, with the allocator's identity and a clock."""

    def __init__(self, cluster: Cluster, path: Path, policy: str, **options: Any) -> None:
        path.write_text(policy)
        self.path, self.clock, self.metrics = path, Clock(), AllocatorMetrics()
        self.kube = Kube.from_kubeconfig(str(cluster.add_user(contract.ALLOCATOR_USER)))
        source = PolicySource(str(path), contract.INSTALL_NAMESPACE, clock=self.clock, check_interval=0)
        self.probe = PolicyProbe(
            self.kube, source, self.metrics, interval=300, monotonic=self.clock, clock=self.clock, **options
        )


@pytest.fixture
def leader(cluster: Cluster, tmp_path: Path) -> Iterator[Callable[..., Leader]]:
    made: list[Leader] = []

    def make(policy: str, **options: Any) -> Leader:
        made.append(Leader(cluster, tmp_path / "policy.yaml", policy, **options))
        return made[-1]

    yield make
    for one in made:
        one.kube.close()


def test_the_leader_exports_results_records_refusals_and_probes_again_when_due(
    cluster: Cluster, leader: Callable[..., Leader]
) -> None:
    one = leader(POLICY.format(klass="spark-batch", extra=BROKEN))
    probe, metrics, clock, path = one.probe, one.metrics, one.clock, one.path
    assert probe.due()
    results = probe.run_once()
    assert [(r.profile, r.namespace, r.verdict.value) for r in results] == [
        ("spark", "spark", "admitted"),
        ("broken", "spark-b", "refused"),
    ]
    assert sample(metrics, "spark") == 1 and sample(metrics, "broken") == 0
    [event] = refused_events(cluster)
    config_map = cluster.store.get("configmaps", contract.INSTALL_NAMESPACE, contract.POLICY_CONFIGMAP)
    assert event["type"] == "Warning"
    assert event["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "name": contract.POLICY_CONFIGMAP,
        "namespace": contract.INSTALL_NAMESPACE,
        "uid": config_map["metadata"]["uid"],
    }
    assert event["message"] == (
        "profile broken: the API server refuses its executor pods (dry run) in namespace spark-b: "
        'pods "sparkgate-probe-broken" is forbidden: no PriorityClass with name no-such-class was found'
    )
    assert not cluster.store.list_objects("pods")[0], "dry runs store nothing"

    assert not probe.due()
    clock.now += 300
    assert probe.due(), "every interval"
    probe.run_once()
    [again] = refused_events(cluster)
    assert again["count"] == 1, "the same refusal is not recorded again at every run"
    path.write_text(POLICY.format(klass="spark-batch", extra=""))
    clock.now += 1
    assert probe.due(), "when the policy changes"
    probe.run_once()
    assert sample(metrics, "broken") is None, "a profile that is gone has no series"
    assert sample(metrics, "spark") == 1
    probe.forget()
    assert sample(metrics, "spark") is None and probe.due()


def test_a_refusal_whose_event_was_not_written_is_recorded_by_the_next_run(
    cluster: Cluster, leader: Callable[..., Leader]
) -> None:
    one = leader(POLICY.format(klass="spark-batch", extra=BROKEN))
    cluster.faults.fail("create", "events", 500, count=1)
    one.probe.run_once()
    assert sample(one.metrics, "broken") == 0 and not refused_events(cluster)
    one.clock.now += 300
    one.probe.run_once()
    [event] = refused_events(cluster)
    assert event["message"].startswith("profile broken: the API server refuses its executor pods")


WIDE = """  - name: wide
    match: {namespaces: ["spark-*"]}
"""


def test_a_namespace_being_deleted_is_not_probed_and_one_deleted_meanwhile_is_no_refusal(
    cluster: Cluster, leader: Callable[..., Leader]
) -> None:
    """Issue 37: on the real cluster the probe dry-ran into namespaces being deleted and reported both profiles
    refused (4 ERROR lines, 2 ProfileRefused Events, policy_probe_admitted 0 for five minutes): the API server
    refuses any creation in a namespace being deleted (NamespaceLifecycle, kubesim answers as it does:
    tests/kubesim/test_api_semantics.py). Such a namespace is not probed; one deleted between the list and its
    dry run is no verdict on the profile (an error, its last result kept)."""
    cluster.add_namespace("spark-gone")
    # A finalizer of another controller keeps the namespace Terminating while the test looks.
    held = {"metadata": {"name": "held", "finalizers": ["example.com/hold"]}}
    cluster.store.create("configmaps", held, namespace="spark-gone")
    cluster.store.delete("namespaces", "", "spark-gone")
    assert cluster.store.get("namespaces", "", "spark-gone")["status"]["phase"] == "Terminating"
    one = leader(POLICY.format(klass="spark-batch", extra=WIDE))
    results = one.probe.run_once()
    assert [(r.profile, r.namespace, r.verdict.value) for r in results] == [
        ("spark", "spark", "admitted"),
        ("wide", "spark-b", "admitted"),
    ]
    assert sample(one.metrics, "wide") == 1 and not refused_events(cluster)
    policy = one.probe.policy.current()
    assert policy is not None
    wide = policy.profile_named("wide")
    assert wide is not None
    late = probe(one.kube, policy, wide, "spark-gone")  # as if listed before its deletion
    assert late.verdict is Verdict.ERROR and late.message == (
        'pods "sparkgate-probe-wide" is forbidden: unable to create new content in namespace spark-gone '
        "because it is being terminated"
    )


def test_a_run_keeps_to_its_dry_run_bound_and_rotates_through_the_namespaces(
    cluster: Cluster, leader: Callable[..., Leader]
) -> None:
    """Seven namespaces, at most four dry runs (two probes) a run: four runs cover them all, the refusals
    found so far are one Event whose message grows, and the bound is counted where it bites."""
    namespaces = [f"team-{i}" for i in range(7)]
    for namespace in namespaces:
        cluster.add_namespace(namespace)
    one = leader(
        "apiVersion: sparkgate.io/v1alpha1\nkind: Policy\nprofiles:\n  - name: teams\n"
        "    match: {namespaces: ['team-*']}\n    template: {spec: {priorityClassName: no-such-class}}\n",
        max_dry_runs=4,
    )
    probe, metrics, clock = one.probe, one.metrics, one.clock
    covered: list[str] = []
    for run in range(4):
        since = len(cluster.requests.entries())
        covered += [r.namespace for r in probe.run_once()]
        assert dry_runs(cluster, since) <= 4, f"run {run}"
        clock.now += 300
    assert sorted(set(covered)) == namespaces and covered[:7] == namespaces
    assert metrics.registry.get_sample_value("sparkgate_allocator_policy_probe_deferred_total") == 4 * 5
    assert sample(metrics, "teams") == 0
    [event] = refused_events(cluster)
    assert event["message"].startswith(
        "profile teams: the API server refuses its executor pods (dry run) in namespaces "
        + ", ".join(namespaces)
        + ': pods "sparkgate-probe-teams" is forbidden: '
    )
    assert event["count"] == 4, "one Event, patched as the refused namespaces were found"


def test_the_alert_fires_on_a_refused_profile_only() -> None:
    """The rule as shipped; its expression over what the leader and a follower export (max over them)."""
    rules = yaml.safe_load((REPO / "manifests" / "monitoring" / "prometheusrule.yaml").read_text())
    [rule] = [
        r for g in rules["spec"]["groups"] for r in g["rules"] if r.get("alert") == "SparkgateProfileRefused"
    ]
    assert rule["expr"].strip() == f"max by (profile) ({METRIC}) == 0"
    # Paged once a second probe refuses too (tests/monitoring: `for` between one and two probe intervals).
    assert rule["labels"]["severity"] == "critical" and rule["for"] == "7m"
    assert "{{ $labels.profile }}" in rule["annotations"]["summary"]
    assert "$labels.namespace" not in str(rule["annotations"]), "namespaces are in the Event, not the metric"


def scrape(text: str) -> dict[str, float]:
    found = {}
    for match in re.finditer(rf'^{METRIC}\{{profile="([^"]*)"\}} (\S+)$', text, re.MULTILINE):
        found[match.group(1)] = float(match.group(2))
    return found


@pytest.fixture
def installed(tmp_path: Path) -> Iterator[Any]:
    systems: list[LocalSystem] = []

    def install(policy: str) -> LocalSystem:
        path = tmp_path / "policy.yaml"
        path.write_text(policy)
        system = LocalSystem(path, tmp_path, namespaces=(), allocator_tick=0.2, nodes=3, node_cpu="8")
        prepare(system.cluster)
        systems.append(system.start())
        return system

    yield install
    for system in systems:
        system.stop()


def test_a_driver_whose_profile_names_a_class_a_runtime_class_and_an_account_runs_every_executor(
    installed: Any,
) -> None:
    system = installed(POLICY.format(klass="spark-batch", extra=BROKEN))
    cluster, allocator = system.cluster, system.allocator
    driver = cluster.spark_driver("spark", "classy", executors=8, batch_size=8, batch_delay=0.2, cpu="1")

    def executors() -> list[dict[str, Any]]:
        pods, _, _ = cluster.store.list_objects(
            "pods", label_selector=f"spark-app-selector={driver.app_id},spark-role=executor"
        )
        return pods

    cluster.wait_for(
        lambda: len([p for p in executors() if p["status"].get("phase") == "Running"]) == 8,
        timeout=90,
        what="all 8 executors running",
    )
    assert driver.failures == 0 and not driver.dead
    for pod in executors():
        spec = pod["spec"]
        assert spec["priorityClassName"] == "spark-batch" and spec["priority"] == 1000
        assert spec["runtimeClassName"] == "gvisor" and spec["overhead"] == {"cpu": "100m", "memory": "64Mi"}
        assert spec["serviceAccountName"] == "spark-exec"
    # The installed policy's broken profile: the leader's probe exports it, and the alert's expression holds.
    cluster.wait_for(
        lambda: scrape(allocator.get("/metrics")[1]) == {"spark": 1.0, "broken": 0.0},
        timeout=60,
        what="the probe's metric for the broken profile",
    )

    def refused_event() -> bool:
        events, _, _ = cluster.store.list_objects("events", namespace=contract.INSTALL_NAMESPACE)
        return any(
            e["reason"] == REASON and "no PriorityClass with name no-such-class was found" in e["message"]
            for e in events
        )

    cluster.wait_for(refused_event, timeout=30, what="the ProfileRefused Event on the policy ConfigMap")
    # The namespaces are on /apps, not in the metric.
    assert allocator.apps()["policyProbe"]["profiles"] == {
        "broken": {
            "admitted": False,
            "namespacesProbed": 1,
            "refused": {
                "spark-b": 'pods "sparkgate-probe-broken" is forbidden: no PriorityClass with name no-such-class '
                "was found"
            },
        },
        "spark": {"admitted": True, "namespacesProbed": 1, "refused": {}},
    }


def test_a_probe_that_cannot_list_the_namespaces_is_a_failed_run(
    cluster: Cluster, leader: Callable[..., Leader]
) -> None:
    """Run as the allocator runs it (a LeaderTask polling `run_if_due`): a refused namespace list is counted
    as an error (sparkgate_allocator_task_runs_total{result="error"}, SparkgateAllocatorTaskFailing), the
    polls in between are not counted, and the next due run that goes through is "ok"."""
    one = leader(POLICY.format(klass="spark-batch", extra=""))
    cluster.faults.fail("list", "namespaces", 403, count=None)
    outcomes: list[str] = []
    stop = threading.Event()
    polls = [0]

    def poll() -> bool:
        polls[0] += 1
        if polls[0] == 4:  # the interval has passed, and the API server lets the allocator list again
            one.clock.now += 300
            cluster.faults.clear()
        if polls[0] == 6:
            stop.set()
        return one.probe.run_if_due()

    def count(_task: str, result: str) -> None:
        outcomes.append(result)

    elector: Any = SimpleNamespace(leading=True, retry_period=0.01)
    task = LeaderTask("policy-probe", 0.0, poll, elector=elector, own_lease=False, stop=stop, on_run=count)
    runner = threading.Thread(target=task.run, daemon=True)
    runner.start()
    runner.join(timeout=60)
    stop.set()
    assert not runner.is_alive()
    assert outcomes == ["error", "ok"]
