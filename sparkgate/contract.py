"""The contract on an executor pod, shared by the webhook and the allocator.

Everything both halves must agree on lives here: the label and annotation keys, the gate's name, how an
application is identified, which container is Spark's, and the name of an app's copy of a config map.
The webhook writes these names at admission; the allocator reads them back later, so they can never drift.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any, NamedTuple

GATE = "sparkgate.io/allocator"

# The install's names (manifests/base). Every default in the code is one of these; the manifests set the
# same values through the environment, and tests/manifests checks that they agree.
INSTALL_NAMESPACE = "sparkgate-system"
ALLOCATOR_SERVICE_ACCOUNT = "sparkgate-allocator"
ALLOCATOR_USER = f"system:serviceaccount:{INSTALL_NAMESPACE}:{ALLOCATOR_SERVICE_ACCOUNT}"
ALLOCATOR_LEASE = "sparkgate-allocator"
CERTS_LEASE = "sparkgate-certs"
CERT_SECRET = "sparkgate-webhook-tls"
WEBHOOK_SERVICE = "sparkgate-webhook"
WEBHOOK_CONFIGURATION = "sparkgate"
POLICY_CONFIGMAP = "sparkgate-policy"  # the policy's ConfigMap (configMapGenerator in manifests/base)
POLICY_FILE = "/etc/sparkgate/policy/policy.yaml"  # where the pod mounts it (the processes' --policy)
# Besides the allocator, the only ones the gate protection lets remove the gate: the admin's break-glass
# path (`sparkgate release`). The install binds nobody to it; an admin binds themselves when needed.
BREAK_GLASS_GROUP = "sparkgate:break-glass"
# The user an admin impersonates with that group where they cannot be a member (`sparkgate release --as
# sparkgate-break-glass --as-group sparkgate:break-glass`; ClusterRole sparkgate-break-glass-impersonator).
BREAK_GLASS_USER = "sparkgate-break-glass"

# Labels Spark sets on every executor pod (Spark's KubernetesConf / Constants); never changed by sparkgate.
LABEL_ROLE = "spark-role"
LABEL_APP_ID = "spark-app-selector"
LABEL_EXEC_ID = "spark-exec-id"
LABEL_RESOURCE_PROFILE = "spark-exec-resourceprofile-id"
LABEL_APP_NAME = "spark-app-name"
LABEL_VERSION = "spark-version"
SPARK_LABELS = frozenset(
    {LABEL_ROLE, LABEL_APP_ID, LABEL_EXEC_ID, LABEL_RESOURCE_PROFILE, LABEL_APP_NAME, LABEL_VERSION}
)
ROLE_EXECUTOR = "executor"
ROLE_DRIVER = "driver"

ANNOTATION_PROFILE = "sparkgate.io/profile"
ANNOTATION_BATCH_SIZE = "sparkgate.io/batch-size"
ANNOTATION_MAX_PENDING = "sparkgate.io/max-pending"

LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "sparkgate"

# Value of ANNOTATION_PROFILE on a pod that sparkgate admitted but that no profile matched.
NO_PROFILE = "none"

SPARK_CONTAINER_ENV = "SPARK_EXECUTOR_ID"
SPARK_CONTAINER_NAME = "spark-kubernetes-executor"


class AppKey(NamedTuple):
    """An application: (namespace, app id). A pod never speaks for another namespace's app."""

    namespace: str
    app_id: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.app_id}"


def is_executor(labels: dict[str, str]) -> bool:
    """An executor pod that sparkgate manages: Spark's executor role and an application id."""
    return labels.get(LABEL_ROLE) == ROLE_EXECUTOR and bool(labels.get(LABEL_APP_ID))


def gate_index(pod: dict[str, Any]) -> int | None:
    """Position of the sparkgate gate in the pod's `spec.schedulingGates`, or None when it has none."""
    gates = (pod.get("spec") or {}).get("schedulingGates") or []
    return next((i for i, g in enumerate(gates) if isinstance(g, dict) and g.get("name") == GATE), None)


