"""`sparkgate certs generate` (files, for a manual or GitOps install) and `sparkgate certs sync` (in-cluster).

Environment variables give the in-cluster defaults so that the manifests set them once for the pod:
SPARKGATE_NAMESPACE, SPARKGATE_CERT_SECRET, SPARKGATE_WEBHOOK_SERVICE, SPARKGATE_WEBHOOK_CONFIGURATION,
POD_NAME (the Lease identity), KUBECONFIG (absent in a pod: the service account is used).
SPARKGATE_CERTS_SYNC=false turns `certs sync` into a no-op: the cert-manager overlay sets it, since there
cert-manager owns the Secret and cainjector the caBundles.
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import os
import signal
import socket
import sys
import threading
from pathlib import Path
from typing import Any

from sparkgate import contract

from .material import fresh
from .pki import service_dns_names
from .plan import CA_CRT, CA_KEY, TLS_CRT, TLS_KEY, Lifetimes


def _days(value: str) -> dt.timedelta:
    return dt.timedelta(days=float(value))


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    env = os.environ.get
    certs = subparsers.add_parser("certs", help="the webhook's TLS certificates")
    verbs = certs.add_subparsers(dest="verb", required=True, metavar="VERB")

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--namespace", default=env("SPARKGATE_NAMESPACE", contract.INSTALL_NAMESPACE))
        p.add_argument("--service", default=env("SPARKGATE_WEBHOOK_SERVICE", contract.WEBHOOK_SERVICE))
        p.add_argument("--ca-days", type=_days, default=Lifetimes.ca, help="CA lifetime in days")
        p.add_argument(
            "--serving-days", type=_days, default=Lifetimes.serving, help="serving certificate lifetime"
        )

    gen = verbs.add_parser(
        "generate",
        help="write a CA and a serving certificate for the webhook Service to a directory",
        description="Writes ca.crt, ca.key, tls.crt and tls.key (keys mode 0600) and prints the caBundle.",
    )
    common(gen)
    gen.add_argument("--out", required=True, type=Path, help="directory (created if missing)")
    gen.add_argument("--force", action="store_true", help="overwrite existing files")
    gen.set_defaults(run=_generate)

    sync = verbs.add_parser(
        "sync",
        help="create, rotate and inject the certificates in the cluster (run by sparkgate itself)",
    )
    common(sync)
    mode = sync.add_mutually_exclusive_group(required=True)
    mode.add_argument("--once", action="store_true", help="one cycle, no Lease; exit 1 on failure")
    mode.add_argument("--loop", action="store_true", help="a cycle every --interval while holding the Lease")
    sync.add_argument("--interval", type=float, default=float(env("SPARKGATE_CERTS_INTERVAL", "60")))
    sync.add_argument("--kubeconfig", default=env("KUBECONFIG"))
    sync.add_argument("--secret", default=env("SPARKGATE_CERT_SECRET", contract.CERT_SECRET))
    sync.add_argument(
        "--webhook-configuration",
        default=env("SPARKGATE_WEBHOOK_CONFIGURATION", contract.WEBHOOK_CONFIGURATION),
        help="name of both the mutating and the validating webhook configuration",
    )
    sync.add_argument("--identity", default=env("POD_NAME") or socket.gethostname())
    sync.add_argument("--metrics-port", type=int, default=0, help="serve /metrics on this port (loop)")
    sync.set_defaults(run=_sync)


def _generate(args: argparse.Namespace) -> int:
    out: Path = args.out
    files = {CA_CRT: 0o644, CA_KEY: 0o600, TLS_CRT: 0o644, TLS_KEY: 0o600}
    existing = [name for name in files if (out / name).exists()]
    if existing and not args.force:
        print(f"{out}: {', '.join(existing)} exist; use --force to overwrite", file=sys.stderr)
        return 1
    lifetimes = Lifetimes(ca=args.ca_days, serving=args.serving_days)
    now = dt.datetime.now(dt.UTC)
    data = fresh(service_dns_names(args.service, args.namespace), now, lifetimes)
    out.mkdir(parents=True, exist_ok=True)
    for name, mode in files.items():
        path = out / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data[name])
        os.chmod(path, mode)
    print(f"wrote {', '.join(files)} to {out}", file=sys.stderr)
    print(f"caBundle: {base64.b64encode(data[CA_CRT]).decode()}")
    return 0


def sync_enabled() -> bool:
    return os.environ.get("SPARKGATE_CERTS_SYNC", "true").lower() not in ("false", "0", "no")


def _sync(args: argparse.Namespace) -> int:
    if not sync_enabled():
        print("certs sync: disabled by SPARKGATE_CERTS_SYNC (certificates managed elsewhere)")
        return 0
    from sparkgate.kube import Kube, KubeError

    from .sync import Target, run_loop, sync_once

    lifetimes = Lifetimes(ca=args.ca_days, serving=args.serving_days)
    target = Target(
        namespace=args.namespace,
        secret=args.secret,
        service=args.service,
        mutating=(args.webhook_configuration,),
        validating=(args.webhook_configuration,),
        lifetimes=lifetimes,
    )
    kube = Kube.from_kubeconfig(args.kubeconfig)
    try:
        if args.once:
            try:
                result = sync_once(kube, target, dt.datetime.now(dt.UTC))
            except KubeError as e:
                print(f"certs sync failed: {e}", file=sys.stderr)
                return 1
            done = [s.value for s in result.steps] + [
                f"inject {r.kind}/{r.configuration}/{r.webhook}" for r in result.injected
            ]
            print("certs sync: " + (", ".join(done) or "nothing to do"))
            for name in result.missing:
                print(f"warning: {name} not found", file=sys.stderr)
            return 0
        from .sync import CertsMetrics

        metrics = CertsMetrics()
        if args.metrics_port:
            from prometheus_client import start_http_server

            start_http_server(args.metrics_port)
        stop = threading.Event()
        signal.signal(signal.SIGTERM, lambda *_: stop.set())
        signal.signal(signal.SIGINT, lambda *_: stop.set())
        run_loop(
            kube,
            target,
            identity=args.identity,
            interval=args.interval,
            stop=stop,
            clock=lambda: dt.datetime.now(dt.UTC),
            metrics=metrics,
        )
        return 0
    finally:
        kube.close()
