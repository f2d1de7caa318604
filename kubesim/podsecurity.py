"""The PodSecurity admission plugin (Pod Security Standards), enforce mode, for pods.

Copied from kubernetes/kubernetes staging/src/k8s.io/pod-security-admission: a namespace labelled
`pod-security.kubernetes.io/enforce: baseline|restricted` (version from `...enforce-version`, default
`latest`) refuses a pod that fails a check, with 403
`pods "NAME" is forbidden: violates PodSecurity "restricted:latest": REASON (DETAIL), REASON (DETAIL)`.
Checks run in the real order (baseline check IDs sorted, then restricted check IDs sorted; a restricted
check replaces the baseline check it overrides) and word their reasons and details as policy/check_*.go
do. On UPDATE only a significant change (a container image) is evaluated, as admission.go does.

Implemented: capabilities_baseline, hostNamespaces, hostPathVolumes, hostPorts, privileged,
seccompProfile_baseline (baseline); allowPrivilegeEscalation, capabilities_restricted, restrictedVolumes,
runAsNonRoot, runAsUser, seccompProfile_restricted (restricted). Not implemented: appArmorProfile,
hostProbesAndHostLifecycle, procMount, seLinuxOptions, sysctls, windowsHostProcess, the `warn` and `audit`
modes, exemptions, pod-controller (Deployment, Job) warnings, ephemeral containers, and the user-namespace
relaxation of runAsNonRoot/runAsUser.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from .errors import ApiError, forbidden
from .store import AdmissionRequest, Obj, Store

Result = tuple[str, str] | None  # (forbidden reason, forbidden detail) or allowed
Check = Callable[[Obj], Result]

_BASELINE_CAPABILITIES = {
    "AUDIT_WRITE", "CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "MKNOD", "NET_BIND_SERVICE",
    "SETFCAP", "SETGID", "SETPCAP", "SETUID", "SYS_CHROOT",
}  # fmt: skip
_ALLOWED_RESTRICTED_VOLUMES = (
    "configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret",
)  # fmt: skip
_KNOWN_RESTRICTED_VOLUMES = (
    "hostPath", "gcePersistentDisk", "awsElasticBlockStore", "gitRepo", "nfs", "iscsi", "glusterfs", "rbd",
    "flexVolume", "cinder", "cephfs", "flocker", "fc", "azureFile", "vsphereVolume", "quobyte", "azureDisk",
    "photonPersistentDisk", "portworxVolume", "scaleIO", "storageos",
)  # fmt: skip


def admit(store: Store, request: AdmissionRequest, pod: Obj) -> None:
    """ApiError 403 when the pod's namespace enforces a level the pod does not meet."""
    if request.operation == "UPDATE" and not _significant_update(pod, request.old or {}):
        return
    if request.operation not in ("CREATE", "UPDATE"):
        return
    try:
        namespace = store.get("namespaces", None, request.namespace)
    except ApiError:
        return
    labels = namespace["metadata"].get("labels") or {}
    level = labels.get("pod-security.kubernetes.io/enforce", "privileged")
    if level not in ("baseline", "restricted"):
        return
    version = labels.get("pod-security.kubernetes.io/enforce-version", "latest")
    failures = [result for check in _checks(level) if (result := check(pod.get("spec") or {})) is not None]
    if failures:
        detail = ", ".join(f"{reason} ({why})" if why else reason for reason, why in failures)
        name = pod["metadata"].get("name") or request.name
        raise forbidden("pods", name, f'violates PodSecurity "{level}:{version}": {detail}')


def _significant_update(pod: Obj, old: Obj) -> bool:
    def images(p: Obj) -> list[list[Any]]:
        spec = p.get("spec") or {}
        return [[c.get("image") for c in spec.get(f) or []] for f in ("initContainers", "containers")]

    return images(pod) != images(old)


def _containers(spec: Obj) -> Iterator[Obj]:
    """visitContainers: init containers, then containers."""
    for field in ("initContainers", "containers"):
        yield from spec.get(field) or []


def _quote(items: list[str]) -> str:
    return ", ".join(f'"{i}"' for i in items)


def _plural(singular: str, plural: str, count: int) -> str:
    return singular if count == 1 else plural


