"""What sparkgate does to an executor pod, and what it lets through on update: pure functions.

`mutate(request, policy)` turns the `request` of an AdmissionReview into JSON Patch operations. Only the
CREATE of a Pod with Spark's executor role and an app id, outside the excluded namespaces, is changed: the
first matching profile's template is merged in (sparkgate/mutation/merge.py), its labels and annotations
added, its config maps mounted from the per-app copies the allocator creates, and the gate appended. What
the API server's plugins derived from a field the template changed is dropped, so that their second pass
derives it again instead of refusing the pod (sparkgate/mutation/derived.py). Spark's own labels are never
changed. sparkgate never denies an executor pod (docs/architecture.md: a denied creation is an executor
failure to Spark), so the only outcomes are a patch or no patch. The webhook (webhook/app.py) serves this
function over HTTP; the policy probe (sparkgate/probe.py) applies it to its dry-run pods.

`validate_update(request, allocator_users)` is the gate protection: an UPDATE that removes the sparkgate
gate is refused unless it comes from the allocator or a member of the break-glass group
(`sparkgate release`, docs/operations.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from sparkgate import contract
from sparkgate.policy import Policy, Profile

from .derived import drop_stale
from .merge import Path, Template
from .patch import Operation, diff

DEFAULT_SCHEDULER = "default-scheduler"  # what the API server sets when a pod names no scheduler


class Outcome(StrEnum):
    MUTATED = "mutated"  # an executor pod that got a patch
    UNCHANGED = "unchanged"  # an executor pod that already had everything (a re-invocation)
    SKIPPED = "skipped"  # not ours: another operation, kind, role, or an excluded namespace


@dataclass(frozen=True)
class Mutation:
    outcome: Outcome
    ops: list[Operation] = field(default_factory=list)
    profile: str | None = None
    reason: str = ""


def mutate(request: dict[str, Any], policy: Policy) -> Mutation:
    """The patch for the pod in an AdmissionReview request (which the caller has checked is well formed)."""
    if request.get("operation") != "CREATE":
        return Mutation(Outcome.SKIPPED, reason=f"operation {request.get('operation')}")
    if not _is_pod(request):
        return Mutation(Outcome.SKIPPED, reason="not a pod")
    pod = request.get("object")
    if not isinstance(pod, dict):
        raise ValueError("request.object is not a JSON object")
    metadata = pod.get("metadata") or {}
    labels = metadata.get("labels") or {}
    if not contract.is_executor(labels):
        return Mutation(Outcome.SKIPPED, reason="not a Spark executor pod")
    namespace = request.get("namespace") or metadata.get("namespace") or ""
    if policy.is_excluded(namespace):
        return Mutation(Outcome.SKIPPED, reason=f"namespace {namespace} is excluded")
    annotations = metadata.get("annotations") or {}
    profile = policy.profile_for(namespace, labels, annotations)
    wanted = desired_pod(pod, profile)
    ops = diff(pod, wanted)
    name = profile.name if profile is not None else contract.NO_PROFILE
    return Mutation(Outcome.MUTATED if ops else Outcome.UNCHANGED, ops, name)


def _is_pod(request: dict[str, Any]) -> bool:
    kind = request.get("kind") or {}
    resource = request.get("resource") or {}
    return (
        kind.get("kind") == "Pod"
        and kind.get("group", "") == ""
        and resource.get("resource", "pods") == "pods"
        and not request.get("subResource")
    )


def desired_pod(pod: dict[str, Any], profile: Profile | None) -> dict[str, Any]:
    """The pod as sparkgate wants it; shares untouched subtrees with `pod`, never mutates it."""
    out = dict(pod)
    pod_metadata = pod.get("metadata") or {}
    metadata = dict(pod_metadata)
    pod_spec = pod.get("spec") or {}
    spec = pod_spec
    pod_labels = pod_metadata.get("labels") or {}
    app_id = pod_labels[contract.LABEL_APP_ID]
    name = profile.name if profile is not None else contract.NO_PROFILE
    labels: dict[str, str] = dict(pod_labels)
    annotations: dict[str, str] = dict(pod_metadata.get("annotations") or {})
    if profile is not None:
        plan = _plan(profile)
        _fill(labels, plan.template_labels, plan.overrides, ("metadata", "labels"))
        _fill(annotations, plan.template_annotations, plan.overrides, ("metadata", "annotations"))
        labels.update(profile.labels)
        annotations.update(profile.annotations)
        spec = plan.spec.merge(pod_spec)
        spec = drop_stale(pod_spec, spec)
        spec = _mount_config_maps(spec, app_id, plan)
        spec = _scheduler_name(spec, profile)
    for key in contract.SPARK_LABELS:
        if key in pod_labels:
            labels[key] = pod_labels[key]
    annotations[contract.ANNOTATION_PROFILE] = name
    metadata["labels"] = labels
    metadata["annotations"] = annotations
    gates = spec.get("schedulingGates") or []
    if not any(g.get("name") == contract.GATE for g in gates if isinstance(g, dict)):
        spec = {**spec, "schedulingGates": [*gates, {"name": contract.GATE}]}
    out["metadata"] = metadata
    out["spec"] = spec
    return out


class _Plan:
    """What a profile's mutation needs that depends on the profile alone, computed once per profile."""

    def __init__(self, profile: Profile) -> None:
        self.overrides = frozenset(profile.overrides)
        template = profile.template
        template_meta = template.get("metadata") or {}
        self.template_labels: dict[str, str] = template_meta.get("labels") or {}
        self.template_annotations: dict[str, str] = template_meta.get("annotations") or {}
        self.spec = Template(template.get("spec") or {}, self.overrides, ("spec",))
        # (source, volume name, mount path) of each config map
        self.config_maps = tuple(
            (cm.source, contract.configmap_volume_name(cm.source), cm.mount_path)
            for cm in profile.config_maps
        )
        self._copies: dict[str, tuple[str, ...]] = {}  # app id -> its copies' names, in config_maps' order

    def copies(self, app_id: str) -> tuple[str, ...]:
        names = self._copies.get(app_id)
        if names is None:
            if len(self._copies) > 10_000:  # apps come and go: a bounded memo
                self._copies.clear()
            names = self._copies[app_id] = tuple(
                contract.app_configmap_name(app_id, source) for source, _, _ in self.config_maps
            )
        return names


