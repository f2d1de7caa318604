"""The policy probe: would the live API server admit the executor pods that each profile shapes?

A profile that the API server refuses kills Spark applications (each refused creation is an executor
failure; DESIGN.md), and only the cluster knows whether its PriorityClass, service account or runtime
class exist, what its namespaces' PodSecurity levels, LimitRanges and quotas allow, and what other
admission policies say. So, for each profile and each namespace it matches, the probe builds an executor
pod as a Spark 4.3 driver sends it (the captured pod shipped in sparkgate/examples/executor-pod.json,
without what the API server's plugins derive), made to match the profile, and asks the API server with
`dryRun=All`, which runs the whole admission chain and stores nothing:

1. the pod as Spark sends it: the built-in plugins and every webhook answer, sparkgate's included when
   installed (it mutates the pod as in production), and the answer is the pod as sparkgate's webhook
   receives it in production;
2. that pod, with the profile applied by the webhook's own function (`sparkgate.mutation.mutate`): the
   API server's second pass after sparkgate's webhook, then its validating plugins and policies.

The result is the API server's answer word for word. `sparkgate policy check --cluster` prints it; the
allocator's leader runs it periodically (allocator/probe.py) and exports it as a metric and Events.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from importlib import resources
from typing import Any

from sparkgate import contract
from sparkgate.json_patch import apply_patch
from sparkgate.kube import Kube, KubeError
from sparkgate.mutation import mutate
from sparkgate.mutation.derived import strip_derived
from sparkgate.policy import Policy, Profile

Obj = dict[str, Any]
DRY_RUN = {"dryRun": "All"}
NAME_PREFIX = "sparkgate-probe-"
_SERVER_SET = ("uid", "resourceVersion", "creationTimestamp", "generation", "managedFields", "selfLink")


class Verdict(StrEnum):
    ADMITTED = "admitted"
    REFUSED = "refused"  # the API server answered no: this profile's executor pods would fail
    ERROR = "error"  # no answer, or the probe itself may not ask: nothing is known about the profile


@dataclass(frozen=True)
class ProbeResult:
    profile: str
    namespace: str
    verdict: Verdict
    message: str = ""  # the API server's refusal word for word (or why the probe could not ask)

    def line(self) -> str:
        head = f"profile {self.profile} in namespace {self.namespace}: {self.verdict.value}"
        return head if self.verdict is Verdict.ADMITTED else f"{head}: {self.message}"


def captured_executor_pod() -> Obj:
    """The executor pod a Spark 4.3 driver sent to a real kube-apiserver 1.36, after the built-in
    plugins' first pass (tests/data/spark-4.3/adhoc-query-exec-1; a test keeps the two equal)."""
    text = resources.files("sparkgate").joinpath("examples", "executor-pod.json").read_text(encoding="utf-8")
    pod: Obj = json.loads(text)
    return pod


def probe_name(profile: str) -> str:
    return (NAME_PREFIX + profile)[: contract.NAME_MAX].rstrip("-")


def spark_pod(profile: Profile, namespace: str) -> Obj:
    """The executor pod as Spark sends it, in `namespace`, labelled and annotated to pick `profile`."""
    pod = copy.deepcopy(captured_executor_pod())
    name = probe_name(profile.name)
    metadata = pod["metadata"]
    for key in _SERVER_SET:
        metadata.pop(key, None)
    metadata.update(name=name, namespace=namespace)
    labels = metadata.setdefault("labels", {})
    labels.update({k: v for k, v in profile.match.labels.items() if k not in contract.SPARK_LABELS})
    metadata["annotations"] = {contract.ANNOTATION_PROFILE: profile.name}
    pod["spec"] = {**strip_derived(pod["spec"]), "hostname": name}
    pod.pop("status", None)
    return pod


def targets(kube: Kube, policy: Policy, namespaces: Sequence[str] | None = None) -> list[tuple[Profile, str]]:
    """(profile, namespace) for every profile and every namespace it matches: those given, else every
    namespace of the cluster; excluded namespaces never (sparkgate does not touch their pods)."""
    if namespaces is None:
        items, _ = kube.list("/api/v1/namespaces")
        namespaces = [item["metadata"]["name"] for item in items]
    names = sorted(set(namespaces))
    return [
        (profile, ns)
        for profile in policy.profiles
        for ns in names
        if not policy.is_excluded(ns) and profile.match.namespace_allowed(ns)
    ]


def probe(kube: Kube, policy: Policy, profile: Profile, namespace: str) -> ProbeResult:
    """One profile in one namespace, by two dry-run creations (module docstring)."""
    sent = spark_pod(profile, namespace)
    try:
        try:
            pod = _as_sent(
                kube.request("POST", f"/api/v1/namespaces/{namespace}/pods", query=DRY_RUN, body=sent)
            )
        except KubeError as e:
            if _verdict(e) is Verdict.ERROR:
                raise
            # A validating plugin may refuse Spark's pod alone where the profile makes it pass (PodSecurity:
            # the template hardens Spark's container). In production the webhook changes the pod before
            # any validation, so the answer that counts is the one with the profile: apply it to the pod
            # as Spark sends it and let the plugins derive everything in one pass.
            pod = sent
        mutation = mutate(_review(pod, namespace), policy)
        if mutation.profile != profile.name:
            why = f"the webhook would apply profile {mutation.profile} to the probe's pod ({mutation.reason})"
            return ProbeResult(profile.name, namespace, Verdict.ERROR, why)
        kube.request(
            "POST",
            f"/api/v1/namespaces/{namespace}/pods",
            query=DRY_RUN,
            body=apply_patch(pod, mutation.ops),
        )
    except KubeError as e:
        return ProbeResult(profile.name, namespace, _verdict(e), e.message)
    return ProbeResult(profile.name, namespace, Verdict.ADMITTED)


def probe_policy(kube: Kube, policy: Policy, namespaces: Sequence[str] | None = None) -> list[ProbeResult]:
    return [probe(kube, policy, profile, ns) for profile, ns in targets(kube, policy, namespaces)]


def _verdict(error: KubeError) -> Verdict:
    if error.status == 0:
        return Verdict.ERROR  # no answer at all
    if error.status == 403 and 'cannot create resource "pods"' in error.message:
        return Verdict.ERROR  # RBAC refused the probe itself, not the pod
    return Verdict.REFUSED


def _as_sent(received: Obj) -> Obj:
    """A dry run's answer as a client would send it again: without what the server sets on storing."""
    pod = {k: v for k, v in received.items() if k != "status"}
    pod["metadata"] = {k: v for k, v in (received.get("metadata") or {}).items() if k not in _SERVER_SET}
    return pod


def _review(pod: Obj, namespace: str) -> Obj:
    """The AdmissionReview request the API server would send sparkgate's webhook for `pod`."""
    return {
        "uid": "sparkgate-policy-probe",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "operation": "CREATE",
        "namespace": namespace,
        "name": pod["metadata"]["name"],
        "object": pod,
        "dryRun": True,
    }
