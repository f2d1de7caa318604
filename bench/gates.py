"""Gate removal throughput: the real allocator removing the gates of N gated executors on kubesim, against the
floor, a bare loop of the same PATCHes with the official client on the same kubesim in the same run.

kubesim runs in this process (its API server over HTTP, Nagle off as in bench/refill.py); its scheduler and
kubelets are stopped so that neither run pays for binding and starting pods the other did not, and there is
no webhook (the gate-protection check would cost both runs the same). The policy leaves room for all: each
app's one batch is all its pods, the pending limits are above N.

- floor: N gated pods; one thread sends each pod's JSON Patch (`test` of the gate's entry, then `remove`, as
  allocator/actor.py sends it) with `CoreV1Api.patch_namespaced_pod` of the official client, raw
  (`_preload_content=False`: no model decoding), one after the other on one keep-alive connection. Run
  before and after the actor's run (the machine's load moves: the faster of the two is the floor);
- actor: N gated pods in namespace `spark-bench`, `--apps` apps, then `sparkgate allocator` started as its own
  process with `--kube-api-qps` / `--kube-api-burst` high enough not to bind (reported); it lists them and
  releases every app's batch through its actor. A store listener stamps each gate removal; the rate is
  (N - 1) / (first to last removal) for both runs. CPU shares (CPU seconds / wall seconds, per process) say
  which side is saturated: kubesim in this process, the allocator in its own;
- latency: the allocator's `sparkgate_allocator_gate_removal_seconds` over the run (quantiles interpolated in
  its buckets, as Prometheus' histogram_quantile does): all N are seen at once, so it is the queue. Then the
  paced run: `--paced` more gated pods, one app each, created at `--paced-rate` a second while the allocator
  runs, each timed exactly from its creation to its gate removal (store commits, one clock): watch delivery,
  decision, actor, PATCH.

Target (issue 19): actor removals/s >= 0.8 x the floor's.

    python -m bench.gates [--executors 5000] [--apps 10] [--smoke]
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from kubernetes import client as k8s
from kubernetes import config as k8s_config

import kubesim.apiserver
from kubesim.cluster import Cluster
from sandbox.localsystem import AllocatorProcess
from sparkgate import contract

from . import common
from .common import Row, fmt

NAME = "gates"
RATIO_TARGET = 0.8
FLOORS, ACTOR = ("floor-before", "floor-after"), "spark-bench"

POLICY = """\
apiVersion: sparkgate.io/v1alpha1
kind: Policy
allocation: {{batchSize: {batch}, batchDelaySeconds: 0, maxPendingPerApp: {batch},
  maxPendingPerNamespace: 1000000, maxPendingCluster: 1000000}}
caps: {{batchSize: {batch}, maxPendingPerApp: {batch}}}
profiles:
  - name: default
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--executors", type=int, default=5000, help="gated executors in each run")
    parser.add_argument("--apps", type=int, default=10, help="apps the actor run's executors belong to")
    parser.add_argument("--qps", type=float, default=100_000, help="the allocator's --kube-api-qps")
    parser.add_argument("--burst", type=int, default=10_000, help="the allocator's --kube-api-burst")
    parser.add_argument("--paced", type=int, default=500, help="paced run: gated pods created one by one")
    parser.add_argument("--paced-rate", type=float, default=100.0, help="paced run: creations per second")
    parser.add_argument("--timeout", type=float, default=600.0)


def gated_pod(namespace: str, app: str, exec_id: int) -> dict[str, Any]:
    """An executor pod as the webhook admits it: Spark's labels, the profile annotation, the gate."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{app}-exec-{exec_id}",
            "namespace": namespace,
            "labels": {
                contract.LABEL_ROLE: contract.ROLE_EXECUTOR,
                contract.LABEL_APP_ID: app,
                contract.LABEL_EXEC_ID: str(exec_id),
                "spark-exec-resourceprofile-id": "0",
            },
            "annotations": {contract.ANNOTATION_PROFILE: "default"},
        },
        "spec": {
            "containers": [
                {
                    "name": "spark-kubernetes-executor",
                    "image": "apache/spark:4.0.0",
                    "resources": {"requests": {"cpu": "1", "memory": "1Gi"}},
                }
            ],
            "schedulingGates": [{"name": contract.GATE}],
        },
    }


class Removals:
    """When each gate was removed and each gated pod created, by namespace (a store listener: every
    committed change, in order, stamped with one clock)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.created: dict[str, float] = {}  # uid -> creation
        self.removed: dict[str, dict[str, float]] = {}  # namespace -> uid -> gate removal
        self.done = threading.Condition(self.lock)

    def on_change(self, kind: str, resource: str, obj: dict[str, Any]) -> None:
        if resource != "pods" or kind == "DELETED":
            return
        now = time.perf_counter()
        meta = obj["metadata"]
        gated = any(g.get("name") == contract.GATE for g in obj["spec"].get("schedulingGates") or ())
        with self.lock:
            if kind == "ADDED" and gated:
                self.created[meta["uid"]] = now
            elif not gated and meta["uid"] in self.created:
                removed = self.removed.setdefault(meta["namespace"], {})
                if meta["uid"] not in removed:
                    removed[meta["uid"]] = now
                    self.done.notify_all()

    def count(self, namespace: str) -> int:
        return len(self.removed.get(namespace, {}))

    def wait(self, namespace: str, n: int, timeout: float) -> None:
        with self.lock:
            if not self.done.wait_for(lambda: self.count(namespace) >= n, timeout):
                raise TimeoutError(
                    f"{self.count(namespace)} of {n} gates removed in {namespace} in {timeout} s"
                )

    def rate(self, namespace: str) -> tuple[float, float]:
        """(removals per second from the first to the last, those seconds)."""
        with self.lock:
            times = sorted(self.removed[namespace].values())
        span = times[-1] - times[0]
        return ((len(times) - 1) / span if span > 0 else float("nan")), span


