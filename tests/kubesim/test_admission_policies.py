"""dryRun=All, ValidatingAdmissionPolicy and webhook matchConditions (CEL) in kubesim, over HTTP with the
official client. Each test names the Kubernetes source or documentation it copies."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, config

from kubesim.cluster import Cluster

from .conftest import pod
from .test_cluster import TinyWebhook, executor_pod, gate_patch

ALLOCATOR = "system:serviceaccount:sparkgate-system:sparkgate-allocator"
GATE = [{"name": "sparkgate.io/allocator"}]
HAD_GATE = (
    "has(oldObject.spec.schedulingGates) && "
    "oldObject.spec.schedulingGates.exists(g, g.name == 'sparkgate.io/allocator')"
)


def refusal(e: pytest.ExceptionInfo[client.ApiException]) -> tuple[int, str]:
    return e.value.status, json.loads(e.value.body)["message"]


@pytest.fixture
def webhook() -> Iterator[TinyWebhook]:
    hook = TinyWebhook(gate_patch)
    yield hook
    hook.close()


@pytest.fixture
def allocator(cluster: Cluster) -> Iterator[client.CoreV1Api]:
    api = config.new_client_from_config(str(cluster.add_user(ALLOCATOR)))
    yield client.CoreV1Api(api)
    api.close()


# --- dryRun ---------------------------------------------------------------------------------------------


def test_a_dry_run_create_runs_the_whole_chain_and_stores_nothing(
    cluster: Cluster, core: client.CoreV1Api, webhook: TinyWebhook
) -> None:
    """https://kubernetes.io/docs/reference/using-api/api-concepts/#dry-run: admission runs (webhooks get
    `request.dryRun: true`), the answer is the object as it would be stored, nothing is persisted; a
    refused dry run answers as a real create (measured on 1.36: the same 403)."""
    cluster.store.create("mutatingwebhookconfigurations", webhook.config())
    before = cluster.store.resource_version
    answer = core.create_namespaced_pod("spark", executor_pod("e1"), dry_run="All")
    assert [g.name for g in answer.spec.scheduling_gates] == ["sparkgate.io/allocator"]
    assert answer.spec.priority == 0 and answer.spec.volumes[0].name.startswith("kube-api-access-")
    review = webhook.requests[0]
    assert review["dryRun"] is True and review["options"]["dryRun"] == ["All"]
    assert cluster.store.resource_version == before
    assert cluster.store.list_objects("pods", "spark")[0] == []
    with pytest.raises(client.ApiException) as e:
        core.create_namespaced_pod("spark", pod("p", priorityClassName="nope"), dry_run="All")
    assert refusal(e) == (403, 'pods "p" is forbidden: no PriorityClass with name nope was found')


def test_a_dry_run_patch_answers_the_change_and_keeps_the_object(
    cluster: Cluster, core: client.CoreV1Api
) -> None:
    """dryRun on PATCH (and PUT): the patched object comes back, the stored one is unchanged."""
    core.create_namespaced_pod("spark", pod("p", schedulingGates=GATE))  # gated: nothing else changes it
    stored = cluster.store.get("pods", "spark", "p")
    answer = core.patch_namespaced_pod("p", "spark", {"metadata": {"labels": {"x": "y"}}}, dry_run="All")
    assert answer.metadata.labels == {"x": "y"}
    assert cluster.store.get("pods", "spark", "p") is stored
    replaced = {**stored, "metadata": {**stored["metadata"], "labels": {"z": "1"}}}
    answer = core.replace_namespaced_pod("p", "spark", replaced, dry_run="All")
    assert answer.metadata.labels == {"z": "1"} and cluster.store.get("pods", "spark", "p") is stored


def test_a_webhook_with_side_effects_fails_a_dry_run(
    cluster: Cluster, core: client.CoreV1Api, webhook: TinyWebhook
) -> None:
    """staging/src/k8s.io/apiserver/pkg/admission/plugin/webhook/mutating/dispatcher.go: on a dry run a
    webhook whose sideEffects is not None/NoneOnDryRun is not called and the request is 400
    `admission webhook "NAME" does not support dry run`; NoneOnDryRun webhooks are called."""
    cluster.store.create("mutatingwebhookconfigurations", webhook.config(sideEffects="Some"))
    with pytest.raises(client.ApiException) as e:
        core.create_namespaced_pod("spark", executor_pod("e1"), dry_run="All")
    assert refusal(e) == (400, 'admission webhook "test.example.com" does not support dry run')
    assert webhook.requests == []
    configured = cluster.store.get("mutatingwebhookconfigurations", None, "test.example.com")
    changed = json.loads(json.dumps(configured))
    changed["webhooks"][0]["sideEffects"] = "NoneOnDryRun"
    cluster.store.replace("mutatingwebhookconfigurations", None, "test.example.com", changed)
    assert core.create_namespaced_pod("spark", executor_pod("e1"), dry_run="All").spec.scheduling_gates


# --- webhook matchConditions ------------------------------------------------------------------------------


def test_webhook_match_conditions_select_updates_of_gated_pods(
    cluster: Cluster, core: client.CoreV1Api
) -> None:
    """matchconditions/matcher.go with the shipped validating webhook's condition (manifests/base/
    webhooks.yaml): only updates of a pod that carried the gate reach the webhook."""
    hook = TinyWebhook(lambda r: {"allowed": True})
    try:
        rules = [{"operations": ["UPDATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}]
        conditions = [{"name": "had-sparkgate-gate", "expression": HAD_GATE}]
        cluster.store.create(
            "validatingwebhookconfigurations",
            hook.config("gate.example.com", rules=rules, matchConditions=conditions, failurePolicy="Ignore"),
        )
        core.create_namespaced_pod("spark", gated_executor("gated"))
        core.create_namespaced_pod("spark", executor_pod("free"))
        core.patch_namespaced_pod("free", "spark", {"metadata": {"labels": {"a": "1"}}})
        assert hook.requests == []
        core.patch_namespaced_pod("gated", "spark", {"metadata": {"labels": {"a": "1"}}})
        assert [r["name"] for r in hook.requests] == ["gated"]
    finally:
        hook.close()


def test_a_match_condition_that_fails_to_evaluate_refuses_under_fail(
    cluster: Cluster, core: client.CoreV1Api
) -> None:
    """matchconditions/matcher.go + generic/webhook.go: an evaluation error refuses the request (403, the
    error as message) under failurePolicy Fail, and skips the webhook under Ignore."""
    hook = TinyWebhook(lambda r: {"allowed": True})
    try:
        conditions = [{"name": "broken", "expression": "object.spec.nope == 1"}]
        cluster.store.create(
            "validatingwebhookconfigurations", hook.config("v.example.com", matchConditions=conditions)
        )
        with pytest.raises(client.ApiException) as e:
            core.create_namespaced_pod("spark", executor_pod("e1"))
        status, message = refusal(e)
        assert status == 403
        assert message.startswith(
            "pods \"e1\" is forbidden: expression 'object.spec.nope == 1' resulted in error: "
        )
        assert hook.requests == []
    finally:
        hook.close()


# --- ValidatingAdmissionPolicy ----------------------------------------------------------------------------


def gate_policy(**spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "gate-guard"},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "operations": ["UPDATE"],
                        "resources": ["pods"],
                    }
                ],
                "objectSelector": {"matchLabels": {"spark-role": "executor"}},
            },
            "matchConditions": [{"name": "had-gate", "expression": HAD_GATE}],
            "validations": [
                {
                    "expression": f"request.userInfo.username == '{ALLOCATOR}' || "
                    "(has(object.spec.schedulingGates) && "
                    "object.spec.schedulingGates.exists(g, g.name == 'sparkgate.io/allocator'))",
                    "message": "only the sparkgate allocator may remove the sparkgate.io/allocator gate",
                }
            ],
            **spec,
        },
    }


def binding(name: str = "gate-guard-binding", **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {"policyName": "gate-guard", "validationActions": ["Deny"], **spec},
    }


def gated_executor(name: str) -> dict[str, Any]:
    body = executor_pod(name)
    body["spec"]["schedulingGates"] = GATE
    return body


def test_policy_denies_with_the_real_message_and_allows_the_allocator(
    cluster: Cluster, core: client.CoreV1Api, allocator: client.CoreV1Api
) -> None:
    """staging/src/k8s.io/apiserver/pkg/admission/plugin/policy/validating/dispatcher.go: a denial is
    `pods "NAME" is forbidden: ValidatingAdmissionPolicy 'P' with binding 'B' denied request: MESSAGE`
    with reason Invalid (422) unless the validation gives one; validator.go: matchConditions gate it."""
    admission = client.AdmissionregistrationV1Api(core.api_client)
    admission.create_validating_admission_policy(gate_policy())
    admission.create_validating_admission_policy_binding(binding())
    core.create_namespaced_pod("spark", gated_executor("e1"))
    core.create_namespaced_pod("spark", gated_executor("e2"))
    ungate = {"spec": {"schedulingGates": None}}
    with pytest.raises(client.ApiException) as e:
        core.patch_namespaced_pod("e1", "spark", ungate)
    assert refusal(e) == (
        422,
        "pods \"e1\" is forbidden: ValidatingAdmissionPolicy 'gate-guard' with binding 'gate-guard-binding' "
        "denied request: only the sparkgate allocator may remove the sparkgate.io/allocator gate",
    )
    assert json.loads(e.value.body)["reason"] == "Invalid"
    core.patch_namespaced_pod("e1", "spark", {"metadata": {"labels": {"a": "1"}}})  # gate kept: allowed
    released = allocator.patch_namespaced_pod("e2", "spark", ungate)
    assert released.spec.scheduling_gates is None
    core.patch_namespaced_pod("e2", "spark", {"metadata": {"labels": {"a": "1"}}})  # no gate before: skipped


def test_policy_sees_the_requesting_users_groups(cluster: Cluster, core: client.CoreV1Api) -> None:
    """The CEL `request.userInfo` is the authenticated user's (k8s.io/apiserver/pkg/admission/plugin/cel
    `CreateAdmissionRequest` copies `attr.GetUserInfo()`): its groups are those the authenticator gave,
    `system:authenticated` included (pkg/authentication/group/authenticated_group_adder.go)."""
    admission = client.AdmissionregistrationV1Api(core.api_client)
    policy = gate_policy()
    policy["spec"]["validations"] = [
        {"expression": "'system:authenticated' in request.userInfo.groups", "message": "anonymous"},
        {
            "expression": "'ops:break-glass' in request.userInfo.groups",
            "messageExpression": "'not in the group; first group: ' + request.userInfo.groups[0]",
        },
    ]
    admission.create_validating_admission_policy(policy)
    admission.create_validating_admission_policy_binding(binding())
    core.create_namespaced_pod("spark", gated_executor("e1"))
    ungate = {"spec": {"schedulingGates": None}}
    member = config.new_client_from_config(str(cluster.add_user("ops", groups=("ops:break-glass",))))
    outsider = config.new_client_from_config(str(cluster.add_user("jane", groups=("team-a",))))
    try:
        with pytest.raises(client.ApiException) as e:
            client.CoreV1Api(outsider).patch_namespaced_pod("e1", "spark", ungate)
        assert refusal(e)[1].endswith("denied request: not in the group; first group: team-a")
        released = client.CoreV1Api(member).patch_namespaced_pod("e1", "spark", ungate)
        assert released.spec.scheduling_gates is None
    finally:
        member.close()
        outsider.close()


def test_policy_message_expression_reason_and_failure_policy(
    cluster: Cluster, core: client.CoreV1Api
) -> None:
    """validator.go: messageExpression's string wins over message, then `failed expression: EXPR`;
    `reason: Forbidden` answers 403; an expression that fails to evaluate denies under Fail with its error
    and is ignored under Ignore; a binding's matchResources narrows the policy (namespaceSelector)."""
    admission = client.AdmissionregistrationV1Api(core.api_client)
    rules = [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}]
    validations = [
        {
            "expression": "object.metadata.name.startsWith('ok-')",
            "messageExpression": "'pod ' + object.metadata.name + ' must be named ok-*'",
            "message": "unused",
            "reason": "Forbidden",
        },
        {"expression": "size(object.spec.containers) < 2"},
    ]
    admission.create_validating_admission_policy(
        {
            "metadata": {"name": "names"},
            "spec": {"matchConstraints": {"resourceRules": rules}, "validations": validations},
        }
    )
    only_spark = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "spark"}}}
    admission.create_validating_admission_policy_binding(
        {
            "metadata": {"name": "names-spark"},
            "spec": {"policyName": "names", "validationActions": ["Deny"], "matchResources": only_spark},
        }
    )
    with pytest.raises(client.ApiException) as e:
        core.create_namespaced_pod("spark", pod("bad"))
    assert refusal(e) == (
        403,
        "pods \"bad\" is forbidden: ValidatingAdmissionPolicy 'names' with binding 'names-spark' denied "
        "request: pod bad must be named ok-*",
    )
    two = pod("ok-two")
    two["spec"]["containers"].append({"name": "d", "image": "x"})
    with pytest.raises(client.ApiException) as e:
        core.create_namespaced_pod("spark", two)
    assert refusal(e)[1].endswith("denied request: failed expression: size(object.spec.containers) < 2")
    assert core.create_namespaced_pod("default", pod("bad")).metadata.name == "bad"  # not bound there

    broken = {"expression": "object.spec.nope == 1"}
    policy = cluster.store.get("validatingadmissionpolicies", None, "names")
    fail = json.loads(json.dumps(policy))
    fail["spec"]["validations"] = [broken]
    cluster.store.replace("validatingadmissionpolicies", None, "names", fail)
    with pytest.raises(client.ApiException) as e:
        core.create_namespaced_pod("spark", pod("ok-1"))
    assert refusal(e)[1].startswith(
        "pods \"ok-1\" is forbidden: ValidatingAdmissionPolicy 'names' with binding 'names-spark' denied "
        "request: expression 'object.spec.nope == 1' resulted in error: "
    )
    ignore = cluster.store.get("validatingadmissionpolicies", None, "names")
    ignore = json.loads(json.dumps(ignore))
    ignore["spec"]["failurePolicy"] = "Ignore"
    cluster.store.replace("validatingadmissionpolicies", None, "names", ignore)
    assert core.create_namespaced_pod("spark", pod("ok-1")).metadata.name == "ok-1"


