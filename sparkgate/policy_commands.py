"""`sparkgate policy check`: validate a policy file before installing it, and with `--cluster` ask the
live API server whether it admits each profile's executor pods (sparkgate/probe.py).

The file's policy is judged, not the live webhook's: each probe pod is shaped by the file's policy and kept
out of the live sparkgate webhook. The same Spark pod is then dry-run once more through the live webhook,
and where the live webhook's answer differs (another profile, other fields, another verdict) a
`live policy differs:` line says so: information about what applying the file changes, never a failure.
Exit 0 when every probe is admitted, 1 when one is refused or could not be asked, or the file is invalid.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from sparkgate.cli_options import install_namespace
from sparkgate.kube import Kube, KubeError, add_impersonation_arguments, kubeconfig_path
from sparkgate.policy import Policy, PolicyError, Scheduling, SchedulingOverride, load_policy


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    policy = subparsers.add_parser("policy", help="work with policy files")
    verbs = policy.add_subparsers(dest="verb", required=True, metavar="VERB")
    check = verbs.add_parser("check", help="validate a policy file and summarise it")
    check.add_argument("file", help="policy YAML file")
    install_namespace(check, "--install-namespace", in_pod=False)
    check.add_argument(
        "--cluster",
        action="store_true",
        help="also create each profile's executor pod, shaped by this file's policy, with dryRun=All in "
        "every namespace it matches (nothing is stored) and print the API server's answer and where the "
        "live webhook's policy differs; exit 1 if any is refused",
    )
    check.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help="kubeconfig file for --cluster (default: $KUBECONFIG, else ~/.kube/config, else the in-cluster "
        "service account)",
    )
    add_impersonation_arguments(
        check,
        "with --cluster: make the check's requests as this user (kubectl's --as: needs the RBAC verb "
        "'impersonate'), e.g. a namespace's Spark service account, system:serviceaccount:NAMESPACE:NAME, with "
        "--namespace NAMESPACE, to see what its driver's executors would meet there",
    )
    check.add_argument(
        "--namespace",
        action="append",
        dest="namespaces",
        metavar="NAMESPACE",
        help="with --cluster: probe these namespaces (repeatable) instead of listing the cluster's",
    )
    check.add_argument(
        "--admission",
        choices=("webhook", "policy"),
        default="webhook",
        help="the install's admission mode: with `policy`, also refuse a policy that cannot be rendered as a "
        "MutatingAdmissionPolicy within the API server's CEL limits (docs/install.md)",
    )
    check.set_defaults(run=_check)
    _register_render(verbs)


def _check(args: argparse.Namespace) -> int:
    if (args.act_as or args.as_group) and not args.cluster:
        print(
            "sparkgate policy check: --as and --as-group act on the cluster: add --cluster", file=sys.stderr
        )
        return 2
    try:
        with open(args.file, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        print(f"{args.file}: {exc.strerror}", file=sys.stderr)
        return 1
    try:
        policy = load_policy(text, args.install_namespace)
    except PolicyError as exc:
        print(f"{args.file}: {len(exc.errors)} error(s)", file=sys.stderr)
        for line in exc.errors:
            print(f"  {line}", file=sys.stderr)
        return 1
    a = policy.allocation
    print(f"{args.file}: valid (digest {policy.digest})")
    print(
        f"  defaults: batchSize {a.batch_size}, batchDelaySeconds {a.batch_delay_seconds:g}, "
        f"maxPendingPerApp {a.max_pending_per_app}"
    )
    print(
        f"  limits: maxPendingPerNamespace {policy.max_pending_per_namespace}, "
        f"maxPendingCluster {policy.max_pending_cluster}; caps: batchSize {policy.caps.batch_size}, "
        f"maxPendingPerApp {policy.caps.max_pending_per_app}"
    )
    print(f"  excluded namespaces: {', '.join(policy.excluded_namespaces)}")
    print(f"  scheduling: {_scheduling(policy.scheduling)}")
    for i, p in enumerate(policy.profiles):
        where = ", ".join(p.match.namespaces) or "any namespace"
        labels = ", ".join(f"{k}={v}" for k, v in p.match.labels.items())
        print(f"  profile {i + 1} {p.name!r}: {where}" + (f" with labels {labels}" if labels else ""))
        if p.config_maps:
            print("    config maps: " + ", ".join(f"{c.source} -> {c.mount_path}" for c in p.config_maps))
        if p.overrides:
            print("    admin wins on: " + ", ".join(".".join(o) for o in p.overrides))
        if p.scheduling != SchedulingOverride():
            print(f"    scheduling: {_scheduling(policy.scheduling_for(p.name))}")
    if args.admission == "policy" and not _renders(args.file, policy, args.install_namespace):
        return 1
    return _check_cluster(args, policy) if args.cluster else 0


def _check_cluster(args: argparse.Namespace, policy: Policy) -> int:
    from kubernetes.config import ConfigException

    from sparkgate.probe import Verdict, live, probe, targets

    try:
        kube = Kube.from_kubeconfig(
            kubeconfig_path(args.kubeconfig), as_user=args.act_as, as_groups=args.as_group
        )
    except (ConfigException, OSError) as exc:
        print(f"cannot reach the cluster: {exc}", file=sys.stderr)
        return 1
    try:
        print(f"{args.file}: dry runs on {kube.host} (nothing is stored):")
        try:
            pairs = targets(kube, policy, args.namespaces)
        except KubeError as exc:
            print(f"  cannot list the namespaces: {exc}", file=sys.stderr)
            return 1
        for profile in policy.profiles:
            if not any(p is profile for p, _ in pairs):
                print(f"  profile {profile.name}: no namespace matches")
        refused = differs = 0
        for profile, namespace in pairs:
            result = probe(kube, policy, profile, namespace)
            refused += result.verdict is not Verdict.ADMITTED
            print(f"  {result.line()}")
            if result.verdict is not Verdict.ERROR:
                seen = live(kube, result, profile)
                if seen.differs(result):
                    differs += 1
                    print(f"    live policy differs: {seen.line()}")
    finally:
        kube.close()
    if differs:
        print(
            f"the live webhook's policy differs from {args.file} in {differs} of {len(pairs)} (information)"
        )
    if refused:
        print(f"{refused} of {len(pairs)} refused or not checked", file=sys.stderr)
        return 1
    return 0


def _scheduling(s: Scheduling) -> str:
    """The scheduler extender's settings in force (docs/policy.md "Scheduling")."""
    text = (
        f"a node is refused to an app after {s.failures_per_app} of its executors failed there, to every app "
        f"after executors of {s.suspect_node_apps} apps did, within {s.failure_window_seconds:g}s; "
        f"packing {s.packing}, driverZone {s.driver_zone}"
    )
    return text + (f"; schedulerName {s.scheduler_name}" if s.scheduler_name else "")


