"""kube-apiserver's built-in (in-tree) admission plugins for pods, in their real order.

The order is `AllOrderedPlugins` of kubernetes/kubernetes pkg/kubeapiserver/options/plugins.go, default-on
plugins only. `mutate` runs the mutating half (`Admit`) of LimitRanger, ServiceAccount, Priority,
DefaultTolerationSeconds, RuntimeClass and PodTopologyLabels; `validate` the validating half (`Validate`)
of ServiceAccount, PodSecurity, Priority (PriorityClass objects) and RuntimeClass. The admission chain
(admission.py) runs `mutate` before the mutating webhooks and again after a webhook changed the object,
as the real reinvoker does, so a webhook that sets `priorityClassName` on a pod whose `priority` the first
pass already filled is refused, exactly as on a real server. ResourceQuota, the last validating plugin,
runs in the store (quota.py), atomically with the write.

Each rule names its source file under plugin/pkg/admission/ (kubernetes/kubernetes).
"""

from __future__ import annotations

from typing import Any

from . import ids, podrules, podsecurity, quantities
from .errors import ApiError, forbidden, invalid
from .store import AdmissionRequest, Obj, Store

# scheduling/v1 SystemPriorityClasses (pkg/apis/scheduling/types.go): served as objects from the start.
SYSTEM_PRIORITY_CLASSES: dict[str, int] = {
    "system-node-critical": 2000001000,
    "system-cluster-critical": 2000000000,
}
HIGHEST_USER_DEFINABLE_PRIORITY = 1000000000

TOKEN_MOUNT_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"


def mutate(store: Store, request: AdmissionRequest, obj: Obj) -> None:
    """The mutating plugins, in order, on `obj` (changed in place)."""
    if request.resource != "pods" or request.subresource or request.operation not in ("CREATE", "UPDATE"):
        return
    if request.operation == "UPDATE":
        _priority_update(request, obj)
        return
    _limit_ranger(store, request, obj)
    _service_account(store, request, obj)
    _priority(store, request, obj)
    _default_toleration_seconds(obj)
    _runtime_class(store, request, obj)
    _pod_topology_labels(store, obj)


def validate(store: Store, request: AdmissionRequest, obj: Obj) -> None:
    """The validating plugins, in order; an ApiError refuses the request."""
    if request.subresource:
        return
    if request.resource == "priorityclasses" and request.operation in ("CREATE", "UPDATE"):
        _validate_priority_class(store, request, obj)
    if request.resource != "pods":
        return
    if request.operation == "CREATE":
        _service_account_exists(store, request, obj)
    podsecurity.admit(store, request, obj)
    if request.operation == "CREATE":
        _validate_overhead(store, request, obj)


def _refuse(request: AdmissionRequest, obj: Obj, why: str) -> ApiError:
    return forbidden(request.resource, (obj.get("metadata") or {}).get("name") or request.name, why)


# --- LimitRanger (limitranger/admission.go): Container defaults, on CREATE -----------------------------


def _limit_ranger(store: Store, request: AdmissionRequest, pod: Obj) -> None:
    limit_ranges, _, _ = store.list_objects("limitranges", request.namespace)
    defaults: dict[str, dict[str, Any]] = {"requests": {}, "limits": {}}
    for limit_range in limit_ranges:
        for item in (limit_range.get("spec") or {}).get("limits") or []:
            if item.get("type") != "Container":
                continue
            default, request_default = _limit_range_item_defaults(item)
            defaults["requests"].update(request_default)
            defaults["limits"].update(default)
    if not defaults["requests"] and not defaults["limits"]:
        return
    notes: list[str] = []
    spec = pod.setdefault("spec", {})
    for field, kind in (("initContainers", "init container"), ("containers", "container")):
        for container in spec.get(field) or []:
            resources = container.setdefault("resources", {})
            set_by: dict[str, list[str]] = {"requests": [], "limits": []}
            for part in ("limits", "requests"):
                current = resources.setdefault(part, {})
                for name, value in defaults[part].items():
                    if name not in current:
                        current[name] = value
                        set_by[part].append(name)
                if not current:
                    resources.pop(part)
            for part, word in (("requests", "request"), ("limits", "limit")):
                if set_by[part]:
                    notes.append(
                        f"{', '.join(sorted(set_by[part]))} {word} for {kind} {container.get('name')}"
                    )
    if notes:
        annotations = pod.setdefault("metadata", {}).setdefault("annotations", {})
        annotations["kubernetes.io/limit-ranger"] = "LimitRanger plugin set: " + "; ".join(notes)