def gate_removal(index: int) -> list[dict[str, Any]]:
    """The JSON Patch that removes the gate at `index`: its `test` makes a concurrent change of the gates
    fail the patch (422) instead of removing another gate."""
    pointer = f"/spec/schedulingGates/{index}"
    return [{"op": "test", "path": pointer, "value": {"name": GATE}}, {"op": "remove", "path": pointer}]


def spark_container_index(containers: list[dict[str, Any]]) -> int:
    """Index of Spark's container: the one with SPARK_EXECUTOR_ID, else Spark's default name, else 0.

    With an executor pod template Spark appends its container after the template's sidecars, so the
    index alone says nothing.
    """
    for i, container in enumerate(containers):
        for env in container.get("env") or ():  # a loop, not any() over a generator: asked at every admission
            if env.get("name") == SPARK_CONTAINER_ENV:
                return i
    for i, container in enumerate(containers):
        if container.get("name") == SPARK_CONTAINER_NAME:
            return i
    return 0


_INVALID_NAME_CHARS = re.compile(r"[^a-z0-9-]+")
NAME_MAX = 63


def _name_part(text: str, limit: int) -> str:
    return _INVALID_NAME_CHARS.sub("-", text.lower()).strip("-")[:limit].strip("-")


def _digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:10]


# An app id that is a DNS label this short is used as it is (Spark's own ids, `spark-` + 32 hex digits, are).
PLAIN_APP_ID = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
PLAIN_APP_ID_MAX = NAME_MAX - len("sg-") - 1 - 10


def app_configmap_name(app_id: str, source: str) -> str:
    """Name of the per-app copy of the config map `source`.

    A pure function of (app id, source name), so the webhook (which mounts it) and the allocator (which
    creates it) agree without talking. A valid DNS-1123 label for any app id. An app id that is already a
    short DNS label is kept whole, followed by a digest of the source: `sg-<app id>-<digest>`, which a
    MutatingAdmissionPolicy computes in CEL (it has no hash function; sparkgate/render.py). Any other app
    id gives readable parts and a digest of the exact inputs, so that two apps whose ids differ only in
    characters that get folded never collide.
    """
    if len(app_id) <= PLAIN_APP_ID_MAX and PLAIN_APP_ID.match(app_id):
        return f"sg-{app_id}-{source_digest(source)}"
    digest = _digest(app_id, source)
    readable = f"{_name_part(app_id, 28)}-{_name_part(source, 20)}".strip("-")
    return f"sg-{readable}-{digest}" if readable else f"sg-{digest}"


def source_digest(source: str) -> str:
    """The digest of a source config map's name that ends its copies' names (for a plain app id)."""
    return _digest("", source)


def configmap_volume_name(source: str) -> str:
    """Name of the pod volume that mounts the copy of `source` (unique per source within a pod)."""
    return f"sparkgate-{_name_part(source, 40)}-{_digest(source)[:8]}"


# --- demand: sparkgate's mark on the executor pods it holds (docs/policy.md "autoscalerDemand") ----------
# cluster-autoscaler and Karpenter count a pending pod only when its PodScheduled condition is False with
# reason Unschedulable (docs/real-cluster-facts.md, "cluster-autoscaler and a gated pod"); the API server
# writes reason SchedulingGated on a gated pod. The allocator writes the autoscaler's reason on the pods it
# holds, with a message that starts with HELD_MARK: how it tells its own condition from kube-scheduler's
# verdict (whose message starts "0/N nodes are available"), which replaces it once the pod is released.
# The install's ValidatingAdmissionPolicy sparkgate-allocator-pod-updates allows the allocator this
# condition, with this mark, on a pod that carries the gate, and no other change of a pod's status.
HELD_MARK = "Held by sparkgate:"
SCHEDULING_GATED = "SchedulingGated"  # the API server's reason on a gated pod (pod strategy PrepareForCreate)