def cpu_seconds(pid: int) -> float:
    """CPU seconds used so far by the process group `pid` leads (Linux /proc)."""
    user, system = common.group_cpu_seconds(pid)
    return user + system


def floor_run(cluster: Cluster, removals: Removals, namespace: str, n: int, timeout: float) -> dict[str, Any]:
    configuration = k8s.Configuration()
    k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
        config_file=str(cluster.add_user("bench-floor", ["system:masters"])),
        client_configuration=configuration,
    )
    api = k8s.ApiClient(configuration)
    core = k8s.CoreV1Api(api)
    patch: list[dict[str, Any]] = [
        {"op": "test", "path": "/spec/schedulingGates/0", "value": {"name": contract.GATE}},
        {"op": "remove", "path": "/spec/schedulingGates/0"},
    ]
    names = [
        cluster.store.create("pods", gated_pod(namespace, "floor", i))["metadata"]["name"] for i in range(n)
    ]
    cpu, wall = time.process_time(), time.perf_counter()
    try:
        for name in names:
            response: Any = core.patch_namespaced_pod(  # raw: an urllib3 response, not a V1Pod
                name, namespace, patch, _content_type="application/json-patch+json", _preload_content=False
            )
            response.read()
            if response.status != 200:
                raise RuntimeError(f"floor PATCH of {name}: {response.status} {response.data[:200]!r}")
    finally:
        api.close()  # type: ignore[no-untyped-call]
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    removals.wait(namespace, n, timeout)
    rate, span = removals.rate(namespace)
    return {
        "removals": n,
        "seconds": round(span, 3),
        "per_second": round(rate, 1),
        "bench_process_cpu_share": round(cpu / wall, 2),  # kubesim and the loop's client together
    }


def metric_quantiles(text: str, name: str, quantiles: tuple[float, ...]) -> dict[str, float | int]:
    """Quantiles of a Prometheus histogram from its exposition text, interpolated linearly within the bucket
    that holds each rank (histogram_quantile's rule), and its count."""
    buckets = sorted(
        (float("inf") if le == "+Inf" else float(le), float(v))
        for le, v in re.findall(rf'^{name}_bucket{{le="([^"]+)"}} (\S+)$', text, re.M)
    )
    count = buckets[-1][1] if buckets else 0.0
    out: dict[str, float | int] = {"count": int(count)}
    for q in quantiles:
        rank, lower, below = q * count, 0.0, 0.0
        for upper, cumulative in buckets:
            if cumulative >= rank:
                if upper == float("inf"):
                    value = lower
                else:
                    share = (rank - below) / (cumulative - below) if cumulative > below else 1.0
                    value = lower + (upper - lower) * share
                out[f"p{round(q * 100)}"] = round(value * 1000, 1)
                break
            lower, below = upper, cumulative
    return out


