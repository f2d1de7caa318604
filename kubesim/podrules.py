"""The pod rules of kube-apiserver that sparkgate can observe.

- Defaults at creation: phase Pending, terminationGracePeriodSeconds 30, requests from limits, the
  deprecated `serviceAccount` as `serviceAccountName`.
- Updates of the main resource may change metadata, and in the spec only what the real server allows
  (https://kubernetes.io/docs/concepts/workloads/pods/#pod-update-and-replacement): container and init
  container images, activeDeadlineSeconds, additions to tolerations, and the removal of scheduling gates;
  while a pod is gated, nodeSelector additions and affinity too (Pod Scheduling Readiness,
  https://kubernetes.io/docs/concepts/scheduling-eviction/pod-scheduling-readiness/). Status changes on
  the main resource are ignored; the status subresource changes the status and the metadata, never the
  spec or the ownerReferences.
- Graceful deletion: a pod that is not bound to a node, or has finished, goes at once; otherwise it gets a
  deletionTimestamp and the kubelet removes it after its grace period.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from . import quantities
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
    pod.setdefault("status", {})  # the server sets it after admission (prepare_for_create): a webhook sees {}


SCHEDULING_GATED = "Scheduling is blocked due to non-empty scheduling gates"


def prepare_for_create(pod: Obj, now: str) -> None:
    """pkg/registry/core/pod/strategy.go `PrepareForCreate`, after the mutating admission: the status is the
    server's own (phase Pending and the QoS class, whatever the client or a webhook sent), and a pod created
    with scheduling gates is PodScheduled=False, reason SchedulingGated (`applySchedulingGatedCondition`,
    through podutil.UpdatePodCondition, which stamps lastTransitionTime)."""
    status: Obj = {"phase": "Pending", "qosClass": qos_class(pod)}
    if (pod.get("spec") or {}).get("schedulingGates"):
        status["conditions"] = [
            {
                "type": "PodScheduled",
                "status": "False",
                "lastProbeTime": None,
                "lastTransitionTime": now,
                "reason": "SchedulingGated",
                "message": SCHEDULING_GATED,
            }
        ]
    pod["status"] = status


def qos_class(pod: Obj) -> str:
    """pkg/apis/core/helper/qos `ComputePodQOS`: BestEffort without a positive cpu or memory request or limit
    in any container (init containers too); Guaranteed when every container limits both cpu and memory and
    the summed requests equal the summed limits, resource by resource; Burstable otherwise."""
    spec = pod.get("spec") or {}
    requests: dict[str, Decimal] = {}
    limits: dict[str, Decimal] = {}
    guaranteed = True
    for container in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]:
        resources = container.get("resources") or {}
        for kind, into in (("requests", requests), ("limits", limits)):
            for name, value in (resources.get(kind) or {}).items():
                if name in ("cpu", "memory") and (amount := _amount(value)) > 0:
                    into[name] = into.get(name, Decimal(0)) + amount
        limited = {n for n, v in (resources.get("limits") or {}).items() if _amount(v) > 0}
        if not {"cpu", "memory"} <= limited:
            guaranteed = False
    if not requests and not limits:
        return "BestEffort"
    if guaranteed and requests == limits:
        return "Guaranteed"
    return "Burstable"


def _amount(value: Any) -> Decimal:
    # kube-apiserver refuses a malformed quantity when it decodes the request (400); kubesim does not model
    # that refusal, and counts it as none here.
    try:
        return quantities.parse(value)
    except ValueError:
        return Decimal(0)


def _mutable_masked(spec: Obj, gated: bool) -> Obj:
    """The spec without what an update may change, for comparison only: it shares the spec's values."""
    dropped = {"activeDeadlineSeconds", "tolerations", "schedulingGates"}
    if gated:
        dropped |= {"nodeSelector", "affinity"}
    masked = {k: v for k, v in spec.items() if k not in dropped}
    for field in ("containers", "initContainers"):
        if isinstance(masked.get(field), list):
            masked[field] = [
                {k: v for k, v in c.items() if k != "image"} if isinstance(c, dict) else c
                for c in masked[field]
            ]
    return masked


def check_update(old: Obj, new: Obj, subresource: str) -> Obj:
    name = old["metadata"]["name"]
    if subresource == "status":
        # pkg/registry/core/pod/strategy.go `podStatusStrategy.PrepareForUpdate`: the old spec, the old
        # ownerReferences, the QoS class backfilled; metadata (labels, annotations) and the whole status
        # as sent. A PodScheduled condition that a client writes on a gated pod is kept as it is.
        status = clone(new.get("status") or {})
        if not status.get("qosClass") and (old.get("status") or {}).get("qosClass"):
            status["qosClass"] = old["status"]["qosClass"]
        metadata = {k: v for k, v in new["metadata"].items() if k != "ownerReferences"}
        if "ownerReferences" in old["metadata"]:
            metadata["ownerReferences"] = clone(old["metadata"]["ownerReferences"])
        return {**clone(old), "metadata": metadata, "status": status}
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
    """pkg/registry/core/pod/strategy.go `CheckGracefulDelete`: the request's period, else the pod's
    terminationGracePeriodSeconds; 0 for a pod not scheduled or already terminated; a negative one is 1."""
    if not (pod.get("spec") or {}).get("nodeName"):
        return 0
    if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return 0
    if requested is not None:
        return 1 if requested < 0 else requested
    return int((pod.get("spec") or {}).get("terminationGracePeriodSeconds", 30))
