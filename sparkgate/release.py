"""`sparkgate release`: the admin's break-glass path, removing sparkgate's gate from executor pods by hand.

The allocator is the one that releases pods, within the limits; this command is for when it cannot (it is
down, or an app must be unblocked now) and for the uninstall. It runs with the admin's own credentials (a
kubeconfig, else the in-cluster service account), which the gate protection admits only for members of
the group `sparkgate:break-glass` (contract.BREAK_GLASS_GROUP): the install binds nobody to it, so an
admin is never let through by accident (docs/operations.md, "Releasing executor pods by hand"). Where an
admin's groups come from an identity provider they cannot change (GKE, AKS), `--as`/`--as-group` act as
a member of it through the API server's impersonation, as kubectl's flags of the same names do.

Each pod is released with the allocator's own patch (contract.gate_removal: a `test` of the gate's entry,
then its removal), so a concurrent change of the pod's gates is detected and the pod re-read, never
overwritten. `--dry-run` sends the same patches with `dryRun=All`: the API server runs its whole admission
chain on them (so a refusal shows) and stores nothing. A pod that is gone or already released is skipped;
a refusal is printed with the API server's message and makes the command exit 1, after the other pods.
When an answer is lost (no answer, a 5xx: sparkgate/kube.py retries the patch, which its test makes safe,
and marks what follows `maybe_applied`), the pod is read again: without its gate it is counted released
(this command's patch most likely landed; the line says the answer was lost), with it the patch is sent
again, and a pod still unanswered after ATTEMPTS is a failure, never counted.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from typing import Any

from kubernetes.config import ConfigException

from sparkgate import contract
from sparkgate.kube import Invalid, Kube, KubeError, NotFound, add_impersonation_arguments, kubeconfig_path

Obj = dict[str, Any]
ATTEMPTS = 3  # re-reads of a pod whose gates changed between our read and our patch


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    p = subparsers.add_parser(
        "release",
        help="remove sparkgate's gate from executor pods by hand (needs the group sparkgate:break-glass)",
        description="Remove sparkgate's scheduling gate from executor pods with your own credentials, "
        "bypassing the allocator's limits. The gate protection admits this only for members of the group "
        f"{contract.BREAK_GLASS_GROUP}.",
    )
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("-n", "--namespace", help="release the executor pods of this namespace")
    where.add_argument(
        "-A", "--all-namespaces", action="store_true", help="release the executor pods of every namespace"
    )
    which = p.add_mutually_exclusive_group()
    which.add_argument("--app", metavar="APP_ID", help="only this application's pods (spark-app-selector)")
    which.add_argument("--pod", action="append", metavar="NAME", help="only this pod (repeatable; needs -n)")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="send each patch with dryRun=All: the API server checks it and stores nothing",
    )
    p.add_argument(
        "--kubeconfig",
        metavar="FILE",
        help="kubeconfig file (default: $KUBECONFIG, else ~/.kube/config, else the in-cluster service account)",
    )
    add_impersonation_arguments(
        p,
        "act as this user (kubectl's --as: needs the RBAC verb 'impersonate'); for an admin who cannot "
        f"be a member of {contract.BREAK_GLASS_GROUP}: --as {contract.BREAK_GLASS_USER} "
        f"--as-group {contract.BREAK_GLASS_GROUP} (ClusterRole sparkgate-break-glass-impersonator)",
    )
    p.set_defaults(run=run_release)


def run_release(args: argparse.Namespace) -> int:
    if args.pod and not args.namespace:
        print("sparkgate release: --pod needs -n/--namespace", file=sys.stderr)
        return 2
    try:
        kube = Kube.from_kubeconfig(
            kubeconfig_path(args.kubeconfig), as_user=args.act_as, as_groups=args.as_group
        )
    except ConfigException as e:  # a kubeconfig that does not load, or groups to act as without a user
        print(f"sparkgate release: {e}", file=sys.stderr)
        return 2
    try:
        return release(kube, args.namespace, app=args.app, pods=args.pod or (), dry_run=args.dry_run)
    except KubeError as e:
        print(f"sparkgate release: {e.message}", file=sys.stderr)
        return 1
    finally:
        kube.close()


def release(
    kube: Kube, namespace: str | None, *, app: str | None = None, pods: tuple[str, ...] = (), dry_run: bool
) -> int:
    """Release the gated executor pods chosen (namespace None: every namespace); 0, or 1 if any was refused."""
    verb = "would release" if dry_run else "released"
    done = refused = 0
    for where, pod in _candidates(kube, namespace, app, pods):
        if pod is None:
            print(f"{where}: gone, nothing to release")
            continue
        try:
            outcome = _release_one(kube, pod, dry_run)
        except KubeError as e:
            print(f"refused {where}: {e.message}", file=sys.stderr)
            refused += 1
            continue
        if outcome not in (RELEASED, LOST_ANSWER):
            print(f"{where}: {outcome}, nothing to release")
            continue
        done += 1
        labels = pod["metadata"].get("labels") or {}
        note = " (the answer was lost; a re-read shows the gate gone)" if outcome == LOST_ANSWER else ""
        print(f"{verb} {where} (app {labels.get(contract.LABEL_APP_ID, '-')}){note}")
    summary = f"{verb} {done} executor pod(s)"
    if dry_run:
        summary += " (dry run: the API server admitted each patch and stored nothing)"
    if refused:
        summary += f"; {refused} refused"
    print(summary)
    return 1 if refused else 0


def _candidates(
    kube: Kube, namespace: str | None, app: str | None, names: tuple[str, ...]
) -> Iterator[tuple[str, Obj | None]]:
    """("namespace/name", pod) for each executor pod chosen that carries the gate; each named pod, gated or
    not, so that it is reported, read just before its turn and None when it is gone."""
    if names:
        for name in names:
            try:
                yield f"{namespace}/{name}", kube.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
            except NotFound:
                yield f"{namespace}/{name}", None
        return
    path = f"/api/v1/namespaces/{namespace}/pods" if namespace else "/api/v1/pods"
    selector = f"{contract.LABEL_ROLE}={contract.ROLE_EXECUTOR}"
    if app:
        selector += f",{contract.LABEL_APP_ID}={app}"
    items, _ = kube.list(path, label_selector=selector)
    gated = [p for p in items if contract.gate_index(p) is not None]
    for pod in sorted(gated, key=lambda p: (p["metadata"]["namespace"], p["metadata"]["name"])):
        yield f"{pod['metadata']['namespace']}/{pod['metadata']['name']}", pod


RELEASED, LOST_ANSWER = "", "released, answer lost"


def _release_one(kube: Kube, pod: Obj, dry_run: bool) -> str:
    """Remove the gate: RELEASED, LOST_ANSWER (the answer was lost and a re-read shows the gate gone), or why
    there was nothing to remove."""
    meta = pod["metadata"]
    path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
    lost, error = False, None  # lost: an earlier patch of this pod may have landed
    for _ in range(ATTEMPTS):
        index = contract.gate_index(pod)
        if index is None:
            return LOST_ANSWER if lost else "not gated"
        try:
            kube.request(
                "PATCH",
                path,
                query={"dryRun": "All"} if dry_run else None,
                body=contract.gate_removal(index),
                content_type="application/json-patch+json",
            )
            return RELEASED
        except NotFound:
            return "gone"
        except KubeError as e:
            lost |= e.maybe_applied and not dry_run
            if not (isinstance(e, Invalid) or lost):
                raise
            error = e  # the `test` failed (the gates changed since the read), or the answer was lost
        try:
            pod = kube.get(path)
        except NotFound:
            return "gone"
    if contract.gate_index(pod) is None:
        return LOST_ANSWER if lost else "not gated"
    assert error is not None
    raise error
