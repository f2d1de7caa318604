"""kubesim's cluster-autoscaler (kubesim/autoscaler.py) against kubernetes-sigs/cluster-autoscaler's rules, and
the autoscaler's signal on a gated pod. "Measured" below: on a real kube-apiserver and kube-scheduler v1.36.2
with cluster-autoscaler (kwok provider) built 2026-07-30 (issue 36): six gated pods unmarked were ignored;
marked Unschedulable through pods/status together, one plan 0->6; marked one by one, three plans.

Pods are created and marked over HTTP with the official client, as the allocator does; time is short
(scan interval 50 ms, provisioning 0.1 s) and every wait is `Cluster.wait_for`.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, config

from kubesim.autoscaler import AutoscalerConfig
from kubesim.cluster import Cluster
from kubesim.nodegroups import NodeGroup

STRATEGIC = "application/strategic-merge-patch+json"
GATE = "sparkgate.io/allocator"
SMALL = NodeGroup("ng-small", max_size=10, cpu="2", memory="8Gi")


def autoscaled(*groups: NodeGroup, nodes: int = 0, **options: Any) -> Cluster:
    settings: dict[str, Any] = {
        "provisioning_delay": 0.1,
        "scan_interval": 0.05,
        "new_pods_buffer": 0.0,
        "unneeded_time": 3600.0,
        "delay_after_add": 0.0,
    }
    settings.update(options)
    return Cluster(
        nodes=nodes,
        node_cpu="8",
        bookmark_interval=0.2,
        namespaces=("default", "spark"),
        autoscaler=AutoscalerConfig(groups=groups or (SMALL,), **settings),
    )


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    with autoscaled() as c:
        yield c


def core(cluster: Cluster) -> client.CoreV1Api:
    return client.CoreV1Api(config.new_client_from_config(str(cluster.kubeconfig())))


def executor(
    name: str, *, cpu: str = "2", memory: str = "1Gi", gated: bool = True, **annotations: str
) -> Any:
    spec: dict[str, Any] = {
        "containers": [
            {"name": "spark", "image": "spark", "resources": {"requests": {"cpu": cpu, "memory": memory}}}
        ]
    }
    if gated:
        spec["schedulingGates"] = [{"name": GATE}]
    return {"metadata": {"name": name, "annotations": annotations}, "spec": spec}


def create(api: client.CoreV1Api, count: int, **options: Any) -> list[str]:
    names = [f"exec-{i + 1}" for i in range(count)]
    for name in names:
        api.create_namespaced_pod("spark", executor(name, **options))
    return names


def mark(api: client.CoreV1Api, name: str, message: str = "held by sparkgate: the app's window") -> None:
    """What the allocator writes on a held pod: PodScheduled=False, reason Unschedulable, through pods/status."""
    condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}
    api.patch_namespaced_pod_status(
        name, "spark", {"status": {"conditions": [condition]}}, _content_type=STRATEGIC
    )


def mark_together(cluster: Cluster, api: client.CoreV1Api, names: list[str]) -> None:
    """Marks that land between two loops (no loop starts while they are written)."""
    assert cluster.autoscaler is not None
    with cluster.autoscaler.hold():
        for name in names:
            mark(api, name)


def scheduled_condition(cluster: Cluster, name: str) -> dict[str, Any]:
    pod = cluster.store.get("pods", "spark", name)
    return next(c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled")


def loops_after(cluster: Cluster, count: int) -> None:
    """Wait until `count` more autoscaler loops have run."""
    assert cluster.autoscaler is not None
    target = cluster.autoscaler.loop_count + count
    cluster.wait_for(lambda: cluster.autoscaler is not None and cluster.autoscaler.loop_count >= target)


def nodes(cluster: Cluster) -> list[str]:
    items, _, _ = cluster.store.list_objects("nodes")
    return sorted(n["metadata"]["name"] for n in items)


# --- the signal: ArrangePodsBySchedulability (pkg/utils/kubernetes/listers.go) -----------------------------


def test_gated_pods_without_the_mark_are_ignored(cluster: Cluster) -> None:
    """listers.go: a gated pod carries reason SchedulingGated, neither scheduled nor unschedulable: CA logs it
    "ignored by allowed schedulers" and "No unschedulable pods", and scales nothing (the measured fact)."""
    create(core(cluster), 6)
    loops_after(cluster, 3)
    assert cluster.autoscaler is not None
    last = cluster.autoscaler.loops[-1]
    assert (last.unschedulable, last.ignored, last.outcome) == (0, 6, "No unschedulable pods")
    assert cluster.autoscaler.rounds == 0 and nodes(cluster) == []


def test_gated_pods_marked_together_get_one_scale_up(cluster: Cluster) -> None:
    """listers.go counts PodScheduled=False/Unschedulable whoever wrote it, gated or not; marks that land
    between two loops (core/static_autoscaler.go takes its snapshot at the start of RunOnce) are one plan:
    `Final scale-up plan: [{ng-small 0->6}]`, as measured. The nodes join after the provisioning delay, and
    later loops see "Schedulable pods present" (filter_out_schedulable.go) and add nothing."""
    api = core(cluster)
    names = create(api, 6)
    mark_together(cluster, api, names)
    cluster.wait_for(lambda: len(nodes(cluster)) == 6, what="six nodes of ng-small")
    loops_after(cluster, 3)
    assert cluster.autoscaler.plans == [{"ng-small": (0, 6)}] and cluster.autoscaler.rounds == 1
    assert cluster.autoscaler.loops[-1].schedulable_present
    assert all(cluster.store.get("pods", "spark", n)["spec"].get("schedulingGates") for n in names)


def test_gated_pods_marked_one_by_one_scale_up_in_steps() -> None:
    """loop/trigger.go: a pod that becomes unschedulable starts a loop at once (here the scan interval is an
    hour, so nothing else could), and marks written one at a time, each after the previous loop, are helped
    one plan each (measured: 0->1, 1->2, 2->6)."""
    with autoscaled(scan_interval=3600.0) as cluster:
        api = core(cluster)
        assert cluster.autoscaler is not None
        for i, name in enumerate(create(api, 3)):
            mark(api, name)
            cluster.wait_for(
                lambda i=i: cluster.autoscaler is not None and cluster.autoscaler.rounds == i + 1
            )
        assert cluster.autoscaler.plans == [{"ng-small": (0, 1)}, {"ng-small": (1, 2)}, {"ng-small": (2, 3)}]
        planned = [loop.trigger for loop in cluster.autoscaler.loops if loop.plan]
        assert planned == ["Autoscaler loop triggered by unschedulable pod appearing"] * 3


def test_pods_marked_while_a_loop_runs_wait_for_the_next_one() -> None:
    """core/static_autoscaler.go `RunOnce` lists the pods and nodes at its start and scales up at its end,
    seconds later in a real CA (`loop_duration` stands in for that time): pods marked in between are the
    next loop's, which the productive loop starts at once (loop/trigger.go). The cloud goes on meanwhile:
    nodes due while a loop spends its time join when due, not at its end."""
    with autoscaled(scan_interval=3600.0, loop_duration=3.0) as cluster:
        api = core(cluster)
        autoscaler = cluster.autoscaler
        assert autoscaler is not None
        names = create(api, 5)
        mark_together(cluster, api, names[:2])
        cluster.wait_for(lambda: any(loop.unschedulable == 2 for loop in autoscaler.loops))  # its snapshot
        for name in names[2:]:
            mark(api, name)
        cluster.wait_for(lambda: autoscaler.rounds == 1)
        assert autoscaler.plans == [{"ng-small": (0, 2)}]
        cluster.wait_for(lambda: len(nodes(cluster)) == 2, what="the first plan's nodes")
        assert autoscaler.loop_count == 2 and autoscaler.loops[-1].outcome == ""  # the next loop still runs
        cluster.wait_for(lambda: autoscaler.rounds == 2)
        assert autoscaler.plans[1] == {"ng-small": (2, 5)} and autoscaler.loops[-1].unschedulable == 5


def test_pods_that_fit_the_nodes_scale_nothing() -> None:
    """filter_out_schedulable.go: unschedulable pods that the simulation packs onto existing nodes are
    dropped before a scale-up ("Schedulable pods present")."""
    with autoscaled(nodes=1) as cluster:
        api = core(cluster)
        for name in create(api, 3):
            mark(api, name)
        loops_after(cluster, 3)
        assert cluster.autoscaler is not None
        assert cluster.autoscaler.rounds == 0 and cluster.autoscaler.loops[-1].schedulable_present
        assert cluster.autoscaler.loops[-1].helped == 0


def test_new_pods_wait_one_loop() -> None:
    """static_autoscaler.go `shouldScaleUp`: when every pod to help was created less than
    unschedulablePodTimeBuffer ago, "Unschedulable pods are very new, waiting one iteration for more"."""
    with autoscaled(new_pods_buffer=3600.0) as cluster:
        api = core(cluster)
        for name in create(api, 2):
            mark(api, name)
        loops_after(cluster, 2)
        assert cluster.autoscaler is not None
        assert cluster.autoscaler.rounds == 0
        assert (
            cluster.autoscaler.loops[-1].outcome
            == "Unschedulable pods are very new, waiting one iteration for more"
        )


def test_least_waste_picks_the_group_that_wastes_least() -> None:
    """expander/waste/waste.go: two 3-CPU pods waste half of two 4-CPU nodes, nothing of one 6-CPU node."""
    four = NodeGroup("ng-four", max_size=10, cpu="4", memory="16Gi")
    six = NodeGroup("ng-six", max_size=10, cpu="6", memory="24Gi")
    with autoscaled(four, six) as cluster:
        api = core(cluster)
        names = create(api, 2, cpu="3", memory="12Gi")
        mark_together(cluster, api, names)
        cluster.wait_for(lambda: cluster.autoscaler is not None and cluster.autoscaler.rounds == 1)
        assert cluster.autoscaler.plans == [{"ng-six": (0, 1)}]


def test_a_group_never_grows_past_its_max_size() -> None:
    """core/scaleup/orchestrator: the estimate stops at max size minus target size (SngCapacityThreshold)
    and a group at its max is skipped ("max size reached")."""
    with autoscaled(NodeGroup("ng-small", max_size=3, cpu="2", memory="8Gi")) as cluster:
        api = core(cluster)
        names = create(api, 6)
        mark_together(cluster, api, names)
        cluster.wait_for(lambda: len(nodes(cluster)) == 3)
        loops_after(cluster, 3)
        assert cluster.autoscaler.plans == [{"ng-small": (0, 3)}]


def test_new_nodes_join_the_scheduler_and_the_kubelets(cluster: Cluster) -> None:
    """A node of the group carries its template's capacity; the scheduler binds the ungated pod there (its
    verdict replacing the mark) and the kubelet runs it."""
    api = core(cluster)
    [name] = create(api, 1, gated=False)
    cluster.wait_for(lambda: cluster.store.get("pods", "spark", name)["status"].get("phase") == "Running")
    pod = cluster.store.get("pods", "spark", name)
    assert pod["spec"]["nodeName"] == "ng-small-1"
    assert cluster.store.get("nodes", None, "ng-small-1")["status"]["capacity"]["cpu"] == "2"


def test_an_unneeded_node_goes_after_the_unneeded_time() -> None:
    """core/scaledown (eligibility.go, unneeded/nodes.go): a node whose utilization is below the threshold
    and whose pods can move is removed once unneeded for scale-down-unneeded-time; NodeUsage counts it."""
    with autoscaled(unneeded_time=0.3) as cluster:
        api = core(cluster)
        names = create(api, 2, gated=False)
        cluster.wait_for(
            lambda: all(
                cluster.store.get("pods", "spark", n)["status"].get("phase") == "Running" for n in names
            )
        )
        assert nodes(cluster) == ["ng-small-1", "ng-small-2"]
        api.delete_namespaced_pod(names[0], "spark")
        cluster.wait_for(lambda: len(nodes(cluster)) == 1, what="the emptied node removed")
        assert cluster.autoscaler is not None
        assert any(loop.deleted for loop in cluster.autoscaler.loops)
        assert cluster.autoscaler.usage.peak == 2 and cluster.autoscaler.usage.node_seconds() > 0
        loops_after(cluster, 5)
        assert len(nodes(cluster)) == 1, "the busy node (utilization 1.0) stays"


# --- the signal on a gated pod: kube-apiserver and kube-scheduler ----------------------------------------


def test_the_mark_stays_while_gated_and_the_scheduler_replaces_it() -> None:
    """pkg/registry/core/pod/strategy.go `podStatusStrategy.PrepareForUpdate` keeps a client's condition
    (HTTP 200); conditions merge by type (strategic merge patch). kube-scheduler does not see a gated pod;
    after the gate goes, `handleSchedulingFailure`/`updatePod` (pkg/scheduler/schedule_one.go) writes its
    verdict through podutil.UpdatePodCondition, which keeps lastTransitionTime (False stays False)."""
    with Cluster(nodes=1, node_cpu="1", namespaces=("default", "spark")) as plain:
        api = core(plain)
        api.create_namespaced_pod("spark", executor("exec-1"))
        gated = scheduled_condition(plain, "exec-1")
        assert (gated["reason"], gated["message"]) == (
            "SchedulingGated",
            "Scheduling is blocked due to non-empty scheduling gates",
        )
        mark(api, "exec-1", "held by sparkgate: cluster cap")
        api.patch_namespaced_pod(
            "exec-1", "spark", {"metadata": {"labels": {"x": "y"}}}, _content_type=STRATEGIC
        )
        held = scheduled_condition(plain, "exec-1")
        assert (held["reason"], held["message"]) == ("Unschedulable", "held by sparkgate: cluster cap")
        assert plain.store.get("pods", "spark", "exec-1")["status"]["qosClass"] == "Burstable"
        api.patch_namespaced_pod(
            "exec-1",
            "spark",
            {"spec": {"schedulingGates": None}},
            _content_type="application/merge-patch+json",
        )
        plain.wait_for(lambda: scheduled_condition(plain, "exec-1")["message"].startswith("0/1 nodes"))
        verdict = scheduled_condition(plain, "exec-1")
        assert verdict["reason"] == "Unschedulable" and "1 Insufficient cpu" in verdict["message"]
        assert verdict["lastTransitionTime"] == held["lastTransitionTime"]
        assert plain.scheduler.peak_pending == 1


def test_a_bind_replaces_the_mark_with_scheduled_true() -> None:
    """pods/binding sets PodScheduled=True (pkg/registry/core/pod/storage `setPodNodeAndMetadata`)."""
    with Cluster(nodes=1, node_cpu="8", namespaces=("default", "spark")) as plain:
        api = core(plain)
        api.create_namespaced_pod("spark", executor("exec-1"))
        mark(api, "exec-1")
        api.patch_namespaced_pod(
            "exec-1",
            "spark",
            {"spec": {"schedulingGates": None}},
            _content_type="application/merge-patch+json",
        )
        plain.wait_for(lambda: scheduled_condition(plain, "exec-1")["status"] == "True")
        assert plain.store.get("pods", "spark", "exec-1")["spec"]["nodeName"] == "node-1"
