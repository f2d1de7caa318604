"""kube-scheduler, simulated: binds schedulable pods to nodes that fit them, first come first served.

A pod is schedulable when it has no scheduling gates, no node, no deletionTimestamp and is Pending (a gated
pod is invisible to the real scheduler: https://kubernetes.io/docs/concepts/scheduling-eviction/pod-scheduling-readiness/).
Pods are taken in the order they became schedulable. A node fits when the pod's requests (sum of its
containers, or the largest init container) fit in the node's allocatable CPU, memory and pod count minus
what its live pods request, its nodeSelector matches the node's labels, and it tolerates the node's
NoSchedule/NoExecute taints. The least loaded fitting node wins. A pod that fits nowhere gets the
`PodScheduled=False, reason Unschedulable` condition, as the real scheduler reports it, and waits for a
change in the cluster. Bind latency and a maximum bind rate are configurable.
"""

from __future__ import annotations

import collections
import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

from .errors import ApiError
from .quantities import cpu_millis, memory_bytes
from .store import Obj, Store, now_rfc3339

Key = tuple[str, str]


def pod_requests(pod: Obj) -> tuple[int, int]:
    spec = pod.get("spec") or {}

    def total(containers: list[Obj]) -> tuple[int, int]:
        cpu = mem = 0
        for c in containers:
            requests = (c.get("resources") or {}).get("requests") or {}
            cpu += cpu_millis(requests.get("cpu", "0"))
            mem += memory_bytes(requests.get("memory", "0"))
        return cpu, mem

    cpu, mem = total(spec.get("containers") or [])
    for init in spec.get("initContainers") or []:
        icpu, imem = total([init])
        cpu, mem = max(cpu, icpu), max(mem, imem)
    return cpu, mem


def tolerates(pod: Obj, taint: Obj) -> bool:
    if taint.get("effect") not in ("NoSchedule", "NoExecute"):
        return True
    for t in (pod.get("spec") or {}).get("tolerations") or []:
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        if t.get("operator") == "Exists" and (not t.get("key") or t.get("key") == taint.get("key")):
            return True
        if t.get("key") == taint.get("key") and t.get("value", "") == taint.get("value", ""):
            return True
    return False


def schedulable(pod: Obj) -> bool:
    spec, meta = pod.get("spec") or {}, pod["metadata"]
    return (
        not spec.get("schedulingGates")
        and not spec.get("nodeName")
        and not meta.get("deletionTimestamp")
        and (pod.get("status") or {}).get("phase") == "Pending"
    )


