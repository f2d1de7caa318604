"""ValidatingAdmissionPolicy (admissionregistration.k8s.io/v1), evaluated with CEL (cel.py).

Copied from k8s.io/apiserver/pkg/admission/plugin/policy/validating (dispatcher.go, validator.go): a policy
applies when its `matchConstraints` (resourceRules, excludeResourceRules, namespaceSelector,
objectSelector) match and a binding names it (`policyName`) whose `matchResources`, if any, match too.
Its `matchConditions` must all be true; `variables` are evaluated in order and offered as `variables.NAME`;
then each of `validations` must be true. CEL sees `object`, `oldObject`, `request` (with
`request.userInfo`: the requesting user's username, uid and groups, `system:authenticated` included),
`params` (null: paramKind/paramRef are not implemented) and `namespaceObject`. A false validation is a denial with its `reason` (default Invalid) and message: the
`messageExpression`'s string if it gives a non-empty single line, else `message`, else
`failed expression: EXPR`. An expression that fails to evaluate denies under `failurePolicy: Fail` (the
default) with its error, and is ignored under `Ignore`. With `validationActions: [Deny]` the first denial
reaches the client as `matching.NewForbidden` with the reason's code (Forbidden 403, Invalid 422,
Unauthorized 401, RequestEntityTooLarge 413, else 422):
`pods "NAME" is forbidden: ValidatingAdmissionPolicy 'POLICY' with binding 'BINDING' denied request: MSG`.
`Warn` and `Audit` actions, auditAnnotations and typechecking are not implemented.
"""

from __future__ import annotations

from . import cel, matching
from .errors import forbidden
from .resources import RESOURCES
from .store import AdmissionRequest, Obj, Store

_CODES = {"Forbidden": 403, "Invalid": 422, "Unauthorized": 401, "RequestEntityTooLarge": 413}


def validate(store: Store, request: AdmissionRequest, obj: Obj | None) -> None:
    policies, _, _ = store.list_objects("validatingadmissionpolicies")
    if not policies:
        return
    bindings, _, _ = store.list_objects("validatingadmissionpolicybindings")
    for definition in policies:
        spec = definition.get("spec") or {}
        constraints = spec.get("matchConstraints") or {}
        if not matching.matches(store, request, obj, constraints, rules_key="resourceRules"):
            continue
        name = definition["metadata"]["name"]
        for binding in bindings:
            binding_spec = binding.get("spec") or {}
            if binding_spec.get("policyName") != name:
                continue
            if not matching.binding_matches(store, request, obj, binding_spec):
                continue
            denial = _evaluate(store, request, obj, spec)
            if denial is not None and "Deny" in (binding_spec.get("validationActions") or []):
                reason, message = denial
                _deny(request, obj, name, binding["metadata"]["name"], reason, message)


def _evaluate(store: Store, request: AdmissionRequest, obj: Obj | None, spec: Obj) -> tuple[str, str] | None:
    """(reason, message) of the first failed validation, or None when the request is allowed."""
    failure_policy = spec.get("failurePolicy") or "Fail"
    variables = cel.Inputs(
        {
            "object": obj,
            "oldObject": request.old,
            "request": matching.cel_request(request, obj),
            "params": None,
            "namespaceObject": matching.namespace_object(store, request),
        }
    )
    error = matching.match_conditions(spec.get("matchConditions") or [], variables, failure_policy)
    if error == "":
        return None
    if error is not None:
        return "Invalid", error
    variables.define(spec.get("variables") or [])
    for validation in spec.get("validations") or []:
        expression = str(validation.get("expression", ""))
        try:
            allowed = cel.evaluate(expression, variables)
        except cel.CelError as e:
            if failure_policy == "Ignore":
                continue
            return "Invalid", str(e)
        if allowed is True:
            continue
        return validation.get("reason") or "Invalid", _message(validation, variables)
    return None


def _message(validation: Obj, variables: cel.Inputs) -> str:
    if validation.get("messageExpression"):
        try:
            text = cel.evaluate(str(validation["messageExpression"]), variables)
        except cel.CelError:
            text = None
        if isinstance(text, str) and text.strip() and "\n" not in text.strip():
            return text.strip()
    if str(validation.get("message") or "").strip():
        return str(validation["message"]).strip()
    return f"failed expression: {str(validation.get('expression', '')).strip()}"


def _deny(
    request: AdmissionRequest, obj: Obj | None, policy: str, binding: str, reason: str, message: str
) -> None:
    text = f"ValidatingAdmissionPolicy '{policy}' with binding '{binding}' denied request: {message}"
    name = ((obj or request.old or {}).get("metadata") or {}).get("name") or request.name
    error = forbidden(request.resource, name, text, group=RESOURCES[request.resource].group)
    error.code, error.reason = _CODES.get(reason, 422), reason
    assert error.details is not None
    error.details["causes"] = [{"message": text}]
    raise error
