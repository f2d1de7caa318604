"""The scheduler extender end to end: kubesim's scheduler runs the `sparkgate` profile of the scheduler
overlay's KubeSchedulerConfiguration (its URL, verbs, weight 5, nodeCacheCapable), whose extender is the real
allocator process (POST /scheduler/filter and /scheduler/prioritize over HTTP, as kube-scheduler's
HTTPExtender calls it: pkg/scheduler/extender.go), the real webhook sets the executors' schedulerName, and
simulated kubelets OOM-kill every executor that starts on a bad node (exit 137, reason OOMKilled, as the
kubelet reports a container killed by the kernel's OOM killer).

The overlay ships the extender `ignorable` with a 500ms httpTimeout: on a busy machine one slow answer would
then be skipped in silence and the pod placed by kube-scheduler alone (on the killing node), so a test would
pass or fail on the machine's load. Here the extender is not ignorable and has 30 s: every placement is
sparkgate's answer, and an extender error is a SchedulerError every test fails on (`Bindings.errors`). The
shipped ignorable extender is exercised where that is the point (the allocator down).

Each app runs one executor at a time where failures matter, so a failed executor is always seen by the
allocator before its replacement is scheduled: the watch delivers the failure before the new pod's creation.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from kubesim.cluster import Cluster
from kubesim.scheduler import Extender
from kubesim.sparkdriver import SparkDriver
from sandbox.localsystem import AllocatorProcess, LocalSystem

OVERLAY = Path(__file__).resolve().parents[2] / "manifests" / "components" / "scheduler" / "scheduler.yaml"
POLICY = """
apiVersion: sparkgate.io/v1alpha1
kind: Policy
allocation: {{batchSize: {batch}, batchDelaySeconds: 0.05, maxPendingPerApp: {batch}}}
scheduling: {scheduling}
profiles:
  - name: spark
    scheduling: {profile}
"""


def overlay_profile(url_prefix: str) -> tuple[str, list[Extender]]:
    """The scheduler name and the extenders, as shipped, of the overlay's own KubeSchedulerConfiguration,
    the extenders' urlPrefix replaced."""
    config = next(
        yaml.safe_load(o["data"]["scheduler-config.yaml"])
        for o in yaml.safe_load_all(OVERLAY.read_text())
        if o["kind"] == "ConfigMap"
    )
    (profile,) = config["profiles"]
    return profile["schedulerName"], [Extender.from_config(e, url_prefix) for e in config["extenders"]]


