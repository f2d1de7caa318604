"""The policy rendered as a MutatingAdmissionPolicy (sparkgate/render.py): its shape, what it refuses to
render, and the API server's limits it is held to. The parity with the webhook is test_render_parity.py."""

from __future__ import annotations

import copy
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from sparkgate.cli import main
from sparkgate.mutation.derived import RULES
from sparkgate.policy import Policy, load_policy
from sparkgate.render import DERIVED_RULES_RENDERED, POLICY_NAME, RenderError, check_limits, render

HEAD = "apiVersion: sparkgate.io/v1alpha1\nkind: Policy\n"


def test_the_example_policy_renders_one_policy_and_its_binding(example_policy: Policy) -> None:
    policy, binding = render(example_policy).objects
    assert policy["apiVersion"] == binding["apiVersion"] == "admissionregistration.k8s.io/v1"
    assert (policy["kind"], binding["kind"]) == ("MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding")
    assert policy["metadata"]["name"] == binding["spec"]["policyName"] == POLICY_NAME
    spec = policy["spec"]
    assert spec["matchConstraints"]["resourceRules"] == [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "operations": ["CREATE"],
            "resources": ["pods"],
            "scope": "Namespaced",
        }
    ]
    # The selectors, checked before any CEL, and no matchConditions: the API server converts the whole pod to
    # CEL values for them, on each admission and again on the reinvocation pass.
    assert spec["matchConstraints"]["objectSelector"] == {
        "matchLabels": {"spark-role": "executor"},
        "matchExpressions": [{"key": "spark-app-selector", "operator": "Exists"}],
    }
    assert spec["matchConstraints"]["namespaceSelector"]["matchExpressions"] == [
        {
            "key": "kubernetes.io/metadata.name",
            "operator": "NotIn",
            "values": ["kube-system", "monitoring", "sparkgate-system"],  # legacy-* is in the guard
        }
    ]
    assert "matchConditions" not in spec
    assert spec["failurePolicy"] == "Ignore"  # never deny an executor pod (docs/architecture.md)
    assert spec["reinvocationPolicy"] == "Never"  # as the webhook's: one run per pod
    assert {m["patchType"] for m in spec["mutations"]} == {"JSONPatch"}  # never ApplyConfiguration
    assert "Object." not in spec["mutations"][0]["jsonPatch"]["expression"]  # no typed values
    assert policy["metadata"]["annotations"]["sparkgate.io/policy-digest"] == example_policy.digest


def test_every_derived_rule_has_a_rendering() -> None:
    """One table of derived fields (sparkgate/mutation/derived.py): a rule added there must be rendered."""
    assert {r.plugin for r in RULES} == set(DERIVED_RULES_RENDERED)


@pytest.mark.parametrize(
    "override", ["spec.containers", "spec.containers[spark-kubernetes-executor]"], ids=["list", "spark"]
)
def test_an_override_that_replaces_sparks_container_is_refused_with_the_reason(override: str) -> None:
    policy = load_policy(
        HEAD + "profiles:\n  - name: p\n    template:\n      spec:\n        containers:\n"
        "          - name: spark-kubernetes-executor\n            image: x\n"
        f"    overrides: ['{override}']\n"
    )
    with pytest.raises(RenderError) as e:
        render(policy)
    assert e.value.errors == [
        f"profiles[0] (p): overrides: {override} replaces Spark's own container; the admission-policy mode "
        "does not render it (name the fields to override instead)"
    ]


def big_template_policy(env: int) -> Policy:
    """A profile whose template gives Spark's container `env` variables (each merged by name)."""
    variables = [{"name": f"V{i}", "value": "x"} for i in range(env)]
    spark = {"name": "spark-kubernetes-executor", "env": variables}
    profile = {"name": "p", "template": {"spec": {"containers": [spark]}}}
    return load_policy(yaml.safe_dump({**yaml.safe_load(HEAD), "profiles": [profile]}))


def test_a_profile_whose_cel_exceeds_the_parsers_size_limit_is_refused() -> None:
    """cel-go's parser refuses an expression above 100,000 code points: the policy would not be created."""
    small = render(big_template_policy(10))
    assert all(len(m["jsonPatch"]["expression"]) < 100_000 for m in small.objects[0]["spec"]["mutations"])
    with pytest.raises(RenderError) as e:
        render(big_template_policy(100))
    (line,) = e.value.errors
    assert line.startswith("profile p: its operations take ")
    assert line.endswith("within cel-go's limit of 100,000 code points per expression")


def test_many_profiles_are_spread_over_mutations_and_stay_within_the_limits() -> None:
    profiles = [
        {"name": f"p{i}", "match": {"labels": {"team": f"t{i}"}}, "labels": {"tier": f"t{i}"}}
        for i in range(50)
    ]
    rendered = render(load_policy(yaml.safe_dump({**yaml.safe_load(HEAD), "profiles": profiles})))
    mutations = rendered.objects[0]["spec"]["mutations"]
    assert len(mutations) == 50 // 8 + 1  # 8 profiles per mutation, `none` and the gate in the last
    assert check_limits(rendered) == []