def _limit_range_item_defaults(item: Obj) -> tuple[dict[str, Any], dict[str, Any]]:
    """(default limits, default requests) after v1 SetDefaults_LimitRangeItem: default ← max,
    defaultRequest ← default, then ← min."""
    default = dict(item.get("default") or {})
    for name, value in (item.get("max") or {}).items():
        default.setdefault(name, value)
    request = dict(item.get("defaultRequest") or {})
    for source in (default, item.get("min") or {}):
        for name, value in source.items():
            request.setdefault(name, value)
    return default, request


# --- ServiceAccount (serviceaccount/admission.go) -------------------------------------------------------


def _service_account(store: Store, request: AdmissionRequest, pod: Obj) -> None:
    spec = pod.setdefault("spec", {})
    if (pod.get("metadata") or {}).get("annotations", {}).get("kubernetes.io/config.mirror"):
        return
    spec["serviceAccountName"] = spec.get("serviceAccountName") or "default"
    spec["serviceAccount"] = spec["serviceAccountName"]  # v1 conversion: the deprecated field follows
    account = _lookup_service_account(store, request, pod)
    automount = spec.get("automountServiceAccountToken")
    if automount is None:
        automount = account.get("automountServiceAccountToken")
    if automount is not False:
        _mount_token(spec)
    if not spec.get("imagePullSecrets") and account.get("imagePullSecrets"):
        spec["imagePullSecrets"] = [{"name": s.get("name")} for s in account["imagePullSecrets"]]


def _lookup_service_account(store: Store, request: AdmissionRequest, pod: Obj) -> Obj:
    name = pod["spec"]["serviceAccountName"]
    try:
        return store.get("serviceaccounts", request.namespace, name)
    except ApiError:
        raise _refuse(
            request,
            pod,
            f'error looking up service account {request.namespace}/{name}: serviceaccount "{name}" not found',
        ) from None


def _service_account_exists(store: Store, request: AdmissionRequest, pod: Obj) -> None:
    spec = pod.get("spec") or {}
    if not spec.get("serviceAccountName"):
        raise _refuse(
            request,
            pod,
            f"no service account specified for pod {request.namespace}/{pod['metadata'].get('name', '')}",
        )
    _lookup_service_account(store, request, pod)


def _mount_token(spec: Obj) -> None:
    """The projected `kube-api-access-xxxxx` volume, mounted in every container that has nothing at the
    token path (an existing volume of that name prefix is reused, as on reinvocation)."""
    volumes = spec.setdefault("volumes", [])
    existing = next(
        (v["name"] for v in volumes if str(v.get("name", "")).startswith("kube-api-access-")), None
    )
    name = existing or "kube-api-access-" + ids.suffix(5, ids.NAME_CHARS)
    mount = {"name": name, "readOnly": True, "mountPath": TOKEN_MOUNT_PATH}
    needed = False
    for field in ("initContainers", "containers"):
        for container in spec.get(field) or []:
            mounts = container.setdefault("volumeMounts", [])
            if not any(m.get("mountPath") == TOKEN_MOUNT_PATH for m in mounts):
                mounts.append(dict(mount))
                needed = True
    if needed and existing is None:
        volumes.append({"name": name, "projected": _token_volume_source()})
    if not volumes:
        spec.pop("volumes")


