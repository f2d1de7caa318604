"""MutatingAdmissionPolicy (admissionregistration.k8s.io/v1, GA in 1.36), evaluated with CEL (cel.py).

Copied from k8s.io/apiserver/pkg/admission/plugin/policy/mutating (dispatcher.go, patch/json_patch.go,
patch/smd.go) and policy/generic (policy_dispatcher.go), with the behaviour measured on a real v1.36.2
(docs/real-cluster-facts.md, "Admission policies in the API server"):

- Place in the chain: after the in-tree mutating plugins, before the mutating webhooks (admission.py); it
  sees the pod with its priority, service account, token volume and default tolerations.
- A policy applies when its `matchConstraints` (resourceRules, excludeResourceRules, namespaceSelector,
  objectSelector; `matchPolicy` changes nothing here, kubesim serves one version of each resource) match and
  a binding names it (`policyName`) whose `matchResources`, if any, match too; then, per parameter object,
  its `matchConditions` must all be true. Policies run in name order, their bindings in name order; the
  real order is unspecified (policy/generic/policy_source.go `calculatePolicyData` ranges over a Go map,
  and it may change at each refresh), so nothing may depend on it.
- `paramKind` + the binding's `paramRef` (`name`, or `selector`; `namespace`, else the request's for a
  namespaced kind; `parameterNotFoundAction: Deny` refuses when none is found): one invocation per
  parameter object, offered as `params`.
- `variables` are offered as `variables.NAME`, each evaluated when an expression reads it, on the object as
  the mutations before it left it (one that fails fails its readers: cel.py); CEL also sees
  `object`, `oldObject`, `request`, `params`, `namespaceObject` (`authorizer` is not offered).
- `mutations` in order, each seeing the previous one's result. `JSONPatch`: the expression returns a list
  of `JSONPatch{op, path, from, value}` applied to the object; a failed `test` leaves it unchanged; another
  failure is `JSONPath: <why>`; a value that is a list of typed objects (`[Object.spec.x{...}]`) panics the
  real server's handler (cel-go's list ConvertToNative): kubesim fails the request with the measured message
  whatever the failurePolicy. `ApplyConfiguration`: the expression returns `Object{...}`, merged into the
  object as server-side apply merges (apply.merge); one that sets an atomic list is refused (`invalid
  ApplyConfiguration: may not mutate atomic arrays, maps or structs: PATH`). A constructed object whose
  field holds an object of another type path is a `type mismatch`. A mutated pod is defaulted again.
- Failures (a compile error, an evaluation error, a bad patch, the cost limits of cel.py) are collected:
  ignored under `failurePolicy: Ignore`, and under `Fail` (the default) the request is refused with
  admission.NewForbidden (403) whose message is the first one's,
  `policy 'POLICY' with binding 'BINDING' denied request: WHY`, reason Invalid, and one cause per failure.
- Reinvocation (dispatcher.go): a policy whose invocation changed the object asks for the mutating phase to
  run again; a successful mutation marks the object dirty, which asks the same after the pass, so a policy
  with `reinvocationPolicy: IfNeeded` that changed the object is itself run once more, after the in-tree
  plugins ran again (measured: every mutation must be idempotent).

Not done: CEL's static type check at policy creation (cel.py: a type error on `dyn` `object` is accepted by
the API server too; one on the typed `request` would be refused there), the `authorizer` variable, and the measured
failure of `ApplyConfiguration` on a server whose OpenAPI document is broken (kubesim behaves as a server
with a working schema). `apply_policies` runs policies on one object without a cluster, for parity tests.

Stateless: the policies and bindings are read from the store at each request; the per-request state is the
request's Reinvocation (reinvocation.py), owned by the admitting thread.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from sparkgate.json_patch import PatchError, apply_patch

from . import apply as ssa
from . import cel, matching, podrules
from .errors import ApiError, UserInfo, forbidden
from .jsondata import clone
from .reinvocation import Reinvocation
from .resources import RESOURCES
from .selectors import match_label_selector_object
from .store import AdmissionRequest, Obj, Store

PLUGIN = "MutatingAdmissionPolicy"
PANIC = (
    "kubesim: the API server's request handler panicked, as kube-apiserver v1.36.2 does (its client sees "
    "the HTTP/2 stream reset with INTERNAL_ERROR): reflect.Set: value of type *structpb.Struct is not "
    "assignable to type *structpb.Value (a JSONPatch value that is a list of typed objects)"
)


class _Failure(Exception):
    """A policy error that failurePolicy decides on (generic.PolicyError)."""

    def __init__(self, message: str, reason: str = "Invalid") -> None:
        super().__init__(message)
        self.reason = reason


def mutate(store: Store, request: AdmissionRequest, obj: Obj, context: Reinvocation) -> Obj:
    """One pass of the MutatingAdmissionPolicy plugin over `obj` (the chain's current object)."""
    policies, _, _ = store.list_objects("mutatingadmissionpolicies")
    if not policies:
        return obj
    bindings, _, _ = store.list_objects("mutatingadmissionpolicybindings")
    return _dispatch(store, request, obj, policies, bindings, context)


def apply_policies(
    policies: Iterable[Obj],
    bindings: Iterable[Obj],
    obj: Obj,
    *,
    namespace: Obj | None = None,
    params: Iterable[Obj] = (),
    operation: str = "CREATE",
    old: Obj | None = None,
    user: UserInfo | None = None,
) -> Obj:
    """`obj` as the MutatingAdmissionPolicy plugin leaves it, without HTTP and without the other plugins:
    a pass, and a second one when the first asked for it (the reinvoker). `namespace` is the object's
    Namespace (its labels for namespaceSelector, `namespaceObject`); `params` the objects paramRef may
    name. ApiError as the chain would refuse the request. The inputs are not changed."""
    store = Store()
    if namespace is not None:
        store.create("namespaces", clone(namespace))
    for param in params:
        plural = _resource_of(param.get("apiVersion", ""), param.get("kind", ""))
        if plural is None:
            raise ValueError(
                f"kubesim serves no {param.get('apiVersion')} {param.get('kind')} (a param object)"
            )
        store.create(plural, clone(param), namespace=(param.get("metadata") or {}).get("namespace"))
    kind = obj.get("kind", "")
    resource = next((r.plural for r in RESOURCES.values() if r.kind == kind), None)
    if resource is None:
        raise ValueError(f"kubesim serves no kind {kind!r} (the object's `kind`)")
    meta = obj.get("metadata") or {}
    request = AdmissionRequest(
        operation,
        resource,
        "",
        meta.get("namespace", "") if RESOURCES[resource].namespaced else "",
        meta.get("name", ""),
        obj,
        old,
        user or UserInfo("admin", "admin", ("system:masters", "system:authenticated")),
        False,
    )
    policies, bindings = sorted(policies, key=_name), sorted(bindings, key=_name)
    context = Reinvocation()
    out = _dispatch(store, request, clone(obj), policies, bindings, context)
    if context.should_reinvoke:
        context.is_reinvoke = True
        out = _dispatch(store, request, out, policies, bindings, context)
    return out


def _name(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("name", ""))


def _dispatch(
    store: Store,
    request: AdmissionRequest,
    obj: Obj,
    policies: list[Obj],
    bindings: list[Obj],
    context: Reinvocation,
) -> Obj:
    state = context.plugin(PLUGIN)
    if context.is_reinvoke and state.output_changed(obj):
        state.require_reinvoking_previously_invoked()  # the in-tree plugins changed it
    failures: list[tuple[Obj, Obj, _Failure]] = []
    dirty = False
    for policy in policies:
        spec = policy.get("spec") or {}
        if not matching.matches(
            store, request, obj, spec.get("matchConstraints") or {}, rules_key="resourceRules"
        ):
            continue
        for binding in bindings:
            binding_spec = binding.get("spec") or {}
            if binding_spec.get("policyName") != _name(policy):
                continue
            if not matching.binding_matches(store, request, obj, binding_spec):
                continue
            try:
                params = _params(store, request, spec, binding_spec)
            except _Failure as e:
                failures.append((policy, binding, e))
                continue
            for param in params:
                key = f"{_name(policy)}/{_name(binding)}/{_name(param or {})}"
                before = obj
                try:
                    obj, mutated = _invoke(
                        store, request, obj, spec, param, key, context, failures, policy, binding
                    )
                except _Skip:
                    continue
                dirty = dirty or mutated
                if obj != before:
                    state.require_reinvoking_previously_invoked()
                    context.should_reinvoke = True
                if spec.get("reinvocationPolicy") == "IfNeeded":
                    state.previously_invoked.add(key)
    if dirty:
        state.require_reinvoking_previously_invoked()
        context.should_reinvoke = True
    state.set_last_output(obj)
    fatal = [
        (p, b, e)
        for p, b, e in failures
        if ((p.get("spec") or {}).get("failurePolicy") or "Fail") != "Ignore"
    ]
    if fatal:
        raise _forbidden(request, obj, fatal)
    return obj


class _Skip(Exception):
    """The invocation does not run: its matchConditions are not all true, or it is not to be reinvoked."""


def _invoke(
    store: Store,
    request: AdmissionRequest,
    obj: Obj,
    spec: Obj,
    param: Obj | None,
    key: str,
    context: Reinvocation,
    failures: list[tuple[Obj, Obj, _Failure]],
    policy: Obj,
    binding: Obj,
) -> tuple[Obj, bool]:
    """(the object after the policy's mutations, whether any mutation succeeded)."""
    variables = cel.Inputs(
        {
            "object": obj,
            "oldObject": request.old,
            "request": matching.cel_request(request, obj),
            "params": param,
            "namespaceObject": matching.namespace_object(store, request),
        }
    )
    error = matching.match_conditions(
        spec.get("matchConditions") or [], variables, spec.get("failurePolicy") or "Fail"
    )
    if error == "":
        raise _Skip
    if error is not None:
        failures.append((policy, binding, _Failure(error)))
        raise _Skip
    if context.is_reinvoke and key not in context.plugin(PLUGIN).reinvoke:
        raise _Skip
    mutated = False
    variables.define(spec.get("variables") or [])
    for mutation in spec.get("mutations") or []:
        variables.set("object", obj)
        try:
            obj = _mutation(request, obj, mutation, variables)
            mutated = True
        except _Failure as e:
            failures.append((policy, binding, e))
    return obj, mutated


def _mutation(request: AdmissionRequest, obj: Obj, mutation: Obj, variables: cel.Inputs) -> Obj:
    patch_type = mutation.get("patchType")
    body = mutation.get("jsonPatch" if patch_type == "JSONPatch" else "applyConfiguration") or {}
    try:
        value = cel.evaluate(str(body.get("expression", "")), variables, cel.Budget())
    except cel.CelError as e:
        raise _Failure(str(e)) from None
    if patch_type == "JSONPatch":
        patched = _json_patch(obj, value)
    elif patch_type == "ApplyConfiguration":
        patched = _apply_configuration(obj, value)
    else:
        raise _Failure(f"unsupported patchType {patch_type!r}")
    if request.resource == "pods":
        podrules.default_pod(patched)  # dispatchOne: the patched object is defaulted
    return patched


def _json_patch(obj: Obj, value: Any) -> Obj:
    """patch/json_patch.go."""
    if not isinstance(value, list):
        raise _Failure("type mismatch: JSONPatchType.expression should evaluate to array")
    operations = []
    for element in value:
        if not isinstance(element, cel.Typed) or element.type_path != ("JSONPatch",):
            raise _Failure("type mismatch: JSONPatchType.expression should evaluate to array of JSONPatch")
        operation = {"op": str(element.get("op", "")), "path": str(element.get("path", ""))}
        if element.get("from"):
            operation["from"] = str(element["from"])
        if "value" in element:
            if _list_of_typed(element["value"]):
                raise ApiError(500, "InternalError", PANIC)
            if isinstance(element["value"], cel.Typed):
                _check_type_names(element["value"])
            operation["value"] = _untyped(element["value"])
        operations.append(operation)
    try:
        patched: Obj = apply_patch(obj, operations)
    except PatchError as e:
        if e.test_failed:
            return obj  # jsonpatch.ErrTestFailed: the patch is not applied
        raise _Failure(f"JSONPath: {e}") from None
    return patched


def _apply_configuration(obj: Obj, value: Any) -> Obj:
    """patch/smd.go."""
    if not isinstance(value, cel.Typed) or value.type_path != ("Object",):
        raise _Failure(f"unsupported return type from ApplyConfiguration expression: {type(value).__name__}")
    _check_type_names(value)
    config = _untyped(value)
    atomics = _atomic_lists(config, "", "")
    if atomics:
        raise _Failure(
            "error applying patch: invalid ApplyConfiguration: may not mutate atomic arrays, maps or structs: "
            + ", ".join(atomics)
        )
    try:
        merged: Obj = ssa.merge(obj, config)
    except ValueError as e:
        raise _Failure(f"error applying patch: failed to merge patch: {e}") from None
    return merged


def _atomic_lists(value: Any, path: str, field: str) -> list[str]:
    """smd.go findAtomics, for lists (kubesim's maps are all granular)."""
    out: list[str] = []
    if isinstance(value, dict):
        for key, child in value.items():
            out += _atomic_lists(child, f"{path}.{key}", key)
    elif isinstance(value, list):
        if field not in ssa.LIST_KEYS and field not in ssa.SETS:
            out.append(path)
        for i, child in enumerate(value):
            out += _atomic_lists(child, f"{path}[{i}]", "")
    return out


def _check_type_names(value: cel.Typed) -> None:
    """ObjectVal.CheckTypeNamesMatchFieldPathNames: `Object.spec{selector: Object.spec.wrong{}}` is a
    mismatch (kubesim's wording)."""
    for name, child in value.items():
        for item in child if isinstance(child, list) else [child]:
            if isinstance(item, cel.Typed):
                want = (*value.type_path, name)
                if item.type_path != want:
                    raise _Failure(
                        f"type mismatch: field {name!r} of {'.'.join(value.type_path)} holds "
                        f"{'.'.join(item.type_path)}, expected {'.'.join(want)}"
                    )
                _check_type_names(item)


def _list_of_typed(value: Any) -> bool:
    if isinstance(value, list):
        return any(isinstance(v, cel.Typed) or _list_of_typed(v) for v in value)
    if isinstance(value, dict) and not isinstance(value, cel.Typed):
        return any(_list_of_typed(v) for v in value.values())
    return False


def _untyped(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _untyped(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_untyped(v) for v in value]
    return value


def _resource_of(api_version: str, kind: str) -> str | None:
    return next(
        (r.plural for r in RESOURCES.values() if r.api_version == api_version and r.kind == kind), None
    )


def _params(store: Store, request: AdmissionRequest, spec: Obj, binding_spec: Obj) -> list[Obj | None]:
    """generic/policy_dispatcher.go CollectParams."""
    kind = spec.get("paramKind")
    ref = binding_spec.get("paramRef")
    if not kind or not ref:
        return [None]
    plural = _resource_of(str(kind.get("apiVersion", "")), str(kind.get("kind", "")))
    if plural is None:
        raise _Failure(
            f"failed to configure binding: paramKind kind `{kind.get('apiVersion')}, Kind={kind.get('kind')}` "
            "not known",
            reason="",
        )
    namespace = None
    if RESOURCES[plural].namespaced:
        namespace = ref.get("namespace") or request.namespace
        if not namespace:
            raise _Failure(
                "failed to configure binding: cannot use namespaced paramRef in policy binding that matches "
                "cluster-scoped resources",
                reason="",
            )
    elif ref.get("namespace"):
        raise _Failure(
            "failed to configure binding: paramRef.namespace must not be provided for a cluster-scoped "
            "`paramKind`",
            reason="",
        )
    found: list[Obj]
    if ref.get("name"):
        try:
            found = [store.get(plural, namespace, str(ref["name"]))]
        except ApiError:
            found = []
    else:
        items, _, _ = store.list_objects(plural, namespace)
        selector = ref.get("selector") or {}
        found = [o for o in items if match_label_selector_object(selector, o["metadata"].get("labels") or {})]
    if not found and ref.get("parameterNotFoundAction") == "Deny":
        raise _Failure(
            "failed to configure binding: no params found for policy binding with `Deny` parameterNotFoundAction",
            reason="",
        )
    return list(found)


def _forbidden(request: AdmissionRequest, obj: Obj, failures: list[tuple[Obj, Obj, _Failure]]) -> ApiError:
    """policy_dispatcher.go: admission.NewForbidden, its message the first failure's, one cause each."""
    meta = (obj or request.old or {}).get("metadata") or {}
    r = RESOURCES[request.resource]
    error = forbidden(request.resource, meta.get("name") or request.name, "", group=r.group)
    messages = [f"policy '{_name(p)}' with binding '{_name(b)}' denied request: {e}" for p, b, e in failures]
    error.message = messages[0]
    error.args = (messages[0],)
    if failures[0][2].reason:
        error.reason = failures[0][2].reason
    assert error.details is not None
    error.details["causes"] = [{"message": m} for m in messages]
    return error