class Bindings:
    """Every executor binding, in order: app id -> [node, ...] (a store listener sees each change), and
    every extender error of the overlay's profile: a SchedulerError condition kube-scheduler writes when a
    non-ignorable extender fails (handleSchedulingFailure)."""

    def __init__(self, cluster: Cluster, scheduler_name: str) -> None:
        self.scheduler_name = scheduler_name
        self.lock = threading.Lock()
        self.seen: set[str] = set()
        self.nodes: dict[str, list[str]] = {}
        self.errors: list[str] = []
        self.unsubscribe = cluster.store.subscribe(self.on_change)

    def on_change(self, kind: str, resource: str, obj: dict[str, Any]) -> None:
        if resource != "pods":
            return
        meta = obj.get("metadata") or {}
        labels = meta.get("labels") or {}
        spec = obj.get("spec") or {}
        node = spec.get("nodeName")
        if spec.get("schedulerName") == self.scheduler_name:
            for c in (obj.get("status") or {}).get("conditions") or ():
                if c.get("type") == "PodScheduled" and c.get("reason") == "SchedulerError":
                    with self.lock:
                        self.errors.append(f"{meta.get('name')}: {c.get('message')}")
        if labels.get("spark-role") != "executor" or not node:
            return
        with self.lock:
            if meta["uid"] not in self.seen:
                self.seen.add(meta["uid"])
                self.nodes.setdefault(labels["spark-app-selector"], []).append(node)

    def of(self, driver: SparkDriver) -> list[str]:
        with self.lock:
            return list(self.nodes.get(driver.app_id, []))


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Any]:
    """start(nodes=[(name, cpu, zone)], scheduling=..., profile=..., batch=1, prioritize=True) -> (cluster,
    allocator, bindings); after the test, no extender error may have happened on the overlay's profile."""
    systems: list[LocalSystem] = []
    recorders: list[Bindings] = []

    def build(
        *,
        nodes: list[tuple[str, str, str | None]],
        scheduling: str = "{}",
        profile: str = "{}",
        batch: int = 1,
        prioritize: bool = True,
    ) -> tuple[Cluster, AllocatorProcess, Bindings]:
        policy = tmp_path / "policy.yaml"
        policy.write_text(POLICY.format(batch=batch, scheduling=scheduling, profile=profile))
        system = LocalSystem(
            policy, tmp_path, nodes=0, node_memory="1000Gi", allocator_tick=0.2, bookmark_interval=0.5
        )
        systems.append(system)
        for name, cpu, zone in nodes:
            labels = {"topology.kubernetes.io/zone": zone} if zone else {}
            system.cluster.add_node(name, cpu=cpu, memory="1000Gi", labels=labels)
        system.start()
        assert system.allocator is not None
        # The overlay's own extender, its urlPrefix pointed at this allocator, made strict and patient: a
        # slow answer is waited for, an error is a SchedulerError (see the module docstring). Without
        # `prioritize`, kube-scheduler asks sparkgate's filter only.
        name, extenders = overlay_profile(f"{system.allocator.url}/scheduler")
        verb = {} if prioritize else {"prioritize_verb": ""}
        system.cluster.scheduler.add_profile(
            name, [replace(e, ignorable=False, http_timeout=30.0, **verb) for e in extenders]
        )
        recorders.append(Bindings(system.cluster, name))
        system.cluster.wait_for(
            lambda: system.allocator is not None and system.allocator.get("/readyz")[0] == 200,
            timeout=60,
            what="the allocator's cache synced",
        )
        return system.cluster, system.allocator, recorders[-1]

    yield build
    for recorder in recorders:
        recorder.unsubscribe()
    for system in reversed(systems):
        system.stop()
    assert [e for r in recorders for e in r.errors] == [], "the extender failed: placements not sparkgate's"


def driver(cluster: Cluster, name: str, executors: int = 1, **options: Any) -> SparkDriver:
    return cluster.spark_driver(
        "spark", name, executors=executors, batch_delay=0.1, max_failures=10_000, **options
    )


def running_on(app: SparkDriver, *nodes: str) -> int:
    """The app's Running executors on these nodes."""
    return sum(
        1
        for p in app.pods().values()
        if p["status"].get("phase") == "Running" and p["spec"].get("nodeName") in nodes
    )


def excluded(allocator: AllocatorProcess, app: SparkDriver) -> list[dict[str, Any]]:
    code, body = allocator.get(f"/apps/spark/{app.app_id}")
    assert code == 200, body
    nodes: list[dict[str, Any]] = json.loads(body)["excludedNodes"]
    return nodes


def metric(allocator: AllocatorProcess, name: str) -> float:
    _, text = allocator.get("/metrics")
    found = re.search(rf"^{name} (\S+)$", text, re.M)
    assert found, name
    return float(found.group(1))


