"""A whole simulated cluster in one object: API server, admission, scheduler, kubelets, users, drivers.

Admission is kube-apiserver's chain (admission.py): the built-in pod plugins, webhooks, and
ValidatingAdmissionPolicy. Like a real cluster it starts with the PriorityClasses system-cluster-critical
and system-node-critical, and every namespace has its `default` ServiceAccount.

    with Cluster(nodes=3) as cluster:
        kubeconfig = cluster.add_user("system:serviceaccount:spark:spark")
        driver = cluster.spark_driver("spark", "etl", executors=12, user=...)
        cluster.wait_for(lambda: driver.running() == 12)

`wait_for` re-evaluates its predicate after every change in the store (never by sleeping in a loop), so
tests wait exactly as long as the cluster needs.

With `autoscaler=AutoscalerConfig(groups=[NodeGroup(...)], ...)` the cluster also runs a simulated
cluster-autoscaler (autoscaler.py), which adds nodes of its node groups and serves the ProvisioningRequest
CRD; without one (the default) the cluster has only its static nodes and does not serve that CRD.
"""

from __future__ import annotations

import collections
import faulthandler
import secrets
import shutil
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from sparkgate.ratelimit import TokenBucket

from .admission import AdmissionChain, WebhookAdmission
from .apiserver import ADMIN, ApiServer
from .autoscaler import Autoscaler, AutoscalerConfig
from .errors import UserInfo
from .faults import Faults, RequestLog
from .kubeconfig import write_kubeconfig
from .kubelet import Kubelets
from .nodegroups import node_object
from .podplugins import SYSTEM_PRIORITY_CLASSES
from .scheduler import Scheduler
from .sparkdriver import CONTROLLER_MANAGER_BURST, CONTROLLER_MANAGER_QPS, SparkDriver
from .store import Store

RECENT_POD_EVENTS = 20_000  # pod events kept for `history` (a wait that expires reports them)