def test_policy_variables(cluster: Cluster, core: client.CoreV1Api) -> None:
    """ValidatingAdmissionPolicy `variables` are composed in order and read as `variables.NAME`
    (https://kubernetes.io/docs/reference/access-authn-authz/validating-admission-policy/#variable-composition)."""
    admission = client.AdmissionregistrationV1Api(core.api_client)
    rules = [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}]
    admission.create_validating_admission_policy(
        {
            "metadata": {"name": "team"},
            "spec": {
                "matchConstraints": {"resourceRules": rules},
                "variables": [
                    {
                        "name": "labels",
                        "expression": "has(object.metadata.labels) ? object.metadata.labels : {}",
                    },
                    {
                        "name": "team",
                        "expression": "'team' in variables.labels ? variables.labels['team'] : ''",
                    },
                ],
                "validations": [
                    {"expression": "variables.team != ''", "message": "a team label is required"}
                ],
            },
        }
    )
    admission.create_validating_admission_policy_binding(
        {"metadata": {"name": "team"}, "spec": {"policyName": "team", "validationActions": ["Deny"]}}
    )
    with pytest.raises(client.ApiException) as e:
        core.create_namespaced_pod("spark", pod("p"))
    assert refusal(e)[1].endswith("denied request: a team label is required")
    assert core.create_namespaced_pod("spark", pod("q", {"team": "a"})).metadata.name == "q"