def test_a_failing_node_is_refused_to_the_app_then_to_every_app(start: Any) -> None:
    """node-1 is the roomiest (kube-scheduler's LeastAllocated score prefers it) and OOM-kills every
    executor. failuresPerApp 2, suspectNodeApps 2: app a gets exactly 2 executors there, then runs
    elsewhere while app b still gets node-1; b's executor killed there makes 2 apps, node-1 is suspect, and
    neither b nor app c goes there again. With the good nodes full, app d's next executor waits with a FailedScheduling
    event carrying sparkgate's reason (the FitError message of pkg/scheduler/framework/types.go). The filter
    alone: sparkgate's scores would keep the executors off node-1 from its first failure (the next test)."""
    cluster, allocator, bindings = start(
        nodes=[("node-1", "32", None), ("node-2", "2", None), ("node-3", "2", None)],
        scheduling="{failuresPerApp: 2, suspectNodeApps: 2, failureWindowSeconds: 300}",
        profile="{schedulerName: sparkgate}",
        prioritize=False,
    )
    cluster.kubelet.fail_on("node-1")
    a = driver(cluster, "a")
    cluster.wait_for(lambda: running_on(a, "node-2", "node-3") == 1, what="a's executor on a good node")
    assert bindings.of(a)[:2] == ["node-1", "node-1"] and "node-1" not in bindings.of(a)[2:]
    assert [(e["node"], e["scope"], e["reason"]) for e in excluded(allocator, a)] == [
        ("node-1", "app", "oom_killed")
    ]
    assert excluded(allocator, a)[0]["message"] == (
        f"sparkgate: 2 executors of spark/{a.app_id[:12]}… failed here in the last 5m (OOMKilled \u00d72)"
    )

    b = driver(cluster, "b")
    cluster.wait_for(lambda: running_on(b, "node-2", "node-3") == 1, what="b's executor on a good node")
    assert bindings.of(b)[0] == "node-1" and "node-1" not in bindings.of(b)[1:], "2 apps: suspect"
    assert bindings.of(a).count("node-1") == 2, "a never went back"

    c = driver(cluster, "c")
    cluster.wait_for(lambda: c.running() == 1, what="c's executor running")
    assert "node-1" not in bindings.of(c), "a suspect node is refused to every app"

    d = driver(cluster, "d", executors=2)
    reason = "sparkgate: executors of 2 apps failed here in the last 5m (suspect node: OOMKilled \u00d73)"

    def failed_scheduling() -> list[str]:
        events, _, _ = cluster.store.list_objects("events", "spark")
        return [e["message"] for e in events if e["reason"] == "FailedScheduling"]

    def scheduled_conditions() -> list[dict[str, Any]]:
        pending = [p for p in d.pods().values() if not p["spec"].get("nodeName")]
        return [
            c
            for p in pending
            for c in cluster.store.get("pods", "spark", p["metadata"]["name"])
            .get("status", {})
            .get("conditions", [])
            if c["type"] == "PodScheduled"
        ]

    # The scheduler writes the event, then the pod's condition (handleSchedulingFailure's order): both awaited.
    cluster.wait_for(
        lambda: bool(failed_scheduling()) and bool(scheduled_conditions()),
        what="d's second executor failing to schedule, its event and its condition",
    )
    assert failed_scheduling() == [
        f"0/3 nodes are available: 1 {reason}, 2 Insufficient cpu. no new claims to deallocate, preemption: "
        "0/3 nodes are available: 1 Preemption is not helpful for scheduling, 2 No preemption victims found "
        "for incoming pod."
    ]
    assert d.running() == 1 and "node-1" not in bindings.of(d)
    pending = [p for p in d.pods().values() if not p["spec"].get("nodeName")]
    assert len(pending) == 1
    [condition] = scheduled_conditions()
    assert condition["status"] == "False" and condition["reason"] == "Unschedulable"
    assert reason in condition["message"]
    assert (
        metric(
            allocator, 'sparkgate_allocator_extender_excluded_nodes_total{reason="oom_killed",scope="node"}'
        )
        >= 1
    )