class Cluster:
    def __init__(
        self,
        *,
        nodes: int = 3,
        node_cpu: str = "8",
        node_memory: str = "32Gi",
        node_pods: int = 110,
        start_delay: float = 0.05,
        terminate_delay: float = 0.05,
        bind_latency: float = 0.0,
        max_bind_rate: float | None = None,
        compaction_window: int = 100_000,
        bookmark_interval: float = 1.0,
        services: Mapping[tuple[str, str], str] | None = None,
        namespaces: Sequence[str] = ("default", "kube-system", "sparkgate-system"),
        workdir: Path | None = None,
        controller_qps: float | None = CONTROLLER_MANAGER_QPS,
        controller_burst: int = CONTROLLER_MANAGER_BURST,
        autoscaler: AutoscalerConfig | None = None,
    ) -> None:
        self._own_workdir = workdir is None
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="kubesim-"))
        self.store = Store(compaction_window=compaction_window)
        self.admission = WebhookAdmission(self.store, services=services)
        self.chain = AdmissionChain(self.store, self.admission)
        self.store.admit = self.chain.mutate
        self.store.validate = self.chain.validate
        self.faults = Faults()
        self.requests = RequestLog()
        self.apiserver = ApiServer(
            self.store, faults=self.faults, log=self.requests, bookmark_interval=bookmark_interval
        )
        self.url = self.apiserver.url
        self.scheduler = Scheduler(self.store, bind_latency=bind_latency, max_bind_rate=max_bind_rate)
        self.kubelet = Kubelets(self.store, start_delay=start_delay, terminate_delay=terminate_delay)
        self._kubeconfigs: dict[tuple[str, str], Path] = {}
        self._drivers: list[SparkDriver] = []
        # The ReplicaSet controller's client-side rate limit, shared by the Deployment drivers
        # (kube-controller-manager's defaults): None, a controller that is never throttled.
        self.replicaset_client = (
            TokenBucket(controller_qps, controller_burst) if controller_qps is not None else None
        )
        self._changed = threading.Condition()
        self._recent: collections.deque[tuple[str, str, str, str, bool, bool, str]] = collections.deque(
            maxlen=RECENT_POD_EVENTS
        )
        self._version = 0
        self._unsubscribe = self.store.subscribe(self._on_change)
        for name, value in SYSTEM_PRIORITY_CLASSES.items():
            self.add_priority_class(name, value, description="Used for system critical pods that must run.")
        for name in namespaces:
            self.store.create("namespaces", {"metadata": {"name": name}})
        for i in range(nodes):
            self.add_node(f"node-{i + 1}", cpu=node_cpu, memory=node_memory, pods=node_pods)
        self.add_user(ADMIN.username, ADMIN.groups)
        self.autoscaler = Autoscaler(self.store, autoscaler, on_loop=self.notify) if autoscaler else None

    # --- setup ----------------------------------------------------------------------------------------

    def add_node(
        self,
        name: str,
        *,
        cpu: str,
        memory: str,
        pods: int = 110,
        labels: Mapping[str, str] | None = None,
        taints: Sequence[Mapping[str, Any]] = (),
    ) -> None:
        self.store.create(
            "nodes", node_object(name, cpu=cpu, memory=memory, pods=pods, labels=labels, taints=taints)
        )

    def add_namespace(self, name: str, labels: Mapping[str, str] | None = None) -> None:
        self.store.create("namespaces", {"metadata": {"name": name, "labels": dict(labels or {})}})

    def add_service_account(self, namespace: str, name: str) -> None:
        self.store.create("serviceaccounts", {"metadata": {"name": name}}, namespace=namespace)

    def add_priority_class(
        self,
        name: str,
        value: int,
        *,
        global_default: bool = False,
        preemption_policy: str = "PreemptLowerPriority",
        description: str = "",
    ) -> None:
        """A scheduling.k8s.io/v1 PriorityClass (preemptionPolicy defaults as the API defaults it)."""
        body: dict[str, Any] = {
            "metadata": {"name": name},
            "value": value,
            "globalDefault": global_default,
            "preemptionPolicy": preemption_policy,
        }
        if description:
            body["description"] = description
        self.store.create("priorityclasses", body)

    def add_runtime_class(
        self,
        name: str,
        handler: str,
        *,
        overhead: Mapping[str, str] | None = None,
        node_selector: Mapping[str, str] | None = None,
        tolerations: Sequence[Mapping[str, Any]] = (),
    ) -> None:
        """A node.k8s.io/v1 RuntimeClass with `overhead.podFixed` and `scheduling`, when given."""
        body: dict[str, Any] = {"metadata": {"name": name}, "handler": handler}
        if overhead:
            body["overhead"] = {"podFixed": dict(overhead)}
        if node_selector or tolerations:
            body["scheduling"] = {
                "nodeSelector": dict(node_selector or {}),
                "tolerations": [dict(t) for t in tolerations],
            }
        self.store.create("runtimeclasses", body)

    def add_user(self, username: str, groups: Sequence[str] = (), *, pod: str = "") -> Path:
        """A user with a bearer token; returns a kubeconfig file that authenticates as it. `pod`: a service
        account token bound to that pod (each replica of a service account has its own)."""
        if (username, pod) in self._kubeconfigs:
            return self._kubeconfigs[(username, pod)]
        token = secrets.token_hex(16)
        self.apiserver.add_user(
            token, UserInfo(username, secrets.token_hex(4), (*groups, "system:authenticated"), pod)
        )
        name = f"{username}-{pod}" if pod else username
        safe = "".join(c if c.isalnum() else "-" for c in name)
        path = write_kubeconfig(self.workdir / f"kubeconfig-{safe}", self.url, token)
        self._kubeconfigs[(username, pod)] = path
        return path

    def kubeconfig(self, user: str = "admin") -> Path:
        return self.add_user(user)

    def register_service(self, namespace: str, name: str, base_url: str) -> None:
        """Where a webhook's clientConfig.service points (the test's or demo's local webhook)."""
        self.admission.services[(namespace, name)] = base_url

    # --- drivers ----------------------------------------------------------------------------------------

    def spark_driver(
        self,
        namespace: str,
        app_name: str,
        *,
        executors: int,
        user: str | None = None,
        start: bool = True,
        **options: Any,
    ) -> SparkDriver:
        kubeconfig = self.add_user(user or f"system:serviceaccount:{namespace}:spark")
        options.setdefault("replicaset_client", self.replicaset_client)
        driver = SparkDriver(str(kubeconfig), namespace, app_name, executors=executors, **options)
        self._drivers.append(driver)
        return driver.start() if start else driver

    # --- waiting ---------------------------------------------------------------------------------------

    def _on_change(self, kind: str, resource: str, obj: dict[str, Any]) -> None:
        if resource == "pods":
            # On every pod change (benchmarks included): the fields only, formatted when `history` is asked.
            meta, spec = obj["metadata"], obj.get("spec") or {}
            self._recent.append(
                (
                    meta.get("namespace", ""),
                    meta["name"],
                    kind,
                    meta["resourceVersion"],
                    bool(spec.get("schedulingGates")),
                    bool(spec.get("nodeName")),
                    (obj.get("status") or {}).get("phase", ""),
                )
            )
        with self._changed:
            self._version += 1
            self._changed.notify_all()

    def history(self, namespace: str, name: str) -> list[str]:
        """What the store did to one pod among its last RECENT_POD_EVENTS pod events, and the requests that
        named it (a creation names no pod: its path is the collection's)."""
        events = [
            f"{kind} {rv} {'gated' if gated else 'bound' if bound else 'ungated'} {phase}"
            for ns, n, kind, rv, gated, bound, phase in list(self._recent)
            if (ns, n) == (namespace, name)
        ]
        asked = [
            f"{e.verb} {e.subresource or ''} {e.code} by {e.identity} at rv {e.resource_version}".replace(
                "  ", " "
            )
            for e in self.requests.entries()
            if e.namespace == namespace and e.name == name
        ]
        return events + asked

    def notify(self) -> None:
        """Wake waiters for a change that is not in the store (e.g. a driver's own state)."""
        self._on_change("", "", {})

    def wait_for(self, predicate: Callable[[], bool], timeout: float = 30.0, what: str = "") -> None:
        """Re-evaluates `predicate` after every store change until it holds. The predicate runs outside the
        lock: the store delivers its changes to every listener (the scheduler and the kubelets included) from one thread, which
        must never wait for a predicate's own HTTP calls."""
        deadline = time.monotonic() + timeout
        while True:
            with self._changed:
                seen = self._version
            if predicate():
                return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                # Every thread's stack on stderr (pytest shows it with the failure): a wait that expires
                # because the simulated cluster stopped making progress says where each thread was.
                faulthandler.dump_traceback(all_threads=True)
                raise TimeoutError(
                    f"timed out after {timeout}s waiting for {what or predicate}; the cluster: {self.describe()}"
                )
            with self._changed:
                # Woken by a store change since `seen`; the bounded wait only re-checks state kept outside the
                # store.
                if self._version == seen:
                    self._changed.wait(min(remaining, 0.5))

    def describe(self) -> str:
        """What the simulated cluster is doing, in a line: a wait that expires says it in its message (CI
        shows the message when it cuts the captured output)."""
        states: dict[str, Counter[str]] = {}
        pods, _, _ = self.store.list_objects("pods")
        for pod in pods:
            meta, spec, status = pod["metadata"], pod.get("spec") or {}, pod.get("status") or {}
            state = (
                "deleting" if meta.get("deletionTimestamp")
                else "gated" if spec.get("schedulingGates")
                else "unbound" if not spec.get("nodeName")
                else (status.get("phase") or "Pending").lower()
            )  # fmt: skip
            states.setdefault(meta.get("namespace", ""), Counter())[state] += 1
        drivers = [
            f"{d.namespace}/{d.app_name}: target {d.target}, seen {len(d.pods())}, running {d.running()}, "
            f"created {len(d.created)}, unseen {sorted(d.unseen())}, failures {d.failures}"
            + "".join(f" [{d.executor_name(i)}: {self.history(d.namespace, d.executor_name(i))}]" for i in sorted(d.unseen()))
            + (f" its watch: {d.trail()}" if d.unseen() else "")
            + (", dead" if d.dead else "") + (", stopped" if d.finished else "")
            for d in self._drivers
        ]  # fmt: skip
        return "; ".join(
            [
                f"store rv {self.store.resource_version}, dispatched {self.store.dispatched}",
                *(f"pods in {ns}: {dict(c)}" for ns, c in sorted(states.items())),
                f"scheduler: {self.scheduler.describe()}",
                f"kubelets: {self.kubelet.describe()}",
                *([f"autoscaler: {self.autoscaler.describe()}"] if self.autoscaler else []),
                *drivers,
            ]
        )

    # --- lifecycle -------------------------------------------------------------------------------------

    def start(self) -> Cluster:
        self.apiserver.start()
        self.scheduler.start()
        self.kubelet.start()
        if self.autoscaler:
            self.autoscaler.start()
        return self

    def stop(self) -> None:
        for driver in self._drivers:
            driver.stop()
        if self.autoscaler:
            self.autoscaler.stop()
        self.scheduler.stop()
        self.kubelet.stop()
        self.apiserver.stop()
        self._unsubscribe()
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