def test_a_delete_is_validated_with_the_object_being_deleted_as_old_object(
    cluster: Cluster, core: client.CoreV1Api
) -> None:
    """k8s.io/apiserver/pkg/endpoints/handlers/delete.go gives a DELETE to validating admission through
    rest.AdmissionToValidateObjectDeleteFunc: no `object`, the object being deleted as `oldObject`, the
    operation DELETE, its options a DeleteOptions; the etcd3 store checks the preconditions first (a wrong
    uid is a 409, not the policy's 403). A dry run (dryRun=All) is validated the same and deletes nothing."""
    admission = client.AdmissionregistrationV1Api(core.api_client)
    rule = {
        "apiGroups": [""],
        "apiVersions": ["v1"],
        "operations": ["DELETE"],
        "resources": ["configmaps", "pods"],
    }
    admission.create_validating_admission_policy(
        {
            "metadata": {"name": "keep"},
            "spec": {
                "matchConstraints": {"resourceRules": [rule]},
                "validations": [
                    {
                        "expression": "object == null && request.operation == 'DELETE' && "
                        "request.options.kind == 'DeleteOptions' && !('keep' in oldObject.metadata.labels)",
                        "reason": "Forbidden",
                        "message": "kept",
                    }
                ],
            },
        }
    )
    admission.create_validating_admission_policy_binding(
        {"metadata": {"name": "keep"}, "spec": {"policyName": "keep", "validationActions": ["Deny"]}}
    )
    for name, labels in (("kept", {"keep": "yes"}), ("gone", {"other": "x"})):
        core.create_namespaced_config_map("spark", {"metadata": {"name": name, "labels": labels}})
    with pytest.raises(client.ApiException) as e:
        core.delete_namespaced_config_map("kept", "spark")
    assert refusal(e) == (
        403,
        "configmaps \"kept\" is forbidden: ValidatingAdmissionPolicy 'keep' with binding 'keep' denied request: "
        "kept",
    )
    with pytest.raises(client.ApiException) as e:
        core.delete_namespaced_config_map(
            "kept", "spark", body=client.V1DeleteOptions(preconditions={"uid": "x"})
        )
    assert e.value.status == 409
    with pytest.raises(client.ApiException) as e:
        core.delete_namespaced_config_map("kept", "spark", dry_run="All")
    assert e.value.status == 403
    core.delete_namespaced_config_map("gone", "spark", dry_run="All")
    assert {c["metadata"]["name"] for c in cluster.store.list_objects("configmaps", "spark")[0]} == {
        "kept",
        "gone",
    }
    core.create_namespaced_pod("spark", pod("gated", schedulingGates=GATE))
    before = cluster.store.resource_version
    core.delete_namespaced_pod("gated", "spark", dry_run="All")
    assert cluster.store.resource_version == before and cluster.store.get("pods", "spark", "gated")
    core.delete_namespaced_config_map("gone", "spark")
    assert [c["metadata"]["name"] for c in cluster.store.list_objects("configmaps", "spark")[0]] == ["kept"]


