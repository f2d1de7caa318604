"""ResourceQuota for pods: the admission check and the usage the quota controller writes to status.

Copied from k8s.io/apiserver/pkg/admission/plugin/resourcequota/controller.go and
pkg/quota/v1/evaluator/core/pods.go: a pod is charged `pods`, `count/pods`, `cpu`/`requests.cpu`,
`memory`/`requests.memory`, `limits.cpu`, `limits.memory` (containers summed, an init container counting
when it is larger, plus `spec.overhead`) from its creation on (a gated pod counts) until it is Succeeded or
Failed or gone. A create that would pass a quota's `status.hard` is refused with 403
`exceeded quota: NAME, requested: R, used: U, limited: L`; a quota on cpu or memory refuses a container
without that request or limit with `failed quota: NAME: must specify ...`. The store runs the check inside
its write lock, so concurrent creates cannot both take the last unit (the real plugin gets the same
guarantee from a compare-and-swap on the quota), and recomputes `status.used` after every pod change, as a
prompt quota controller would. A quota with `scopes` or a `scopeSelector` charges only the pods they match
(pkg/quota/v1/evaluator/core/pods.go `podMatchesScopeFunc`: Terminating, NotTerminating, BestEffort,
NotBestEffort, and PriorityClass with In, NotIn, Exists, DoesNotExist on spec.priorityClassName; every scope
must match). Not implemented: the CrossNamespacePodAffinity scope (it matches no pod here), object counts of
other resources, extended resources and hugepages, quota on pod updates (in-place resize).
"""

from __future__ import annotations

from collections.abc import Iterable
from decimal import Decimal
from typing import Any

from . import podrules, quantities
from .errors import ApiError, forbidden

Obj = dict[str, Any]
Usage = dict[str, Decimal]

_COMPUTE = ("cpu", "memory")
_CONSTRAINED = {"cpu", "memory", "requests.cpu", "requests.memory", "limits.cpu", "limits.memory"}


