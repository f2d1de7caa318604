"""A simulated Spark 4.x driver: executor pods requested as Spark's ExecutorPodsAllocator requests them.

Follows Spark's ExecutorPodsAllocator (resource-managers/kubernetes, Spark 3.x-4.x) and what was measured on Spark
4.3 (tests/data/spark-4.3/README.md), over HTTP with its own service account like the real driver:
- a driver pod (optional) that owns the executors, and the executor conf ConfigMap;
- every `batch_delay` an allocation cycle on the latest snapshot of its pods (kept by a watch):
  Running and Pending pods count toward the target; while a created pod has not been seen yet, no new
  request is made; otherwise `n = min(target - count, batch_size, max_pending - not running)` pods are
  created with ids from a monotonic counter. A pod counts as seen once any snapshot showed it, deleted or
  not: Spark processes its snapshots in the allocation thread, after the creation returned, and a pod
  deleted meanwhile is in them as PodDeleted (`newlyCreatedExecutors --= k8sKnownExecIds`). Here the watch
  runs in its own thread, so the ids it showed are kept (`_known`) for a creation that returns after its
  pod has come and gone (a slow answer under load: without this the driver waited forever). A pod whose
  whole life no snapshot showed (its watch was down, and a relist after 410 cannot show a deleted pod)
  stays among the newly created, and the driver asks for no executor again: Spark's own stall
  (SPARK-44609, not fixed in Spark as of 2025-12; for an executor that never registered, Spark gives up
  after `spark.kubernetes.allocation.executor.timeout`, 600 s, which is not simulated);
- scaling down deletes excess Pending pods (newest first) and remembers their ids;
- a pod that failed counts as an executor failure and is deleted; a creation the API server refuses counts
  as one too (measured on 4.3), and at `max_failures` (default 2 x executors) the app dies;
- client mode (`driver_pod=False`: a notebook, `spark-shell`, a driver outside the cluster): no driver pod,
  so the executors and the conf ConfigMap have no owner; `kill` is a kill -9 of the driver JVM: nothing is
  deleted (measured on the real cluster, docs/real-cluster-facts.md: 40 executor pods stayed, 15 of them
  gated forever), and each executor that runs or starts afterwards exits 1, as Spark's
  CoarseGrainedExecutorBackend does when it loses its driver (`onDisconnected` -> `exitExecutor(1, ...)`) or
  cannot reach it at start.

`allocator="deployment"` is Spark 4.2+'s `spark.kubernetes.allocation.pods.allocator=deployment`
(docs/real-cluster-facts.md): Spark scales a Deployment `spark-d-<appId>-<rpId>` and the ReplicaSet controller
creates every executor pod, as fast as its client's rate limit lets it (30 at once, then 20 a second, shared by
every ReplicaSet of the cluster: CONTROLLER_MANAGER_QPS below), with `spark-exec-id: EXECID` (a literal placeholder), `pod-template-hash`
and `controller.kubernetes.io/pod-deletion-cost: "0"`, and creates a new one for each that is deleted or
fails; Spark's batch size and max pending do not apply. kubesim serves no Deployments or ReplicaSets, so the
driver stands in for the ReplicaSet controller: it creates those pods itself, every cycle up to the target,
in the controller's slow-start batches of 1, 2, 4, ... concurrent creations (`_create_replicas`), each
creation and each deletion of a scale-down waiting on the cluster's one ReplicaSet-controller client
(`replicaset_client`),
owned by the driver pod (on a real cluster: by the ReplicaSet, whose Deployment the driver owns; either way
they go when the driver pod goes).
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from sparkgate.kube import Kube, KubeError, Reflector
from sparkgate.ratelimit import TokenBucket

log = logging.getLogger(__name__)
Obj = dict[str, Any]


class SparkDriver:
    def __init__(
        self,
        kubeconfig: str,
        namespace: str,
        app_name: str,
        *,
        executors: int,
        batch_size: int = 5,
        batch_delay: float = 1.0,
        max_pending: int | None = None,
        driver_pod: bool = True,
        cpu: str = "1",
        memory: str = "1Gi",
        labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None,
        max_failures: int | None = None,
        allocator: str = "direct",  # or "deployment": the pods a ReplicaSet controller creates
        replicaset_client: TokenBucket | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube = Kube.from_kubeconfig(kubeconfig, max_attempts=3)
        self.namespace = namespace
        self.app_name = app_name
        self.app_id = f"spark-{uuid.uuid4().hex}"
        self.target = executors
        self.batch_size = batch_size
        self.batch_delay = batch_delay
        self.max_pending = max_pending if max_pending is not None else 2**31 - 1
        self.with_driver_pod = driver_pod
        self.cpu = cpu
        self.memory = memory
        self.labels = labels or {}
        self.annotations = annotations or {}
        self.max_failures = max_failures if max_failures is not None else max(3, 2 * executors)
        self.clock = clock
        self.deployment = allocator == "deployment"
        # The ReplicaSet controller's client-side rate limit (client-go's token bucket), which the cluster's
        # Deployment drivers share as its ReplicaSets share the one controller: None, no limit.
        self.replicaset_client = replicaset_client
        self.driver_uid: str | None = None
        self.created: list[int] = []  # executor ids, in creation order
        self.batches: list[int] = []  # pods created per allocation cycle that created any
        self.failures = 0
        self.dead = False
        self.finished = False
        self._next_id = 0
        self._pods: dict[int, Obj] = {}
        self._newly: set[int] = set()
        self._known: set[int] = set()  # every executor id a snapshot (list or watch event) has shown
        # What its watch did lately (events, lists, restarts with the resourceVersion it resumed from), for
        # a wait that expires (Cluster.describe).
        self._trail: collections.deque[str] = collections.deque(maxlen=TRAIL)
        self._failed_seen: set[int] = set()
        self._deleted: set[int] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._closed = (
            threading.Event()
        )  # the simulation is over (set by stop; after kill, ends the executors' loop)
        self._wake = threading.Event()
        self._threads: list[threading.Thread] = []

    # --- lifecycle -----------------------------------------------------------------------------------

    def start(self) -> SparkDriver:
        if self.with_driver_pod:
            driver = self.kube.create(f"/api/v1/namespaces/{self.namespace}/pods", self._driver_pod())
            self.driver_uid = driver["metadata"]["uid"]
        self.kube.create(f"/api/v1/namespaces/{self.namespace}/configmaps", self._conf_map())
        # The snapshot: a watch on this app's executor pods, on sparkgate's one reflector.
        reflector = Reflector(
            self.kube,
            f"spark-driver-{self.app_name}",
            f"/api/v1/namespaces/{self.namespace}/pods",
            f"spark-app-selector={self.app_id},spark-role=executor",
            self._event,
            self._replace,
            stop=self._stop,
            timeout_seconds=2,
            on_restart=lambda _, cause: self._trail.append(f"{cause} at {reflector.resource_version or '-'}"),
        )
        allocation = threading.Thread(
            target=self._allocation_loop, name=f"spark-driver-{self.app_name}", daemon=True
        )
        for thread in (reflector.thread, allocation):
            thread.start()
            self._threads.append(thread)
        return self

    def stop(self) -> None:
        """Stop requesting executors (the driver process stops; its pods stay until deleted)."""
        self._closed.set()
        self._halt()

    def _halt(self) -> None:
        self._stop.set()
        self._wake.set()
        for thread in self._threads:
            thread.join(timeout=10)
        self.finished = True

    def kill(self, exit_executor: Callable[[str, str], None]) -> None:
        """kill -9 of the driver JVM: its pods stay; every executor that runs, now or later, exits 1, through
        `exit_executor(namespace, pod name)` (the kubelet's `fail`). Until `stop`."""
        self._halt()
        thread = threading.Thread(
            target=self._orphaned_executors,
            args=(exit_executor,),
            name=f"spark-executors-{self.app_name}",
            daemon=True,
        )
        thread.start()
        self._threads.append(thread)

    def _orphaned_executors(self, exit_executor: Callable[[str, str], None]) -> None:
        selector = f"spark-app-selector={self.app_id},spark-role=executor"
        path = f"/api/v1/namespaces/{self.namespace}/pods"
        while not self._closed.is_set():
            try:
                items, rv = self.kube.list(path, label_selector=selector)
                for pod in items:
                    _exit_if_running(pod, exit_executor)
                for kind, obj in self.kube.watch(
                    path, resource_version=rv, label_selector=selector, timeout_seconds=2
                ):
                    if kind in ("ADDED", "MODIFIED"):
                        _exit_if_running(obj, exit_executor)
                    if self._closed.is_set():
                        return
            except KubeError:
                if self._closed.wait(0.2):
                    return

    def delete_driver_pod(self) -> None:
        self.kube.delete(f"/api/v1/namespaces/{self.namespace}/pods/{self.driver_name}", grace_period=0)

    def scale_to(self, executors: int) -> None:
        with self._lock:
            self.target = executors
        self._wake.set()

    @property
    def driver_name(self) -> str:
        return f"{self.app_name}-driver"

    def running(self) -> int:
        with self._lock:
            return sum(1 for p in self._pods.values() if _state(p) == "running")

    def pods(self) -> dict[int, Obj]:
        with self._lock:
            return dict(self._pods)

    def executor_name(self, exec_id: int) -> str:
        if self.deployment:
            # The ReplicaSet's pod: named <replicaset>-<suffix> (a sequence number here, 5 random characters
            # on a real cluster, which _exec_id reads back as the simulation's key).
            return f"spark-d-{self.app_id}-0-{DEPLOYMENT_HASH}-{exec_id:05d}"
        return f"{self.app_name}-exec-{exec_id}"

    def trail(self) -> list[str]:
        with self._lock:
            return list(self._trail)

    def unseen(self) -> set[int]:
        """Executors created that its watch has not shown yet (no new request is made meanwhile)."""
        with self._lock:
            return set(self._newly)

    # --- the snapshot: a watch on this app's executor pods (the Reflector calls these) ------------------

    def _replace(self, items: Iterable[Obj]) -> None:
        with self._lock:
            self._pods = {_exec_id(p): p for p in items if _exec_id(p) is not None}  # type: ignore[misc]
            self._known |= set(self._pods)
            self._trail.append(f"list: {sorted(self._pods)}")
            # Spark drops from its newly created executors those the snapshot knows
            # (ExecutorPodsAllocator: newlyCreatedExecutors --= k8sKnownExecIds).
            self._newly -= set(self._pods)

    def _event(self, kind: str, obj: Obj) -> None:
        exec_id = _exec_id(obj)
        if exec_id is None:
            return
        with self._lock:
            if kind == "DELETED":
                self._pods.pop(exec_id, None)
            else:
                self._pods[exec_id] = obj
            self._newly.discard(exec_id)
            self._known.add(exec_id)
            self._trail.append(f"{kind} {exec_id} at {obj['metadata'].get('resourceVersion')}")
        self._wake.set()

    # --- the allocation cycle -------------------------------------------------------------------------

    def _allocation_loop(self) -> None:
        while not self._stop.is_set():
            self._cycle()
            if self.dead:
                return
            self._stop.wait(self.batch_delay)

    def _cycle(self) -> None:
        with self._lock:
            pods = dict(self._pods)
            target = self.target
            newly = set(self._newly)
        for exec_id, pod in pods.items():
            if _state(pod) == "failed" and exec_id not in self._failed_seen:
                self._failed_seen.add(exec_id)
                self.failures += 1
                self._delete_executor(exec_id, pod)
        if self._check_failures():
            return
        live = {
            i: p for i, p in pods.items() if i not in self._deleted and _state(p) in ("pending", "running")
        }
        running = sum(1 for p in live.values() if _state(p) == "running")
        pending = [i for i, p in live.items() if _state(p) == "pending"]
        not_running = len(pending) + len(newly)
        count = running + not_running
        if count > target:
            excess = count - target
            for exec_id in sorted(pending, reverse=True)[:excess]:
                self._deleted.add(exec_id)
                if self.deployment and not self._throttled():
                    return  # the driver stopped while the ReplicaSet controller waited
                self._delete_executor(exec_id, pods[exec_id])
            return
        if newly or count >= target:
            return
        if self.deployment:
            created = self._create_replicas(min(target - count, BURST_REPLICAS))
        else:
            created = 0
            for _ in range(max(min(target - count, self.batch_size, self.max_pending - not_running), 0)):
                if self._create(self._take_id()):
                    created += 1
                elif self._check_failures():
                    return
        if created:
            self.batches.append(created)

    def _take_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def _create(self, exec_id: int) -> bool:
        """Create one executor pod; a refusal is an executor failure (measured on Spark 4.3)."""
        try:
            self.kube.create(f"/api/v1/namespaces/{self.namespace}/pods", self._executor_pod(exec_id))
        except KubeError as e:
            log.info("Failed to create executor pod %d: %s", exec_id, e)
            with self._lock:
                self.failures += 1
            return False
        with self._lock:
            if exec_id not in self._known:
                self._newly.add(exec_id)
            self.created.append(exec_id)
        return True

    def _create_replicas(self, n: int) -> int:
        """The ReplicaSet controller's creations (replica_set.go `manageReplicas`, `slowStartBatch`): batches
        of 1, 2, 4, ... pods, each batch's creations at once, the next batch only when the whole batch
        succeeded; on a failure the rest waits for the next sync. kube-controller-manager runs a batch's
        creations in as many goroutines (at most `burstReplicas`, 500, per sync); here at most
        REPLICA_CREATORS threads, the driver's connection pool."""
        created, batch = 0, 1
        while created < n:
            ids = [self._take_id() for _ in range(min(batch, n - created))]
            with concurrent.futures.ThreadPoolExecutor(
                min(len(ids), REPLICA_CREATORS), thread_name_prefix=f"replicaset-{self.app_name}"
            ) as pool:
                ok = sum(pool.map(self._create_replica, ids))
            created += ok
            if ok < len(ids):
                self._check_failures()
                break
            batch *= 2
        return created

    def _create_replica(self, exec_id: int) -> bool:
        return self._throttled() and self._create(exec_id)

    def _throttled(self) -> bool:
        """Wait for the ReplicaSet controller's client to allow one more request; False if the driver stopped
        meanwhile (the request is not sent)."""
        limiter = self.replicaset_client
        return limiter is None or not self._stop.wait(limiter.reserve())

    def _check_failures(self) -> bool:
        if self.failures >= self.max_failures and not self.dead:
            log.warning("Max number of executor failures (%d) reached", self.max_failures)
            self.dead = True
            self._stop.set()
        return self.dead

    def _delete_executor(self, exec_id: int, pod: Obj) -> None:
        with contextlib.suppress(KubeError):
            self.kube.delete(f"/api/v1/namespaces/{self.namespace}/pods/{pod['metadata']['name']}")

    # --- the objects Spark creates ---------------------------------------------------------------------

    def _spark_labels(self, role: str) -> dict[str, str]:
        return {
            "spark-app-selector": self.app_id,
            "spark-role": role,
            "spark-app-name": self.app_name,
            "spark-version": "4.3.0",
        }

    def _driver_pod(self) -> Obj:
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": self.driver_name, "labels": self._spark_labels("driver")},
            "spec": {
                "containers": [
                    {
                        "name": "spark-kubernetes-driver",
                        "image": "apache/spark:4.3.0",
                        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
                    }
                ],
            },
        }

    def _conf_map(self) -> Obj:
        meta: Obj = {
            "name": f"spark-exec-{uuid.uuid4().hex[:16]}-conf-map",
            "labels": {"spark-app-selector": self.app_id, "spark-role": "executor"},
        }
        if self.driver_uid:
            meta["ownerReferences"] = [self._owner()]
        return {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": meta,
            "data": {"spark.properties": "spark.executor.cores=1\n"},
        }

    def _owner(self) -> Obj:
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": self.driver_name,
            "uid": self.driver_uid,
            "controller": True,
        }

    def _executor_pod(self, exec_id: int) -> Obj:
        labels = {
            **self.labels,
            **self._spark_labels("executor"),
            "spark-exec-id": "EXECID" if self.deployment else str(exec_id),
            "spark-exec-resourceprofile-id": "0",
        }
        meta: Obj = {"name": self.executor_name(exec_id), "labels": labels}
        annotations = dict(self.annotations)
        if self.deployment:
            labels["pod-template-hash"] = DEPLOYMENT_HASH
            annotations["controller.kubernetes.io/pod-deletion-cost"] = "0"
        if annotations:
            meta["annotations"] = annotations
        if self.driver_uid:
            meta["ownerReferences"] = [self._owner()]
        env = [
            {"name": "SPARK_EXECUTOR_ID", "value": labels["spark-exec-id"]},
            {"name": "SPARK_APPLICATION_ID", "value": self.app_id},
            {"name": "SPARK_DRIVER_URL", "value": f"spark://CoarseGrainedScheduler@{self.driver_name}:7078"},
        ]
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": meta,
            "spec": {
                "restartPolicy": "Never",
                "hostname": meta["name"],
                "containers": [
                    {
                        "name": "spark-kubernetes-executor",
                        "image": "apache/spark:4.3.0",
                        "args": ["executor"],
                        "env": env,
                        "resources": {
                            "requests": {"cpu": self.cpu, "memory": self.memory},
                            "limits": {"memory": self.memory},
                        },
                    }
                ],
            },
        }


