"""The allocator end to end on kubesim: real webhook over TLS, real allocator processes, simulated Spark
drivers, and the limits checked at every observed change (not just at the end)."""

from __future__ import annotations

from typing import Any

from sparkgate import contract


def running(cluster: Any, app_id: str) -> int:
    pods, _, _ = cluster.store.list_objects(
        "pods",
        label_selector=f"spark-app-selector={app_id},spark-role=executor",
        field_selector="status.phase=Running",
    )
    return len(pods)


def gated(cluster: Any, app_id: str) -> int:
    pods, _, _ = cluster.store.list_objects(
        "pods", label_selector=f"spark-app-selector={app_id},spark-role=executor"
    )
    return sum(
        1 for p in pods if any(g["name"] == contract.GATE for g in p["spec"].get("schedulingGates") or [])
    )


def test_one_app_100_executors_batch_10_pending_20_room_for_50(system: Any) -> None:
    # 5 nodes of 10.2 CPU: 50 executors of 1 CPU fit beside the driver pod (0.1 CPU).
    cluster, _, (allocator,), observer = system(nodes=5, node_cpu="10200m", batch=10, per_app=20)
    driver = cluster.spark_driver("spark", "big", executors=100, batch_size=100, batch_delay=0.2, cpu="1")
    # Once 50 run, one more batch is released (the allocator does not model capacity); it cannot bind, so
    # "previous batch bound" holds the other 40 gated: the scheduler never sees more than one batch of
    # unschedulable pods.
    cluster.wait_for(
        lambda: running(cluster, driver.app_id) == 50 and gated(cluster, driver.app_id) == 40,
        timeout=90,
        what="50 running, 40 gated",
    )
    assert observer.violations == []
    assert observer.max_in_flight[f"app:{driver.app_id}"] <= 20
    status = allocator.apps()
    app = next(a for a in status["apps"] if a["appId"] == driver.app_id)
    assert (app["gated"], app["inFlight"], app["running"], app["profile"]) == (40, 10, 50, "spark")
    assert app["limits"]["batchSize"] == 10 and app["limits"]["maxPendingPerApp"] == 20
    assert "previous batch not yet bound" in app["waitingFor"]
    driver.scale_to(40)
    cluster.wait_for(
        lambda: gated(cluster, driver.app_id) == 0, timeout=60, what="scale-down deletes the pending pods"
    )
    cluster.wait_for(
        lambda: allocator.apps()["apps"][0]["deletions"].get("deleted_while_gated", 0) >= 40,
        timeout=30,
        what="the deletions in the app's history",
    )
    code, detail = allocator.get(f"/apps/spark/{driver.app_id}")
    assert code == 200 and "deleted_while_gated" in detail
    assert observer.violations == []
