"""What an allocator that does not lead says on /apps: every replica answers the scheduler extender and serves
/apps, so a follower must report each app's profile and the nodes refused to it by that profile's settings,
as the leader does, although only the leader decides (and so keeps the per-app settings of its decisions).
The parts are assembled as the command does, against kubesim over HTTP; this allocator never takes the Lease.
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from allocator.cache import pod_record
from allocator.commands import Allocator, assemble
from allocator.http import StatusServer
from allocator.loop import Options
from allocator.metrics import AllocatorMetrics
from kubesim.cluster import Cluster
from sparkgate import contract
from sparkgate.contract import AppKey
from sparkgate.kube import Kube
from sparkgate.policy_file import PolicySource

from .test_dispatch import executor as gated_executor

POLICY = """
apiVersion: sparkgate.io/v1alpha1
kind: Policy
excludedNamespaces: ["batch-*"]
scheduling: {failuresPerApp: 3, suspectNodeApps: 3, failureWindowSeconds: 600}
profiles:
  - name: spark
  - name: tolerant
    scheduling: {failuresPerApp: 5}
"""


def executor(app: str, exec_id: int, profile: str, **status: Any) -> dict[str, Any]:
    """An executor of `profile` released and bound to n1, Running unless `status` says otherwise."""
    pod = gated_executor(app, exec_id)
    pod["metadata"]["annotations"][contract.ANNOTATION_PROFILE] = profile
    del pod["spec"]["schedulingGates"]
    pod["spec"]["nodeName"] = "n1"
    pod["status"] = status or {"phase": "Running"}
    return pod


@pytest.fixture
def follower(tmp_path: Path) -> Iterator[tuple[Allocator, StatusServer]]:
    with Cluster(nodes=2) as cluster:
        kube = Kube.from_kubeconfig(str(cluster.kubeconfig("admin")))
        (tmp_path / "policy.yaml").write_text(POLICY)
        source = PolicySource(str(tmp_path / "policy.yaml"), contract.INSTALL_NAMESPACE)
        # No batch period: the test takes the cache's news from the queue at once (test_workqueue has it).
        options = Options(identity="follower", batch_period=0.0)
        allocator = assemble(kube, source, options, AllocatorMetrics())
        server = StatusServer(allocator.controller, allocator.extender, "127.0.0.1", 0)
        server.start()
        yield allocator, server
        server.stop()
        allocator.controller.actor.close()
        kube.close()


def test_a_follower_reports_each_apps_profile_and_the_nodes_refused_by_its_settings(
    follower: tuple[Allocator, StatusServer],
) -> None:
    allocator, server = follower
    c = allocator.controller
    assert not c.elector.leading
    oom = {"phase": "Failed", "reason": "OOMKilled"}
    pods = [executor("app-t", i, "tolerant", **oom) for i in (1, 2, 3)] + [executor("app-t", 4, "tolerant")]
    pods += [executor("app-s", i, "spark", **oom) for i in (1, 2, 3)] + [executor("app-s", 4, "spark")]
    c.cache.pods_replace([])
    c.cache.drivers_replace([])
    c.cache.config_maps_replace([], source=True)
    c.cache.config_maps_replace([], source=False)
    allocator.extender.placement.nodes_replace([{"metadata": {"name": n}} for n in ("n1", "n2")])
    for pod in pods:  # each executor seen running on n1, then the first three failed there
        record = pod_record(pod)
        assert record is not None
        c.cache.pod_event("ADDED", executor(record.app_id, record.exec_id or 0, record.profile or ""))
        c.cache.pod_event("MODIFIED", pod)
    c.step(c.queue.get(0))  # a follower's step: it works out the settings in force and acts on nothing
    assert c.memory == {} and c.settings.keys() == {AppKey("spark", "app-t"), AppKey("spark", "app-s")}
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/apps", timeout=30) as response:
        apps = {a["appId"]: a for a in json.load(response)["apps"]}
    assert apps["app-t"]["profile"] == "tolerant" and apps["app-s"]["profile"] == "spark"
    # issue 20: a follower shows the limits in force, not "batch -, max -".
    assert apps["app-s"]["limits"] == {
        "batchSize": 10,
        "batchDelaySeconds": 1.0,
        "maxPendingPerApp": 50,
        "unschedulableSeconds": 60.0,
    }
    # Three failures on n1: enough under the top-level setting (3), not under the tolerant profile's (5).
    assert apps["app-t"]["excludedNodes"] == []
    assert [(e["node"], e["scope"]) for e in apps["app-s"]["excludedNodes"]] == [("n1", "app")]
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/apps/spark/app-t", timeout=30) as response:
        assert json.load(response)["profile"] == "tolerant"


def test_an_excluded_namespaces_executors_are_not_bypassed(follower: tuple[Allocator, StatusServer]) -> None:
    """docs/policy.md: executor pods of an excluded namespace are admitted unchanged, on purpose: /apps and
    the bypassed gauge do not count them as admitted without sparkgate (SparkgateWebhookBypassed would fire
    for as long as Spark runs there); ungated pods elsewhere without sparkgate's annotation still are."""
    allocator, server = follower
    c = allocator.controller
    c.cache.pods_replace([])
    for namespace in ("batch-etl", "spark"):
        pod = executor("app-x", 1, "spark")
        del pod["metadata"]["annotations"][contract.ANNOTATION_PROFILE]  # admitted unchanged
        pod["metadata"]["namespace"] = namespace
        pod["metadata"]["uid"] = f"uid-{namespace}"
        c.cache.pod_event("ADDED", pod)
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/apps", timeout=30) as response:
        document = json.load(response)
    apps = {a["namespace"]: a for a in document["apps"]}
    assert (apps["batch-etl"]["bypassed"], apps["batch-etl"]["excludedNamespace"]) == (0, True)
    assert (apps["spark"]["bypassed"], apps["spark"]["excludedNamespace"]) == (1, False)
    assert document["cluster"]["bypassedByNamespace"] == {"spark": 1}
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/apps/batch-etl/app-x", timeout=30) as r:
        assert json.load(r)["excludedNamespace"] is True
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=30) as response:
        text = response.read().decode()
    assert 'sparkgate_allocator_bypassed_pods{namespace="spark"} 1.0' in text
    assert 'sparkgate_allocator_bypassed_pods{namespace="batch-etl"} 0.0' in text