DEPLOYMENT_HASH = "5d8f7c9b6"  # the pod-template-hash of the simulated ReplicaSet
TRAIL = 40  # the last watch events, lists and restarts a driver keeps (`trail`)
BURST_REPLICAS = 500  # replica_set.go `BurstReplicas`: the most creations of one sync
# kube-controller-manager's client rate limit, `--kube-api-qps` and `--kube-api-burst` by default
# (pkg/controller/apis/config/v1alpha1/defaults.go: "client-connection defaults ... specific to the
# kube-controller-manager"). Each controller builds its clientset, and with it its token bucket, from that
# configuration: the one ReplicaSet controller's creations and deletions share one, whichever ReplicaSet
# they are for.
CONTROLLER_MANAGER_QPS = 20.0
CONTROLLER_MANAGER_BURST = 30
REPLICA_CREATORS = (
    16  # threads creating one slow-start batch: the driver's connection pool (Kube's pool_size)
)


def _exec_id(pod: Obj) -> int | None:
    """The pod's key in the simulation: Spark's executor id, or for a Deployment's pod (spark-exec-id EXECID)
    the sequence number its name ends with."""
    meta = pod.get("metadata") or {}
    raw = (meta.get("labels") or {}).get("spark-exec-id", "")
    if raw == "EXECID":
        raw = meta.get("name", "").rpartition("-")[2]
    return int(raw) if raw.isdecimal() else None


def _exit_if_running(pod: Obj, exit_executor: Callable[[str, str], None]) -> None:
    if _state(pod) == "running":
        with contextlib.suppress(Exception):  # gone meanwhile: nothing to end
            exit_executor(pod["metadata"]["namespace"], pod["metadata"]["name"])


def _state(pod: Obj) -> str:
    """Spark's classification (reference 1.4), reduced to what the simulation needs."""
    phase = ((pod.get("status") or {}).get("phase") or "").lower()
    if pod["metadata"].get("deletionTimestamp") and phase != "running":
        return "deleted"
    return {"pending": "pending", "running": "running", "failed": "failed", "succeeded": "succeeded"}.get(
        phase, "unknown"
    )
