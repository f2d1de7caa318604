"""The whole system on kubesim: the real webhook (gunicorn, TLS) registered in the simulated API server,
real allocator processes, simulated Spark drivers, and an observer that checks the limits at every change."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from kubesim.cluster import Cluster
from sparkgate import contract
from sparkgate.localsystem import AllocatorProcess, LocalSystem
from webhook.local import LocalWebhook

POLICY = """
apiVersion: sparkgate.io/v1alpha1
kind: Policy
allocation: {{batchSize: {batch}, batchDelaySeconds: {delay}, maxPendingPerApp: {per_app}, maxPendingPerNamespace: {per_ns}, maxPendingCluster: {cluster}}}
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
        )
    )
    return path


@dataclass
class Observer:
    """Checks the limits after every change in the store (in flight here: released and not yet bound,
    so `max_in_flight` of an app is also the largest number of its released pods waiting for a node),
    and records which app each gate removal went to and which apps were waiting then."""

    cluster: Cluster
    per_app: int
    per_ns: int
    cluster_cap: int
    batch: int
    violations: list[str] = field(default_factory=list)
    max_in_flight: Counter[str] = field(default_factory=Counter)
    released: set[str] = field(default_factory=set)
    release_order: list[tuple[str, frozenset[str]]] = field(default_factory=list)

    def waiting_apps(self) -> set[str]:
        pods, _, _ = self.cluster.store.list_objects("pods", label_selector="spark-role=executor")
        return {
            p["metadata"]["labels"].get("spark-app-selector", "")
            for p in pods
            if any(g.get("name") == contract.GATE for g in p["spec"].get("schedulingGates") or [])
            and not p["metadata"].get("deletionTimestamp")
        }

    def __post_init__(self) -> None:
        self._gated: dict[str, bool] = {}
        self._lock = threading.Lock()
        self.unsubscribe = self.cluster.store.subscribe(self.on_event)

    def on_event(self, kind: str, resource: str, obj: dict[str, Any]) -> None:
        if resource != "pods":
            return
        labels = obj["metadata"].get("labels") or {}
        if labels.get("spark-role") != "executor":
            return
        with self._lock:
            uid = obj["metadata"]["uid"]
            gated = any(g.get("name") == contract.GATE for g in obj["spec"].get("schedulingGates") or [])
            app = (obj["metadata"]["namespace"], labels.get("spark-app-selector", ""))
            if self._gated.get(uid) and not gated and kind != "DELETED":
                if uid in self.released:
                    self.violations.append(f"{obj['metadata']['name']} released twice")
                self.released.add(uid)
                self.release_order.append((app[1], frozenset(self.waiting_apps())))
            self._gated[uid] = gated
            self.check()

    def check(self) -> None:
        pods, _, _ = self.cluster.store.list_objects("pods", label_selector="spark-role=executor")
        per_app: Counter[tuple[str, str]] = Counter()
        per_ns: Counter[str] = Counter()
        for p in pods:
            gated = any(g.get("name") == contract.GATE for g in p["spec"].get("schedulingGates") or [])
            if (
                not gated
                and not p["metadata"].get("deletionTimestamp")
                and p["status"].get("phase") == "Pending"
                and not p["spec"].get("nodeName")
            ):
                key = (p["metadata"]["namespace"], p["metadata"]["labels"].get("spark-app-selector", ""))
                per_app[key] += 1
                per_ns[key[0]] += 1
        total = sum(per_app.values())
        for key, n in per_app.items():
            self.max_in_flight[f"app:{key[1]}"] = max(self.max_in_flight[f"app:{key[1]}"], n)
            if n > self.per_app:
                self.violations.append(f"app {key} has {n} unbound released pods > {self.per_app}")
        for ns, n in per_ns.items():
            if n > self.per_ns:
                self.violations.append(f"namespace {ns} has {n} > {self.per_ns}")
        self.max_in_flight["cluster"] = max(self.max_in_flight["cluster"], total)
        if total > self.cluster_cap:
            self.violations.append(f"cluster has {total} > {self.cluster_cap}")


@pytest.fixture
def system(tmp_path: Path) -> Iterator[Any]:
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
        observer = Observer(
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
