"""`sparkgate policy check`: validate a policy file before installing it."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from sparkgate import contract
from sparkgate.policy import PolicyError, Scheduling, SchedulingOverride, load_policy


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    policy = subparsers.add_parser("policy", help="work with policy files")
    verbs = policy.add_subparsers(dest="verb", required=True, metavar="VERB")
    check = verbs.add_parser("check", help="validate a policy file and summarise it")
    check.add_argument("file", help="policy YAML file")
    check.add_argument("--install-namespace", default=contract.INSTALL_NAMESPACE)
    check.set_defaults(run=_check)


def _check(args: argparse.Namespace) -> int:
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
    return 0


def _scheduling(s: Scheduling) -> str:
    """The scheduler extender's settings in force (docs/policy.md "Scheduling")."""
    text = (
        f"a node is refused to an app after {s.failures_per_app} of its executors failed there, to every app "
        f"after executors of {s.suspect_node_apps} apps did, within {s.failure_window_seconds:g}s; "
        f"packing {s.packing}, driverZone {s.driver_zone}"
    )
    return text + (f"; schedulerName {s.scheduler_name}" if s.scheduler_name else "")
