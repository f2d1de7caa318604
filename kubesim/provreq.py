"""The ProvisioningRequest API (`autoscaling.x-k8s.io/v1`), as cluster-autoscaler's CRD defines it.

The object, its validation and its conditions, for the store (which validates every write) and for the
simulated autoscaler (provisioning.py, which writes the conditions):

- validation, from the CRD's schema (kubernetes-sigs/cluster-autoscaler
  pkg/apis/config/crd/autoscaling.x-k8s.io_provisioningrequests.yaml, generated from apis/provisioningrequest/
  autoscaling.x-k8s.io/v1/types.go): `spec` required; `spec.podSets` 1..32 items of `{podTemplateRef: {name},
  count >= 1}`; `spec.provisioningClassName` a DNS subdomain of at most 253 characters; `spec.parameters`
  at most 100 string values of at most 255 characters; podSets, provisioningClassName and parameters each
  carry the transition rule `self == oldSelf` ("Value is immutable"), which the API server evaluates only
  when the field is in both the old and the new object. Messages are those of kube-openapi's schema
  validation and of a CEL rule as kube-apiserver words them; unknown fields are not pruned here.
- conditions (pkg/provisioningrequest/conditions/conditions.go): types, reasons and messages as CA writes
  them; `add_or_update_condition` is CA's `AddOrUpdateCondition` (a condition of the same type replaced, its
  lastTransitionTime always now, whether the status changed or not).
- the pods a request stands for (pkg/provisioningrequest/pods/pods.go `PodsForProvisioningRequest`): for
  each podSet i, `count` pods made from the PodTemplate, named `<request>-<i>-<j>`, annotated with the
  request and its class.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from .errors import invalid
from .jsondata import clone

Obj = dict[str, Any]

KIND = "ProvisioningRequest.autoscaling.x-k8s.io"
CHECK_CAPACITY = "check-capacity.autoscaling.x-k8s.io"
BEST_EFFORT_ATOMIC = "best-effort-atomic-scale-up.autoscaling.x-k8s.io"
CONSUME_ANNOTATION = "autoscaling.x-k8s.io/consume-provisioning-request"
CLASS_ANNOTATION = "autoscaling.x-k8s.io/provisioning-class-name"

# Condition types (types.go) and CA's reasons and messages (conditions.go; the literal messages are those
# of checkcapacity/provisioningclass.go and besteffortatomic/provisioning_class.go).
ACCEPTED, PROVISIONED, FAILED, BOOKING_EXPIRED, CAPACITY_REVOKED = (
    "Accepted",
    "Provisioned",
    "Failed",
    "BookingExpired",
    "CapacityRevoked",
)
ACCEPTED_MSG = "ProvisioningRequest is accepted by ClusterAutoscaler"
CAPACITY_IS_FOUND, CAPACITY_IS_FOUND_MSG = "CapacityIsFound", "Capacity is found in the cluster"
CAPACITY_IS_PROVISIONED, CAPACITY_IS_PROVISIONED_MSG = (
    "CapacityIsProvisioned",
    "Capacity is found in the cluster",
)
CAPACITY_IS_NOT_FOUND = "CapacityIsNotFound"
CAPACITY_IS_NOT_FOUND_MSG = "Capacity is not found, CA will try to find it later."
CAPACITY_NOT_FOUND_NO_RETRY_MSG = "CA could not find requested capacity"
FAILED_TO_CREATE_PODS = "FailedToCreatePods"
RESERVATION_EXPIRED, RESERVATION_EXPIRED_MSG = (
    "CapacityReservationTimeExpired",
    "Capacity reservation time is expired",
)
BOOKING_CONSUMED, BOOKING_CONSUMED_MSG = (
    "CapacityBookingConsumed",
    "Capacity booking consumed: all pods scheduled",
)
EXPIRED, EXPIRED_MSG = "Expired", "ProvisioningRequest is expired"
# The types CA's AddOrUpdateCondition writes; it logs an error and writes nothing for any other
# (CapacityRevoked among them: CA defines it, never sets it).
WRITTEN_TYPES = (PROVISIONED, BOOKING_EXPIRED, FAILED, ACCEPTED)

_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_IMMUTABLE = ("podSets", "provisioningClassName", "parameters")


def validate(new: Obj, old: Obj | None) -> None:
    """422 Invalid when `new` breaks the CRD's schema, or changes an immutable field of `old`."""
    name = str((new.get("metadata") or {}).get("name", ""))
    causes = _schema_problems(new)
    if old is not None and not causes:
        new_spec, old_spec = new.get("spec") or {}, old.get("spec") or {}
        for field in _IMMUTABLE:
            if field in new_spec and field in old_spec and new_spec[field] != old_spec[field]:
                shape = _type(new_spec[field])
                causes.append((f"spec.{field}", f'Invalid value: "{shape}": Value is immutable'))
    if causes:
        raise invalid(KIND, name, causes)


