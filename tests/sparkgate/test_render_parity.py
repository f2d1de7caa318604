"""Parity, the oracle of the admission-policy mode: for every captured Spark pod and every profile, the pod
after the rendered MutatingAdmissionPolicy (kubesim's engine, kubesim/mutating_policy.py) equals the pod after
the webhook's patch (sparkgate.mutation.mutate), field by field (docs/policy.md, "Admission policies instead
of the webhook")."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kubesim.mutating_policy import apply_policies
from kubesim.podrules import default_pod
from sparkgate.mutation import mutate
from sparkgate.policy import Policy
from sparkgate.render import RenderError, render

from .policies import NAMESPACES, policies

Obj = dict[str, Any]
REQUESTED = (None, "p0", "p1", "p2", "analytics", "default")


def namespace(name: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": name, "labels": {"kubernetes.io/metadata.name": name}},
    }


def executor_in(review: Obj, ns: str, requested: str | None) -> Obj:
    request = copy.deepcopy(review["request"])
    request["namespace"] = ns
    request["object"]["metadata"]["namespace"] = ns
    if requested is not None:
        request["object"]["metadata"].setdefault("annotations", {})["sparkgate.io/profile"] = requested
    return request


def by_webhook(request: Obj, policy: Policy) -> Obj:
    """The pod as stored after the webhook: its patch, then the API server's defaulting (kubesim's)."""
    pod: Obj = jsonpatch.apply_patch(request["object"], mutate(request, policy).ops)
    default_pod(pod)
    return pod


def by_policy(objects: list[Obj], pod: Obj) -> Obj:
    """The pod as stored after the policies: kubesim's plugin, then defaulting (which the plugin does only
    after a mutation; the API server defaults every created pod)."""
    ns = pod["metadata"]["namespace"]
    out = apply_policies([objects[0]], [objects[1]], pod, namespace=namespace(ns))
    default_pod(out)
    return out


def assert_parity(request: Obj, policy: Policy, objects: list[Obj]) -> None:
    """And a second run of the policy on its own result changes nothing (a policy reinvoked by another's
    change, or an edit of `reinvocationPolicy`, must not move the pod)."""
    want = by_webhook(request, policy)
    got = by_policy(objects, request["object"])
    assert got == want, jsonpatch.make_patch(want, got).patch
    again = by_policy(objects, got)
    assert again == want, jsonpatch.make_patch(want, again).patch


def test_every_captured_pod_in_every_namespace_under_the_example_policy(
    reviews: dict[str, Obj], example_policy: Policy
) -> None:
    objects = render(example_policy).objects
    for review in reviews.values():
        for ns in (*NAMESPACES, review["request"]["namespace"]):
            for requested in (None, "analytics", "default", "nope"):
                assert_parity(executor_in(review, ns, requested), example_policy, objects)


# 250 generated policies: each costs ~0.2 s, nearly all of it cel-python's parser (lark) compiling the
# rendered policy's expressions, which differ from one policy to the next; 500 were an eighth of CI's time.
@settings(max_examples=250, deadline=None, suppress_health_check=list(HealthCheck))
@given(policies(), st.sampled_from(sorted(NAMESPACES)), st.sampled_from(REQUESTED), st.data())
def test_generated_policies_shape_every_captured_pod_as_the_webhook_does(
    reviews: dict[str, Obj], policy: Policy, ns: str, requested: str | None, data: st.DataObject
) -> None:
    try:
        objects = render(policy).objects
    except RenderError as e:  # only an override that replaces Spark's container (test_render.py)
        assert all("replaces Spark's own container" in line for line in e.errors), e.errors
        return
    review = reviews[data.draw(st.sampled_from(sorted(reviews)))]
    assert_parity(executor_in(review, ns, requested), policy, objects)


# --- the differences that cannot be avoided (docs/policy.md, "Admission policies instead of the webhook") ---


def load(text: str) -> Policy:
    from sparkgate.policy import load_policy

    return load_policy("apiVersion: sparkgate.io/v1alpha1\nkind: Policy\n" + text)


def test_an_app_id_that_is_not_a_short_dns_label_gets_no_config_map_from_the_policy(
    reviews: dict[str, Obj],
) -> None:
    """The copy's name then holds a SHA-256 of the app id (contract.app_configmap_name), which CEL cannot
    compute: the policy mounts nothing, the webhook mounts the copy."""
    policy = load("profiles:\n  - name: p\n    configMaps: [{source: spark-log4j, mountPath: /etc/extra}]\n")
    request = executor_in(reviews["adhoc-query-exec-1"], "spark-jobs", None)
    request["object"]["metadata"]["labels"]["spark-app-selector"] = "Spark_App.1"
    want, got = by_webhook(request, policy), by_policy(render(policy).objects, request["object"])
    names = lambda pod: [v["name"] for v in pod["spec"]["volumes"]]  # noqa: E731
    assert [n for n in names(want) if n not in names(got)] == ["sparkgate-spark-log4j-c9bc235f"]
    assert got["spec"]["schedulingGates"] == want["spec"]["schedulingGates"]  # still shaped and gated
    plain = executor_in(reviews["adhoc-query-exec-1"], "spark-jobs", None)
    assert by_policy(render(policy).objects, plain["object"]) == by_webhook(plain, policy)


def test_a_template_that_lists_the_servers_own_default_toleration_is_shaped_as_the_webhook_shapes_it(
    reviews: dict[str, Obj],
) -> None:
    """The webhook drops the default not-ready toleration (a covering one is added) and is not called again.
    The policy is not run again either (`reinvocationPolicy: Never`, as the webhook's): once it re-ran on
    its own result, where the template's copy of that toleration was missing, and appended it (a difference
    documented until the policy stopped being re-run)."""
    default = {
        "key": "node.kubernetes.io/not-ready",
        "operator": "Exists",
        "effect": "NoExecute",
        "tolerationSeconds": 300,
    }
    policy = load(
        "profiles:\n  - name: p\n    template:\n      spec:\n        tolerations:\n"
        "          - {key: node.kubernetes.io/not-ready, operator: Exists, effect: NoExecute, tolerationSeconds: 300}\n"
        "          - {operator: Exists}\n"
    )
    objects = render(policy).objects
    assert objects[0]["spec"]["reinvocationPolicy"] == "Never"
    request = executor_in(reviews["adhoc-query-exec-1"], "spark-jobs", None)
    want, got = by_webhook(request, policy), by_policy(objects, request["object"])
    assert default not in want["spec"]["tolerations"]
    assert got == want


def test_only_the_first_of_two_token_volumes_is_dropped(reviews: dict[str, Obj]) -> None:
    """The ServiceAccount plugin adds one projected `kube-api-access-*` volume; a pod carrying a second one of
    its own loses only the first when the template changes the service account (the patch is computed from
    the pod as received, and CEL cannot remove every match of a list by index)."""
    policy = load(
        "profiles:\n  - name: p\n    template:\n      spec:\n        serviceAccountName: spark-exec\n    overrides: [spec.serviceAccountName]\n"
    )
    request = executor_in(reviews["adhoc-query-exec-1"], "spark-jobs", None)
    volumes = request["object"]["spec"]["volumes"]
    token = next(v for v in volumes if v["name"].startswith("kube-api-access-"))
    volumes.append({**token, "name": "kube-api-access-extra"})
    want, got = by_webhook(request, policy), by_policy(render(policy).objects, request["object"])
    assert [v["name"] for v in got["spec"]["volumes"] if v["name"].startswith("kube-api-access-")] == [
        "kube-api-access-extra"
    ]
    assert not any(v["name"].startswith("kube-api-access-") for v in want["spec"]["volumes"])
    single = executor_in(reviews["adhoc-query-exec-1"], "spark-jobs", None)
    assert by_policy(render(policy).objects, single["object"]) == by_webhook(single, policy)
