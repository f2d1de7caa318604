"""The whole system on kubesim: the real webhook (gunicorn, TLS) registered in the simulated API server,
real allocator processes, simulated Spark drivers, and an observer that checks the limits at every change."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import threading
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from kubesim.cluster import Cluster
from sparkgate import contract
from webhook.local import LocalWebhook, free_port

ALLOCATOR_USER = "system:serviceaccount:sparkgate-system:sparkgate-allocator"


def webhook_configurations(
    w: LocalWebhook, failure_policy: str = "Ignore"
) -> tuple[dict[str, Any], dict[str, Any]]:
    ca = base64.b64encode(w.ca_pem).decode()
    common = {
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "failurePolicy": failure_policy,
        "timeoutSeconds": 5,
        "objectSelector": {"matchLabels": {"spark-role": "executor"}},
        "namespaceSelector": {
            "matchExpressions": [
                {
                    "key": "kubernetes.io/metadata.name",
                    "operator": "NotIn",
                    "values": ["kube-system", "sparkgate-system"],
                }
            ]
        },
    }
    mutating = {
        "metadata": {"name": "sparkgate"},
        "webhooks": [
            {
                "name": "executors.sparkgate.io",
                "clientConfig": {"url": f"{w.url}/mutate", "caBundle": ca},
                "rules": [
                    {
                        "operations": ["CREATE"],
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "resources": ["pods"],
                    }
                ],
                "reinvocationPolicy": "Never",
                **common,
            }
        ],
    }
    validating = {
        "metadata": {"name": "sparkgate"},
        "webhooks": [
            {
                "name": "gate.sparkgate.io",
                "clientConfig": {"url": f"{w.url}/validate", "caBundle": ca},
                "rules": [
                    {
                        "operations": ["UPDATE"],
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "resources": ["pods"],
                    }
                ],
                **common,
            }
        ],
    }
    return mutating, validating


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


def leader(cluster: Cluster) -> str | None:
    """The holder of the allocator's Lease (the allocator serves HTTP before it campaigns)."""
    leases, _, _ = cluster.store.list_objects("leases", "sparkgate-system")
    holders = [
        (lease.get("spec") or {}).get("holderIdentity")
        for lease in leases
        if lease["metadata"]["name"] == "sparkgate-allocator"
    ]
    return holders[0] if holders and holders[0] else None


class AllocatorProcess:
    def __init__(self, cluster: Cluster, policy: Path, workdir: Path, identity: str = "alloc-1") -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        kubeconfig = cluster.add_user(ALLOCATOR_USER)
        self.log = workdir / f"{identity}.log"
        args = [
            sys.executable, "-m", "sparkgate.cli", "allocator",
            "--kubeconfig", str(kubeconfig), "--policy", str(policy), "--namespace", "sparkgate-system",
            "--http", f"127.0.0.1:{self.port}", "--identity", identity, "--tick", "0.2",
            "--lease-duration", "2", "--renew-deadline", "1.5", "--retry-period", "0.3", "--log-level", "info",
        ]  # fmt: skip
        with open(self.log, "ab") as log:
            self.process = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    def apps(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"{self.url}/apps", timeout=5) as r:
            document: dict[str, Any] = json.loads(r.read())
            return document

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"{self.url}{path}", timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, sig)
            self.process.wait(timeout=20)

    def stop(self) -> None:
        self.kill(signal.SIGTERM)


@pytest.fixture
def system(tmp_path: Path) -> Iterator[Any]:
    """Build on demand: system(policy=..., nodes=...) -> (cluster, webhook, [allocators], observer)."""
    resources: list[Any] = []

    def build(
        *,
        nodes: int = 5,
        node_cpu: str = "10",
        allocators: int = 1,
        max_bind_rate: float | None = None,
        config_maps: str = "[]",
        **policy: Any,
    ) -> tuple[Cluster, LocalWebhook, list[AllocatorProcess], Observer]:
        cluster = Cluster(
            nodes=nodes,
            node_cpu=node_cpu,
            node_memory="1000Gi",
            bookmark_interval=0.5,
            max_bind_rate=max_bind_rate,
        ).start()
        resources.append(cluster)
        cluster.add_namespace("spark")
        cluster.add_namespace("spark-b")
        path = write_policy(tmp_path / "policy.yaml", config_maps=config_maps, **policy)
        w = LocalWebhook(path, tmp_path / "webhook", allocator_users=(ALLOCATOR_USER,))
        (tmp_path / "webhook").mkdir(exist_ok=True)
        w.start()
        resources.append(w)
        mutating, validating = webhook_configurations(w)
        cluster.store.create("mutatingwebhookconfigurations", mutating)
        cluster.store.create("validatingwebhookconfigurations", validating)
        procs = []
        for i in range(allocators):
            proc = AllocatorProcess(cluster, path, tmp_path, f"alloc-{i + 1}")
            resources.append(proc)
            procs.append(proc)
        if allocators:
            cluster.wait_for(
                lambda: leader(cluster) is not None, timeout=60, what="an allocator to take the lease"
            )
        observer = Observer(
            cluster,
            policy.get("per_app", 20),
            policy.get("per_ns", 200),
            policy.get("cluster", 500),
            policy.get("batch", 10),
        )
        return cluster, w, procs, observer

    yield build
    for resource in reversed(resources):
        resource.stop()