# Each profile's plan, by the profile object's id; the profile is kept with its plan, so an id is not
# reused while its entry lives. A policy reload brings new profiles: the memo is bounded, not pruned. The
# webhook's request threads share it (a race computes a plan twice, equal; dict operations are atomic).
_PLANS: dict[int, tuple[Profile, _Plan]] = {}


def _plan(profile: Profile) -> _Plan:
    entry = _PLANS.get(id(profile))
    if entry is not None and entry[0] is profile:
        return entry[1]
    if len(_PLANS) > 1_000:
        _PLANS.clear()
    plan = _Plan(profile)
    _PLANS[id(profile)] = (profile, plan)
    return plan


def _fill(
    target: dict[str, str], template: dict[str, str] | None, overrides: frozenset[Path], at: Path
) -> None:
    for key, value in (template or {}).items():
        if key not in target or at in overrides or (*at, key) in overrides:
            target[key] = value


def _mount_config_maps(spec: dict[str, Any], app_id: str, plan: _Plan) -> dict[str, Any]:
    if not plan.config_maps:
        return spec
    containers = spec.get("containers") or []
    if not containers:
        return spec
    volumes = list(spec.get("volumes") or [])
    containers = list(containers)
    index = contract.spark_container_index(containers)
    container = dict(containers[index])
    mounts = list(container.get("volumeMounts") or [])
    for (_, volume, mount_path), copy in zip(plan.config_maps, plan.copies(app_id), strict=True):
        if not _has(volumes, "name", volume):
            volumes.append({"name": volume, "configMap": {"name": copy}})
        if not _has(mounts, "mountPath", mount_path):
            mounts.append({"name": volume, "mountPath": mount_path, "readOnly": True})
    container["volumeMounts"] = mounts
    containers[index] = container
    return {**spec, "volumes": volumes, "containers": containers}


def _has(items: list[Any], key: str, value: str) -> bool:
    """Whether an element of `items` has `value` at `key`."""
    for item in items:  # noqa: SIM110 (a loop, not any() over a generator: asked at every admission)
        if item.get(key) == value:
            return True
    return False


def _scheduler_name(spec: dict[str, Any], profile: Profile) -> dict[str, Any]:
    """The profile's `scheduling.schedulerName` (the kube-scheduler profile that calls sparkgate's extender),
    unless the pod already asks for a scheduler of its own (Spark's spark.kubernetes.scheduler.name)."""
    name = profile.scheduling.scheduler_name
    if name is None or spec.get("schedulerName") not in (None, "", DEFAULT_SCHEDULER):
        return spec
    return {**spec, "schedulerName": name}


def validate_update(request: dict[str, Any], allocator_users: frozenset[str]) -> tuple[bool, str]:
    """Gate protection: (allowed, message). Only the allocator and the break-glass group may remove the
    sparkgate gate."""
    if request.get("operation") != "UPDATE" or not _is_pod(request):
        return True, ""
    old, new = request.get("oldObject"), request.get("object")
    if not isinstance(old, dict) or not isinstance(new, dict):
        return True, ""
    if contract.gate_index(old) is None or contract.gate_index(new) is not None:
        return True, ""
    user_info = request.get("userInfo") or {}
    user = user_info.get("username", "")
    if user in allocator_users or contract.BREAK_GLASS_GROUP in (user_info.get("groups") or ()):
        return True, ""
    who = ", ".join(sorted(allocator_users)) or "the sparkgate allocator"
    return False, (
        f"sparkgate: only the sparkgate allocator ({who}) and members of the group "
        f"{contract.BREAK_GLASS_GROUP} may remove the scheduling gate {contract.GATE}; "
        f"{user or 'this user'} may not. The allocator releases executor pods within the cluster's limits."
    )