def removal_metric(allocator: AllocatorProcess, n: int, timeout: float) -> dict[str, float | int]:
    """The allocator's gate-removal histogram once it counts all `n` (the store commits a PATCH before the
    allocator reads its answer and observes it)."""
    deadline = time.monotonic() + timeout
    while True:
        found = metric_quantiles(
            allocator.get("/metrics")[1], "sparkgate_allocator_gate_removal_seconds", (0.5, 0.99)
        )
        if found["count"] >= n or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def actor_run(
    cluster: Cluster, removals: Removals, args: argparse.Namespace, workdir: Path
) -> dict[str, Any]:
    n, apps = args.executors, args.apps
    per_app = -(-n // apps)
    policy = workdir / "policy.yaml"
    policy.write_text(POLICY.format(batch=per_app))
    for i in range(n):
        cluster.store.create("pods", gated_pod(ACTOR, f"spark-app-{i % apps}", i // apps + 1))
    allocator = AllocatorProcess(
        cluster,
        policy,
        workdir,
        log_level="warning",
        extra_args=("--kube-api-qps", str(args.qps), "--kube-api-burst", str(args.burst)),
    )
    try:
        bench_cpu, allocator_cpu, wall = time.process_time(), cpu_seconds(allocator.process.pid), None
        removals.wait(ACTOR, 1, args.timeout)
        bench_cpu, allocator_cpu, wall = (
            time.process_time(),
            cpu_seconds(allocator.process.pid),
            time.perf_counter(),
        )
        removals.wait(ACTOR, n, args.timeout)
        wall = time.perf_counter() - wall
        bench_cpu = time.process_time() - bench_cpu
        allocator_cpu = cpu_seconds(allocator.process.pid) - allocator_cpu
        rate, span = removals.rate(ACTOR)
        burst = removal_metric(allocator, n, args.timeout)
        paced = paced_run(cluster, removals, allocator, args)
    finally:
        allocator.stop()
    return {
        "removals": n,
        "apps": apps,
        "kube_api_qps": args.qps,
        "kube_api_burst": args.burst,
        "seconds": round(span, 3),
        "per_second": round(rate, 1),
        "kubesim_cpu_share": round(bench_cpu / wall, 2) if wall else None,
        "allocator_cpu_share": round(allocator_cpu / wall, 2) if wall else None,
        "gate_removal_metric_ms": burst,
        "paced": paced,
    }


def paced_run(
    cluster: Cluster, removals: Removals, allocator: AllocatorProcess, args: argparse.Namespace
) -> dict[str, Any]:
    """Gated pods created one by one at a steady rate, one app each (no batch waits for another's bind)."""
    interval = 1.0 / args.paced_rate
    uids = []
    started = time.perf_counter()
    for i in range(args.paced):
        delay = started + i * interval - time.perf_counter()
        if delay > 0:
            time.sleep(delay)  # the pace of the load, not a wait for a condition
        uids.append(cluster.store.create("pods", gated_pod(ACTOR, f"spark-paced-{i}", 1))["metadata"]["uid"])
    removals.wait(ACTOR, args.executors + args.paced, args.timeout)
    with removals.lock:
        latencies = [(removals.removed[ACTOR][u] - removals.created[u]) * 1000 for u in uids]
    return {
        "pods": args.paced,
        "rate_per_second": args.paced_rate,
        "created_to_removed_ms": {
            "p50": round(common.percentile(latencies, 0.5), 1),
            "p99": round(common.percentile(latencies, 0.99), 1),
            "max": round(max(latencies), 1),
        },
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.smoke:
        args.executors, args.apps, args.paced, args.paced_rate = 100, 2, 20, 50.0
    kubesim.apiserver._Handler.disable_nagle_algorithm = True  # see bench/refill.py: ~40 ms per request
    removals = Removals()
    with (
        tempfile.TemporaryDirectory(prefix="bench-gates-") as tmp,
        Cluster(nodes=1, node_cpu="100000") as cluster,
    ):
        cluster.scheduler.stop()
        cluster.kubelet.stop()
        for namespace in (*FLOORS, ACTOR):
            cluster.add_namespace(namespace)
        unsubscribe = cluster.store.subscribe(removals.on_change)
        try:
            before = floor_run(cluster, removals, FLOORS[0], args.executors, args.timeout)
            actor = actor_run(cluster, removals, args, Path(tmp))
            after = floor_run(cluster, removals, FLOORS[1], args.executors, args.timeout)
        finally:
            unsubscribe()
    floor = max(before, after, key=lambda f: float(f["per_second"]))
    return {
        "config": {"executors": args.executors, "apps": args.apps, "paced": args.paced},
        "floor": floor,
        "floor_runs": [before, after],
        "actor": actor,
        "ratio": round(actor["per_second"] / floor["per_second"], 3),
        "targets": {"ratio_min": RATIO_TARGET},
    }


def rows(result: dict[str, Any]) -> list[Row]:
    floor, actor = result["floor"], result["actor"]
    metric, paced = actor["gate_removal_metric_ms"], actor["paced"]
    return [
        Row(
            f"floor: bare loop of {floor['removals']:,} PATCHes (official client), before / after",
            " / ".join(
                f"{fmt(f['per_second'])}/s (this process' CPU share {f['bench_process_cpu_share']:.2f})"
                for f in result["floor_runs"]
            ),
        ),
        Row(
            f"actor: {actor['removals']:,} gate removals, {actor['apps']} apps",
            f"{fmt(actor['per_second'])}/s = x{result['ratio']:.3f} the floor (CPU share: kubesim "
            f"{actor['kubesim_cpu_share']:.2f}, allocator {actor['allocator_cpu_share']:.2f})",
            f">= x{RATIO_TARGET}",
            result["ratio"] >= RATIO_TARGET,
        ),
        Row(
            "gate removal metric p50 / p99 (all seen at once)",
            f"{metric.get('p50', 0):,.1f} / {metric.get('p99', 0):,.1f} ms over {metric['count']:,}",
        ),
        Row(
            f"paced: {paced['pods']} at {paced['rate_per_second']:g}/s, created to removed p50 / p99",
            f"{paced['created_to_removed_ms']['p50']:.1f} / {paced['created_to_removed_ms']['p99']:.1f} ms",
        ),
    ]


if __name__ == "__main__":
    sys.exit(common.main(sys.modules[__name__]))