def _context(container: Obj) -> Obj:
    return container.get("securityContext") or {}


def _windows(spec: Obj) -> bool:
    return ((spec.get("os") or {}).get("name")) == "windows"


# --- baseline -----------------------------------------------------------------------------------------


def _capabilities_baseline(spec: Obj) -> Result:
    bad, caps = [], set()
    for c in _containers(spec):
        added = [
            a
            for a in (_context(c).get("capabilities") or {}).get("add") or []
            if a not in _BASELINE_CAPABILITIES
        ]
        if added:
            bad.append(c.get("name", ""))
            caps.update(added)
    if not bad:
        return None
    return (
        "non-default capabilities",
        f"{_plural('container', 'containers', len(bad))} {_quote(bad)} must not include "
        f"{_quote(sorted(caps))} in securityContext.capabilities.add",
    )


def _host_namespaces(spec: Obj) -> Result:
    used = [f"{field}=true" for field in ("hostNetwork", "hostPID", "hostIPC") if spec.get(field)]
    return ("host namespaces", ", ".join(used)) if used else None


def _host_path_volumes(spec: Obj) -> Result:
    bad = [v.get("name", "") for v in spec.get("volumes") or [] if v.get("hostPath") is not None]
    return ("hostPath volumes", f"{_plural('volume', 'volumes', len(bad))} {_quote(bad)}") if bad else None


def _host_ports(spec: Obj) -> Result:
    bad: list[str] = []
    ports: set[str] = set()
    for c in _containers(spec):
        used = [int(p["hostPort"]) for p in c.get("ports") or [] if p.get("hostPort")]
        if used:
            bad.append(c.get("name", ""))
            ports.update(str(p) for p in used)
    if not bad:
        return None
    return (
        "hostPort",
        f"{_plural('container', 'containers', len(bad))} {_quote(bad)} {_plural('uses', 'use', len(bad))} "
        f"{_plural('hostPort', 'hostPorts', len(ports))} {', '.join(sorted(ports))}",
    )


def _privileged(spec: Obj) -> Result:
    bad = [c.get("name", "") for c in _containers(spec) if _context(c).get("privileged") is True]
    if not bad:
        return None
    return (
        "privileged",
        f"{_plural('container', 'containers', len(bad))} {_quote(bad)} must not set securityContext.privileged=true",
    )


def _seccomp(spec: Obj, *, restricted: bool) -> Result:
    valid = ("RuntimeDefault", "Localhost")
    setters, values = [], set()
    pod_profile = (spec.get("securityContext") or {}).get("seccompProfile")
    pod_set = False
    if pod_profile is not None:
        if pod_profile.get("type") not in valid:
            setters.append("pod")
            values.add(str(pod_profile.get("type")))
        else:
            pod_set = True
    explicit, implicit = [], []
    for c in _containers(spec):
        profile = _context(c).get("seccompProfile")
        if profile is not None:
            if profile.get("type") not in valid:
                explicit.append(c.get("name", ""))
                values.add(str(profile.get("type")))
        elif not pod_set:
            implicit.append(c.get("name", ""))
    if explicit:
        setters.append(f"{_plural('container', 'containers', len(explicit))} {_quote(explicit)}")
    if setters:
        return (
            "seccompProfile",
            f"{' and '.join(setters)} must not set securityContext.seccompProfile.type to {_quote(sorted(values))}",
        )
    if restricted and implicit:
        return (
            "seccompProfile",
            f"pod or {_plural('container', 'containers', len(implicit))} {_quote(implicit)} must set "
            'securityContext.seccompProfile.type to "RuntimeDefault" or "Localhost"',
        )
    return None


# --- restricted ---------------------------------------------------------------------------------------


def _allow_privilege_escalation(spec: Obj) -> Result:
    if _windows(spec):
        return None
    bad = [
        c.get("name", "")
        for c in _containers(spec)
        if _context(c).get("allowPrivilegeEscalation") is not False
    ]
    if not bad:
        return None
    return (
        "allowPrivilegeEscalation != false",
        f"{_plural('container', 'containers', len(bad))} {_quote(bad)} must set "
        "securityContext.allowPrivilegeEscalation=false",
    )


