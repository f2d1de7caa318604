"""ProvisioningRequests end to end (allocator/provisioning.py): the real webhook and allocator process on
kubesim with its cluster-autoscaler serving `autoscaling.x-k8s.io/v1` (kubesim/provisioning.py), the
requests watched at every store change. Counts and objects only, never wall time."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubesim.autoscaler import AutoscalerConfig
from kubesim.cluster import Cluster
from kubesim.nodegroups import NodeGroup
from sandbox.localsystem import AllocatorProcess, lease_holder
from sparkgate import contract

from .test_demand_integration import held_marks, status_writes
from .test_integration import running

SMALL = NodeGroup("ng-small", max_size=20, cpu="4", memory="16Gi")


class Requests:
    """Every ProvisioningRequest of the cluster, at every change: the most that existed at once."""

    def __init__(self, cluster: Cluster) -> None:
        self.lock = threading.Lock()
        self.live: set[str] = set()
        self.made: list[str] = []
        self.most = 0
        self.unsubscribe = cluster.store.subscribe(self.on_change)

    def on_change(self, kind: str, resource: str, obj: dict[str, Any]) -> None:
        if resource != "provisioningrequests":
            return
        name = obj["metadata"]["name"]
        with self.lock:
            if kind == "DELETED":
                self.live.discard(name)
            elif name not in self.live:
                self.live.add(name)
                self.made.append(name)
            self.most = max(self.most, len(self.live))


def owned(cluster: Cluster, resource: str, app_id: str) -> list[str]:
    objects, _, _ = cluster.store.list(resource, "spark", label_selector=f"{contract.LABEL_APP_ID}={app_id}")
    return [o["metadata"]["name"] for o in objects]


@pytest.mark.parametrize("klass", ["best-effort-atomic-scale-up", "check-capacity"])
def test_held_executors_are_asked_for_by_one_request_at_a_time_and_nothing_outlives_the_app(
    system: Any, klass: str, tmp_path: Any
) -> None:
    """One node of 4 CPUs that cluster-autoscaler grows, a cap of 8 in flight, an app of 40 executors of one
    CPU. The pods it holds are asked for by one request at a time (never two at once); under
    best-effort-atomic-scale-up they are not marked as well, and are released to consume it once it is
    provisioned (annotated in the gate's removal); check-capacity, which adds no node, finds no capacity
    and holds nothing: the held pods are marked for the ordinary scale-up. All 40 run. Then the
    leader is killed; the new one, which never saw the requests made, deletes them and their templates when
    the app ends."""
    # CA's timers at a tenth, the booking too (600 s, processor.go defaultReservationTime): a pod released to
    # consume a request may lose its booked node to one released before the request (kube-scheduler knows
    # nothing of bookings) and is then replaced once the booking ends (provisioning.py `stranded`).
    autoscaler = AutoscalerConfig(
        groups=(SMALL,), provisioning_delay=0.5, scan_interval=1.0, scale_down=False, booking_time=60.0
    )
    cluster, _, (allocator,), observer = system(
        nodes=1, node_cpu="4", batch=8, delay=0.1, per_app=8, per_ns=8, cluster=8, pacing="adaptive",
        provisioning=klass, autoscaler=autoscaler,
    )  # fmt: skip
    observer.unbound_limit = 8
    requests = Requests(cluster)
    try:
        driver = cluster.spark_driver("spark", "big", executors=40, batch_size=40, cpu="1")
        cluster.wait_for(
            lambda: running(cluster, driver.app_id) == 40, timeout=300, what="40 executors running"
        )
        assert requests.made and requests.most == 1, requests.made
        if klass == "best-effort-atomic-scale-up":  # the request stands for the held pods: none marked
            assert status_writes(cluster, code=None) == {} and held_marks(cluster) == set()
        else:  # check-capacity adds no node: the held pods are marked for the ordinary scale-up, once each
            assert all(n == 1 for n in status_writes(cluster).values())
        pods, _, _ = cluster.store.list(
            "pods", "spark", label_selector=f"{contract.LABEL_APP_ID}={driver.app_id}"
        )
        consumed = [
            p
            for p in pods
            if (p["metadata"].get("annotations") or {}).get(contract.ANNOTATION_CONSUME_REQUEST)
        ]
        if klass == "best-effort-atomic-scale-up":
            assert consumed, "no executor was released to consume a request"
            assert {
                p["metadata"]["annotations"][contract.ANNOTATION_PROVISIONING_CLASS] for p in consumed
            } == {contract.PROVISIONING_CLASSES[klass]}
        assert owned(cluster, "provisioningrequests", driver.app_id)
        assert owned(cluster, "podtemplates", driver.app_id)
        # A fail-over: the new leader finds the app's requests by their labels.
        allocator.kill()
        successor = AllocatorProcess(
            cluster, allocator.log.parent / "policy.yaml", allocator.log.parent, "alloc-2"
        )
        try:
            cluster.wait_for(lambda: lease_holder(cluster) == "alloc-2", timeout=60, what="alloc-2 leads")
            driver.stop()
            driver_pod = cluster.store.get("pods", "spark", driver.driver_name)
            cluster.store.patch(
                "pods", "spark", driver_pod["metadata"]["name"], {"status": {"phase": "Succeeded"}},
                "application/merge-patch+json", subresource="status",
            )  # fmt: skip
            cluster.wait_for(
                lambda: (
                    not owned(cluster, "provisioningrequests", driver.app_id)
                    and not owned(cluster, "podtemplates", driver.app_id)
                ),
                timeout=60,
                what="the app's requests and templates deleted",
            )
        finally:
            successor.stop()
    finally:
        requests.unsubscribe()
    assert observer.violations == []


def runbook_policy_edit() -> dict[str, Any]:
    """The policy edit docs/operations.md's SparkgateProvisioningRequestsFailing entry gives, as written."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    entry = text[text.index("### SparkgateProvisioningRequestsFailing") :]
    block = entry[entry.index("```yaml\n") + len("```yaml\n") :]
    edit: dict[str, Any] = yaml.safe_load(block[: block.index("```")])
    return edit


def test_the_runbook_of_a_request_that_never_provisions_frees_the_app(system: Any, tmp_path: Path) -> None:
    """The node group can grow by two nodes, the app holds 32 executors: no best-effort-atomic request for
    them can be provisioned (CapacityIsNotFound, tried again for good), and the app waits for it. The
    runbook's policy edit (`provisioning: none`) applied: the request and its template are deleted, the
    held executors are marked for the ordinary scale-up, which grows the group to its max size."""
    group = NodeGroup("ng-small", max_size=2, cpu="4", memory="16Gi")
    autoscaler = AutoscalerConfig(
        groups=(group,), provisioning_delay=0.5, scan_interval=1.0, scale_down=False
    )
    cluster, _, _, observer = system(
        nodes=1, node_cpu="4", batch=8, delay=0.1, per_app=8, per_ns=8, cluster=8, pacing="adaptive",
        provisioning="best-effort-atomic-scale-up", autoscaler=autoscaler,
    )  # fmt: skip
    observer.unbound_limit = 8
    driver = cluster.spark_driver("spark", "big", executors=40, batch_size=40, cpu="1")

    def never() -> bool:
        requests, _, _ = cluster.store.list("provisioningrequests", "spark")
        return any(
            c.get("type") == "Provisioned" and c.get("status") == "False"
            for r in requests
            for c in (r.get("status") or {}).get("conditions") or ()
        )

    cluster.wait_for(never, timeout=120, what="a request cluster-autoscaler cannot provision")
    assert status_writes(cluster, code=None) == {}
    policy = tmp_path / "policy.yaml"
    document = yaml.safe_load(policy.read_text())
    document["allocation"].update(runbook_policy_edit()["allocation"])
    policy.write_text(yaml.safe_dump(document))

    def freed() -> bool:
        pods, _, _ = cluster.store.list(
            "pods", "spark", label_selector=f"{contract.LABEL_APP_ID}={driver.app_id}"
        )
        gated = {p["metadata"]["name"] for p in pods if contract.gate_index(p) is not None}
        return (
            not owned(cluster, "provisioningrequests", driver.app_id)
            and not owned(cluster, "podtemplates", driver.app_id)
            and bool(gated)
            and gated <= held_marks(cluster)
        )

    cluster.wait_for(freed, timeout=120, what="the request and template gone, every held executor marked")
    assert all(n == 1 for n in status_writes(cluster).values())
    cluster.wait_for(
        lambda: cluster.autoscaler is not None and cluster.autoscaler.cloud.target["ng-small"] == 2,
        timeout=60,
        what="the ordinary scale-up to the group's max size",
    )
    assert observer.violations == []
