"""How fast the allocator refills a freed slot, and how many API requests it spends per released executor.

Not a test: it prints numbers. Everything is the production path on kubesim: simulated Spark drivers create
executor pods over HTTP, the real webhook (gunicorn, TLS) gates them, and `sparkgate allocator` runs as its
own process with its own service account. The measurement itself is in-process and exact: the store calls
`subscribe` listeners after every committed change, in order, so each bind, start and gate removal gets a
timestamp from one monotonic clock with no watch latency of our own in between.

Refill latency is measured per app from the last event that could have unblocked the app (a bind, which
completes the previous batch, or a start, which frees an in-flight slot) to the first gate removal after it.
A release that follows the creation of a gated pod (room was already there) is reported apart. Only the
first removal of a batch is counted (the rest of the batch follows as consecutive patches), and
the policy's batchDelaySeconds is 0 so that the number is the allocator's reaction, not the configured pace.

    python -m bench.refill --apps 3 --executors 200
"""

from __future__ import annotations

import argparse
import base64
import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kubesim.apiserver
from kubesim.cluster import Cluster
from sparkgate import contract
from webhook.local import LocalWebhook, free_port
from webhook.review import DEFAULT_ALLOCATOR_USER

NAMESPACE = "spark-bench"
INSTALL = "sparkgate-system"
LEASE = "sparkgate-allocator"

POLICY = """\
apiVersion: sparkgate.io/v1alpha1
kind: Policy
allocation:
  batchSize: {batch}
  batchDelaySeconds: 0
  maxPendingPerApp: {pending}
  maxPendingPerNamespace: {namespace_pending}
  maxPendingCluster: {namespace_pending}
caps:
  batchSize: {batch}
  maxPendingPerApp: {pending}
profiles:
  - name: default
"""