def counts(pod: Obj) -> bool:
    """QuotaV1Pod: a pod is charged until it has finished."""
    return (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


def usage(pod: Obj) -> Usage:
    spec = pod.get("spec") or {}
    totals: dict[str, Usage] = {"requests": {}, "limits": {}}
    for part, total in totals.items():
        for container in spec.get("containers") or []:
            for name, value in ((container.get("resources") or {}).get(part) or {}).items():
                total[name] = total.get(name, Decimal(0)) + quantities.parse(value)
        for container in spec.get("initContainers") or []:
            for name, value in ((container.get("resources") or {}).get(part) or {}).items():
                total[name] = max(total.get(name, Decimal(0)), quantities.parse(value))
        for name, value in (spec.get("overhead") or {}).items():
            if name in total:
                total[name] += quantities.parse(value)
    out: Usage = {"pods": Decimal(1), "count/pods": Decimal(1)}
    for name in _COMPUTE:
        if name in totals["requests"]:
            out[name] = out[f"requests.{name}"] = totals["requests"][name]
        if name in totals["limits"]:
            out[f"limits.{name}"] = totals["limits"][name]
    return out


def in_scope(quota: Obj, pod: Obj) -> bool:
    """Whether the quota charges the pod: every scope of `scopes` and of `scopeSelector` matches it."""
    spec = quota.get("spec") or {}
    scopes = [{"scopeName": name, "operator": "Exists"} for name in spec.get("scopes") or []]
    scopes += (spec.get("scopeSelector") or {}).get("matchExpressions") or []
    return all(_scope_matches(scope, pod) for scope in scopes)


def _scope_matches(scope: Obj, pod: Obj) -> bool:
    spec = pod.get("spec") or {}
    name = str(scope.get("scopeName"))
    if name in ("Terminating", "NotTerminating"):
        deadline = spec.get("activeDeadlineSeconds")
        return (deadline is not None and int(deadline) >= 0) == (name == "Terminating")
    if name in ("BestEffort", "NotBestEffort"):
        return (podrules.qos_class(pod) == "BestEffort") == (name == "BestEffort")
    if name == "PriorityClass":
        # `podMatchesSelector`: a label selector over {"PriorityClass": spec.priorityClassName}, a key always
        # present (empty without a class): DoesNotExist never matches; Exists is a non-empty class.
        value, values = spec.get("priorityClassName") or "", scope.get("values") or []
        return {"In": value in values, "NotIn": value not in values, "Exists": bool(value)}.get(
            str(scope.get("operator")), False
        )
    return False


def used(quota: Obj, pods: Iterable[Obj]) -> dict[str, str]:
    """status.used for `quota`: every hard resource, summed over the namespace's charged pods."""
    hard = _hard(quota)
    total = {name: Decimal(0) for name in hard}
    for pod in pods:
        if counts(pod) and in_scope(quota, pod):
            for name, value in usage(pod).items():
                if name in total:
                    total[name] += value
    return {name: format_quantity(value, _like(hard[name])) for name, value in total.items()}


def check(quota: Obj, pod: Obj) -> None:
    """ApiError 403 when creating `pod` would pass the quota."""
    if not in_scope(quota, pod):
        return
    name = str(quota["metadata"].get("name", ""))
    hard = _hard(quota)
    pod_name = str(pod["metadata"].get("name", ""))
    _constraints(name, hard, pod, pod_name)
    requested = {k: v for k, v in usage(pod).items() if k in hard and v != 0}
    current = {k: quantities.parse(v) for k, v in _status(quota).get("used", {}).items()}
    exceeded = sorted(
        k for k, v in requested.items() if current.get(k, Decimal(0)) + v > quantities.parse(hard[k])
    )
    if exceeded:

        def show(values: dict[str, Decimal]) -> str:
            return ",".join(
                f"{k}={format_quantity(values.get(k, Decimal(0)), _like(hard[k]))}" for k in exceeded
            )

        raise forbidden(
            "pods",
            pod_name,
            f"exceeded quota: {name}, requested: {show(requested)}, used: {show(current)}, "
            f"limited: {show({k: quantities.parse(hard[k]) for k in exceeded})}",
        )


def _constraints(name: str, hard: dict[str, str], pod: Obj, pod_name: str) -> None:
    required = _CONSTRAINED & hard.keys()
    if not required:
        return
    spec = pod.get("spec") or {}
    missing: dict[str, set[str]] = {}
    for field in ("containers", "initContainers"):
        for container in spec.get(field) or []:
            resources = container.get("resources") or {}
            has = set()
            for resource in _COMPUTE:
                if resource in (resources.get("requests") or {}):
                    has |= {resource, f"requests.{resource}"}
                if resource in (resources.get("limits") or {}):
                    has.add(f"limits.{resource}")
            for resource in required - has:
                missing.setdefault(resource, set()).add(str(container.get("name", "")))
    if missing:
        why = "; ".join(f"{r} for: {','.join(sorted(missing[r]))}" for r in sorted(missing))
        raise forbidden("pods", pod_name, f"failed quota: {name}: must specify {why}")


def _status(quota: Obj) -> dict[str, dict[str, str]]:
    status: dict[str, dict[str, str]] = quota.get("status") or {}
    return status


def _hard(quota: Obj) -> dict[str, str]:
    spec = quota.get("spec") or {}
    return {str(k): str(v) for k, v in (spec.get("hard") or {}).items()}


def _like(example: str) -> str:
    return "binary" if example.rstrip("0123456789.").endswith("i") else "decimal"


def format_quantity(value: Decimal, style: str = "decimal") -> str:
    """resource.Quantity's canonical string: `1500m`, `2`, `2816Mi`, `4G`."""
    if style == "binary" and value == value.to_integral_value() and value > 0:
        for suffix, factor in (
            ("Ei", 2**60),
            ("Pi", 2**50),
            ("Ti", 2**40),
            ("Gi", 2**30),
            ("Mi", 2**20),
            ("Ki", 2**10),
        ):
            if value % factor == 0:
                return f"{int(value // factor)}{suffix}"
    if value == 0:
        return "0"
    for suffix, factor in (
        ("E", 10**18),
        ("P", 10**15),
        ("T", 10**12),
        ("G", 10**9),
        ("M", 10**6),
        ("k", 10**3),
    ):
        if value % factor == 0:
            return f"{int(value // factor)}{suffix}"
    if value == value.to_integral_value():
        return str(int(value))
    millis = value * 1000
    if millis == millis.to_integral_value():
        return f"{int(millis)}m"
    raise ApiError(500, "InternalError", f"kubesim cannot format the quantity {value}")
