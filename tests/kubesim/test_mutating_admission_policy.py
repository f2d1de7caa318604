"""MutatingAdmissionPolicy in kubesim (kubesim/mutating_policy.py): policies and bindings created with the
official client over HTTP, pods created through the chain. Sources: k8s.io/apiserver/pkg/admission/plugin/
policy/mutating (dispatcher.go, patch/json_patch.go, patch/smd.go), policy/generic/policy_dispatcher.go,
pkg/kubeapiserver/options/plugins.go (AllOrderedPlugins), k8s.io/apiserver/pkg/apis/cel/config.go, and
the measurements on a real v1.36.2 in docs/real-cluster-facts.md ("Admission policies in the API server")."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from kubesim import cel
from kubesim.cluster import Cluster
from kubesim.mutating_policy import apply_policies

from .conftest import pod
from .test_cluster import TinyWebhook, executor_pod

EXECUTORS = "has(object.metadata.labels) && object.metadata.labels['spark-role'] == 'executor'"
GATE = "[JSONPatch{op: 'add', path: '/spec/schedulingGates', value: [{'name': 'sparkgate.io/allocator'}]}]"


def policy(name: str, *mutations: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["CREATE"],
                        "resources": ["pods"],
                    }
                ]
            },
            "matchConditions": [{"name": "executors", "expression": EXECUTORS}],
            "failurePolicy": "Fail",
            "reinvocationPolicy": "Never",
            "mutations": list(mutations),
            **spec,
        },
    }


def json_patch(expression: str) -> dict[str, Any]:
    return {"patchType": "JSONPatch", "jsonPatch": {"expression": expression}}


def apply_configuration(expression: str) -> dict[str, Any]:
    return {"patchType": "ApplyConfiguration", "applyConfiguration": {"expression": expression}}


def binding(name: str, policy_name: str | None = None, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingAdmissionPolicyBinding",
        "metadata": {"name": name},
        "spec": {"policyName": policy_name or name, **spec},
    }


@pytest.fixture
def admission(api: client.ApiClient) -> client.AdmissionregistrationV1Api:
    return client.AdmissionregistrationV1Api(api)


@pytest.fixture
def install(admission: client.AdmissionregistrationV1Api) -> Any:
    """Create a policy and its binding with the official client."""

    def install(p: dict[str, Any], **binding_spec: Any) -> None:
        admission.create_mutating_admission_policy(p)
        admission.create_mutating_admission_policy_binding(binding(p["metadata"]["name"], **binding_spec))

    return install


def refusal(e: pytest.ExceptionInfo[client.ApiException]) -> tuple[int, str, str]:
    body = json.loads(e.value.body)
    return e.value.status, body["reason"], body["message"]


def test_policies_and_bindings_are_served_by_the_api(
    admission: client.AdmissionregistrationV1Api, install: Any
) -> None:
    """admissionregistration.k8s.io/v1 serves both kinds (GA in 1.36): create, list, get, delete."""
    install(policy("gate", json_patch(GATE)))
    assert [p.metadata.name for p in admission.list_mutating_admission_policy().items] == ["gate"]
    got = admission.read_mutating_admission_policy_binding("gate")
    assert got.spec.policy_name == "gate"
    admission.delete_mutating_admission_policy_binding("gate")
    assert admission.list_mutating_admission_policy_binding().items == []


def test_json_patch_mutations_as_measured(core: client.CoreV1Api, install: Any) -> None:
    """real-cluster-facts.md: `add /spec/schedulingGates`, a label through `jsonpatch.escapeKey`, a
    conditional toleration append, and `add /metadata/annotations` replacing the whole map. A non-executor
    pod (matchConditions false) is left alone."""
    install(
        policy(
            "shape",
            json_patch(GATE),
            json_patch(
                "[JSONPatch{op: 'add', path: '/metadata/labels/' + jsonpatch.escapeKey('sparkgate.io/tier'), "
                "value: 'batch'}]"
            ),
            json_patch(
                "object.spec.tolerations.exists(t, t.key == 'spark') ? [] : "
                "[JSONPatch{op: 'add', path: '/spec/tolerations/-', value: {'key': 'spark', 'operator': 'Exists'}}]"
            ),
            json_patch("[JSONPatch{op: 'add', path: '/metadata/annotations', value: {'a': 'b'}}]"),
        )
    )
    body = executor_pod("e1")
    body["metadata"]["annotations"] = {"user": "x"}
    created = core.create_namespaced_pod("spark", body)
    assert [g.name for g in created.spec.scheduling_gates] == ["sparkgate.io/allocator"]
    assert created.metadata.labels["sparkgate.io/tier"] == "batch"
    assert created.metadata.annotations == {"a": "b"}
    assert [t.key for t in created.spec.tolerations].count("spark") == 1
    other = core.create_namespaced_pod("spark", pod("driver", {"spark-role": "driver"}))
    assert other.spec.scheduling_gates is None and "sparkgate.io/tier" not in (other.metadata.labels or {})


def test_a_policy_sees_the_built_in_plugins_work_and_is_rerun_after_they_run_again(
    core: client.CoreV1Api, install: Any
) -> None:
    """Measured: the policy sees the pod after the in-tree plugins (priority, service account, token
    volume, DefaultTolerationSeconds' two tolerations); with `reinvocationPolicy: IfNeeded` it runs again
    after its own change made the plugins run again (dispatcher.go: a successful mutation marks the object
    dirty), so a pod that arrived with 1 toleration reads 4 and the conditional append stays single."""
    install(
        policy(
            "count",
            json_patch(
                "[JSONPatch{op: 'add', path: '/metadata/annotations', value: {"
                "'seen': string(size(object.spec.tolerations)), "
                "'priority': string(object.spec.priority), 'sa': object.spec.serviceAccountName, "
                "'token': string(object.spec.volumes.exists(v, v.name.startsWith('kube-api-access-')))}}]"
            ),
            json_patch(
                "object.spec.tolerations.exists(t, t.key == 'spark') ? [] : "
                "[JSONPatch{op: 'add', path: '/spec/tolerations/-', value: {'key': 'spark', 'operator': 'Exists'}}]"
            ),
            reinvocationPolicy="IfNeeded",
        )
    )
    body = executor_pod("e1")
    body["spec"]["tolerations"] = [{"key": "own", "operator": "Exists"}]
    created = core.create_namespaced_pod("spark", body)
    assert created.metadata.annotations == {"seen": "4", "priority": "0", "sa": "default", "token": "true"}
    assert [t.key for t in created.spec.tolerations].count("spark") == 1
    assert len(created.spec.tolerations) == 4


def test_a_policy_runs_before_the_mutating_webhooks(
    cluster: Cluster, core: client.CoreV1Api, install: Any
) -> None:
    """AllOrderedPlugins: MutatingAdmissionPolicy before MutatingAdmissionWebhook: the webhook's review
    carries the policy's gate."""
    hook = TinyWebhook(lambda request: {"allowed": True})
    try:
        cluster.store.create("mutatingwebhookconfigurations", hook.config())
        install(policy("gate", json_patch(GATE)))
        core.create_namespaced_pod("spark", executor_pod("e1"))
        assert hook.requests[0]["object"]["spec"]["schedulingGates"] == [{"name": "sparkgate.io/allocator"}]
    finally:
        hook.close()


def test_derived_fields_refuse_a_priority_class_unless_the_policy_removes_priority(
    cluster: Cluster, core: client.CoreV1Api, install: Any
) -> None:
    """Measured: a policy adding `priorityClassName` alone is refused as the webhook case is (the Priority
    plugin runs again); removing `/spec/priority` and `/spec/preemptionPolicy` too admits it."""
    cluster.store.create("priorityclasses", {"metadata": {"name": "spark-batch"}, "value": 1000})
    add_class = "[JSONPatch{op: 'add', path: '/spec/priorityClassName', value: 'spark-batch'}]"
    install(policy("klass", json_patch(add_class)))
    with pytest.raises(client.ApiException) as e:
        core.create_namespaced_pod("spark", executor_pod("e1"))
    assert refusal(e)[2] == (
        'pods "e1" is forbidden: the integer value of priority (0) must not be provided in pod spec; priority '
        "admission controller computed 1000 from the given PriorityClass name"
    )
    cluster.store.delete("mutatingadmissionpolicies", None, "klass")
    cluster.store.delete("mutatingadmissionpolicybindings", None, "klass")
    install(
        policy(
            "klass2",
            json_patch(
                "has(object.spec.priority) && !has(object.spec.priorityClassName) ? ["
                "JSONPatch{op: 'remove', path: '/spec/priority'}, "
                "JSONPatch{op: 'remove', path: '/spec/preemptionPolicy'}] : []"
            ),
            json_patch(add_class),
        )
    )
    assert core.create_namespaced_pod("spark", executor_pod("e2")).spec.priority == 1000


def test_a_json_patch_value_listing_typed_objects_fails_the_create_even_under_ignore(
    core: client.CoreV1Api, cluster: Cluster, install: Any
) -> None:
    """Measured: `[Object.spec.schedulingGates{name: ...}]` as a JSONPatch value panicked v1.36.2's handler
    (cel-go list ConvertToNative, json_patch.go) and the create failed although failurePolicy was Ignore.
    The same value as a plain map list works."""
    typed = (
        "[JSONPatch{op: 'add', path: '/spec/schedulingGates', "
        "value: [Object.spec.schedulingGates{name: 'sparkgate.io/allocator'}]}]"
    )
    install(policy("typed", json_patch(typed), failurePolicy="Ignore"))
    with pytest.raises(client.ApiException) as e:
        core.create_namespaced_pod("spark", executor_pod("e1"))
    code, reason, message = refusal(e)
    assert (code, reason) == (500, "InternalError")
    assert "reflect.Set: value of type *structpb.Struct is not assignable to type *structpb.Value" in message
    assert cluster.store.list_objects("pods", "spark")[0] == []


def test_apply_configuration_merges_like_server_side_apply(core: client.CoreV1Api, install: Any) -> None:
    """patch/smd.go: `Object{...}` merged into the pod (labels added, the executor container matched by
    name and given an env var, the gate list merged by name); a configuration that sets an atomic list
    (tolerations) is refused: `invalid ApplyConfiguration: may not mutate atomic arrays, maps or
    structs`."""
    install(
        policy(
            "apply",
            apply_configuration(
                "Object{metadata: Object.metadata{labels: {'tier': 'batch'}}, spec: Object.spec{"
                "schedulingGates: [Object.spec.schedulingGates{name: 'sparkgate.io/allocator'}], "
                "containers: [Object.spec.containers{name: 'c', env: [Object.spec.containers.env{name: 'X', value: '1'}]}]}}"
            ),
        )
    )
    created = core.create_namespaced_pod("spark", executor_pod("e1"))
    assert created.metadata.labels["tier"] == "batch" and created.metadata.labels["spark-role"] == "executor"
    assert [g.name for g in created.spec.scheduling_gates] == ["sparkgate.io/allocator"]
    [container] = created.spec.containers
    assert container.image == "x" and [(v.name, v.value) for v in container.env] == [("X", "1")]
    install(
        policy(
            "atomic",
            apply_configuration(
                "Object{spec: Object.spec{tolerations: [Object.spec.tolerations{key: 'a'}]}}"
            ),
        )
    )
    with pytest.raises(client.ApiException) as e:
        core.create_namespaced_pod("spark", executor_pod("e2"))
    assert refusal(e) == (
        403,
        "Invalid",
        "policy 'atomic' with binding 'atomic' denied request: error applying patch: invalid ApplyConfiguration: "
        "may not mutate atomic arrays, maps or structs: .spec.tolerations",
    )


def test_failure_policy_decides_on_errors(cluster: Cluster, core: client.CoreV1Api, install: Any) -> None:
    """policy_dispatcher.go: an evaluation error or a patch that does not apply is
    ignored under Ignore (the other mutations still apply) and under Fail refuses with 403, reason Invalid,
    `policy 'P' with binding 'B' denied request: WHY`, one cause per failure. A failed `test` op leaves the
    object unchanged without an error (json_patch.go)."""
    install(
        policy(
            "lenient",
            json_patch("[JSONPatch{op: 'add', path: '/metadata/labels/a', value: object.spec.nope}]"),
            json_patch("[JSONPatch{op: 'add', path: '/metadata/labels/b', value: 'ok'}]"),
            json_patch(
                "[JSONPatch{op: 'test', path: '/metadata/name', value: 'other'}, "
                "JSONPatch{op: 'add', path: '/metadata/labels/c', value: 'no'}]"
            ),
            failurePolicy="Ignore",
        )
    )
    created = core.create_namespaced_pod("spark", executor_pod("e1"))
    assert created.metadata.labels["b"] == "ok" and "a" not in created.metadata.labels
    assert "c" not in created.metadata.labels
    install(
        policy(
            "strict",
            json_patch("[JSONPatch{op: 'replace', path: '/spec/nothing/here', value: 1}]"),
            json_patch("[JSONPatch{op: 'add', path: '/metadata/labels/x', value: object.spec.nope}]"),
        )
    )
    with pytest.raises(client.ApiException) as e:
        core.create_namespaced_pod("spark", executor_pod("e2"))
    code, reason, message = refusal(e)
    assert (code, reason) == (403, "Invalid")
    assert message.startswith("policy 'strict' with binding 'strict' denied request: JSONPath: ")
    causes = json.loads(e.value.body)["details"]["causes"]
    assert len(causes) == 2 and "resulted in error" in causes[1]["message"]
    assert [p["metadata"]["name"] for p in cluster.store.list_objects("pods", "spark")[0]] == ["e1"]


def test_a_policy_that_does_not_compile_is_refused_at_creation(
    admission: client.AdmissionregistrationV1Api,
) -> None:
    """Measured on v1.36.2: a policy whose CEL does not compile is refused when it is created (422,
    `compilation failed: ERROR: <input>:LINE:COLUMN: ...`), as are unknown enum values
    (pkg/apis/admissionregistration/validation)."""
    broken = policy("broken", json_patch("[JSONPatch{op: 'add', path: "), failurePolicy="Sometimes")
    with pytest.raises(client.ApiException) as e:
        admission.create_mutating_admission_policy(broken)
    code, reason, message = refusal(e)
    assert (code, reason) == (422, "Invalid")
    assert message.startswith('MutatingAdmissionPolicy.admissionregistration.k8s.io "broken" is invalid: ')
    assert "spec.mutations[0].jsonPatch.expression: Invalid value: " in message
    assert "compilation failed: ERROR: <input>:1:" in message
    assert 'spec.failurePolicy: Unsupported value: "Sometimes"' in message
    assert admission.list_mutating_admission_policy().items == []


SYNTAX_ERROR = '[JSONPatch{op: "add", path: "/metadata/labels/x", value: object.metadata.name + }]'
TYPE_ERROR = '[JSONPatch{op: "add", path: "/metadata/labels/x", value: object.metadata.name + 1}]'


def test_a_syntax_error_is_refused_at_creation_with_the_compilers_message(
    admission: client.AdmissionregistrationV1Api,
) -> None:
    """docs/real-cluster-facts.md, "A bad expression in a MutatingAdmissionPolicy (v1.36.2)": `spec.mutations[0]
    .jsonPatch.expression: Invalid value: "...": compilation failed: ERROR: <input>:1:80: Syntax error:
    mismatched input '}' expecting {...}`, then the expression and a caret line (k8s.io/apiserver/pkg/
    admission/plugin/cel/compile.go `CompileCELExpression`: "compilation failed: " + cel-go's issues)."""
    with pytest.raises(client.ApiException) as e:
        admission.create_mutating_admission_policy(policy("badsyntax", json_patch(SYNTAX_ERROR)))
    code, reason, message = refusal(e)
    assert (code, reason) == (422, "Invalid")
    column = SYNTAX_ERROR.index("}]") + 1
    assert message == (
        'MutatingAdmissionPolicy.admissionregistration.k8s.io "badsyntax" is invalid: '
        f'spec.mutations[0].jsonPatch.expression: Invalid value: "{SYNTAX_ERROR}": compilation failed: '
        f"ERROR: <input>:1:{column}: Syntax error: mismatched input '}}' expecting {{'[', '{{', '(', '.', "
        "'-', '!', 'true', 'false', 'null', NUM_FLOAT, NUM_INT, NUM_UINT, STRING, BYTES, IDENTIFIER}\n"
        f" | {SYNTAX_ERROR}\n | {'.' * (column - 1)}^"
    )


@pytest.mark.parametrize("failure_policy", ["Fail", "Ignore"])
def test_a_type_error_is_accepted_at_creation_and_fails_each_admission(
    core: client.CoreV1Api, install: Any, failure_policy: str
) -> None:
    """Measured on v1.36.2 (docs/real-cluster-facts.md, "A bad expression"): `object` is `dyn` to the
    compiler (compile.go `createEnvForOpts`), so `object.metadata.name + 1` is accepted at creation; each
    admission fails with cel-go's `no such overload`: under `Fail` the pod is refused with
    `policy 'badtype' with binding 'badtype' denied request: expression '...' resulted in error: no such
    overload` (policy/generic/policy_dispatcher.go), under `Ignore` it is created without the mutation."""
    install(policy("badtype", json_patch(TYPE_ERROR), failurePolicy=failure_policy))
    if failure_policy == "Ignore":
        created = core.create_namespaced_pod("spark", executor_pod("e1"))
        assert "x" not in created.metadata.labels
        return
    with pytest.raises(client.ApiException) as e:
        core.create_namespaced_pod("spark", executor_pod("e1"))
    assert refusal(e) == (
        403,
        "Invalid",
        f"policy 'badtype' with binding 'badtype' denied request: expression '{TYPE_ERROR}' resulted in "
        "error: no such overload",
    )


def test_matching_binding_resources_params_and_variables(
    cluster: Cluster, core: client.CoreV1Api, install: Any
) -> None:
    """matchConstraints.namespaceSelector, the binding's matchResources (objectSelector), paramKind +
    paramRef (a ConfigMap in the request's namespace, offered as `params`), `variables`, and
    `namespaceObject`; a missing param with `parameterNotFoundAction: Deny` refuses."""
    cluster.store.create(
        "configmaps", {"metadata": {"name": "tiers"}, "data": {"tier": "gold"}}, namespace="spark"
    )
    p = policy(
        "params",
        json_patch(
            "[JSONPatch{op: 'add', path: '/metadata/labels/tier', value: variables.tier}, "
            "JSONPatch{op: 'add', path: '/metadata/labels/ns', value: namespaceObject.metadata.name}]"
        ),
        paramKind={"apiVersion": "v1", "kind": "ConfigMap"},
        variables=[{"name": "tier", "expression": "params.data.tier + '-' + request.operation"}],
    )
    p["spec"]["matchConstraints"]["namespaceSelector"] = {
        "matchLabels": {"kubernetes.io/metadata.name": "spark"}
    }
    install(
        p,
        paramRef={"name": "tiers", "parameterNotFoundAction": "Deny"},
        matchResources={"objectSelector": {"matchLabels": {"app": "yes"}}},
    )
    tagged = executor_pod("e1")
    tagged["metadata"]["labels"]["app"] = "yes"
    created = core.create_namespaced_pod("spark", tagged)
    assert created.metadata.labels["tier"] == "gold-CREATE" and created.metadata.labels["ns"] == "spark"
    assert "tier" not in (core.create_namespaced_pod("spark", executor_pod("e2")).metadata.labels or {})
    cluster.store.delete("configmaps", "spark", "tiers")
    tagged["metadata"]["name"] = "e3"
    with pytest.raises(client.ApiException) as e:
        core.create_namespaced_pod("spark", tagged)
    assert refusal(e)[2] == (
        "policy 'params' with binding 'params' denied request: failed to configure binding: no params found "
        "for policy binding with `Deny` parameterNotFoundAction"
    )


def test_a_variable_that_fails_fails_the_mutation_that_reads_it(core: client.CoreV1Api, install: Any) -> None:
    """admission/plugin/cel/composition.go: variables are evaluated for each mutation, on the object the
    mutations before it left; one that fails to evaluate fails only the expressions that read it, with
    `composited variable "NAME" fails to evaluate: WHY`."""
    read_broken = "[JSONPatch{op: 'add', path: '/metadata/labels/x', value: variables.broken}]"
    p = policy(
        "vars",
        json_patch("[JSONPatch{op: 'add', path: '/metadata/labels/n', value: string(variables.gates)}]"),
        json_patch(GATE),
        json_patch("[JSONPatch{op: 'add', path: '/metadata/labels/m', value: string(variables.gates)}]"),
        json_patch(read_broken),
        variables=[
            {
                "name": "gates",
                "expression": "has(object.spec.schedulingGates) ? size(object.spec.schedulingGates) : 0",
            },
            {"name": "broken", "expression": "object.spec.nope"},
        ],
    )
    install(p)
    with pytest.raises(client.ApiException) as e:
        core.create_namespaced_pod("spark", executor_pod("e1"))
    assert refusal(e)[2] == (
        f"policy 'vars' with binding 'vars' denied request: expression '{read_broken}' resulted in error: "
        'composited variable "broken" fails to evaluate: no such key: nope'
    )
    p["spec"]["failurePolicy"] = "Ignore"
    body = {"apiVersion": "v1", "kind": "Pod", **executor_pod("e1")}
    labels = apply_policies([p], [binding("vars")], body)["metadata"]["labels"]
    assert (labels["n"], labels["m"]) == ("0", "1") and "x" not in labels


def test_the_cel_cost_limits_are_the_api_servers() -> None:
    """k8s.io/apiserver/pkg/apis/cel/config.go: PerCallLimit 1000000, RuntimeCELCostBudget 10000000; an
    evaluation past the per-call limit fails with cel-go's `operation cancelled: actual cost limit
    exceeded`, one past the remaining budget with `validation failed due to running out of cost budget`.
    (Smaller limits injected here: cel-python takes ~100 s to spend a million.)"""
    assert (cel.PER_CALL_LIMIT, cel.RUNTIME_BUDGET) == (1_000_000, 10_000_000)
    items = {"object": {"items": list(range(50))}}
    expression = "object.items.map(a, object.items.map(b, a + b)).size()"
    assert cel.evaluate(expression, items) == 50
    with pytest.raises(cel.CelError, match="operation cancelled: actual cost limit exceeded"):
        cel.evaluate(expression, items, cel.Budget(per_call=1000))
    budget = cel.Budget(remaining=3000)
    cel.evaluate("object.items.map(a, a + 1).size()", items, budget)
    with pytest.raises(cel.CelError, match="running out of cost budget"):
        cel.evaluate(expression, items, budget)


def test_apply_policies_runs_without_a_cluster() -> None:
    """The pure function for parity tests: the same engine on one object, with its namespace for
    namespaceSelector and `namespaceObject`, the reinvocation pass included."""
    p = policy(
        "gate",
        json_patch(GATE),
        json_patch(
            "[JSONPatch{op: 'add', path: '/metadata/annotations', value: {'ns': namespaceObject.metadata.name}}]"
        ),
        reinvocationPolicy="IfNeeded",
    )
    body = {"apiVersion": "v1", "kind": "Pod", **executor_pod("e1")}
    body["metadata"]["namespace"] = "spark"
    namespace = {"metadata": {"name": "spark", "labels": {"kubernetes.io/metadata.name": "spark"}}}
    out = apply_policies([p], [binding("gate")], body, namespace=namespace)
    assert out["spec"]["schedulingGates"] == [{"name": "sparkgate.io/allocator"}]
    assert out["metadata"]["annotations"] == {"ns": "spark"}
    assert "schedulingGates" not in body["spec"]  # the input is not changed
    assert apply_policies([p], [], body, namespace=namespace) == body  # no binding, no policy


@pytest.fixture(autouse=True)
def _no_leftover_webhooks(cluster: Cluster) -> Iterator[None]:
    yield