def _schema_problems(obj: Obj) -> list[tuple[str, str]]:
    spec = obj.get("spec")
    if not isinstance(spec, dict):
        return [("spec", "Required value")]
    causes: list[tuple[str, str]] = []
    pod_sets = spec.get("podSets")
    if pod_sets is None:
        causes.append(("spec.podSets", "Required value"))
    elif not isinstance(pod_sets, list):
        causes.append(("spec.podSets", f'Invalid value: "{_type(pod_sets)}": spec.podSets in body must be of type array: "{_type(pod_sets)}"'))  # fmt: skip
    elif not pod_sets:
        causes.append(("spec.podSets", "Invalid value: 0: spec.podSets in body should have at least 1 items"))
    elif len(pod_sets) > 32:
        causes.append(("spec.podSets", f"Too many: {len(pod_sets)}: must have at most 32 items"))
    for i, pod_set in enumerate(pod_sets if isinstance(pod_sets, list) else []):
        causes += _pod_set_problems(f"spec.podSets[{i}]", pod_set)
    class_name = spec.get("provisioningClassName")
    if class_name is None:
        causes.append(("spec.provisioningClassName", "Required value"))
    else:
        causes += _subdomain_problems("spec.provisioningClassName", class_name)
    parameters = spec.get("parameters")
    if parameters is not None:
        if not isinstance(parameters, dict):
            causes.append(("spec.parameters", f'Invalid value: "{_type(parameters)}": spec.parameters in body must be of type object: "{_type(parameters)}"'))  # fmt: skip
        else:
            if len(parameters) > 100:
                causes.append(
                    ("spec.parameters", f"Too many: {len(parameters)}: must have at most 100 items")
                )
            for key, value in parameters.items():
                path = f"spec.parameters.{key}"
                if not isinstance(value, str):
                    causes.append((path, f'Invalid value: "{_type(value)}": {path} in body must be of type string: "{_type(value)}"'))  # fmt: skip
                elif len(value) > 255:
                    causes.append((path, "Too long: may not be more than 255 bytes"))
    return causes


def _pod_set_problems(path: str, pod_set: Any) -> list[tuple[str, str]]:
    if not isinstance(pod_set, dict):
        return [(path, f'Invalid value: "{_type(pod_set)}": {path} in body must be of type object: "{_type(pod_set)}"')]  # fmt: skip
    causes: list[tuple[str, str]] = []
    count = pod_set.get("count")
    if count is None:
        causes.append((f"{path}.count", "Required value"))
    elif not isinstance(count, int) or isinstance(count, bool):
        causes.append((f"{path}.count", f'Invalid value: "{_type(count)}": {path}.count in body must be of type integer: "{_type(count)}"'))  # fmt: skip
    elif count < 1:
        causes.append((f"{path}.count", f"Invalid value: {count}: {path}.count in body should be greater than or equal to 1"))  # fmt: skip
    ref = pod_set.get("podTemplateRef")
    if ref is None:
        causes.append((f"{path}.podTemplateRef", "Required value"))
    elif not isinstance(ref, dict) or "name" not in ref:
        causes.append((f"{path}.podTemplateRef.name", "Required value"))
    else:
        causes += _subdomain_problems(f"{path}.podTemplateRef.name", ref["name"])
    return causes