def _register_render(verbs: argparse._SubParsersAction[Any]) -> None:
    render = verbs.add_parser(
        "render", help="write a policy file as the admission objects that apply it inside the API server"
    )
    render.add_argument("file", help="policy YAML file")
    render.add_argument(
        "--admission",
        choices=("policy",),
        required=True,
        help="policy: a MutatingAdmissionPolicy and its binding (admissionregistration.k8s.io/v1, "
        "Kubernetes 1.36+) that do what the webhook does, without the webhook (docs/install.md)",
    )
    install_namespace(render, "--install-namespace", in_pod=False)
    render.set_defaults(run=_render)


def _renders(path: str, policy: Policy, install_namespace: str) -> bool:
    """Whether the policy renders within the API server's limits; prints why not."""
    from sparkgate.cel import PER_CALL_LIMIT, RUNTIME_BUDGET
    from sparkgate.render import RenderError, render

    try:
        rendered = render(policy, install_namespace)
    except RenderError as exc:
        print(f"{path}: cannot be applied as a MutatingAdmissionPolicy:", file=sys.stderr)
        for line in exc.errors:
            print(f"  {line}", file=sys.stderr)
        return False
    worst = max(rendered.costs.items(), key=lambda kv: kv[1])
    print(
        f"  as a MutatingAdmissionPolicy: {rendered.size:,} bytes; CEL cost up to {rendered.total_cost:,} per "
        f"executor pod (limit {RUNTIME_BUDGET:,}), the dearest expression {worst[0]} up to {worst[1]:,} "
        f"(limit {PER_CALL_LIMIT:,})"
    )
    return True


def _render(args: argparse.Namespace) -> int:
    import yaml

    from sparkgate.render import render

    try:
        with open(args.file, encoding="utf-8") as f:
            policy = load_policy(f.read(), args.install_namespace)
        rendered = render(policy, args.install_namespace)
    except OSError as exc:
        print(f"{args.file}: {exc.strerror}", file=sys.stderr)
        return 1
    except PolicyError as exc:
        print(f"{args.file}: {len(exc.errors)} error(s)", file=sys.stderr)
        for line in exc.errors:
            print(f"  {line}", file=sys.stderr)
        return 1
    print(yaml.safe_dump_all(rendered.objects, sort_keys=False, width=1_000_000), end="")
    return 0
