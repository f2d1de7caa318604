"""Demand as a condition end to end (allocator/demand.py): the real webhook and allocator process on kubesim,
with kubesim's cluster-autoscaler (kubesim/autoscaler.py) where nodes must be added. The marks are counted
from kubesim's request log (the allocator's PATCHes of `pods/status`), never from the allocator's word.
Counts and conditions only, never wall time."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import pytest

from kubesim.autoscaler import AutoscalerConfig
from kubesim.cluster import Cluster
from kubesim.nodegroups import NodeGroup
from sparkgate import contract

from .test_integration import gated, running


def status_writes(cluster: Cluster, *, code: int | None = 200) -> Counter[str]:
    """The allocator's PATCHes of a pod's status (those answered `code`; None: all), by pod name."""
    return Counter(
        e.name or ""
        for e in cluster.requests.entries()
        if e.user == contract.ALLOCATOR_USER and e.resource == "pods/status" and e.verb == "patch"
        and (code is None or e.code == code)
    )  # fmt: skip


def held_marks(cluster: Cluster) -> set[str]:
    """The executor pods that carry sparkgate's mark now."""
    pods, _, _ = cluster.store.list_objects("pods")
    return {
        p["metadata"]["name"]
        for p in pods
        if any(
            c.get("type") == "PodScheduled" and contract.is_held_mark(c.get("message"))
            for c in (p.get("status") or {}).get("conditions") or ()
        )
    }


def metric(allocator: Any, name: str, labels: str) -> float:
    _, text = allocator.get("/metrics")
    match = re.search(rf"^{name}\{{{re.escape(labels)}\}} (\S+)$", text, re.M)
    return float(match.group(1)) if match else 0.0


@pytest.mark.parametrize("demand", ["held", "released"])
def test_a_roomy_cluster_fills_alike_and_nothing_is_marked(system: Any, demand: str) -> None:
    """Room for every executor: the app's pods wait milliseconds for its adaptive window, never
    DEMAND_AFTER_SECONDS, so `held` writes no status at all and fills as `released` does: the same pods
    released the same way."""
    cluster, _, (allocator,), observer = system(
        nodes=3, node_cpu="50200m", batch=10, delay=3600, per_app=120, cap_pending=500, pacing="adaptive",
        demand=demand,
    )  # fmt: skip
    observer.unbound_limit = 120
    driver = cluster.spark_driver("spark", "roomy", executors=120, batch_size=120, cpu="1")
    cluster.wait_for(
        lambda: running(cluster, driver.app_id) == 120, timeout=120, what="120 executors running"
    )
    assert gated(cluster, driver.app_id) == 0
    assert status_writes(cluster, code=None) == Counter() and held_marks(cluster) == set()
    assert metric(allocator, "sparkgate_allocator_demand_marks_total", 'outcome="written"') == 0
    assert observer.violations == []


SMALL = NodeGroup("ng-small", max_size=20, cpu="4", memory="16Gi")


@pytest.mark.parametrize("demand", ["held", "released"])
def test_an_autoscaled_cluster_sees_every_held_executor_marked_once(system: Any, demand: str) -> None:
    """A cluster of one node that cluster-autoscaler grows (4 CPUs a node, 1 CPU an executor), a cap of 8
    pods in flight, an app of 40 executors. With `held`, the 32 pods sparkgate holds are marked, each once,
    and the autoscaler plans for them with the 8 the scheduler refused: the app runs after fewer scale-up
    rounds than with `released`, where it sees only the 8 released at a time. Once every executor runs,
    nothing more is written (steady state), and the marks left on no pod: the scheduler replaced each with its
    own verdict or bound the pod."""
    autoscaler = AutoscalerConfig(
        groups=(SMALL,),
        provisioning_delay=0.5,
        scan_interval=1.0,
        scale_down=False,
        provisioning_requests=False,
    )
    cluster, _, (allocator,), observer = system(
        nodes=1, node_cpu="4", batch=8, delay=0.1, per_app=8, per_ns=8, cluster=8, pacing="adaptive",
        demand=demand, autoscaler=autoscaler,
    )  # fmt: skip
    observer.unbound_limit = 8
    driver = cluster.spark_driver("spark", "big", executors=40, batch_size=40, cpu="1")
    cluster.wait_for(lambda: running(cluster, driver.app_id) == 40, timeout=300, what="40 executors running")
    assert cluster.autoscaler is not None
    rounds = cluster.autoscaler.rounds
    writes = status_writes(cluster)
    assert all(n == 1 for n in writes.values()), writes  # at most one per held pod
    assert all(name.startswith("big-exec-") for name in writes), writes
    if demand == "held":
        assert len(writes) >= 16, writes  # the pods held while the first released ones were refused
        assert metric(allocator, "sparkgate_allocator_demand_marks_total", 'outcome="written"') == len(writes)
    else:
        assert writes == Counter()
    # Steady state: every executor runs; for ten more turns of the allocator's Lease (its ticks go on),
    # nothing is written.
    before = status_writes(cluster, code=None)
    renewals = lease_renewals(cluster)
    cluster.wait_for(lambda: lease_renewals(cluster) >= renewals + 10, timeout=60, what="ten Lease renewals")
    assert status_writes(cluster, code=None) == before
    assert held_marks(cluster) == set()
    assert observer.violations == []
    if demand == "held":
        # The 32 held pods marked at once when the first refusals held the app: one plan for all 40 (two
        # at most, should the marks land across one of its loops), 0 -> 10 nodes.
        assert rounds <= 2, cluster.autoscaler.plans
    else:
        # It sees the 8 released pods at a time: two nodes a round at most (measured: 9 rounds).
        assert rounds >= 5, cluster.autoscaler.plans


def lease_renewals(cluster: Cluster) -> int:
    return sum(1 for e in cluster.requests.entries() if e.resource == "leases" and e.verb == "update")
