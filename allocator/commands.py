"""`sparkgate allocator` (run the controller) and `sparkgate status` (show what it is doing)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import socket
import sys
import urllib.request
from typing import Any

from sparkgate import contract


def register(subparsers: Any) -> None:
    env = os.environ.get
    a = subparsers.add_parser("allocator", help="run the allocator controller")
    a.add_argument(
        "--kubeconfig",
        default=env("KUBECONFIG"),
        help="kubeconfig file (default: in-cluster service account)",
    )
    a.add_argument("--policy", default=env("SPARKGATE_POLICY", "/etc/sparkgate/policy/policy.yaml"))
    a.add_argument(
        "--namespace",
        default=env("SPARKGATE_NAMESPACE", contract.INSTALL_NAMESPACE),
        help="install namespace",
    )
    a.add_argument(
        "--http",
        default=env("SPARKGATE_ALLOCATOR_HTTP", "0.0.0.0:8080"),
        help="HOST:PORT of /metrics, /apps, probes",
    )
    a.add_argument("--lease-name", default=env("SPARKGATE_LEASE", contract.ALLOCATOR_LEASE))
    a.add_argument("--identity", default=env("POD_NAME", socket.gethostname()))
    a.add_argument(
        "--tick", type=float, default=1.0, help="seconds between full decisions (time-based conditions)"
    )
    a.add_argument("--lease-duration", type=float, default=15.0)
    a.add_argument("--renew-deadline", type=float, default=10.0)
    a.add_argument("--retry-period", type=float, default=2.0)
    a.add_argument("--log-level", default=env("SPARKGATE_LOG_LEVEL", "info"))
    # --- policy probe (issue 12) ---
    a.add_argument(
        "--probe-interval",
        type=float,
        default=300.0,
        help="seconds between dry-run probes of the policy's profiles while leading (0: never)",
    )
    # --- end policy probe ---
    a.set_defaults(run=run_allocator)

    s = subparsers.add_parser("status", help="show the allocator's view of every app")
    s.add_argument("--url", default=env("SPARKGATE_ALLOCATOR_URL", "http://127.0.0.1:8080"))
    s.add_argument("--json", action="store_true", help="print the raw /apps document")
    s.set_defaults(run=run_status)


def run_allocator(args: argparse.Namespace) -> int:
    from sparkgate.kube import Kube
    from sparkgate.policy_file import PolicySource

    from .http import StatusServer
    from .loop import Controller, Options
    from .metrics import AllocatorMetrics

    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    metrics = AllocatorMetrics()
    kube = Kube.from_kubeconfig(
        args.kubeconfig,
        on_request=lambda verb, resource, code: metrics.api_requests.labels(verb, resource, str(code)).inc(),
    )
    policy = PolicySource(args.policy, args.namespace, on_reload=metrics.on_reload)
    options = Options(
        install_namespace=args.namespace,
        identity=args.identity,
        lease_name=args.lease_name,
        tick=args.tick,
        lease_duration=args.lease_duration,
        renew_deadline=args.renew_deadline,
        retry_period=args.retry_period,
    )
    controller = Controller(kube, policy, options, metrics)
    host, _, port = args.http.rpartition(":")
    server = StatusServer(controller, host or "0.0.0.0", int(port))
    signal.signal(signal.SIGTERM, lambda *_: controller.stop_event.set())
    server.start()
    controller.start()
    # --- policy probe (issue 12): the leader dry-runs each profile's executor pod (allocator/probe.py) ---
    if args.probe_interval > 0:
        from .probe import PolicyProbe

        PolicyProbe(kube, policy, metrics, args.namespace, args.identity, interval=args.probe_interval).start(
            controller.stop_event, lambda: controller.elector.leading
        )
    # --- end policy probe ---
    try:
        controller.run()
    except KeyboardInterrupt:
        pass
    finally:
        lost = controller.lost_lease.is_set()
        controller.stop()
        server.stop()
    if lost:
        logging.getLogger("sparkgate.allocator").error(
            "lost the lease: exiting so that no write happens without it"
        )
        return 1
    return 0


def run_status(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    try:
        with urllib.request.urlopen(args.url.rstrip("/") + "/apps", timeout=10) as r:
            document = json.loads(r.read())
    except OSError as e:
        print(f"cannot reach the allocator at {args.url}: {e}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(document, indent=2))
        return 0
    table = Table(
        title=f"sparkgate apps ({'leader' if document.get('leader') else 'follower'} {document.get('identity', '')})"
    )
    for column in (
        "namespace",
        "app id",
        "profile",
        "gated",
        "in flight",
        "running",
        "failed",
        "limits",
        "waiting for",
        "deletions",
        "refused nodes",
    ):
        table.add_column(column)
    for app in document["apps"]:
        limits = app.get("limits") or {}
        table.add_row(
            app["namespace"],
            app["appId"],
            app.get("profile") or "-",
            str(app["gated"]),
            str(app["inFlight"]),
            str(app["running"]),
            str(app["failed"]),
            f"batch {limits.get('batchSize', '-')}, max {limits.get('maxPendingPerApp', '-')}",
            app.get("waitingFor") or "",
            ", ".join(f"{k}={v}" for k, v in app.get("deletions", {}).items()),
            "\n".join(
                e["message"].replace("sparkgate: ", f"{e['node']}: ") for e in app.get("excludedNodes", [])
            ),
        )
    cluster = document.get("cluster", {})
    console = Console()
    console.print(table)
    console.print(
        f"cluster: {cluster.get('inFlight')} in flight of {cluster.get('maxPendingCluster')}, {cluster.get('gated')} gated"
    )
    return 0
