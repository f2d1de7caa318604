"""The cloud side of a simulated cluster-autoscaler: node groups, their nodes, and what the nodes cost.

A `NodeGroup` is a node template with a minimum and a maximum size, as a cloud provider's node group is to
cluster-autoscaler (cloudprovider/cloud_provider.go `NodeGroup`: MinSize, MaxSize, TargetSize, IncreaseSize,
DeleteNodes, TemplateNodeInfo). `Cloud` holds each group's target size and makes its nodes real: a node the
autoscaler asked for joins the cluster, Ready, `provisioning_delay` seconds later (a cloud VM's boot and
registration; CA has no such setting, a real cloud takes about a minute), carrying the group's labels,
taints and capacity, so kubesim's scheduler and kubelets use it as any other node. A node that is deleted
gets CA's `ToBeDeletedByClusterAutoscaler` NoSchedule taint (utils/taints/taints.go), its pods are deleted
(CA evicts them), and the Node object goes once none of its pods is left (the instance is gone).

`NodeUsage` counts what a benchmark reports: the peak number of nodes and node-seconds (each node from the
moment its Node object is stored to the moment it is deleted, on the monotonic clock), for every node of
the cluster, the static ones included.

Threads: `Cloud` is driven by the autoscaler's thread alone (autoscaler.py). `NodeUsage` is fed by the
store's dispatching thread and read by any thread, under its lock.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .errors import ApiError
from .store import Obj, Store

TO_BE_DELETED_TAINT = "ToBeDeletedByClusterAutoscaler"


def node_object(
    name: str,
    *,
    cpu: str,
    memory: str,
    pods: int = 110,
    labels: Mapping[str, str] | None = None,
    taints: Sequence[Mapping[str, Any]] = (),
) -> Obj:
    """A Ready Node with this capacity (allocatable the same), labels (and its hostname) and taints."""
    capacity = {"cpu": cpu, "memory": memory, "pods": str(pods)}
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
        "spec": {"taints": [dict(t) for t in taints]} if taints else {},
        "status": {
            "capacity": capacity,
            "allocatable": capacity,
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


@dataclass(frozen=True)
class NodeGroup:
    name: str
    max_size: int
    min_size: int = 0
    cpu: str = "8"
    memory: str = "32Gi"
    pods: int = 110
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: Sequence[Mapping[str, Any]] = ()

    def template(self, name: str) -> Obj:
        """TemplateNodeInfo: the node a scale-up of this group would add."""
        return node_object(
            name, cpu=self.cpu, memory=self.memory, pods=self.pods, labels=self.labels, taints=self.taints
        )


class Cloud:
    def __init__(
        self,
        store: Store,
        groups: Sequence[NodeGroup],
        *,
        provisioning_delay: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.groups = {g.name: g for g in groups}
        self.provisioning_delay = provisioning_delay
        self.clock = clock
        self.target = {g.name: 0 for g in groups}
        self._group_of: dict[str, str] = {}  # node name -> its group, for every node the cloud made
        self._booting: list[tuple[float, str, str]] = []  # (due, group, node name), in due order
        self._deleting: set[str] = set()
        self._serial = 0

    def group_of(self, node: str) -> NodeGroup | None:
        name = self._group_of.get(node)
        return self.groups[name] if name is not None else None

    def registered(self, group: str) -> list[str]:
        """The group's nodes that joined the cluster and are not being deleted."""
        return sorted(n for n, g in self._group_of.items() if g == group and n not in self._deleting)

    def upcoming(self, group: str) -> int:
        """clusterstate `GetUpcomingNodes`: nodes asked for that have not joined yet."""
        return sum(1 for _, g, _ in self._booting if g == group)

    def deleting(self) -> frozenset[str]:
        return frozenset(self._deleting)

    def increase_size(self, group: str, delta: int) -> None:
        """NodeGroup.IncreaseSize: the new nodes join after the provisioning delay."""
        due = self.clock() + self.provisioning_delay
        for _ in range(delta):
            self._serial += 1
            self._booting.append((due, group, f"{group}-{self._serial}"))
        self.target[group] += delta

    def next_due(self) -> float | None:
        return self._booting[0][0] if self._booting else None

    def boot_due(self) -> int:
        """Store the nodes whose provisioning delay is over; how many."""
        now, joined = self.clock(), 0
        while self._booting and self._booting[0][0] <= now:
            _, group, name = self._booting.pop(0)
            self.store.create("nodes", self.groups[group].template(name))
            self._group_of[name] = group
            joined += 1
        return joined

    def delete_node(self, name: str, pods: Sequence[Obj], now_unix: int) -> None:
        """scaledown/actuation: taint the node ToBeDeletedByClusterAutoscaler, evict its pods; the Node goes
        (and the group shrinks) once they are gone (`finish_deletions`)."""
        node = self.store.get("nodes", None, name)
        taints = [*((node.get("spec") or {}).get("taints") or [])]
        taints.append({"key": TO_BE_DELETED_TAINT, "value": str(now_unix), "effect": "NoSchedule"})
        self.store.patch("nodes", None, name, {"spec": {"taints": taints}}, "application/merge-patch+json")
        self._deleting.add(name)
        for pod in pods:
            with contextlib.suppress(ApiError):  # already gone
                self.store.delete("pods", pod["metadata"]["namespace"], pod["metadata"]["name"])

    def finish_deletions(self, bound: Mapping[str, int]) -> list[str]:
        """Delete the Node of each node being deleted that no live pod is bound to (`bound`: pods per node)."""
        done = [n for n in sorted(self._deleting) if not bound.get(n)]
        for name in done:
            with contextlib.suppress(ApiError):
                self.store.delete("nodes", None, name)
            self._deleting.discard(name)
            group = self._group_of.pop(name)
            self.target[group] -= 1
        return done


class NodeUsage:
    """Peak nodes and node-seconds, from the store's node events."""

    def __init__(self, store: Store, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._since: dict[str, float] = {}
        self._closed = 0.0  # node-seconds of the nodes already deleted
        self.peak = 0
        self._unsubscribe = store.subscribe(self._on_event)
        nodes, _, _ = store.list_objects("nodes")
        for node in nodes:
            self._on_event("ADDED", "nodes", node)

    def _on_event(self, kind: str, resource: str, obj: Obj) -> None:
        if resource != "nodes":
            return
        name, now = obj["metadata"]["name"], self.clock()
        with self._lock:
            if kind == "DELETED":
                since = self._since.pop(name, None)
                if since is not None:
                    self._closed += now - since
            elif name not in self._since:
                self._since[name] = now
                self.peak = max(self.peak, len(self._since))

    def nodes(self) -> int:
        with self._lock:
            return len(self._since)

    def node_seconds(self) -> float:
        now = self.clock()
        with self._lock:
            return self._closed + sum(now - since for since in self._since.values())

    def reset(self) -> None:
        """Count from now: node-seconds 0, the peak the nodes there are now (a benchmark's phase)."""
        now = self.clock()
        with self._lock:
            self._closed = 0.0
            self._since = dict.fromkeys(self._since, now)
            self.peak = len(self._since)

    def close(self) -> None:
        self._unsubscribe()
