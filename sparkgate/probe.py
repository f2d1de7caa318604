"""The policy probe: would the live API server admit the executor pods that each profile shapes?

A profile that the API server refuses kills Spark applications (each refused creation is an executor
failure; docs/real-cluster-facts.md), and only the cluster knows whether its PriorityClass, service account or runtime
class exist, what its namespaces' PodSecurity levels, LimitRanges and quotas allow, and what other
admission policies and webhooks say. So, for each profile and each namespace it matches, the probe builds
an executor pod as a Spark 4.3 driver sends it (the captured pod shipped in sparkgate/examples/executor-pod.json,
without what the API server's plugins derive), made to match the profile, and asks the API server with
`dryRun=All`, which runs the whole admission chain and stores nothing.

The policy judged is the one given, which need not be the one the live webhook runs: `sparkgate policy check
--cluster` judges a candidate before it is applied (issue 20: a probe pod re-shaped by the live webhook judged
the old policy, and a profile the live policy lacks was never found). So the live sparkgate webhook is kept
out: every probe pod carries the label `sparkgate.io/policy-probe`, and the webhook's matchCondition
(`MATCH_CONDITION`, in manifests/base/webhooks.yaml) skips a dry run that carries it. A stored pod with
the label is shaped as any other, so the label lets no one past the gate. The probe is then two dry runs:

1. the pod as Spark sends it: the built-in plugins and every other webhook answer, and the answer is the pod
   as sparkgate's webhook receives it in production;
2. that pod, shaped by the judged policy with the webhook's own function (`sparkgate.mutation.mutate`): the
   API server's second pass after sparkgate's webhook, then its validating plugins, policies and webhooks.

A live webhook that shapes the probe pod all the same (installed without the matchCondition) is detected
by the profile it names and reported as an error, never as the candidate's verdict. `live` is what the live
webhook does to the same Spark pod, for the check to report where the live policy differs from the judged one.

The result is the API server's answer word for word. `sparkgate policy check --cluster` prints it; the
allocator's leader runs it periodically (allocator/probe.py) and exports it as a metric and Events.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
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
PROBE_LABEL = "sparkgate.io/policy-probe"
# The mutating webhook's matchCondition (manifests/base/webhooks.yaml; a test keeps them equal): skip a dry
# run of a probe pod. `has` guards both fields, so the expression cannot fail (under failurePolicy Ignore a
# failing condition would skip the webhook for every pod).
MATCH_CONDITION = {
    "name": "not-a-policy-probe-dry-run",
    "expression": "!(has(request.dryRun) && request.dryRun && has(object.metadata.labels) && "
    f"'{PROBE_LABEL}' in object.metadata.labels)",
}
TERMINATING = "Terminating"  # a namespace being deleted: status.phase, what NamespaceLifecycle checks
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
    dry_runs: int = 0  # dry-run creations it took
    # The admitted pod as the API server answered it (for the check's comparison with the live webhook).
    pod: Obj | None = field(default=None, compare=False, repr=False)

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
    labels[PROBE_LABEL] = "true"
    metadata["annotations"] = {contract.ANNOTATION_PROFILE: profile.name}
    pod["spec"] = {**strip_derived(pod["spec"]), "hostname": name}
    pod.pop("status", None)
    return pod


def targets(kube: Kube, policy: Policy, namespaces: Sequence[str] | None = None) -> list[tuple[Profile, str]]:
    """(profile, namespace) for every profile and every namespace it matches: those given, else every
    namespace of the cluster that is not being deleted (its pods are going, and the API server refuses any
    new one: `_terminating`); excluded namespaces never (sparkgate does not touch their pods)."""
    if namespaces is None:
        items, _ = kube.list("/api/v1/namespaces")
        namespaces = [
            item["metadata"]["name"]
            for item in items
            if (item.get("status") or {}).get("phase") != TERMINATING
        ]
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
    dry_runs = 0

    def result(verdict: Verdict, message: str = "", pod: Obj | None = None) -> ProbeResult:
        return ProbeResult(profile.name, namespace, verdict, message, dry_runs, pod)

    try:
        dry_runs += 1
        try:
            pod = _as_sent(_dry_run(kube, sent))
        except KubeError as e:
            if _verdict(e) is Verdict.ERROR:
                raise
            # A validating plugin may refuse Spark's pod alone where the profile makes it pass (PodSecurity:
            # the template hardens Spark's container). In production the webhook changes the pod before
            # any validation, so the answer that counts is the one with the profile: apply it to the pod
            # as Spark sends it and let the plugins derive everything in one pass.
            pod = sent
        if _gated(pod):  # only sparkgate's webhook adds its gate
            return result(Verdict.ERROR, _reshaped(pod))
        mutation = mutate(_review(pod, namespace), policy)
        if mutation.profile != profile.name:
            why = f"the policy applies profile {mutation.profile} to the probe's pod ({mutation.reason})"
            return result(Verdict.ERROR, why)
        dry_runs += 1
        admitted = _dry_run(kube, apply_patch(pod, mutation.ops))
    except KubeError as e:
        return result(_verdict(e), e.message)
    if (admitted["metadata"].get("annotations") or {}).get(contract.ANNOTATION_PROFILE) != profile.name:
        return result(Verdict.ERROR, _reshaped(admitted))
    return result(Verdict.ADMITTED, pod=admitted)


@dataclass(frozen=True)
class LiveResult:
    """What the live admission chain, the live sparkgate webhook included, does to the probe's Spark pod."""

    verdict: Verdict
    message: str = ""  # the refusal, word for word
    profile: str | None = None  # the profile the live webhook applied; None: it did not shape the pod
    differences: tuple[str, ...] = ()  # fields where its pod differs from the judged policy's

    def differs(self, judged: ProbeResult) -> bool:
        if self.verdict is not judged.verdict or self.message != judged.message:
            return True
        return self.verdict is Verdict.ADMITTED and (self.profile != judged.profile or bool(self.differences))

    def line(self) -> str:
        if self.verdict is Verdict.ERROR:
            return f"the live chain was not asked: {self.message}"
        if self.verdict is Verdict.REFUSED:
            return f"with the live webhook the pod is refused: {self.message}"
        if self.profile is None:
            return "the live sparkgate webhook did not shape the pod (not installed, or down under Ignore); admitted"
        others = f", with other {', '.join(self.differences)}" if self.differences else ""
        return f"the live webhook applies profile {self.profile}{others}; admitted"


