"""Fields the API server's built-in admission plugins derive from others: what a template change makes stale.

kube-apiserver runs its mutating plugins before the webhooks, and again after a webhook changed the pod
(docs/policy.md, "Admission plugins"). So the pod that sparkgate's webhook receives already carries what
the first pass derived (`spec.priority` from the PriorityClass, `spec.overhead` from the RuntimeClass,
the service-account token volume, the default not-ready/unreachable tolerations). When a template changes
the field such a value was derived from, the old value must go: the second pass derives it again from
the new field, while a stale value left in place is either refused (`the integer value of priority (0)
must not be provided in pod spec; priority admission controller computed 1000 ...`) or silently wrong.

One table, `RULES`: each rule names its plugin, says when the first pass's value is stale, and drops it.
`drop_stale` is what the webhook applies; `strip_derived` drops every derived value whatever changed, which
turns a captured pod back into the pod as Spark sent it (the policy probe, sparkgate/probe.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Spec = dict[str, Any]

TOKEN_VOLUME_PREFIX = "kube-api-access-"  # serviceaccount/admission.go: ServiceAccountVolumeName + "-"
TOKEN_MOUNT_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"  # DefaultAPITokenMountPath
NOT_READY = "node.kubernetes.io/not-ready"
UNREACHABLE = "node.kubernetes.io/unreachable"
DEFAULT_TOLERATION_SECONDS = 300  # --default-not-ready-toleration-seconds, --default-unreachable-...


@dataclass(frozen=True)
class Rule:
    """A value that `plugin` derives from `sources` (spec fields a template may set)."""

    plugin: str
    sources: tuple[str, ...]
    derived: str  # what the plugin writes, for the documentation
    stale: Callable[[Spec, Spec], bool]  # (spec as received, spec as sparkgate wants it)
    drop: Callable[[Spec], Spec]  # the spec without the derived value (a new dict; never mutates)


def _changed(*fields: str) -> Callable[[Spec, Spec], bool]:
    def changed(before: Spec, after: Spec) -> bool:
        for f in fields:  # noqa: SIM110 (a loop, not any() over a generator: asked for every pod shaped)
            if before.get(f) != after.get(f):
                return True
        return False

    return changed


def _without(*fields: str) -> Callable[[Spec], Spec]:
    def drop(spec: Spec) -> Spec:
        out = dict(spec)  # a copy, then a pop per field: cheaper than a filter of every member
        for f in fields:
            out.pop(f, None)
        return out

    return drop


_drop_alias = _without("serviceAccount")


def _token_volumes(spec: Spec) -> set[str]:
    return {
        v["name"]
        for v in spec.get("volumes") or ()
        if isinstance(v, dict) and str(v.get("name", "")).startswith(TOKEN_VOLUME_PREFIX) and "projected" in v
    }


def _drop_token_volume(spec: Spec) -> Spec:
    """The alias `serviceAccount` (conversion copies serviceAccountName into it), the projected token
    volume and its mounts: the ServiceAccount plugin mounts a token again only where none is mounted, and
    only when the (new) service account and the pod allow automounting."""
    names = _token_volumes(spec)
    out = _drop_alias(spec)
    if not names:
        return out
    out["volumes"] = [
        v for v in spec.get("volumes") or () if not (isinstance(v, dict) and v.get("name") in names)
    ]
    for key in ("initContainers", "containers"):
        if key in spec:
            out[key] = [
                {
                    **c,
                    "volumeMounts": [m for m in c.get("volumeMounts") or () if m.get("name") not in names],
                }
                if any(m.get("name") in names for m in c.get("volumeMounts") or ())
                else c
                for c in spec[key]
            ]
    return out


def default_toleration(key: str) -> dict[str, Any]:
    """What DefaultTolerationSeconds adds when no toleration covers `key` with effect NoExecute."""
    return {
        "key": key,
        "operator": "Exists",
        "effect": "NoExecute",
        "tolerationSeconds": DEFAULT_TOLERATION_SECONDS,
    }


def covers(toleration: Any, key: str) -> bool:
    """defaulttolerationseconds/admission.go: an empty key or effect tolerates every key or effect."""
    return (
        isinstance(toleration, dict)
        and toleration.get("key", "") in ("", key)
        and toleration.get("effect", "") in ("", "NoExecute")
    )


def _toleration_covered_anew(key: str) -> Callable[[Spec, Spec], bool]:
    """The default is stale when the pod has it and the spec sparkgate wants has a toleration covering `key`
    that the pod did not have. Linear in the tolerations (a pod may carry thousands): the merge shares the
    pod's own elements, so only the others (the template's) are looked for in the pod by value."""
    default = default_toleration(key)

    def stale(before: Spec, after: Spec) -> bool:
        had = before.get("tolerations") or ()
        if after.get("tolerations") is had or default not in had:  # the same list: nothing new covers it
            return False
        shared = {id(t) for t in had}
        return any(
            id(t) not in shared and covers(t, key) and t not in had for t in after.get("tolerations") or ()
        )

    return stale


def _drop_toleration(key: str) -> Callable[[Spec], Spec]:
    default = default_toleration(key)

    def drop(spec: Spec) -> Spec:
        if default not in (spec.get("tolerations") or ()):
            return spec
        return {**spec, "tolerations": [t for t in spec["tolerations"] if t != default]}

    return drop


RULES: tuple[Rule, ...] = (
    Rule(
        "Priority",
        ("priorityClassName",),
        "spec.priority and spec.preemptionPolicy, from the PriorityClass (or the globalDefault one)",
        _changed("priorityClassName"),
        _without("priority", "preemptionPolicy"),
    ),
    Rule(
        "RuntimeClass",
        ("runtimeClassName",),
        "spec.overhead, from the RuntimeClass's overhead.podFixed",
        _changed("runtimeClassName"),
        _without("overhead"),
    ),
    Rule(
        "ServiceAccount",
        ("serviceAccountName", "automountServiceAccountToken"),
        f"the projected `{TOKEN_VOLUME_PREFIX}*` token volume mounted at {TOKEN_MOUNT_PATH} in every "
        "container (and the deprecated alias spec.serviceAccount)",
        _changed("serviceAccountName", "automountServiceAccountToken"),
        _drop_token_volume,
    ),
    *(
        Rule(
            "DefaultTolerationSeconds",
            ("tolerations",),
            f"a toleration of {key}:NoExecute for {DEFAULT_TOLERATION_SECONDS} s when none covers it",
            _toleration_covered_anew(key),
            _drop_toleration(key),
        )
        for key in (NOT_READY, UNREACHABLE)
    ),
)


def drop_stale(before: Spec, after: Spec) -> Spec:
    """`after` (the spec sparkgate wants) without the first pass's values that its changes made stale."""
    for rule in RULES:
        if rule.stale(before, after):
            after = rule.drop(after)
    return after


def strip_derived(spec: Spec) -> Spec:
    """The spec without anything the plugins derived: the pod as its author sent it (the plugins will
    derive it all again). The default tolerations go only when they are exactly the plugin's."""
    for rule in RULES:
        spec = rule.drop(spec)
    return spec