def test_a_failing_node_loses_its_draw_from_the_first_failure_not_the_third(start: Any) -> None:
    """Issue 20: node-1, the roomiest (LeastAllocated prefers it, the more as its failures empty it),
    OOM-kills every executor. The executors lost there are counted, each run alike, with sparkgate's scores
    and with its filter alone (what sparkgate answered before: its scores were 0 everywhere without packing
    or driverZone):
    - app a runs one executor at a time, so each failure is seen before the replacement is scheduled: the
      filter alone lets node-1 have a's executors until the third failure refuses it (3 lost); the scores
      send the replacement elsewhere from the first (1 lost);
    - then app b asks for 6 executors at once: with the filter alone, node-1 (a's 1 or 3 failures, 1 app of
      3) draws them until b's own third failure (at least 3 lost); with the scores, a's one failure there
      keeps all 6 off it (0 lost).
    Counts depend on the order of events only (a failure is seen before what follows it), never on speed."""

    def lost(prioritize: bool) -> tuple[int, int]:
        cluster, _, bindings = start(
            nodes=[("node-1", "32", None), ("node-2", "5", None), ("node-3", "5", None)],
            scheduling="{failuresPerApp: 3, suspectNodeApps: 3, failureWindowSeconds: 600}",
            profile="{schedulerName: sparkgate}",
            batch=6,
            prioritize=prioritize,
        )
        cluster.kubelet.fail_on("node-1")
        a = driver(cluster, "a")
        cluster.wait_for(lambda: running_on(a, "node-2", "node-3") == 1, what="a's executor on a good node")
        b = driver(cluster, "b", executors=6, batch_size=6)
        cluster.wait_for(lambda: running_on(b, "node-2", "node-3") == 6, what="b's 6 executors on good nodes")
        assert bindings.of(b).count("node-1") == len(bindings.of(b)) - 6
        return bindings.of(a).count("node-1"), bindings.of(b).count("node-1")

    without = lost(prioritize=False)
    scored = lost(prioritize=True)
    assert without[0] == 3 and without[1] >= 3, without
    assert scored == (1, 0)


def test_an_exclusion_ends_with_its_window(start: Any) -> None:
    """With a short window, the refused node comes back once its failures are older than the window: a new
    executor of the same app lands there again (waiting for the condition, never for a time)."""
    cluster, allocator, bindings = start(
        nodes=[("node-1", "32", None), ("node-2", "2", None)],
        # 10 s: the replacement executor is scheduled well within the window even on a busy machine (with 2 s,
        # a slow reschedule found node-1 allowed again); the wait below is for the expiry, not a time.
        scheduling="{failuresPerApp: 1, failureWindowSeconds: 10}",
        profile="{schedulerName: sparkgate}",
    )
    cluster.kubelet.fail_on("node-1")
    a = driver(cluster, "a")
    cluster.wait_for(lambda: running_on(a, "node-2") == 1, what="a running on node-2")
    assert bindings.of(a)[0] == "node-1" and bindings.of(a)[-1] == "node-2"
    cluster.kubelet.heal("node-1")
    cluster.wait_for(lambda: not excluded(allocator, a), timeout=60, what="the exclusion to expire")
    a.scale_to(2)
    cluster.wait_for(lambda: running_on(a, "node-1") == 1, what="a's second executor on node-1 again")


def test_when_every_node_is_refused_executors_still_schedule(start: Any) -> None:
    """Both nodes kill executors: once both are refused to the app, the extender keeps them all (a node that
    may fail beats no node) and counts the fallback."""
    cluster, allocator, bindings = start(
        nodes=[("node-1", "8", None), ("node-2", "8", None)],
        scheduling="{failuresPerApp: 1, suspectNodeApps: 10}",
        profile="{schedulerName: sparkgate}",
    )
    cluster.kubelet.fail_on("node-1")
    cluster.kubelet.fail_on("node-2")
    a = driver(cluster, "a")
    cluster.wait_for(lambda: len(bindings.of(a)) >= 4, what="executors bound after both nodes failed")
    assert set(bindings.of(a)[:2]) == {"node-1", "node-2"}
    assert metric(allocator, "sparkgate_allocator_extender_fallbacks_total") >= 1


