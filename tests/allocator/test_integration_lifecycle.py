"""The life of an application end to end: kubesim, the real webhook over TLS, the real allocator process
(its settings shortened through its environment), simulated Spark drivers."""

from __future__ import annotations

from typing import Any

import pytest

from allocator.deletions import APP_ANNOTATION, HISTORY_LABEL
from sparkgate import contract

LOG4J = "[{source: log4j, mountPath: /etc/log4j}]"


def executors(cluster: Any, app_id: str) -> list[dict[str, Any]]:
    pods: list[dict[str, Any]] = cluster.store.list_objects(
        "pods", "spark", label_selector=f"spark-app-selector={app_id},spark-role=executor"
    )[0]
    return pods


def copies(cluster: Any, app_id: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cluster.store.list_objects(
        "configmaps",
        "spark",
        label_selector=f"{contract.LABEL_MANAGED_BY}={contract.MANAGED_BY},{contract.LABEL_APP_ID}={app_id}",
    )[0]
    return items


def history(cluster: Any, app_id: str) -> list[dict[str, Any]]:
    items = cluster.store.list_objects(
        "configmaps", contract.INSTALL_NAMESPACE, label_selector=f"{HISTORY_LABEL}=true"
    )[0]
    return [h for h in items if h["metadata"]["annotations"][APP_ANNOTATION] == f"spark/{app_id}"]


def source(cluster: Any, name: str) -> None:
    cluster.store.create(
        "configmaps",
        {
            "metadata": {"name": name, "namespace": contract.INSTALL_NAMESPACE},
            "data": {"log4j2.properties": name},
        },
    )


def test_a_killed_client_mode_app_leaves_no_copy_no_status_no_series_and_its_history_expires(
    system: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 18, as measured on the real cluster: a client-mode driver (no driver pod) killed with -9 leaves
    its executors; the copy, the /apps entry and the series stayed forever. Now they go after the grace."""
    monkeypatch.setenv("SPARKGATE_CLIENT_APP_GRACE", "3")
    monkeypatch.setenv("SPARKGATE_HISTORY_RETENTION", "4")
    cluster, _, (allocator,), observer = system(nodes=2, node_cpu="4", batch=4, per_app=8, config_maps=LOG4J)
    source(cluster, "log4j")
    driver = cluster.spark_driver(
        "spark", "notebook", executors=6, batch_size=6, batch_delay=0.2, cpu="500m", driver_pod=False
    )
    app = driver.app_id

    def series() -> bool:
        return f'app="{app}"' in allocator.get("/metrics")[1]

    def listed() -> bool:
        return any(a["appId"] == app for a in allocator.apps()["apps"])

    cluster.wait_for(lambda: driver.running() == 6 and len(copies(cluster, app)) == 1, timeout=60)
    assert "ownerReferences" not in copies(cluster, app)[0]["metadata"]  # client mode: no owner
    cluster.wait_for(lambda: series() and listed(), timeout=30, what="the app in /apps and /metrics")
    # One executor deleted by hand while running: the app has a deletion history.
    cluster.store.delete("pods", "spark", executors(cluster, app)[0]["metadata"]["name"])
    cluster.wait_for(lambda: len(history(cluster, app)) == 1, timeout=30, what="the app's history saved")
    driver.kill(cluster.kubelet.fail)
    cluster.wait_for(
        lambda: not copies(cluster, app) and not listed() and not series(),
        timeout=60,
        what="copy, /apps entry and series gone after the grace",
    )
    left = executors(cluster, app)
    assert left and all(p["status"]["phase"] == "Failed" for p in left)  # sparkgate deletes no user's pod
    code, document = allocator.get(f"/apps/spark/{app}")
    assert code == 200 and '"finished": true' in document  # what is left: the history, finished
    cluster.wait_for(
        lambda: not history(cluster, app), timeout=60, what="the history expired after retention"
    )
    assert 'sparkgate_allocator_apps_ended_total{mode="client"} 1.0' in allocator.get("/metrics")[1]
    assert observer.violations == []


def test_a_policy_edit_in_the_middle_of_an_app_changes_nothing_for_its_pods(
    system: Any, tmp_path: Any
) -> None:
    """The profile's config map is renamed while an app waits for room, and the app's copy has to be made
    again (it was deleted): its pods mount the copy chosen at their admission, and that copy is the one made,
    so every executor starts once there is room (a pod whose copy is missing would stay in
    ContainerCreating, as on a real kubelet)."""
    cluster, _, (allocator,), observer = system(
        nodes=1, node_cpu="3500m", batch=3, per_app=3, config_maps=LOG4J
    )
    source(cluster, "log4j")
    source(cluster, "log4j-v2")
    driver = cluster.spark_driver("spark", "long", executors=10, batch_size=10, batch_delay=0.2, cpu="1")
    app = driver.app_id

    seen: list[Any] = []  # the app's last /apps entry, for the message if the wait fails

    def waiting() -> bool:
        summary = next((a for a in allocator.apps()["apps"] if a["appId"] == app), None)
        seen[:] = [summary]
        return (
            summary is not None
            and summary["running"] == 3
            and summary["inFlight"] >= 1
            and summary["gated"] + summary["inFlight"] == 7
        )

    # Room for 3 executors (and the driver): 3 run, the next batch waits for a node, the rest stay gated.
    # That batch is 3 pods, or fewer when it was released while the first ones were still starting (they
    # count in flight against maxPendingPerApp 3); under fixed pacing the app then waits for it to be bound.
    try:
        cluster.wait_for(waiting, timeout=60, what="3 running, the next batch unschedulable, the rest gated")
    except TimeoutError as e:
        raise AssertionError(f"{e}; the app's last /apps entry: {seen}") from e
    policy = tmp_path / "policy.yaml"
    policy.write_text(policy.read_text().replace("source: log4j,", "source: log4j-v2,"))
    cluster.wait_for(
        lambda: (
            'sparkgate_allocator_policy_reloads_total{result="success"} 2.0' in allocator.get("/metrics")[1]
        ),
        timeout=30,
        what="the edited policy loaded",
    )
    cluster.store.delete("configmaps", "spark", copies(cluster, app)[0]["metadata"]["name"])
    cluster.add_node("node-2", cpu="8", memory="1000Gi")
    cluster.wait_for(lambda: driver.running() == 10, timeout=90, what="every executor running")
    # The copy the pods admitted before the edit mount; a pod Spark created after it mounts the new one.
    mounted = {
        v["configMap"]["name"]
        for p in executors(cluster, app)
        for v in p["spec"].get("volumes") or []
        if "configMap" in v
    }
    assert contract.app_configmap_name(app, "log4j") in mounted
    assert {c["metadata"]["name"] for c in copies(cluster, app)} == mounted
    assert observer.violations == []
