"""Adaptive pacing end to end on kubesim: the real webhook over TLS, the real allocator process, simulated Spark
drivers, kubesim's scheduler answering (binds, or PodScheduled=False/Unschedulable as kube-scheduler does),
and the limits checked at every change by the observer. Counts and caps only, never wall time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sandbox.localsystem import LocalSystem

from .test_integration import gated, running

EXECUTORS = 120


def app_status(allocator: Any, app_id: str) -> dict[str, Any] | None:
    return next((a for a in allocator.apps()["apps"] if a["appId"] == app_id), None)


@pytest.mark.parametrize("pacing", ["adaptive", "fixed"])
def test_a_roomy_cluster_gets_every_pod_at_once_under_adaptive_one_batch_per_delay_under_fixed(
    system: Any, pacing: str
) -> None:
    # Room for 150 executors; the driver creates all 120 at once, as Spark's Deployment allocator does. The
    # batch delay is an hour: under `fixed` one batch of 10 goes, then the app waits for the delay; under
    # `adaptive` the scheduler binds each round at once, so the window grows and no delay applies.
    cluster, _, (allocator,), observer = system(
        nodes=3, node_cpu="50200m", batch=10, delay=3600, per_app=EXECUTORS, cap_pending=500, pacing=pacing
    )
    observer.unbound_limit = EXECUTORS if pacing == "adaptive" else 10
    driver = cluster.spark_driver("spark", "roomy", executors=EXECUTORS, batch_size=EXECUTORS, cpu="1")

    if pacing == "adaptive":

        def done() -> bool:
            a = app_status(allocator, driver.app_id)
            return (
                running(cluster, driver.app_id) == EXECUTORS and a is not None and a["running"] == EXECUTORS
            )

        cluster.wait_for(done, timeout=120, what=f"all {EXECUTORS} executors running")
        a = app_status(allocator, driver.app_id)
        assert a is not None and a["pacing"]["reason"] in ("slow-start", "ceiling")
        assert a["pacing"]["window"] >= 20  # it grew: at least one full round was bound at once
    else:

        def held() -> bool:
            a = app_status(allocator, driver.app_id)
            return (
                len(driver.created) == EXECUTORS
                and running(cluster, driver.app_id) == 10
                and a is not None
                and a["gated"] == EXECUTORS - 10
                and "batch delay of 3600s" in (a["waitingFor"] or "")
            )

        cluster.wait_for(held, timeout=120, what="one batch running, the rest held by the batch delay")
        assert gated(cluster, driver.app_id) == EXECUTORS - 10
        a = app_status(allocator, driver.app_id)
        assert a is not None and a["pacing"] == {"window": 10, "reason": "fixed", "unanswered": 0}
    assert observer.violations == []


def test_a_full_cluster_falls_back_and_never_exceeds_the_caps(system: Any) -> None:
    # Room for 24 executors, two apps of 60, at most 10 in flight per app and 12 in the cluster (the real
    # cluster's run, docs/real-cluster-facts.md). The scheduler refuses what does not fit; adaptive pacing falls
    # back for both apps, the refused pods no longer hold their app, and the cluster cap holds all along.
    cluster, _, (allocator,), observer = system(
        nodes=2, node_cpu="12200m", batch=10, delay=0.1, per_app=10, cluster=12, pacing="adaptive"
    )
    observer.unbound_limit = 12
    first = cluster.spark_driver("spark", "first", executors=60, batch_size=60, cpu="1")
    second = cluster.spark_driver("spark", "second", executors=60, batch_size=60, cpu="1")
    drivers = (first, second)

    def full() -> bool:
        apps = [app_status(allocator, d.app_id) for d in drivers]
        return (
            sum(running(cluster, d.app_id) for d in drivers) == 24
            and all(a is not None and a["pacing"]["reason"] == "unschedulable" for a in apps)
            and allocator.apps()["cluster"]["inFlight"] == 12
        )

    cluster.wait_for(full, timeout=120, what="24 running, both apps fallen back, 12 unschedulable in flight")
    assert observer.violations == []
    assert observer.max_in_flight["cluster"] == 12
    assert all(observer.max_in_flight[d.app_id] <= 10 for d in drivers)
    apps = [app_status(allocator, d.app_id) for d in drivers]
    assert all(a is not None and a["pacing"]["window"] == 10 for a in apps)


BASE_POLICY = Path(__file__).parents[2] / "manifests" / "base" / "policy.yaml"


def test_under_the_shipped_policy_apps_that_cannot_be_scheduled_leave_the_others_their_executors(
    tmp_path: Path, observe: Any
) -> None:
    """Issue 37's acceptance, end to end: manifests/base/policy.yaml (namespace budget 60, 20 an app, batches of
    10, adaptive pacing), three apps whose executors ask more CPU than any node has and two whose executors
    fit, in one namespace. The three came first and, once fallen back, released until they held all 60 slots
    with pods the scheduler refuses (20 each): the two others never got an executor. Now each holds one batch
    of refused pods at most, and the two run every executor."""
    system = LocalSystem(
        BASE_POLICY, tmp_path, namespaces=("spark",), allocator_tick=0.2, nodes=4, node_cpu="20",
        node_memory="1000Gi", bookmark_interval=0.5,
    ).start()  # fmt: skip
    try:
        cluster, allocator = system.cluster, system.allocator
        assert allocator is not None
        observer = observe(cluster, 20, 60, 150, 20)
        never = [
            cluster.spark_driver("spark", f"huge-{i}", executors=40, batch_size=40, cpu="64")
            for i in range(3)
        ]

        def all_held() -> bool:
            apps = [app_status(allocator, d.app_id) for d in never]
            return all(
                a is not None and a["gated"] > 0 and a["waitingFor"] and a["inFlight"] > 0 for a in apps
            ) and all(
                "unschedulable" in a["waitingFor"] or "pods in flight" in a["waitingFor"]
                for a in apps
                if a is not None
            )

        cluster.wait_for(all_held, timeout=120, what="the three apps that cannot be scheduled held")
        fitting = [
            cluster.spark_driver("spark", f"fits-{i}", executors=30, batch_size=30, cpu="1") for i in range(2)
        ]
        cluster.wait_for(
            lambda: all(running(cluster, d.app_id) == 30 for d in fitting),
            timeout=120,
            what="the two apps that fit: every executor running",
        )
        assert all(observer.max_in_flight[d.app_id] <= 10 for d in never)  # one batch of refused pods each
        assert observer.violations == []
    finally:
        system.stop()
