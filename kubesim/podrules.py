"""The pod rules of kube-apiserver that sparkgate can observe.

- Defaults at creation: phase Pending, terminationGracePeriodSeconds 30, requests from limits, the
  deprecated `serviceAccount` as `serviceAccountName`.
- Updates of the main resource may change metadata, and in the spec only what the real server allows
  (https://kubernetes.io/docs/concepts/workloads/pods/#pod-update-and-replacement): container and init
  container images, activeDeadlineSeconds, additions to tolerations, and the removal of scheduling gates;
  while a pod is gated, nodeSelector additions and affinity too (Pod Scheduling Readiness,
  https://kubernetes.io/docs/concepts/scheduling-eviction/pod-scheduling-readiness/). Status changes on
  the main resource are ignored; the status subresource changes only the status.
- Graceful deletion: a pod that is not bound to a node, or has finished, goes at once; otherwise it gets a
  deletionTimestamp and the kubelet removes it after its grace period.
"""

from __future__ import annotations

from typing import Any

from .errors import invalid
from .jsondata import clone

Obj = dict[str, Any]
GATES_FORBIDDEN = "Forbidden: only deletion is allowed, but found new scheduling gate '{}'"
SPEC_FORBIDDEN = (
    "Forbidden: pod updates may not change fields other than `spec.containers[*].image`,"
    "`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to "
    "existing tolerations),`spec.terminationGracePeriodSeconds` (allow it to be set to 1 if it was previously "
    "negative)"
)


# PodTopologyLabels (plugin/pkg/admission/podtopologylabels/admission.go, kube-apiserver 1.35+): copied from
# the node onto the pod when it is bound.
TOPOLOGY_LABELS = ("topology.kubernetes.io/zone", "topology.kubernetes.io/region")


def topology_labels(node: Obj) -> dict[str, str]:
    labels = (node.get("metadata") or {}).get("labels") or {}
    return {k: labels[k] for k in TOPOLOGY_LABELS if k in labels}


def default_pod(pod: Obj) -> None:
    """v1 defaulting and conversion, applied on create and to a mutating webhook's answer."""
    spec = pod.setdefault("spec", {})
    if not spec.get("serviceAccountName") and spec.get("serviceAccount"):
        spec["serviceAccountName"] = spec["serviceAccount"]
    for field in ("initContainers", "containers"):
        for container in spec.get(field) or []:
            resources = container.get("resources") or {}
            if resources.get("limits"):  # SetDefaults_Pod: a limit without a request is also the request
                requests = resources.setdefault("requests", {})
                for name, value in resources["limits"].items():
                    requests.setdefault(name, value)
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("schedulerName", "default-scheduler")
    status = pod.setdefault("status", {})
    status["phase"] = "Pending"
    status.setdefault("qosClass", "BestEffort")


def _mutable_masked(spec: Obj, gated: bool) -> Obj:
    spec = clone(spec)
    for field in ("containers", "initContainers"):
        for container in spec.get(field) or []:
            container.pop("image", None)
    for field in ("activeDeadlineSeconds", "tolerations", "schedulingGates"):
        spec.pop(field, None)
    if gated:
        spec.pop("nodeSelector", None)
        spec.pop("affinity", None)
    return spec


def check_update(old: Obj, new: Obj, subresource: str) -> Obj:
    name = old["metadata"]["name"]
    if subresource == "status":
        return {**clone(old), "metadata": new["metadata"], "status": new.get("status") or {}}
    new = {**new, "status": clone(old.get("status") or {})}
    old_spec, new_spec = old.get("spec") or {}, new.get("spec") or {}
    old_gates = [g.get("name") for g in old_spec.get("schedulingGates") or []]
    for gate in new_spec.get("schedulingGates") or []:
        if gate.get("name") not in old_gates:
            raise invalid("Pod", name, [("spec.schedulingGates", GATES_FORBIDDEN.format(gate.get("name")))])
    old_tolerations = old_spec.get("tolerations") or []
    new_tolerations = new_spec.get("tolerations") or []
    if any(t not in new_tolerations for t in old_tolerations):
        raise invalid(
            "Pod",
            name,
            [
                (
                    "spec.tolerations",
                    "Forbidden: existing toleration can not be modified except its tolerationSeconds",
                )
            ],
        )
    gated = bool(old_gates)
    if gated:
        for key, value in (old_spec.get("nodeSelector") or {}).items():
            if (new_spec.get("nodeSelector") or {}).get(key) != value:
                raise invalid(
                    "Pod",
                    name,
                    [("spec.nodeSelector", "Invalid value: only additions to spec.nodeSelector are allowed")],
                )
    if _mutable_masked(old_spec, gated) != _mutable_masked(new_spec, gated):
        raise invalid("Pod", name, [("spec", SPEC_FORBIDDEN)])
    if "schedulingGates" in new_spec and not new_spec["schedulingGates"]:
        new = {**new, "spec": {k: v for k, v in new_spec.items() if k != "schedulingGates"}}  # omitempty
    return new


def grace_period(pod: Obj, requested: int | None) -> int:
    if not (pod.get("spec") or {}).get("nodeName"):
        return 0
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return 0
    if requested is not None:
        return max(requested, 0)
    return int((pod.get("spec") or {}).get("terminationGracePeriodSeconds", 30))
