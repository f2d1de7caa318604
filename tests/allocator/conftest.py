"""The whole system on kubesim: the real webhook (gunicorn, TLS) registered in the simulated API server,
real allocator processes, simulated Spark drivers, and an observer that checks the limits at every change."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kubesim.cluster import Cluster
from sandbox.local_webhook import LocalWebhook
from sandbox.localsystem import AllocatorProcess, LocalSystem
from sparkgate import contract

POLICY = """
apiVersion: sparkgate.io/v1alpha1
kind: Policy
allocation: {{batchSize: {batch}, batchDelaySeconds: {delay}, maxPendingPerApp: {per_app}, maxPendingPerNamespace: {per_ns}, maxPendingCluster: {cluster}, pacing: {pacing}}}
caps: {{batchSize: {cap_batch}, maxPendingPerApp: {cap_pending}}}
profiles:
  - name: spark
    configMaps: {config_maps}
"""


def write_policy(
    path: Path,
    *,
    batch: int = 10,
    delay: float = 0.1,
    per_app: int = 20,
    per_ns: int = 200,
    cluster: int = 500,
    cap_batch: int = 50,
    cap_pending: int = 100,
    config_maps: str = "[]",
    pacing: str = "fixed",
) -> Path:
    path.write_text(
        POLICY.format(
            batch=batch,
            delay=delay,
            per_app=per_app,
            per_ns=per_ns,
            cluster=cluster,
            cap_batch=cap_batch,
            cap_pending=cap_pending,
            config_maps=config_maps,
            pacing=pacing,
        )
    )
    return path


class Observer:
    """Checks sparkgate's limits after every committed change of an executor pod (a store listener sees each
    change in order, so this is every moment, not samples):
    - in flight (released, phase Pending, not being deleted; bound or not) never exceeds maxPendingPerApp
      per app, maxPendingPerNamespace per namespace, maxPendingCluster in all;
    - released-but-unbound pods of an app never exceed `unbound_limit` (one batch: the next one is released
      only once the previous one is bound);
    - no gate is removed twice.
    It also records, for each gate removal, the app and the apps that had gated pods at that moment."""

    def __init__(self, cluster: Cluster, per_app: int, per_ns: int, cluster_cap: int, unbound_limit: int):
        self.per_app, self.per_ns, self.cluster_cap = per_app, per_ns, cluster_cap
        self.unbound_limit = unbound_limit
        self.lock = threading.Lock()
        # uid -> (namespace, app, gated, bound, in flight)
        self.pods: dict[str, tuple[str, str, bool, bool, bool]] = {}
        self.bypassed: set[str] = set()  # admitted without sparkgate (no profile annotation)
        self.phase = "start"
        self.releases: Counter[str] = Counter()
        self.violations: list[str] = []
        self.max_in_flight: Counter[str] = Counter()  # by app id, "ns:<namespace>" and "cluster"
        self.max_unbound: Counter[str] = Counter()  # by app id
        self.release_order: list[tuple[str, frozenset[str]]] = []
        self.unsubscribe = cluster.store.subscribe(self.on_change)

    def on_change(self, kind: str, resource: str, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        labels = meta.get("labels") or {}
        if resource != "pods" or labels.get(contract.LABEL_ROLE) != contract.ROLE_EXECUTOR:
            return
        namespace, app = meta.get("namespace", ""), labels.get(contract.LABEL_APP_ID, "")
        spec, status = obj.get("spec") or {}, obj.get("status") or {}
        gated = any(g.get("name") == contract.GATE for g in spec.get("schedulingGates") or ())
        bound = bool(spec.get("nodeName"))
        pending = (status.get("phase") or "Pending") == "Pending" and not meta.get("deletionTimestamp")
        with self.lock:
            old = self.pods.get(meta["uid"])
            if contract.ANNOTATION_PROFILE not in (meta.get("annotations") or {}):
                self.bypassed.add(meta["uid"])
            if kind == "DELETED":
                self.pods.pop(meta["uid"], None)
            else:
                self.pods[meta["uid"]] = (namespace, app, gated, bound, not gated and pending)
            if old is not None and old[2] and not gated and kind != "DELETED":
                self.releases[meta["uid"]] += 1
                if self.releases[meta["uid"]] > 1:
                    self.violations.append(f"{meta.get('name')} released twice")
                waiting = frozenset(a for _, a, g, _, _ in self.pods.values() if g)
                self.release_order.append((app, waiting))
            self._check(namespace, app)

    def _check(self, namespace: str, app: str) -> None:
        in_flight = sum(1 for _, a, _, _, f in self.pods.values() if a == app and f)
        unbound = sum(1 for _, a, _, b, f in self.pods.values() if a == app and f and not b)
        in_namespace = sum(1 for ns, _, _, _, f in self.pods.values() if ns == namespace and f)
        total = sum(1 for *_, f in self.pods.values() if f)
        for key, n in ((app, in_flight), (f"ns:{namespace}", in_namespace), ("cluster", total)):
            self.max_in_flight[key] = max(self.max_in_flight[key], n)
        self.max_unbound[app] = max(self.max_unbound[app], unbound)
        if in_flight > self.per_app:
            self.violations.append(f"{self.phase}: app {app}: {in_flight} in flight > {self.per_app}")
        if in_namespace > self.per_ns:
            bypassed = sum(1 for uid, p in self.pods.items() if p[4] and uid in self.bypassed)
            self.violations.append(
                f"{self.phase}: namespace {namespace}: {in_namespace} in flight > {self.per_ns} "
                f"({bypassed} bypassed)"
            )
        if total > self.cluster_cap:
            self.violations.append(f"{self.phase}: cluster: {total} in flight > {self.cluster_cap}")
        if unbound > self.unbound_limit:
            self.violations.append(
                f"{self.phase}: app {app}: {unbound} released and unbound > {self.unbound_limit}"
            )


@pytest.fixture
def observe() -> Iterator[Any]:
    """observe(cluster, per_app, per_ns, cluster_cap, unbound_limit) -> an Observer, unsubscribed after."""
    observers: list[Observer] = []

    def make(*args: Any) -> Observer:
        observers.append(Observer(*args))
        return observers[-1]

    yield make
    for observer in observers:
        observer.unsubscribe()


@pytest.fixture
def system(tmp_path: Path, observe: Any) -> Iterator[Any]:
    """Build on demand: system(policy=..., nodes=...) -> (cluster, webhook, [allocators], observer)."""
    resources: list[LocalSystem] = []

    def build(
        *,
        nodes: int = 5,
        node_cpu: str = "10",
        max_bind_rate: float | None = None,
        config_maps: str = "[]",
        **policy: Any,
    ) -> tuple[Cluster, LocalWebhook, list[AllocatorProcess], Observer]:
        path = write_policy(tmp_path / "policy.yaml", config_maps=config_maps, **policy)
        system = LocalSystem(
            path,
            tmp_path,
            namespaces=("spark", "spark-b"),
            allocator_tick=0.2,
            nodes=nodes,
            node_cpu=node_cpu,
            node_memory="1000Gi",
            bookmark_interval=0.5,
            max_bind_rate=max_bind_rate,
        )
        resources.append(system.start())
        assert system.webhook is not None and system.allocator is not None
        observer = observe(
            system.cluster,
            policy.get("per_app", 20),
            policy.get("per_ns", 200),
            policy.get("cluster", 500),
            policy.get("batch", 10),
        )
        return system.cluster, system.webhook, [system.allocator], observer

    yield build
    for resource in reversed(resources):
        resource.stop()