class Timeline:
    """Per-app bind/start/release times, recorded by a store listener."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.lock = threading.Lock()
        self.state: dict[tuple[str, str], tuple[bool, bool, bool]] = {}  # (gated, bound, running)
        self.trigger: dict[str, tuple[str, float]] = {}  # app -> (kind, time) since its last release
        self.latencies: dict[str, list[float]] = collections.defaultdict(list)  # trigger kind -> seconds
        self.slowest: list[tuple[float, str, str, float, str]] = []  # (seconds, trigger kind, app, at, mix)
        self.app_of: dict[tuple[str, str], str] = {}
        self.releases = 0
        self.batches = 0

    def on_change(self, kind: str, resource: str, obj: dict[str, Any]) -> None:
        if resource != "pods" or kind == "DELETED":
            return
        meta = obj.get("metadata") or {}
        labels = meta.get("labels") or {}
        if labels.get(contract.LABEL_ROLE) != contract.ROLE_EXECUTOR:
            return
        now = self.clock()
        app = labels.get(contract.LABEL_APP_ID, "")
        spec = obj.get("spec") or {}
        gated = any(g.get("name") == contract.GATE for g in spec.get("schedulingGates") or ())
        bound = bool(spec.get("nodeName"))
        running = (obj.get("status") or {}).get("phase") == "Running"
        key = (meta.get("namespace", ""), meta.get("name", ""))
        with self.lock:
            self.app_of[key] = app
            if key not in self.state and gated:
                self.trigger[app] = ("create", now)
            was_gated, was_bound, was_running = self.state.get(key, (gated, False, False))
            self.state[key] = (gated, bound, running)
            if bound and not was_bound:
                self.trigger[app] = ("bind", now)
            if running and not was_running:
                self.trigger[app] = ("start", now)
            if was_gated and not gated:
                self.releases += 1
                trigger = self.trigger.pop(app, None)
                if trigger is not None:
                    self.batches += 1
                    self.latencies[trigger[0]].append(now - trigger[1])
                    mix = collections.Counter(v for k, v in self.state.items() if self.app_of.get(k) == app)
                    self.slowest = sorted(
                        [*self.slowest, (now - trigger[1], trigger[0], app, now, str(dict(mix)))]
                    )[-5:]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def webhook_configuration(webhook: LocalWebhook) -> dict[str, Any]:
    hook = {
        "name": "executors.sparkgate.io",
        "clientConfig": {
            "url": webhook.url + "/mutate",
            "caBundle": base64.b64encode(webhook.ca_pem).decode(),
        },
        "rules": [
            {"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}
        ],
        "objectSelector": {"matchLabels": {contract.LABEL_ROLE: contract.ROLE_EXECUTOR}},
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "failurePolicy": "Ignore",
        "timeoutSeconds": 5,
    }
    return {"metadata": {"name": "sparkgate"}, "webhooks": [hook]}


def start_allocator(
    cluster: Cluster, policy: Path, workdir: Path, tick: float, log_level: str
) -> tuple[subprocess.Popen[bytes], str]:
    kubeconfig = cluster.add_user(DEFAULT_ALLOCATOR_USER, ["system:serviceaccounts"])
    port = free_port()
    args = [
        sys.executable,
        "-m",
        "sparkgate.cli",
        "allocator",
        "--kubeconfig",
        str(kubeconfig),
        "--policy",
        str(policy),
        "--namespace",
        INSTALL,
        "--http",
        f"127.0.0.1:{port}",
        "--lease-name",
        LEASE,
        "--identity",
        "bench",
        "--tick",
        str(tick),
        "--log-level",
        log_level,
    ]
    with open(workdir / "allocator.log", "ab") as log:
        process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return process, f"http://127.0.0.1:{port}"


def lease_held(cluster: Cluster) -> bool:
    try:
        lease = cluster.store.get("leases", INSTALL, LEASE)
    except Exception:
        return False
    return (lease.get("spec") or {}).get("holderIdentity") == "bench"


def run(args: argparse.Namespace) -> dict[str, Any]:
    # kubesim's handler writes the headers and the body of an answer in two send()s without TCP_NODELAY:
    # Nagle holds the body until the client's delayed ACK (~40 ms), so every request costs ~44 ms instead
    # of ~1 ms. That measures the simulator, not the allocator: switch Nagle off unless asked to keep it.
    kubesim.apiserver._Handler.disable_nagle_algorithm = not args.keep_nagle
    executors_per_node = 40
    nodes = max(1, -(-args.apps * (args.executors + 1) // executors_per_node))  # + the driver pods
    with (
        tempfile.TemporaryDirectory(prefix="sparkgate-bench-") as tmp,
        Cluster(
            nodes=nodes,
            node_cpu="64",
            node_memory="256Gi",
            node_pods=executors_per_node,
            start_delay=args.start_delay,
        ) as cluster,
    ):
        workdir = Path(tmp)
        cluster.add_namespace(NAMESPACE)
        policy = workdir / "policy.yaml"
        policy.write_text(
            POLICY.format(
                batch=args.batch_size, pending=args.max_pending, namespace_pending=args.cluster_pending
            )
        )
        timeline = Timeline()
        unsubscribe = cluster.store.subscribe(timeline.on_change)
        allocator: subprocess.Popen[bytes] | None = None
        try:
            with LocalWebhook(
                policy, workdir / "webhook", allocator_users=(DEFAULT_ALLOCATOR_USER,)
            ) as webhook:
                cluster.store.create("mutatingwebhookconfigurations", webhook_configuration(webhook))
                allocator, _ = start_allocator(cluster, policy, workdir, args.tick, args.log_level)
                cluster.wait_for(
                    lambda: lease_held(cluster), timeout=60, what="the allocator to take the lease"
                )
                cluster.requests.clear()
                started = time.time()
                drivers = [
                    cluster.spark_driver(
                        NAMESPACE,
                        f"bench-{i}",
                        executors=args.executors,
                        batch_size=args.spark_batch,
                        batch_delay=0.2,
                        cpu="100m",
                        memory="256Mi",
                    )
                    for i in range(args.apps)
                ]
                total = args.apps * args.executors
                try:
                    cluster.wait_for(
                        lambda: sum(d.running() for d in drivers) == total,
                        timeout=args.timeout,
                        what=f"{total} executors running",
                    )
                except TimeoutError:
                    states = collections.Counter(timeline.state.values())
                    print(f"(gated, bound, running): {dict(states)}", file=sys.stderr)
                    print((workdir / "allocator.log").read_text()[-4000:], file=sys.stderr)
                    raise
                elapsed = time.time() - started
                requests = [e for e in cluster.requests.entries() if e.user == DEFAULT_ALLOCATOR_USER]
                for driver in drivers:
                    driver.stop()
        finally:
            unsubscribe()
            if allocator is not None:
                allocator.terminate()
                allocator.wait(timeout=30)
            if args.keep_log:
                Path(args.keep_log).write_bytes((workdir / "allocator.log").read_bytes())
    by_verb = collections.Counter(f"{e.verb} {e.resource}" for e in requests)
    writes = sum(n for key, n in by_verb.items() if key.split()[0] in ("create", "update", "patch", "delete"))
    result: dict[str, Any] = {
        "executors": total,
        "released": timeline.releases,
        "seconds_to_all_running": round(elapsed, 2),
        "api_requests": len(requests),
        "api_requests_per_released_executor": round(len(requests) / max(1, timeline.releases), 3),
        "api_writes_per_released_executor": round(writes / max(1, timeline.releases), 3),
        "requests_by_verb": dict(by_verb.most_common()),
    }
    result["slowest_refills"] = [
        {
            "ms": round(s * 1000, 1),
            "after": kind,
            "app": app[-6:],
            "at_s": round(at - started, 2),
            "at": round(at, 3),
            "app_pods": mix,
        }
        for s, kind, app, at, mix in reversed(timeline.slowest)
    ]
    for kind, values in sorted(timeline.latencies.items()):
        result[f"refill_after_{kind}_ms"] = {
            "count": len(values),
            "median": round(statistics.median(values) * 1000, 2),
            "p99": round(percentile(values, 0.99) * 1000, 2),
        }
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--apps", type=int, default=3)
    parser.add_argument("--executors", type=int, default=200, help="per app")
    parser.add_argument("--batch-size", type=int, default=10)
    parser.add_argument("--max-pending", type=int, default=20, help="maxPendingPerApp")
    parser.add_argument(
        "--cluster-pending", type=int, default=1000, help="maxPendingPerNamespace and Cluster"
    )
    parser.add_argument("--spark-batch", type=int, default=10, help="the drivers' allocation batch size")
    parser.add_argument("--start-delay", type=float, default=0.2, help="kubelet: bind to Running, seconds")
    parser.add_argument(
        "--tick", type=float, default=1.0, help="the allocator's --tick (time-based decisions)"
    )
    parser.add_argument("--keep-nagle", action="store_true", help="leave kubesim's ~40 ms Nagle stall in")
    parser.add_argument("--keep-log", help="copy the allocator's log here")
    parser.add_argument("--log-level", default="warning", help="the allocator's log level")
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args(argv)
    os.environ.setdefault("SPARKGATE_LOG_LEVEL", "warning")
    print(json.dumps(run(args), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