def _token_volume_source() -> Obj:
    return {
        "sources": [
            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
            {
                "downwardAPI": {
                    "items": [
                        {
                            "path": "namespace",
                            "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"},
                        }
                    ]
                }
            },
        ],
        "defaultMode": 420,
    }


# --- Priority (priority/admission.go) -------------------------------------------------------------------


def _priority(store: Store, request: AdmissionRequest, pod: Obj) -> None:
    spec = pod.setdefault("spec", {})
    name = spec.get("priorityClassName") or ""
    if name:
        try:
            cls = store.get("priorityclasses", None, name)
        except ApiError:
            raise _refuse(request, pod, f"no PriorityClass with name {name} was found") from None
    else:
        default = _default_priority_class(store)
        cls = default or {"value": 0, "preemptionPolicy": "PreemptLowerPriority"}
        if default is not None:
            spec["priorityClassName"] = default["metadata"]["name"]
    value = int(cls.get("value") or 0)
    if spec.get("priority") is not None and spec["priority"] != value:
        raise _refuse(
            request,
            pod,
            f"the integer value of priority ({spec['priority']}) must not be provided in pod spec; priority "
            f"admission controller computed {value} from the given PriorityClass name",
        )
    spec["priority"] = value
    policy = cls.get("preemptionPolicy") or "PreemptLowerPriority"
    if spec.get("preemptionPolicy") is not None and spec["preemptionPolicy"] != policy:
        raise _refuse(
            request,
            pod,
            f"the string value of PreemptionPolicy ({spec['preemptionPolicy']}) must not be provided in pod "
            f"spec; priority admission controller computed {policy} from the given PriorityClass name",
        )
    spec["preemptionPolicy"] = policy


def _priority_update(request: AdmissionRequest, pod: Obj) -> None:
    """On UPDATE the stored priority and preemptionPolicy are kept when the new object omits them."""
    old_spec = (request.old or {}).get("spec") or {}
    spec = pod.setdefault("spec", {})
    for field in ("priority", "preemptionPolicy"):
        if spec.get(field) is None and old_spec.get(field) is not None:
            spec[field] = old_spec[field]


def _unknown_system_class(name: str, value: int, global_default: bool) -> str:
    """scheduling/v1 IsKnownSystemPriorityClass: why the class is not one of the system classes, or ""."""
    if name not in SYSTEM_PRIORITY_CLASSES:
        return f"{name} is not a known system priority class"
    if SYSTEM_PRIORITY_CLASSES[name] != value:
        return f"value of {name} PriorityClass must be {SYSTEM_PRIORITY_CLASSES[name]}"
    if global_default:
        return f"globalDefault of {name} PriorityClass must be false"
    return ""


def _default_priority_class(store: Store) -> Obj | None:
    classes, _, _ = store.list_objects("priorityclasses")
    defaults = [c for c in classes if c.get("globalDefault")]
    return min(defaults, key=lambda c: int(c.get("value") or 0)) if defaults else None


def _validate_priority_class(store: Store, request: AdmissionRequest, obj: Obj) -> None:
    name = obj["metadata"].get("name", "")
    value = int(obj.get("value") or 0)
    if name.startswith("system-"):
        problem = _unknown_system_class(name, value, bool(obj.get("globalDefault")))
        if problem:
            raise invalid(
                "PriorityClass",
                name,
                [
                    (
                        "metadata.name",
                        "Forbidden: priority class names with 'system-' prefix are reserved for system use "
                        f"only. error: {problem}",
                    )
                ],
            )
    elif value > HIGHEST_USER_DEFINABLE_PRIORITY:
        raise invalid(
            "PriorityClass",
            name,
            [
                (
                    "value",
                    f"Forbidden: maximum allowed value of a user defined priority is {HIGHEST_USER_DEFINABLE_PRIORITY}",
                )
            ],
        )
    if obj.get("globalDefault"):
        default = _default_priority_class(store)
        if default is not None and (request.operation == "CREATE" or default["metadata"]["name"] != name):
            raise forbidden(
                "priorityclasses",
                name,
                f"PriorityClass {default['metadata']['name']} is already marked as default. Only one default can exist",
                group="scheduling.k8s.io",
            )