def test_a_pending_graceful_deletion_is_neither_validated_nor_changed_by_a_plain_delete(
    cluster: Cluster, core: client.CoreV1Api
) -> None:
    """registry/rest/delete.go BeforeDelete: a pod already being deleted with a grace period keeps it when a
    DELETE asks for none or a longer one ("graceful deletion is pending, do nothing": no validation, the
    pod's terminationGracePeriodSeconds not read again), and a shorter one is a deletion again, validated."""
    admission = client.AdmissionregistrationV1Api(core.api_client)
    rule = {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["DELETE"], "resources": ["pods"]}
    admission.create_validating_admission_policy(
        {
            "metadata": {"name": "no-pod-deletes"},
            "spec": {"matchConstraints": {"resourceRules": [rule]}, "validations": [{"expression": "false"}]},
        }
    )
    admission.create_validating_admission_policy_binding(
        {
            "metadata": {"name": "no-pod-deletes"},
            "spec": {"policyName": "no-pod-deletes", "validationActions": ["Deny"]},
        }
    )
    # Bound to a node no kubelet runs: nothing finishes the deletion.
    core.create_namespaced_pod("spark", pod("p", nodeName="elsewhere", terminationGracePeriodSeconds=10))
    cluster.store.delete("pods", "spark", "p", grace_period_seconds=60)  # no user: not an API request
    pending = cluster.store.get("pods", "spark", "p")
    for grace in (None, 60, 90):
        core.delete_namespaced_pod("p", "spark", grace_period_seconds=grace)
    assert cluster.store.get("pods", "spark", "p") == pending
    with pytest.raises(client.ApiException) as e:
        core.delete_namespaced_pod("p", "spark", grace_period_seconds=5)
    assert e.value.status == 422 and "no-pod-deletes" in json.loads(e.value.body)["message"]
    assert cluster.store.get("pods", "spark", "p") == pending
