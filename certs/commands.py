"""`sparkgate certs generate` (files, for a manual or GitOps install) and `sparkgate certs sync` (in-cluster).

Environment variables give the in-cluster defaults so that the manifests set them once for the pod:
SPARKGATE_NAMESPACE, SPARKGATE_CERT_SECRET, SPARKGATE_WEBHOOK_SERVICE, SPARKGATE_WEBHOOK_CONFIGURATION,
POD_NAME (the Lease identity), KUBECONFIG (absent in a pod: the service account is used), the lifetimes
SPARKGATE_CA_LIFETIME, SPARKGATE_CA_RENEW_BEFORE, SPARKGATE_SERVING_LIFETIME,
SPARKGATE_SERVING_RENEW_BEFORE, SPARKGATE_CA_OVERLAP, SPARKGATE_CA_KEEP_PREVIOUS (durations: `90d`, `12h`,
`10m`, `30s`) and the cycle
SPARKGATE_CERTS_INTERVAL (seconds). The allocator, which runs rotation in the installed system, takes the
same options (`add_target_options`). SPARKGATE_CERTS_SYNC=false turns `certs sync` and the allocator's
rotation off: the cert-manager overlay sets it, since there cert-manager owns the Secret and cainjector the
caBundles.
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from sparkgate import contract
from sparkgate.cli_options import DURATION_UNITS, FromEnv, client_options, install_namespace, switch

from .material import fresh
from .pki import service_dns_names
from .plan import CA_CRT, CA_KEY, TLS_CRT, TLS_KEY, Lifetimes


def duration(value: str) -> dt.timedelta:
    """`90d`, `12h`, `10m`, `30s` or `1.5d`; a bare number is days."""
    text = value.strip().lower()
    unit = DURATION_UNITS.get(text[-1:]) if text else None
    number = text[:-1] if unit is not None else text
    try:
        seconds = float(number) * (unit or DURATION_UNITS["d"])
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a duration (like 90d, 12h, 10m, 30s)") from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"{value!r}: a duration must be positive")
    return dt.timedelta(seconds=seconds)


def _lifetime_options(p: argparse.ArgumentParser) -> None:
    defaults = Lifetimes()
    for flag, variable, default, what in (
        ("--ca-lifetime", "SPARKGATE_CA_LIFETIME", defaults.ca, "CA lifetime"),
        ("--ca-renew-before", "SPARKGATE_CA_RENEW_BEFORE", defaults.ca_renew_before, "stage a new CA this long before the CA expires"),
        ("--serving-lifetime", "SPARKGATE_SERVING_LIFETIME", defaults.serving, "serving certificate lifetime"),
        ("--serving-renew-before", "SPARKGATE_SERVING_RENEW_BEFORE", defaults.serving_renew_before, "renew the serving certificate this long before it expires"),
        ("--ca-overlap", "SPARKGATE_CA_OVERLAP", defaults.overlap, "how long a new CA is trusted before the serving certificate switches to it"),
        ("--ca-keep-previous", "SPARKGATE_CA_KEEP_PREVIOUS", defaults.keep_previous, "how long the old CA stays trusted after the switch"),
    ):  # fmt: skip
        p.add_argument(
            flag,
            type=duration,
            action=FromEnv,
            env=variable,
            default=default,
            metavar="DURATION",
            help=f"{what}, as 90d, 12h, 10m or 30s",
        )


def lifetimes_from(args: argparse.Namespace) -> Lifetimes:
    return Lifetimes(
        ca=args.ca_lifetime,
        ca_renew_before=args.ca_renew_before,
        serving=args.serving_lifetime,
        serving_renew_before=args.serving_renew_before,
        overlap=args.ca_overlap,
        keep_previous=args.ca_keep_previous,
    )


def add_target_options(p: argparse.ArgumentParser, *interval_aliases: str) -> None:
    """Where the certificates live, which webhook configurations trust them, their lifetimes and cycle."""
    _service_option(p)
    p.add_argument(
        "--secret",
        action=FromEnv,
        env="SPARKGATE_CERT_SECRET",
        default=contract.CERT_SECRET,
        metavar="NAME",
        help="the Secret of the certificates, in the install namespace",
    )
    p.add_argument(
        "--webhook-configuration",
        action=FromEnv,
        env="SPARKGATE_WEBHOOK_CONFIGURATION",
        default=contract.WEBHOOK_CONFIGURATION,
        metavar="NAME",
        help="name of both the mutating and the validating webhook configuration",
    )
    p.add_argument(
        "--certs-interval",
        *interval_aliases,
        type=float,
        action=FromEnv,
        env="SPARKGATE_CERTS_INTERVAL",
        default=60.0,
        metavar="SECONDS",
        help="seconds between certificate sync cycles",
    )
    _lifetime_options(p)


def target_from(args: argparse.Namespace, namespace: str) -> Any:
    from .sync import Target

    return Target(
        namespace=namespace,
        secret=args.secret,
        service=args.service,
        mutating=(args.webhook_configuration,),
        validating=(args.webhook_configuration,),
        lifetimes=lifetimes_from(args),
    )


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    certs = subparsers.add_parser("certs", help="the webhook's TLS certificates")
    verbs = certs.add_subparsers(dest="verb", required=True, metavar="VERB")

    gen = verbs.add_parser(
        "generate",
        help="write a CA and a serving certificate for the webhook Service to a directory",
        description="Writes ca.crt, ca.key, tls.crt and tls.key (keys mode 0600) and prints the caBundle.",
    )
    install_namespace(gen)
    _service_option(gen)
    _lifetime_options(gen)
    gen.add_argument(
        "--out", required=True, type=Path, metavar="DIRECTORY", help="directory (created if missing)"
    )
    gen.add_argument("--force", action="store_true", help="overwrite existing files")
    gen.set_defaults(run=_generate)

    sync = verbs.add_parser(
        "sync",
        help="create, rotate and inject the certificates in the cluster (run by sparkgate itself)",
    )
    install_namespace(sync)
    add_target_options(sync, "--interval")
    mode = sync.add_mutually_exclusive_group(required=True)
    mode.add_argument("--once", action="store_true", help="one cycle, no Lease; exit 1 on failure")
    mode.add_argument(
        "--loop", action="store_true", help="a cycle every --certs-interval while holding the Lease"
    )
    client_options(sync, "the sparkgate-certs Lease")
    sync.add_argument(
        "--metrics-port",
        type=int,
        default=0,
        metavar="PORT",
        help="serve /metrics on this port (loop; 0: none)",
    )
    sync.set_defaults(run=_sync)


def _service_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--service",
        action=FromEnv,
        env="SPARKGATE_WEBHOOK_SERVICE",
        default=contract.WEBHOOK_SERVICE,
        metavar="NAME",
        help="the Service the serving certificate is issued for, in the install namespace",
    )


def _generate(args: argparse.Namespace) -> int:
    out: Path = args.out
    files = {CA_CRT: 0o644, CA_KEY: 0o600, TLS_CRT: 0o644, TLS_KEY: 0o600}
    existing = [name for name in files if (out / name).exists()]
    if existing and not args.force:
        print(f"{out}: {', '.join(existing)} exist; use --force to overwrite", file=sys.stderr)
        return 1
    lifetimes = lifetimes_from(args)
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
    return switch(os.environ.get("SPARKGATE_CERTS_SYNC", "true"))


def _sync(args: argparse.Namespace) -> int:
    if not sync_enabled():
        print("certs sync: disabled by SPARKGATE_CERTS_SYNC (certificates managed elsewhere)")
        return 0
    from sparkgate.kube import Kube, KubeError

    from .sync import run_loop, sync_once

    target = target_from(args, args.namespace)
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
            interval=args.certs_interval,
            stop=stop,
            clock=lambda: dt.datetime.now(dt.UTC),
            metrics=metrics,
        )
        return 0
    finally:
        kube.close()
