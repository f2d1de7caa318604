"""Kubelets, simulated: bound pods start after a delay, finish when told to, and terminate gracefully.

A pod bound to a node becomes Running (containers running, Ready) `start_delay` seconds later. Tests and
the demo end pods with `fail` (an exit code), `oom_kill` (exit 137, reason OOMKilled), `evict` (phase
Failed, reason Evicted, as the kubelet's eviction manager reports it) or `succeed`. `fail_on(node, ...)`
makes a node bad: every matching pod that starts there runs, then fails `start_delay` later (OOMKilled
with exit 137 by default), until `heal(node)`. A pod with a
deletionTimestamp on a node is removed after `terminate_delay` (capped by its grace period), as the
kubelet does once its containers stopped. A pod mounting a ConfigMap that does not exist stays Pending,
its containers waiting in ContainerCreating, until the ConfigMap appears.
"""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Callable
from typing import Any

from .errors import ApiError
from .store import Obj, Store, now_rfc3339

Key = tuple[str, str]
MOUNT_RETRY = 0.5  # seconds between two attempts to mount a missing configMap volume


class Kubelets:
    def __init__(
        self,
        store: Store,
        *,
        start_delay: float = 0.05,
        terminate_delay: float = 0.05,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        self.start_delay = start_delay
        self.terminate_delay = terminate_delay
        self.clock = clock
        self._timers: list[tuple[float, int, str, Key]] = []
        self._seq = itertools.count()
        self._scheduled: set[tuple[str, Key]] = set()
        self._cond = threading.Condition()
        self._stop = False
        self._bad_nodes: dict[
            str, tuple[int, str, dict[str, str]]
        ] = {}  # node -> (exit code, reason, labels)
        self._thread = threading.Thread(target=self._run, name="kubesim-kubelets", daemon=True)
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
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def describe(self) -> str:
        with self._cond:
            timers = len(self._timers)
            due = sum(1 for at, *_ in self._timers if at <= self.clock())
        alive = "running" if self._thread.is_alive() else "NOT RUNNING"
        return f"{alive}, {timers} timers ({due} due)"

    def fail_on(
        self,
        node: str,
        *,
        exit_code: int = 137,
        reason: str = "OOMKilled",
        labels: dict[str, str] | None = None,
    ) -> None:
        """Fail every pod with these labels (default: Spark executors) that starts on `node` from now on."""
        self._bad_nodes[node] = (exit_code, reason, {"spark-role": "executor"} if labels is None else labels)

    def heal(self, node: str) -> None:
        self._bad_nodes.pop(node, None)

    def _later(self, delay: float, action: str, key: Key) -> None:
        with self._cond:
            if (action, key) in self._scheduled:
                return
            self._scheduled.add((action, key))
            heapq.heappush(self._timers, (self.clock() + delay, next(self._seq), action, key))
            self._cond.notify_all()

    def _on_event(self, kind: str, resource: str, obj: Obj) -> None:
        if resource != "pods" or kind == "DELETED":
            return
        meta, spec = obj["metadata"], obj.get("spec") or {}
        if not spec.get("nodeName"):
            return
        key = (meta.get("namespace", ""), meta["name"])
        if meta.get("deletionTimestamp"):
            grace = float(meta.get("deletionGracePeriodSeconds") or 0)
            self._later(min(self.terminate_delay, grace), "remove", key)
        elif (obj.get("status") or {}).get("phase") == "Pending":
            self._later(self.start_delay, "start", key)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stop and (not self._timers or self._timers[0][0] > self.clock()):
                    timeout = self._timers[0][0] - self.clock() if self._timers else None
                    self._cond.wait(timeout)
                if self._stop:
                    return
                _, _, action, key = heapq.heappop(self._timers)
                self._scheduled.discard((action, key))
            try:
                if action == "start":
                    self._start(key)
                elif action == "crash":
                    self._crash(key)
                else:
                    self.store.delete("pods", key[0], key[1], grace_period_seconds=0)
            except ApiError:
                pass  # the pod went away meanwhile

    def _set_status(self, key: Key, change: Callable[[dict[str, Any]], None]) -> None:
        pod = self.store.get("pods", key[0], key[1])
        status = dict(pod.get("status") or {})
        change(status)
        self.store.patch(
            "pods", key[0], key[1], {"status": status}, "application/merge-patch+json", subresource="status"
        )

    def _start(self, key: Key) -> None:
        pod = self.store.get("pods", key[0], key[1])
        if pod["metadata"].get("deletionTimestamp") or (pod.get("status") or {}).get("phase") != "Pending":
            return
        now = now_rfc3339(self.store.clock)
        containers = (pod.get("spec") or {}).get("containers") or []
        if self._unmountable(key, pod, containers):
            return

        def running(status: dict[str, Any]) -> None:
            status["phase"] = "Running"
            status["startTime"] = now
            status["hostIP"] = "10.0.0.1"
            status["podIP"] = "10.1.0.1"
            status["containerStatuses"] = [
                {
                    "name": c.get("name"),
                    "ready": True,
                    "restartCount": 0,
                    "image": c.get("image", ""),
                    "imageID": "",
                    "state": {"running": {"startedAt": now}},
                }
                for c in containers
            ]
            conditions = [
                c for c in status.get("conditions") or [] if c.get("type") not in ("Ready", "ContainersReady")
            ]
            conditions += [
                {"type": "Ready", "status": "True", "lastTransitionTime": now},
                {"type": "ContainersReady", "status": "True", "lastTransitionTime": now},
            ]
            status["conditions"] = conditions

        self._set_status(key, running)
        bad = self._bad_nodes.get((pod.get("spec") or {}).get("nodeName", ""))
        labels = pod["metadata"].get("labels") or {}
        if bad is not None and all(labels.get(k) == v for k, v in bad[2].items()):
            self._later(self.start_delay, "crash", key)

    def _unmountable(self, key: Key, pod: Obj, containers: list[Obj]) -> bool:
        """A configMap volume whose ConfigMap does not exist (and is not `optional`) holds the pod: its
        containers wait with reason ContainerCreating and the mount is tried again (the kubelet's volume
        manager, pkg/kubelet/volumemanager; the error of pkg/volume/configmap/configmap.go's SetUpAt is
        the API's `configmaps "<name>" not found`; the real retry backs off up to about 2 minutes, here a
        fixed MOUNT_RETRY seconds)."""
        names = [
            v["configMap"].get("name", "")
            for v in (pod.get("spec") or {}).get("volumes") or []
            if v.get("configMap") and not v["configMap"].get("optional")
        ]
        if all(self._exists("configmaps", key[0], name) for name in names):
            return False
        self._later(MOUNT_RETRY, "start", key)
        waiting = [
            {"name": c.get("name"), "ready": False, "restartCount": 0, "image": c.get("image", ""),
             "imageID": "", "state": {"waiting": {"reason": "ContainerCreating"}}}
            for c in containers
        ]  # fmt: skip
        if (pod.get("status") or {}).get("containerStatuses") != waiting:
            self._set_status(key, lambda status: status.update(containerStatuses=waiting))
        return True

    def _exists(self, resource: str, namespace: str, name: str) -> bool:
        try:
            self.store.get(resource, namespace, name)
        except ApiError:
            return False
        return True

    def _crash(self, key: Key) -> None:
        pod = self.store.get("pods", key[0], key[1])
        bad = self._bad_nodes.get((pod.get("spec") or {}).get("nodeName", ""))
        if bad is None or (pod.get("status") or {}).get("phase") != "Running":
            return
        if bad[1] == "Evicted":
            self.evict(key[0], key[1])
        else:
            self.fail(key[0], key[1], bad[0], bad[1])

    def _terminate(
        self, namespace: str, name: str, phase: str, exit_code: int, reason: str, message: str = ""
    ) -> None:
        now = now_rfc3339(self.store.clock)
        pod = self.store.get("pods", namespace, name)
        containers = (pod.get("spec") or {}).get("containers") or []

        def terminated(status: dict[str, Any]) -> None:
            status["phase"] = phase
            if reason == "Evicted":
                status["reason"], status["message"] = (
                    "Evicted",
                    message or "The node was low on resource: memory.",
                )
            status["containerStatuses"] = [
                {
                    "name": c.get("name"),
                    "ready": False,
                    "restartCount": 0,
                    "image": c.get("image", ""),
                    "imageID": "",
                    "state": {"terminated": {"exitCode": exit_code, "reason": reason, "finishedAt": now}},
                }
                for c in containers
            ]

        self._set_status((namespace, name), terminated)

    def fail(self, namespace: str, name: str, exit_code: int = 1, reason: str = "Error") -> None:
        self._terminate(namespace, name, "Failed", exit_code, reason)

    def oom_kill(self, namespace: str, name: str) -> None:
        self._terminate(namespace, name, "Failed", 137, "OOMKilled")

    def evict(self, namespace: str, name: str) -> None:
        self._terminate(namespace, name, "Failed", 137, "Evicted")

    def succeed(self, namespace: str, name: str) -> None:
        self._terminate(namespace, name, "Succeeded", 0, "Completed")
