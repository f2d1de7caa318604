"""`sparkgate mutate` (preview what a policy does to a pod) and `sparkgate webhook` (run the server).

Nothing here imports prometheus-client at module level: its multiprocess mode is chosen when it is first
imported, so `sparkgate webhook` makes sure PROMETHEUS_MULTIPROC_DIR is set before that happens.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from typing import Any

import yaml

from sparkgate import contract
from sparkgate.cli_options import FromEnv, FromEnvRepeated, install_namespace, server_options
from sparkgate.json_patch import apply_patch
from sparkgate.policy import PolicyError, load_policy

from .review import BadReview, parse_review


def register(subparsers: Any) -> None:
    from .server import ServerOptions

    p = subparsers.add_parser(
        "mutate",
        help="show what the policy does to an executor pod",
        description="Print the pod as the webhook would admit it (or, with --patch, the JSON Patch).",
    )
    p.add_argument("--policy", required=True, metavar="FILE", help="policy file (YAML)")
    p.add_argument(
        "--namespace", help="namespace of the pod when INPUT is a bare pod without one (else: default)"
    )
    install_namespace(p, "--install-namespace", in_pod=False)
    p.add_argument("--patch", action="store_true", help="print the JSON Patch operations instead")
    p.add_argument("input", help="a pod or an AdmissionReview, YAML or JSON; - for stdin")
    p.set_defaults(run=run_mutate)

    w = subparsers.add_parser("webhook", help="run the admission webhook (gunicorn, TLS)")
    server_options(w)
    w.add_argument(
        "--bind",
        action=FromEnv,
        env="SPARKGATE_BIND",
        default="0.0.0.0:8443",
        metavar="HOST:PORT",
        help="where the webhook serves TLS",
    )
    w.add_argument(
        "--cert-dir",
        action=FromEnv,
        env="SPARKGATE_CERT_DIR",
        default="/etc/sparkgate/tls",
        metavar="DIRECTORY",
        help="directory holding tls.crt and tls.key (the layout of a kubernetes.io/tls Secret volume)",
    )
    install_namespace(w, "--install-namespace")
    w.add_argument(
        "--workers",
        type=int,
        action=FromEnv,
        env="SPARKGATE_WEBHOOK_WORKERS",
        default=ServerOptions.workers,
        metavar="PROCESSES",
        help="gunicorn worker processes",
    )
    w.add_argument(
        "--threads",
        type=int,
        action=FromEnv,
        env="SPARKGATE_WEBHOOK_THREADS",
        default=ServerOptions.threads,
        metavar="THREADS",
        help="threads per worker",
    )
    w.add_argument(
        "--allocator-user",
        action=FromEnvRepeated,
        env="SPARKGATE_ALLOCATOR_USER",
        default=contract.ALLOCATOR_USER,
        metavar="USER",
        help="the user allowed to remove the gate besides the break-glass group (repeatable)",
    )
    w.set_defaults(run=run_webhook)


def _read_input(path: str) -> Any:
    if path == "-":
        return yaml.safe_load(sys.stdin)
    with open(path, encoding="utf-8") as f:
        return yaml.safe_load(f)


def run_mutate(args: argparse.Namespace) -> int:
    from sparkgate.mutation import mutate

    try:
        with open(args.policy, encoding="utf-8") as f:
            policy = load_policy(f.read(), args.install_namespace)
    except PolicyError as e:
        print(f"{args.policy}: the policy is invalid:", file=sys.stderr)
        for error in e.errors:
            print(f"  {error}", file=sys.stderr)
        return 1
    document = _read_input(args.input)
    if isinstance(document, dict) and document.get("kind") == "AdmissionReview":
        try:
            request = parse_review(json.dumps(document).encode())
        except BadReview as e:
            print(f"{args.input}: {e}", file=sys.stderr)
            return 1
    elif isinstance(document, dict) and document.get("kind", "Pod") == "Pod":
        namespace = args.namespace or (document.get("metadata") or {}).get("namespace") or "default"
        request = {
            "uid": "preview",
            "operation": "CREATE",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": namespace,
            "object": document,
        }
    else:
        print(f"{args.input}: expected a Pod or an AdmissionReview", file=sys.stderr)
        return 1
    result = mutate(request, policy)
    print(
        f"# {result.outcome.value}" + (f", profile {result.profile}" if result.profile else ""),
        file=sys.stderr,
    )
    if result.reason:
        print(f"# {result.reason}", file=sys.stderr)
    if args.patch:
        json.dump(result.ops, sys.stdout, indent=2)
        print()
        return 0
    yaml.safe_dump(apply_patch(request["object"], result.ops), sys.stdout, sort_keys=False)
    return 0


def run_webhook(args: argparse.Namespace) -> int:
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        # prometheus-client picks its mode at import: set the directory, then start afresh.
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="sparkgate-webhook-metrics-")
        os.execv(sys.executable, [sys.executable, "-m", "sparkgate.cli", *sys.argv[1:]])
    from .server import ServerOptions, WebhookServer

    options = ServerOptions(
        bind=args.bind,
        cert_dir=args.cert_dir,
        policy=args.policy,
        install_namespace=args.install_namespace,
        allocator_users=frozenset(args.allocator_user),
        workers=args.workers,
        threads=args.threads,
        log_level=args.log_level,
    )
    WebhookServer(options).run()
    return 0