def test_costs_above_the_api_servers_budgets_are_named_with_their_source(example_policy: Policy) -> None:
    rendered = render(example_policy)
    dear = replace(rendered, costs={**rendered.costs, "mutations[0]": 1_000_001, "variables[x]": 9_000_000})
    assert check_limits(dear) == [
        "mutations[0]: a CEL cost of up to 1,000,001 on an executor pod within the assumed bounds is above the "
        "API server's per-expression limit of 1,000,000 (PerCallLimit, apis/cel/config.go)",
        "variables[x]: a CEL cost of up to 9,000,000 on an executor pod within the assumed bounds is above the "
        "API server's per-expression limit of 1,000,000 (PerCallLimit, apis/cel/config.go)",
        f"the policy's expressions cost up to {dear.total_cost:,} together, above the API server's budget of "
        "10,000,000 per policy evaluation (RuntimeCELCostBudget, apis/cel/config.go)",
    ]


def test_render_prints_both_objects_as_yaml(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(HEAD + "profiles:\n  - name: p\n    labels: {tier: batch}\n")
    assert main(["policy", "render", "--admission", "policy", str(path)]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [d["kind"] for d in docs] == ["MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding"]
    assert docs == render(load_policy(path.read_text())).objects


def test_check_in_policy_mode_refuses_what_cannot_be_rendered(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "policy.yaml"
    variables = [{"name": f"V{i}", "value": "x"} for i in range(100)]
    spark = {"name": "spark-kubernetes-executor", "env": variables}
    profile = {"name": "p", "template": {"spec": {"containers": [spark]}}}
    path.write_text(yaml.safe_dump({**yaml.safe_load(HEAD), "profiles": [profile]}))
    assert main(["policy", "check", str(path)]) == 0  # the webhook has no such limit
    assert main(["policy", "check", "--admission", "policy", str(path)]) == 1
    err = capsys.readouterr().err
    assert f"{path}: cannot be applied as a MutatingAdmissionPolicy:" in err
    assert "100,000 code points" in err


def test_check_in_policy_mode_reports_size_and_cost(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(HEAD + "profiles:\n  - name: p\n    labels: {tier: batch}\n")
    assert main(["policy", "check", "--admission", "policy", str(path)]) == 0
    rendered = render(load_policy(path.read_text()))
    assert (
        f"  as a MutatingAdmissionPolicy: {rendered.size:,} bytes; CEL cost up to {rendered.total_cost:,} per "
        "executor pod (limit 10,000,000)"
    ) in capsys.readouterr().out


def test_an_expression_above_the_parsers_size_limit_is_named() -> None:
    """Thousands of profiles make the profile choice itself too long for one expression."""
    profiles = [
        {"name": f"profile-{i:05d}", "match": {"namespaces": [f"team-{i:05d}-*"]}} for i in range(2500)
    ]
    with pytest.raises(RenderError) as e:
        render(load_policy(yaml.safe_dump({**yaml.safe_load(HEAD), "profiles": profiles})))
    assert any(
        line.startswith("variables[requestedIndex]: ")
        and line.endswith("above cel-go's limit of 100,000 per expression")
        for line in e.value.errors
    ), e.value.errors


@pytest.mark.parametrize(
    ("namespace", "app_id"),
    [("legacy-x", "spark-1"), ("monitoring", "spark-1"), ("spark-jobs", ""), ("spark-jobs", None)],
    ids=["excluded-by-pattern", "excluded-by-name", "empty-app-id", "no-app-id"],
)
def test_what_the_webhook_leaves_alone_the_policy_leaves_alone_without_match_conditions(
    reviews: dict[str, Any], example_policy: Policy, namespace: str, app_id: str | None
) -> None:
    """The selectors (kubesim's matching, as matching.go) and the guard around the mutation stand for the match
    conditions the rendering no longer has; the same pod in spark-jobs with its app id is shaped."""
    from kubesim.mutating_policy import apply_policies

    objects = render(example_policy).objects
    pod = copy.deepcopy(reviews["etl-nightly-exec-1"]["request"]["object"])

    def through_policy(ns: str, app: str | None) -> Any:
        p = copy.deepcopy(pod)
        p["metadata"]["namespace"] = ns
        p["metadata"]["labels"].pop("spark-app-selector")
        if app is not None:
            p["metadata"]["labels"]["spark-app-selector"] = app
        meta = {"name": ns, "labels": {"kubernetes.io/metadata.name": ns}}
        got = apply_policies([objects[0]], [objects[1]], p, namespace={"kind": "Namespace", "metadata": meta})
        return p, got

    before, after = through_policy(namespace, app_id)
    assert after == before
    before, after = through_policy("spark-jobs", "spark-1")
    assert after != before and "sparkgate.io/allocator" in str(after["spec"]["schedulingGates"])