# --- DefaultTolerationSeconds (defaulttolerationseconds/admission.go) ----------------------------------


def _default_toleration_seconds(pod: Obj) -> None:
    tolerations = pod.setdefault("spec", {}).setdefault("tolerations", [])
    for key in ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"):
        if not any(
            t.get("key", "") in (key, "") and t.get("effect", "") in ("NoExecute", "") for t in tolerations
        ):
            tolerations.append(
                {"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 300}
            )


# --- RuntimeClass (runtimeclass/admission.go) -----------------------------------------------------------


def _runtime_class_of(store: Store, request: AdmissionRequest, pod: Obj) -> Obj | None:
    name = (pod.get("spec") or {}).get("runtimeClassName")
    if name is None:
        return None
    try:
        return store.get("runtimeclasses", None, name)
    except ApiError:
        raise _refuse(request, pod, f'pod rejected: RuntimeClass "{name}" not found') from None


def _same_resources(a: Obj | None, b: Obj | None) -> bool:
    a, b = a or {}, b or {}
    return a.keys() == b.keys() and all(quantities.parse(a[k]) == quantities.parse(b[k]) for k in a)


def _runtime_class(store: Store, request: AdmissionRequest, pod: Obj) -> None:
    runtime_class = _runtime_class_of(store, request, pod)
    if runtime_class is None:
        return
    spec = pod["spec"]
    fixed = (runtime_class.get("overhead") or {}).get("podFixed")
    if fixed is not None:
        if spec.get("overhead") and not _same_resources(fixed, spec["overhead"]):
            raise _refuse(
                request, pod, "pod rejected: Pod's Overhead doesn't match RuntimeClass's defined Overhead"
            )
        spec["overhead"] = dict(fixed)
    scheduling = runtime_class.get("scheduling") or {}
    selector = dict(spec.get("nodeSelector") or {})
    for key, value in (scheduling.get("nodeSelector") or {}).items():
        if key in selector and selector[key] != value:
            raise _refuse(
                request,
                pod,
                f"conflict: runtimeClass.scheduling.nodeSelector[{key}] = {value}; "
                f"pod.spec.nodeSelector[{key}] = {selector[key]}",
            )
        selector[key] = value
    if selector:
        spec["nodeSelector"] = selector
    tolerations = spec.setdefault("tolerations", [])
    for toleration in scheduling.get("tolerations") or []:
        if toleration not in tolerations:
            tolerations.append(dict(toleration))


def _validate_overhead(store: Store, request: AdmissionRequest, pod: Obj) -> None:
    runtime_class = _runtime_class_of(store, request, pod)
    fixed = ((runtime_class or {}).get("overhead") or {}).get("podFixed")
    overhead = (pod.get("spec") or {}).get("overhead")
    if fixed is not None and not _same_resources(fixed, overhead):
        raise _refuse(
            request, pod, "pod rejected: Pod's Overhead doesn't match RuntimeClass's defined Overhead"
        )
    if fixed is None and overhead is not None:
        raise _refuse(
            request, pod, "pod rejected: Pod Overhead set without corresponding RuntimeClass defined Overhead"
        )


# --- PodTopologyLabels (podtopologylabels/admission.go): pods created bound; binding is in Store.bind -----


def _pod_topology_labels(store: Store, pod: Obj) -> None:
    node_name = (pod.get("spec") or {}).get("nodeName")
    if not node_name:
        return
    try:
        node = store.get("nodes", None, node_name)
    except ApiError:
        return  # an unknown node copies nothing, as the real plugin ignores NotFound
    copied = podrules.topology_labels(node)
    if copied:
        pod.setdefault("metadata", {}).setdefault("labels", {}).update(copied)