def live(kube: Kube, judged: ProbeResult, profile: Profile) -> LiveResult:
    """One dry run of the judged pair's Spark pod without the probe label: the live webhook shapes it."""
    sent = spark_pod(profile, judged.namespace)
    del sent["metadata"]["labels"][PROBE_LABEL]
    try:
        answer = _dry_run(kube, sent)
    except KubeError as e:
        return LiveResult(_verdict(e), e.message)
    profile_name = (answer["metadata"].get("annotations") or {}).get(contract.ANNOTATION_PROFILE)
    applied = None if not _gated(answer) else profile_name
    differences = _differences(answer, judged.pod) if judged.pod is not None and applied else ()
    return LiveResult(Verdict.ADMITTED, profile=applied, differences=differences)


def _verdict(error: KubeError) -> Verdict:
    if error.status == 0:
        return Verdict.ERROR  # no answer at all
    if error.status == 403 and 'cannot create resource "pods"' in error.message:
        return Verdict.ERROR  # RBAC refused the probe itself, not the pod
    if _terminating(error):
        return Verdict.ERROR  # the namespace, not the pod: deleted since it was listed
    return Verdict.REFUSED


def _terminating(error: KubeError) -> bool:
    """The NamespaceLifecycle admission plugin's refusal of any creation in a namespace being deleted
    (k8s.io/apiserver plugin/namespace/lifecycle/admission.go `Admit`: 403 Forbidden, `unable to create new
    content in namespace X because it is being terminated`, with the cause NamespaceTerminating)."""
    return error.status == 403 and "because it is being terminated" in error.message


def _dry_run(kube: Kube, pod: Obj) -> Obj:
    namespace = pod["metadata"]["namespace"]
    answer: Obj = kube.request("POST", f"/api/v1/namespaces/{namespace}/pods", query=DRY_RUN, body=pod)
    return answer


def _gated(pod: Obj) -> bool:
    return any(g.get("name") == contract.GATE for g in (pod.get("spec") or {}).get("schedulingGates") or ())


def _reshaped(pod: Obj) -> str:
    """The error of a probe whose pod the live sparkgate webhook shaped all the same."""
    named = (pod["metadata"].get("annotations") or {}).get(contract.ANNOTATION_PROFILE)
    return (
        f"the live sparkgate webhook shaped the probe's pod (profile {named}): its configuration lacks the "
        f"matchCondition {MATCH_CONDITION['name']} that keeps it out of the probe's dry runs (install the "
        "manifests of this version)"
    )


def _differences(live_pod: Obj, judged_pod: Obj) -> tuple[str, ...]:
    """The fields (metadata.labels, metadata.annotations, spec.X) where two answered pods differ, leaving
    out what the API server sets or derives (token volume names are random)."""
    out = []
    for part in ("labels", "annotations"):
        a = {k: v for k, v in (live_pod["metadata"].get(part) or {}).items() if k != PROBE_LABEL}
        b = {k: v for k, v in (judged_pod["metadata"].get(part) or {}).items() if k != PROBE_LABEL}
        if part == "annotations":
            a.pop(contract.ANNOTATION_PROFILE, None)
            b.pop(contract.ANNOTATION_PROFILE, None)
        if a != b:
            out.append(f"metadata.{part}")
    live_spec, judged_spec = strip_derived(live_pod["spec"]), strip_derived(judged_pod["spec"])
    for key in sorted(set(live_spec) | set(judged_spec)):
        if key != "hostname" and live_spec.get(key) != judged_spec.get(key):
            out.append(f"spec.{key}")
    return tuple(out)


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