def live(pod: Obj) -> bool:
    return (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


class Scheduler:
    def __init__(
        self,
        store: Store,
        *,
        bind_latency: float = 0.0,
        max_bind_rate: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.bind_latency = bind_latency
        self.max_bind_rate = max_bind_rate
        self.clock = clock
        self.binds = 0
        self.attempts = 0  # pods evaluated against the nodes: the scheduler's work (kube-scheduler's
        # scheduling attempts), which grows with every unschedulable pod retried on each cluster change
        self._queue: collections.OrderedDict[Key, None] = collections.OrderedDict()
        self._unschedulable: set[Key] = set()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kubesim-scheduler", daemon=True)
        self._unsubscribe: Callable[[], None] | None = None

    def start(self) -> None:
        self._unsubscribe = self.store.subscribe(self._on_event)
        pods, _, _ = self.store.list_objects("pods")
        for pod in pods:
            self._on_event("ADDED", "pods", pod)
        self._thread.start()

    def stop(self) -> None:
        if self._unsubscribe:
            self._unsubscribe()
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _on_event(self, kind: str, resource: str, obj: Obj) -> None:
        if resource == "pods":
            key = (obj["metadata"].get("namespace", ""), obj["metadata"]["name"])
            if kind != "DELETED" and schedulable(obj):
                if key not in self._queue:
                    self._queue[key] = None
            else:
                self._queue.pop(key, None)
                self._unschedulable.discard(key)
            if kind == "DELETED" or not live(obj) or key in self._queue:
                self._wake.set()
        elif resource == "nodes":
            self._wake.set()

    def _run(self) -> None:
        next_bind = 0.0
        while not self._stop.is_set():
            self._wake.wait()
            self._wake.clear()
            if self._stop.is_set():
                return
            free = self._free_capacity()
            for key in list(self._queue):
                if self._stop.is_set():
                    return
                try:
                    pod = self.store.get("pods", key[0], key[1])
                except ApiError:
                    self._queue.pop(key, None)
                    continue
                if not schedulable(pod):
                    self._queue.pop(key, None)
                    continue
                self.attempts += 1
                node = self._pick(pod, free)
                if node is None:
                    self._mark_unschedulable(key, pod)
                    continue
                if self.max_bind_rate:
                    wait = next_bind - self.clock()
                    if wait > 0 and self._stop.wait(wait):
                        return
                    next_bind = max(next_bind, self.clock()) + 1.0 / self.max_bind_rate
                if self.bind_latency and self._stop.wait(self.bind_latency):
                    return
                try:
                    self.store.bind(key[0], key[1], node)
                except ApiError:
                    continue
                self.binds += 1
                self._queue.pop(key, None)
                self._unschedulable.discard(key)
                cpu, mem = pod_requests(pod)
                c, m, n = free[node]
                free[node] = (c - cpu, m - mem, n - 1)

    def _free_capacity(self) -> dict[str, tuple[int, int, int]]:
        nodes, _, _ = self.store.list_objects("nodes")
        free: dict[str, tuple[int, int, int]] = {}
        for node in nodes:
            alloc = (node.get("status") or {}).get("allocatable") or {}
            free[node["metadata"]["name"]] = (
                cpu_millis(alloc.get("cpu", "0")),
                memory_bytes(alloc.get("memory", "0")),
                int(alloc.get("pods", "110")),
            )
        pods, _, _ = self.store.list_objects("pods")
        for pod in pods:
            name = (pod.get("spec") or {}).get("nodeName")
            if name in free and live(pod):
                cpu, mem = pod_requests(pod)
                c, m, n = free[name]
                free[name] = (c - cpu, m - mem, n - 1)
        self._nodes = {n["metadata"]["name"]: n for n in nodes}
        return free

    def _pick(self, pod: Obj, free: dict[str, tuple[int, int, int]]) -> str | None:
        cpu, mem = pod_requests(pod)
        selector = (pod.get("spec") or {}).get("nodeSelector") or {}
        best: tuple[int, str] | None = None
        for name, (c, m, n) in free.items():
            node = self._nodes[name]
            labels = node["metadata"].get("labels") or {}
            if c < cpu or m < mem or n < 1:
                continue
            if any(labels.get(k) != v for k, v in selector.items()):
                continue
            if not all(tolerates(pod, t) for t in (node.get("spec") or {}).get("taints") or []):
                continue
            if best is None or c > best[0]:
                best = (c, name)
        return best[1] if best else None

    def _mark_unschedulable(self, key: Key, pod: Obj) -> None:
        if key in self._unschedulable:
            return
        self._unschedulable.add(key)
        status: dict[str, Any] = dict(pod.get("status") or {})
        conditions = [c for c in status.get("conditions") or [] if c.get("type") != "PodScheduled"]
        conditions.append(
            {
                "type": "PodScheduled",
                "status": "False",
                "reason": "Unschedulable",
                "message": "0/N nodes are available: insufficient resources.",
                "lastTransitionTime": now_rfc3339(self.store.clock),
            }
        )
        with contextlib.suppress(ApiError):
            self.store.patch(
                "pods",
                key[0],
                key[1],
                {"status": {"conditions": conditions}},
                "application/merge-patch+json",
                subresource="status",
            )