def _capabilities_restricted(spec: Obj) -> Result:
    if _windows(spec):
        return None
    missing_drop, adding, caps = [], [], set()
    for c in _containers(spec):
        capabilities = _context(c).get("capabilities")
        if capabilities is None:
            missing_drop.append(c.get("name", ""))
            continue
        if "ALL" not in (capabilities.get("drop") or []):
            missing_drop.append(c.get("name", ""))
        added = [a for a in capabilities.get("add") or [] if a != "NET_BIND_SERVICE"]
        if added:
            adding.append(c.get("name", ""))
            caps.update(added)
    details = []
    if missing_drop:
        details.append(
            f"{_plural('container', 'containers', len(missing_drop))} {_quote(missing_drop)} must set "
            'securityContext.capabilities.drop=["ALL"]'
        )
    if adding:
        details.append(
            f"{_plural('container', 'containers', len(adding))} {_quote(adding)} must not include "
            f"{_quote(sorted(caps))} in securityContext.capabilities.add"
        )
    return ("unrestricted capabilities", "; ".join(details)) if details else None


def _restricted_volumes(spec: Obj) -> Result:
    bad, kinds = [], set()
    for volume in spec.get("volumes") or []:
        if any(volume.get(k) is not None for k in _ALLOWED_RESTRICTED_VOLUMES):
            continue
        bad.append(volume.get("name", ""))
        kinds.add(next((k for k in _KNOWN_RESTRICTED_VOLUMES if volume.get(k) is not None), "unknown"))
    if not bad:
        return None
    return (
        "restricted volume types",
        f"{_plural('volume', 'volumes', len(bad))} {_quote(bad)} {_plural('uses', 'use', len(bad))} "
        f"{_plural('restricted volume type', 'restricted volume types', len(kinds))} {_quote(sorted(kinds))}",
    )


def _run_as_non_root(spec: Obj) -> Result:
    setters = []
    pod_value = (spec.get("securityContext") or {}).get("runAsNonRoot")
    if pod_value is False:
        setters.append("pod")
    explicit, implicit = [], []
    for c in _containers(spec):
        value = _context(c).get("runAsNonRoot")
        if value is False:
            explicit.append(c.get("name", ""))
        elif value is None and pod_value is not True:
            implicit.append(c.get("name", ""))
    if explicit:
        setters.append(f"{_plural('container', 'containers', len(explicit))} {_quote(explicit)}")
    if setters:
        return (
            "runAsNonRoot != true",
            f"{' and '.join(setters)} must not set securityContext.runAsNonRoot=false",
        )
    if implicit:
        return (
            "runAsNonRoot != true",
            f"pod or {_plural('container', 'containers', len(implicit))} {_quote(implicit)} must set "
            "securityContext.runAsNonRoot=true",
        )
    return None


def _run_as_user(spec: Obj) -> Result:
    setters = ["pod"] if (spec.get("securityContext") or {}).get("runAsUser") == 0 else []
    explicit = [c.get("name", "") for c in _containers(spec) if _context(c).get("runAsUser") == 0]
    if explicit:
        setters.append(f"{_plural('container', 'containers', len(explicit))} {_quote(explicit)}")
    return ("runAsUser=0", f"{' and '.join(setters)} must not set runAsUser=0") if setters else None


def _checks(level: str) -> list[Check]:
    baseline: list[tuple[str, Check]] = [
        ("capabilities_baseline", _capabilities_baseline),
        ("hostNamespaces", _host_namespaces),
        ("hostPathVolumes", _host_path_volumes),
        ("hostPorts", _host_ports),
        ("privileged", _privileged),
        ("seccompProfile_baseline", lambda spec: _seccomp(spec, restricted=False)),
    ]
    if level == "baseline":
        return [check for _, check in baseline]
    overridden = {"capabilities_baseline", "hostPathVolumes", "seccompProfile_baseline"}
    restricted: list[Check] = [
        _allow_privilege_escalation,
        _capabilities_restricted,
        _restricted_volumes,
        _run_as_non_root,
        _run_as_user,
        lambda spec: None if _windows(spec) else _seccomp(spec, restricted=True),
    ]
    return [check for check_id, check in baseline if check_id not in overridden] + restricted
