"""The whole system on kubesim: the real webhook (gunicorn, TLS) registered in the simulated API server,
real allocator processes, simulated Spark drivers, and an observer that checks the limits at every change."""

from __future__ import annotations

import dataclasses
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kubesim.cluster import Cluster
from sandbox.caps import CapChecker, Caps, state_of
from sandbox.local_webhook import LocalWebhook
from sandbox.localsystem import AllocatorProcess, LocalSystem
from sparkgate import contract

POLICY = """
apiVersion: sparkgate.io/v1alpha1
kind: Policy
allocation: {{batchSize: {batch}, batchDelaySeconds: {delay}, maxPendingPerApp: {per_app}, maxPendingPerNamespace: {per_ns}, maxPendingCluster: {cluster}, pacing: {pacing}, autoscalerDemand: {demand}, provisioning: {provisioning}}}
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
    demand: str = "held",
    provisioning: str = "none",
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
            demand=demand,
            provisioning=provisioning,
        )
    )
    return path


class Observer:
    """Checks sparkgate's limits after every committed change of an executor pod (a store listener sees each
    change in order, so this is every moment, not samples), with the one definition of the invariant
    (sandbox/caps.py `CapChecker`: in flight per app, namespace and cluster, one unbound batch per app, no gate
    removed twice). It also records the pods admitted without sparkgate and, for each gate removal, the app
    and the apps that had gated pods at that moment."""

    def __init__(self, cluster: Cluster, per_app: int, per_ns: int, cluster_cap: int, unbound_limit: int):
        self.lock = threading.Lock()
        self.checker = CapChecker(Caps(per_app, per_ns, cluster_cap, unbound_limit))
        self.bypassed: set[str] = set()  # admitted without sparkgate (no profile annotation)
        self.release_order: list[tuple[str, frozenset[str]]] = []
        self.unsubscribe = cluster.store.subscribe(self.on_change)

    @property
    def phase(self) -> str:
        return self.checker.phase

    @phase.setter
    def phase(self, phase: str) -> None:
        self.checker.phase = phase

    @property
    def unbound_limit(self) -> int | None:
        return self.checker.caps.unbound

    @unbound_limit.setter
    def unbound_limit(self, limit: int) -> None:
        self.checker.caps = dataclasses.replace(self.checker.caps, unbound=limit)

    @property
    def violations(self) -> list[str]:
        return self.checker.violations

    @property
    def releases(self) -> Counter[str]:
        return self.checker.releases

    @property
    def max_in_flight(self) -> Counter[str]:  # by app id, "ns:<namespace>" and "cluster"
        return self.checker.max_in_flight

    @property
    def max_unbound(self) -> Counter[str]:  # by app id
        return self.checker.max_unbound

    def on_change(self, kind: str, resource: str, obj: dict[str, Any]) -> None:
        state = state_of(obj) if resource == "pods" else None
        if state is None:
            return
        meta = obj["metadata"]
        with self.lock:
            if contract.ANNOTATION_PROFILE not in (meta.get("annotations") or {}):
                self.bypassed.add(meta["uid"])
            if self.checker.change(meta["uid"], None if kind == "DELETED" else state):
                waiting = frozenset(p.app for p in self.checker.pods.values() if p.gated)
                self.release_order.append((state.app, waiting))


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
        autoscaler: Any = None,
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
            autoscaler=autoscaler,
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
