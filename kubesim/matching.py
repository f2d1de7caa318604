"""Which admission webhooks and admission policies a request reaches, and what CEL sees of it.

One definition for MutatingAdmissionWebhook, ValidatingAdmissionWebhook and ValidatingAdmissionPolicy:
rules (operations, apiGroups, apiVersions, resources with `*` and `pods/*`, resourceNames, scope),
excludeResourceRules, namespaceSelector (on the namespace's labels), objectSelector (on the new or the old
object's labels), and `matchConditions` (k8s.io/apiserver/pkg/admission/plugin/webhook/matchconditions/
matcher.go: any false condition skips; an evaluation error skips under failurePolicy Ignore and refuses
under Fail).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from . import cel, ids
from .errors import ApiError
from .resources import RESOURCES
from .selectors import match_label_selector_object
from .store import AdmissionRequest, Obj, Store


def matches(
    store: Store,
    request: AdmissionRequest,
    obj: Obj | None,
    criteria: Mapping[str, Any],
    *,
    rules_key: str = "rules",
) -> bool:
    """The request matches a webhook's (or an admission policy's matchConstraints) rules and selectors."""
    resource = RESOURCES[request.resource]
    target = f"{request.resource}/{request.subresource}" if request.subresource else request.resource

    def rule_matches(rule: Obj) -> bool:
        scope = rule.get("scope") or "*"
        if scope != "*" and (scope == "Namespaced") != resource.namespaced:
            return False
        return _rule_matches(rule, request.operation, resource.group, resource.version, target, request.name)

    if not any(rule_matches(rule) for rule in criteria.get(rules_key) or []):
        return False
    if any(rule_matches(rule) for rule in criteria.get("excludeResourceRules") or []):
        return False
    if resource.namespaced and criteria.get("namespaceSelector"):
        try:
            namespace = store.get("namespaces", None, request.namespace)
        except ApiError:
            return False
        if not match_label_selector_object(
            criteria["namespaceSelector"], namespace["metadata"].get("labels") or {}
        ):
            return False
    selector = criteria.get("objectSelector")
    if selector:
        candidates = [o for o in (obj, request.old) if o is not None]
        if not any(
            match_label_selector_object(selector, (o.get("metadata") or {}).get("labels") or {})
            for o in candidates
        ):
            return False
    return True


_ANY = {"apiGroups": ["*"], "apiVersions": ["*"], "operations": ["*"], "resources": ["*", "*/*"]}


def binding_matches(store: Store, request: AdmissionRequest, obj: Obj | None, binding_spec: Obj) -> bool:
    """An admission policy binding's `matchResources` (generic/policy_matcher.go BindingMatches): none
    matches whatever the policy matches; without resourceRules it narrows by its selectors alone."""
    resources = binding_spec.get("matchResources")
    if not resources:
        return True
    if resources.get("resourceRules") is None:
        resources = {**resources, "resourceRules": [_ANY]}
    return matches(store, request, obj, resources, rules_key="resourceRules")


def namespace_object(store: Store, request: AdmissionRequest) -> Obj | None:
    """CEL's `namespaceObject`: the request's namespace, null for a cluster-scoped resource."""
    if not RESOURCES[request.resource].namespaced or not request.namespace:
        return None
    try:
        return store.get("namespaces", None, request.namespace)
    except ApiError:
        return None


# Each operation's options object (k8s.io/apiserver admission.Attributes GetOperationOptions); UPDATE's and
# CONNECT's otherwise.
_OPTIONS = {"CREATE": "CreateOptions", "DELETE": "DeleteOptions"}


def review_request(request: AdmissionRequest, obj: Obj | None) -> Obj:
    """An AdmissionReview v1 `request`; also the CEL `request` variable (without the objects)."""
    r = RESOURCES[request.resource]
    gvk = {"group": r.group, "version": r.version, "kind": r.kind}
    gvr = {"group": r.group, "version": r.version, "resource": request.resource}
    options: Obj = {"kind": _OPTIONS.get(request.operation, "UpdateOptions"), "apiVersion": "meta.k8s.io/v1"}
    if request.dry_run:
        options["dryRun"] = ["All"]
    body: Obj = {
        "uid": ids.uid(),
        "kind": gvk,
        "resource": gvr,
        "requestKind": gvk,
        "requestResource": gvr,
        "name": request.name,
        "namespace": request.namespace,
        "operation": request.operation,
        "userInfo": request.user.review(),
        "object": obj,
        "oldObject": request.old,
        "dryRun": request.dry_run,
        "options": options,
    }
    if request.subresource:
        body["subResource"] = request.subresource
    return body


def match_conditions(conditions: list[Obj], variables: cel.Inputs, failure_policy: str) -> str | None:
    """matchconditions/matcher.go: None when every condition is true, "" when one is false (or one fails to
    evaluate under Ignore), else the evaluation error (under Fail)."""
    errors = []
    for condition in conditions:
        try:
            if cel.evaluate(str(condition.get("expression", "")), variables) is False:
                return ""
        except cel.CelError as e:
            errors.append(str(e))
    if errors:
        if failure_policy == "Ignore":
            return ""
        return errors[0] if len(errors) == 1 else "[" + ", ".join(errors) + "]"
    return None


def cel_request(request: AdmissionRequest, obj: Obj | None) -> Obj:
    body = review_request(request, obj)
    return {k: v for k, v in body.items() if k not in ("object", "oldObject")}


def _rule_matches(rule: Obj, operation: str, group: str, version: str, resource: str, name: str) -> bool:
    def has(values: Any, value: str) -> bool:
        return "*" in (values or []) or value in (values or [])

    if not has(rule.get("operations"), operation):
        return False
    if not has(rule.get("apiGroups"), group) or not has(rule.get("apiVersions"), version):
        return False
    if rule.get("resourceNames") and name not in rule["resourceNames"]:
        return False
    resources = rule.get("resources") or []
    main = resource.split("/")[0]
    return any(
        r == resource or r == "*" or (r == f"{main}/*" and "/" in resource) or (r == "*/*") for r in resources
    )