def is_held_mark(message: object) -> bool:
    """A PodScheduled message that sparkgate wrote on a pod it held (not the scheduler's verdict)."""
    return isinstance(message, str) and message.startswith(HELD_MARK)


def held_condition(why: str, at: str) -> dict[str, Any]:
    """The PodScheduled condition sparkgate writes on a held executor: `why` in a Spark user's words (what
    `kubectl describe pod` shows), `at` (RFC 3339) its lastTransitionTime: the autoscaler's pod observer
    starts a loop at once for a condition that changed less than 10 s ago (cluster-autoscaler
    pkg/loop/trigger.go), so the time is when it was written, not the gate's."""
    return {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": f"{HELD_MARK} {why}",
        "lastTransitionTime": at,
    }


def demand_mark(gate: int, condition: int, why: str, at: str) -> list[dict[str, Any]]:
    """The JSON Patch (pods/status) that marks a held pod: it tests that its PodScheduled condition (at
    `condition`) still says SchedulingGated and that the gate (at `gate`) is still there, then replaces the
    condition. A pod released or marked meanwhile fails the test (422) and is left alone; a repeat of a patch
    that landed fails it too (sparkgate/kube.py `repeat_is_safe`)."""
    pointer = f"/status/conditions/{condition}"
    return [
        {"op": "test", "path": f"{pointer}/reason", "value": SCHEDULING_GATED},
        {"op": "test", "path": f"{pointer}/type", "value": "PodScheduled"},
        {"op": "test", "path": f"/spec/schedulingGates/{gate}/name", "value": GATE},
        {"op": "replace", "path": pointer, "value": held_condition(why, at)},
    ]


# --- ProvisioningRequests (docs/policy.md "provisioning"; allocator/provisioning.py) ---------------------
# cluster-autoscaler's API (autoscaling.x-k8s.io/v1, CA 1.30+ with --enable-provisioning-requests): a request
# names PodTemplates of its namespace and how many pods of each; the pods that consume it carry two
# annotations. The allocator makes one request (and its PodTemplate) per app at a time, labelled as the app's
# config-map copies are, so that any replica's watch finds them and the app's end removes them.
PROVISIONING_CLASSES = {
    "check-capacity": "check-capacity.autoscaling.x-k8s.io",
    "best-effort-atomic-scale-up": "best-effort-atomic-scale-up.autoscaling.x-k8s.io",
}
ANNOTATION_CONSUME_REQUEST = "autoscaling.x-k8s.io/consume-provisioning-request"
ANNOTATION_PROVISIONING_CLASS = "autoscaling.x-k8s.io/provisioning-class-name"
_SEQUENCE = re.compile(r"-pr(\d+)$")


def provisioning_name(app_id: str, sequence: int) -> str:
    """The name of an app's `sequence`th ProvisioningRequest and of its PodTemplate (a DNS label)."""
    if len(app_id) <= PLAIN_APP_ID_MAX - 6 and PLAIN_APP_ID.match(app_id):
        return f"sg-{app_id}-pr{sequence}"
    readable = _name_part(app_id, 28)
    return (
        f"sg-{readable}-{_digest(app_id)}-pr{sequence}" if readable else f"sg-{_digest(app_id)}-pr{sequence}"
    )


def provisioning_sequence(name: str) -> int:
    """The sequence number in a request's name (0: not one of sparkgate's names)."""
    found = _SEQUENCE.search(name)
    return int(found.group(1)) if found else 0


def consuming_release(index: int, request: str, class_name: str) -> list[dict[str, Any]]:
    """The gate removal of a pod that consumes a provisioned request: the annotations cluster-autoscaler and
    the scheduler read (pods.go, pods_filter.go), in the same patch, after the gate's test and removal."""
    return [
        *gate_removal(index),
        {"op": "add", "path": "/metadata/annotations/autoscaling.x-k8s.io~1consume-provisioning-request", "value": request},
        {"op": "add", "path": "/metadata/annotations/autoscaling.x-k8s.io~1provisioning-class-name", "value": class_name},
    ]  # fmt: skip