def _subdomain_problems(path: str, value: Any) -> list[tuple[str, str]]:
    if not isinstance(value, str):
        return [
            (
                path,
                f'Invalid value: "{_type(value)}": {path} in body must be of type string: "{_type(value)}"',
            )
        ]
    causes = []
    if len(value) > 253:
        causes.append((path, "Too long: may not be more than 253 bytes"))
    if not re.match(_SUBDOMAIN, value):
        causes.append((path, f"Invalid value: \"{value}\": {path} in body should match '{_SUBDOMAIN}'"))
    return causes


def _type(value: Any) -> str:
    return {
        bool: "boolean",
        int: "integer",
        float: "number",
        str: "string",
        list: "array",
        dict: "object",
    }.get(type(value), "null")


# --- reading and writing conditions ---------------------------------------------------------------------


def condition(pr: Obj, kind: str) -> Obj | None:
    """apimeta.FindStatusCondition."""
    return next((c for c in (pr.get("status") or {}).get("conditions") or [] if c.get("type") == kind), None)


def is_true(pr: Obj, kind: str) -> bool:
    """apimeta.IsStatusConditionTrue."""
    found = condition(pr, kind)
    return found is not None and found.get("status") == "True"


def add_or_update_condition(pr: Obj, kind: str, status: str, reason: str, message: str, now: str) -> Obj:
    """conditions.go `AddOrUpdateCondition`: the request with this condition replacing one of its type (or
    appended), lastTransitionTime `now` even when nothing changed, observedGeneration the request's."""
    if kind not in WRITTEN_TYPES:
        return pr
    new = clone(pr)
    entry = {
        "type": kind,
        "status": status,
        "observedGeneration": int(new["metadata"].get("generation", 0)),
        "lastTransitionTime": now,
        "reason": reason,
        "message": message,
    }
    conditions = (new.setdefault("status", {}) or {}).get("conditions") or []
    if any(c.get("type") == kind for c in conditions):
        conditions = [entry if c.get("type") == kind else c for c in conditions]
    else:
        conditions = [*conditions, entry]
    new["status"]["conditions"] = conditions
    return new


def pod_count(pr: Obj) -> int:
    """provreqwrapper.go `PodCount`: the sum of the podSets' counts."""
    return sum(int(s.get("count", 0)) for s in (pr.get("spec") or {}).get("podSets") or [])


def missing_templates(pr: Obj, templates: Mapping[str, Obj]) -> str | None:
    """provreqwrapper.go `errMissingPodTemplates`: the error CA fails a request with, or None."""
    pod_sets = (pr.get("spec") or {}).get("podSets") or []
    missing = [s["podTemplateRef"]["name"] for s in pod_sets if s["podTemplateRef"]["name"] not in templates]
    if not missing:
        return None
    return (
        f"missing pod templates, {len(pod_sets)} pod templates were referenced, {len(missing)} templates "
        f"were missing: {','.join(missing)}"
    )


def pods_for(pr: Obj, templates: Mapping[str, Obj]) -> Sequence[Obj]:
    """The in-memory pods CA injects for a request (pods.go `PodsForProvisioningRequest`)."""
    meta = pr["metadata"]
    spec = pr.get("spec") or {}
    pods = []
    for i, pod_set in enumerate(spec.get("podSets") or []):
        template = (templates[pod_set["podTemplateRef"]["name"]].get("template")) or {}
        for j in range(int(pod_set["count"])):
            name = f"{meta['name']}-{i}-{j}"
            annotations = {
                **((template.get("metadata") or {}).get("annotations") or {}),
                CONSUME_ANNOTATION: meta["name"],
                CLASS_ANNOTATION: spec.get("provisioningClassName", ""),
            }
            pods.append(
                {
                    "metadata": {
                        "name": name,
                        "namespace": meta.get("namespace", ""),
                        "uid": f"{meta.get('namespace', '')}/{name}",
                        "labels": dict((template.get("metadata") or {}).get("labels") or {}),
                        "annotations": annotations,
                        "creationTimestamp": meta.get("creationTimestamp"),
                    },
                    "spec": clone(template.get("spec") or {}),
                    "status": {"phase": "Pending"},
                }
            )
    return pods