def test_with_the_allocator_down_an_ignorable_extender_does_not_stop_scheduling(start: Any) -> None:
    """kube-scheduler skips an ignorable extender that errs (findNodesThatPassExtenders: IsIgnorable): the
    overlay's extender as shipped (ignorable) does not stop scheduling; a non-ignorable one fails the
    attempt: FailedScheduling with the error, PodScheduled=False reason SchedulerError
    (handleSchedulingFailure). (The allocator is down: both calls are refused at once.)"""
    cluster, allocator, _ = start(nodes=[("node-1", "8", None), ("node-2", "8", None)])
    url = f"{allocator.url}/scheduler"
    _, (shipped,) = overlay_profile(url)
    assert shipped.ignorable
    cluster.scheduler.add_profile("tolerant", [shipped])
    cluster.scheduler.add_profile("strict", [Extender(url, ignorable=False, http_timeout=30)])
    allocator.kill()

    def pod(name: str, scheduler: str) -> dict[str, Any]:
        return {
            "metadata": {"name": name, "namespace": "spark"},
            "spec": {"schedulerName": scheduler, "containers": [{"name": "c", "image": "busybox"}]},
        }

    cluster.store.create("pods", pod("tolerant", "tolerant"))
    cluster.store.create("pods", pod("strict", "strict"))
    node = lambda name: cluster.store.get("pods", "spark", name)["spec"].get("nodeName")  # noqa: E731
    cluster.wait_for(lambda: node("tolerant") is not None, what="the pod of the ignorable profile bound")

    def condition() -> dict[str, Any] | None:
        conditions = cluster.store.get("pods", "spark", "strict")["status"].get("conditions") or []
        return next((c for c in conditions if c["type"] == "PodScheduled"), None)

    cluster.wait_for(lambda: condition() is not None, what="the strict profile's pod failing")
    found = condition()
    assert found is not None and found["reason"] == "SchedulerError"
    assert found["message"].startswith(f'Post "{url}/filter"') and node("strict") is None


def test_packing_app_puts_an_apps_executors_on_the_fewest_nodes(start: Any) -> None:
    """Three 8-CPU nodes and 10 executors of 1 CPU: kube-scheduler alone spreads them (LeastAllocated);
    with `packing: app` (weight 5) they fill one node, then a second: the fewest nodes that fit them."""
    cluster, _, bindings = start(
        nodes=[("node-1", "8", None), ("node-2", "8", None), ("node-3", "8", None)],
        profile="{schedulerName: sparkgate, packing: app}",
    )
    a = driver(cluster, "a", executors=10)
    cluster.wait_for(lambda: a.running() == 10, what="10 executors running")
    placed = bindings.of(a)
    assert len(set(placed)) == 2
    first = placed[0]
    assert placed.count(first) == 7 or placed.count(first) == 8, placed  # 7 when the driver is there


def test_driver_zone_prefer_fills_the_drivers_zone_first(start: Any) -> None:
    """Two zones of two 4-CPU nodes; `driverZone: prefer` puts executors in the zone of the driver's node
    (topology.kubernetes.io/zone) while it has room, the rest in the other zone."""
    cluster, _, bindings = start(
        nodes=[("node-1", "4", "a"), ("node-2", "4", "a"), ("node-3", "4", "b"), ("node-4", "4", "b")],
        profile="{schedulerName: sparkgate, driverZone: prefer}",
        batch=10,
    )
    app = driver(cluster, "a", executors=10)
    cluster.wait_for(lambda: app.running() == 10, what="10 executors running")
    driver_node = cluster.store.get("pods", "spark", app.driver_name)["spec"]["nodeName"]
    zone = {"node-1": "a", "node-2": "a", "node-3": "b", "node-4": "b"}
    in_zone = [n for n in bindings.of(app) if zone[n] == zone[driver_node]]
    assert len(in_zone) == 7, bindings.of(app)  # 8 CPUs minus the driver's 100m
